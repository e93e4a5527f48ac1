// Host-to-device copy times on the GPU, for the calibration's copy samples (calibration_harness.hpp): the
// GPU backend does not time its copy engine (it reports copy_s = 0), so the copies an expert costs are
// measured here: `calls` copies of `bytes_per_call` bytes each, cudaMemcpyAsync on one stream, each from its
// own region of a pinned host buffer into its own region of a device buffer, as the DoubleBufferLoader issues
// them for distinct experts (a restore is 3 calls of one
// expert page, a buffered expert 1 call of 3 pages), timed by CUDA events around the calls. The copy
// engine's time per call (latency) and per byte (bandwidth) are what the cost model prices.
//
// CUDA-free header: h2d_copy_probe.cu where the CUDA backend is built (AMOEBA_HAS_CUDA_BACKEND),
// h2d_copy_probe_stub.cpp elsewhere, whose constructor refuses naming --backend.
#pragma once

#include <cstdint>
#include <memory>

namespace amoeba::engine {

class H2dCopyProbe {
 public:
  // Takes max_calls x max_bytes_per_call bytes of pinned host memory and of device memory on `device` and
  // warms the copy path up. Throws ConfigError naming --backend when there is no usable device (or no CUDA
  // backend in this build), std::runtime_error when an allocation fails, std::logic_error when either
  // argument is 0.
  H2dCopyProbe(std::uint64_t max_bytes_per_call, std::uint64_t max_calls, int device = 0);
  ~H2dCopyProbe();
  H2dCopyProbe(const H2dCopyProbe&) = delete;
  H2dCopyProbe& operator=(const H2dCopyProbe&) = delete;

  // Seconds from the first of `calls` copies of `bytes_per_call` bytes to the end of the last. Throws
  // std::logic_error when calls is 0 or above max_calls, or bytes_per_call is 0 or above max_bytes_per_call.
  double time(std::uint64_t calls, std::uint64_t bytes_per_call);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace amoeba::engine
