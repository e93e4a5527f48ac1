// The copy probe on the GPU; see h2d_copy_probe.hpp.
#include "engine/h2d_copy_probe.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("h2d copy probe: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

struct H2dCopyProbe::Impl {
  std::uint64_t max_bytes = 0, max_calls = 0;
  void* host = nullptr;  // pinned
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;

  ~Impl() {
    // Best effort: a failing free cannot be reported from a destructor.
    if (begin) (void)cudaEventDestroy(begin);
    if (end) (void)cudaEventDestroy(end);
    if (stream) (void)cudaStreamDestroy(stream);
    if (device) (void)cudaFree(device);
    if (host) (void)cudaFreeHost(host);
  }
};

H2dCopyProbe::H2dCopyProbe(std::uint64_t max_bytes_per_call, std::uint64_t max_calls, int device)
    : impl_(std::make_unique<Impl>()) {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices <= device)
    throw ConfigError("--backend", "cuda",
                      e != cudaSuccess ? std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")"
                                       : "device " + std::to_string(device) + " does not exist (" +
                                             std::to_string(devices) + " CUDA devices)");
  if (max_bytes_per_call == 0) throw std::logic_error("h2d copy probe: max_bytes_per_call is 0");
  if (max_calls == 0) throw std::logic_error("h2d copy probe: max_calls is 0");
  Impl& d = *impl_;
  d.max_bytes = max_bytes_per_call;
  d.max_calls = max_calls;
  const std::uint64_t total = max_bytes_per_call * max_calls;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaHostAlloc(&d.host, total, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(d.host, 0x3c, total);  // touch every page before the copies are timed
  check(cudaMalloc(&d.device, total), "cudaMalloc");
  check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreate(&d.begin), "cudaEventCreate");
  check(cudaEventCreate(&d.end), "cudaEventCreate");
  // Warm-up: the first copies pay for mappings the later ones do not.
  check(cudaMemcpyAsync(d.device, d.host, total, cudaMemcpyHostToDevice, d.stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize");
}

H2dCopyProbe::~H2dCopyProbe() = default;

double H2dCopyProbe::time(std::uint64_t calls, std::uint64_t bytes_per_call) {
  Impl& d = *impl_;
  if (calls == 0 || calls > d.max_calls || bytes_per_call == 0 || bytes_per_call > d.max_bytes)
    throw std::logic_error("h2d copy probe: " + std::to_string(calls) + " calls of " +
                           std::to_string(bytes_per_call) + " bytes (at most " + std::to_string(d.max_calls) +
                           " calls of " + std::to_string(d.max_bytes) + ")");
  // Each call from its own source into its own destination, as the loader copies distinct experts.
  auto* dst = static_cast<std::byte*>(d.device);
  const auto* src = static_cast<const std::byte*>(d.host);
  check(cudaEventRecord(d.begin, d.stream), "cudaEventRecord");
  for (std::uint64_t i = 0; i < calls; ++i)
    check(cudaMemcpyAsync(dst + i * d.max_bytes, src + i * d.max_bytes, bytes_per_call,
                          cudaMemcpyHostToDevice, d.stream),
          "cudaMemcpyAsync");
  check(cudaEventRecord(d.end, d.stream), "cudaEventRecord");
  check(cudaEventSynchronize(d.end), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, d.begin, d.end), "cudaEventElapsedTime");
  return double(ms) * 1e-3;
}

}  // namespace amoeba::engine
