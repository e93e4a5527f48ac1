// Loader benchmark on one GPU, one call (DESIGN §8 loader targets):
//   1. raw pinned host-to-device copy rate per transfer size (one cudaMemcpyAsync, CUDA events, median);
//   2. the DoubleBufferLoader moving experts of Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B and Mixtral-8x7B shapes --
//      whole experts into a load buffer (one copy per expert) and restores into reserved pool pages (three
//      copies per expert) -- as a fraction of the raw rate at the same copy size and of the peak raw rate;
//   3. the slowdown of a kernel on the compute stream while host-to-device copies run on the copy stream,
//      for a memory-bound kernel (device copy) and a compute-bound one (FMA chain).
// Writes JSON (argv[1], default loader_h200.json) and prints a markdown table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "amoeba/policies/stacks.hpp"
#include "amoeba/pool.hpp"
#include "loader/double_buffer_loader.cuh"

using namespace amoeba;
using namespace amoeba::kernels;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timer {
  cudaEvent_t a{}, b{};
  Timer() {
    AMOEBA_CUDA_CHECK(cudaEventCreate(&a));
    AMOEBA_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  double ms() {
    AMOEBA_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    AMOEBA_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

// ---- 1. raw pinned copies
double raw_h2d_gbps(std::byte* dst, const std::byte* src, std::uint64_t bytes, cudaStream_t s, int reps) {
  Timer t;
  std::vector<double> ms;
  for (int i = 0; i < reps + 3; ++i) {
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.a, s));
    AMOEBA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.b, s));
    const double x = t.ms();
    if (i >= 3) ms.push_back(x);
  }
  return bytes / (median(ms) * 1e-3) / 1e9;
}

// ---- 2. the loader
struct ModelShape {
  const char* name;
  std::uint32_t experts, hidden, inter, slots;
};

struct LoaderResult {
  std::string model, mode;
  std::uint64_t matrix_bytes, bytes_per_copy, experts_per_batch;
  double gbps, raw_same_size_gbps;
};

// Moves `slots` experts of one layer per measurement, `reps` times, through the loader.
std::vector<LoaderResult> loader_rates(const ModelShape& m,
                                       const std::vector<std::pair<std::uint64_t, double>>& raw, int reps) {
  const std::uint64_t mb = std::uint64_t(m.hidden) * m.inter * 2;
  const std::uint32_t layers = 2;
  PinnedExpertStore store(layers, m.experts, mb);
  store.fill(
      [](ExpertKey k, std::byte* dst, std::uint64_t n) { std::memset(dst, int(k.expert * 7 + 1), n); });
  // A pool with room for every expert of both layers plus the restores.
  DeviceArena arena((std::uint64_t(layers) * m.experts * 3 + 3 * m.slots + 3) * mb);
  MoePool pool(arena.span(), {PageSpec{mb}, PageSpec{mb / 8}});
  ResidencyTable table(layers, m.experts);  // nothing resident: every expert is a load
  cudaStream_t compute;
  AMOEBA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  DoubleBufferLoader loader(LoaderShape{layers, m.experts, m.slots}, store, arena.span(), compute);
  auto raw_at = [&](std::uint64_t bytes) {
    for (auto& [b, g] : raw)
      if (b == bytes) return g;
    return 0.0;
  };
  std::vector<LoaderResult> out;
  Timer t;

  // (a) whole experts into a load buffer: prefetch `slots` experts of layer 0 (one copy each).
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    std::vector<std::uint32_t> pick;
    for (std::uint32_t i = 0; i < m.slots; ++i) pick.push_back((r * m.slots + i) % m.experts);
    if (loader.begin_forward(ChangeList{}, table, pool)) throw std::runtime_error("begin_forward");
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.a, loader.copy_stream()));
    if (loader.prefetch(0, pick)) throw std::runtime_error("prefetch");
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.b, loader.copy_stream()));
    auto w = loader.prepare_layer(0, pick);
    if (!w) throw std::runtime_error(w.error().message);
    loader.layer_done(0);
    const double x = t.ms();
    loader.end_forward();
    if (r >= 2) ms.push_back(x);
  }
  out.push_back({m.name, "buffer (1 copy/expert)", mb, 3 * mb, m.slots,
                 3.0 * mb * m.slots / (median(ms) * 1e-3) / 1e9, raw_at(3 * mb)});

  // (b) restores straight into reserved pool pages (three copies per expert).
  ms.clear();
  for (int r = 0; r < reps + 2; ++r) {
    ChangeList cl;
    for (std::uint32_t i = 0; i < m.slots; ++i) {
      Restore rs{{0, (r * m.slots + i) % m.experts}, {}};
      for (amoeba::ExpertMatrix mm : kExpertMatrices)
        rs.pages[mm] = *pool.allocate<ExpertPage>(expert_owner(rs.expert, mm, true));
      cl.restores.push_back(rs);
    }
    if (loader.begin_forward(cl, table, pool)) throw std::runtime_error("begin_forward restores");
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.a, loader.copy_stream()));
    if (loader.prefetch(0, {})) throw std::runtime_error("prefetch");
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.b, loader.copy_stream()));
    if (!loader.prepare_layer(0, {})) throw std::runtime_error("prepare");
    loader.layer_done(0);
    const double x = t.ms();
    loader.end_forward();
    for (auto& rs : cl.restores)
      for (auto p : rs.pages.pages) (void)pool.free(p);
    if (r >= 2) ms.push_back(x);
  }
  out.push_back({m.name, "restore (3 copies/expert)", mb, mb, m.slots,
                 3.0 * mb * m.slots / (median(ms) * 1e-3) / 1e9, raw_at(mb)});
  AMOEBA_CUDA_CHECK(cudaStreamDestroy(compute));
  return out;
}

// ---- 3. compute slowdown while copies run
__global__ void device_copy(const float4* __restrict__ in, float4* __restrict__ out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}
__global__ void fma_chain(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-4f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    d = fmaf(d, c, b);
    b = fmaf(b, c, a * 1e-9f);
  }
  if (a + b + d == 12345.f) out[0] = a;
}

struct Slowdown {
  std::string kernel;
  double alone_ms, with_copies_ms;
};

Slowdown slowdown(const char* name, const std::function<void(cudaStream_t)>& launch, std::byte* h2d_dst,
                  const std::byte* h2d_src, std::uint64_t chunk, int reps) {
  cudaStream_t compute, copy;
  AMOEBA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  AMOEBA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  Timer t;
  auto time_once = [&] {
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.a, compute));
    launch(compute);
    AMOEBA_CUDA_CHECK(cudaEventRecord(t.b, compute));
    return t.ms();
  };
  for (int i = 0; i < 3; ++i) time_once();
  std::vector<double> alone, busy;
  for (int r = 0; r < reps; ++r) {
    alone.push_back(time_once());
    // Keep the copy engine busy for longer than the kernel runs: 12 chunks queued ahead.
    for (int c = 0; c < 12; ++c)
      AMOEBA_CUDA_CHECK(cudaMemcpyAsync(h2d_dst, h2d_src, chunk, cudaMemcpyHostToDevice, copy));
    busy.push_back(time_once());
    const bool still_copying = cudaStreamQuery(copy) == cudaErrorNotReady;
    AMOEBA_CUDA_CHECK(cudaStreamSynchronize(copy));
    if (!still_copying) std::fprintf(stderr, "warning: copies ended before the kernel (%s)\n", name);
  }
  AMOEBA_CUDA_CHECK(cudaStreamDestroy(compute));
  AMOEBA_CUDA_CHECK(cudaStreamDestroy(copy));
  return {name, median(alone), median(busy)};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "loader_h200.json";
  cudaDeviceProp prop{};
  AMOEBA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // 1. raw rates
  const std::vector<std::uint64_t> sizes = {
      1ull << 20,  2048ull * 768 * 2,   2048ull * 1408 * 2,     3 * 2048ull * 768 * 2, 3 * 2048ull * 1408 * 2,
      64ull << 20, 4096ull * 14336 * 2, 3 * 4096ull * 14336 * 2};
  const std::uint64_t max_bytes = sizes.back();
  std::byte *h = nullptr, *d = nullptr;
  AMOEBA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&h), max_bytes, cudaHostAllocDefault));
  AMOEBA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), max_bytes));
  std::memset(h, 0x3c, max_bytes);
  cudaStream_t s;
  AMOEBA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::pair<std::uint64_t, double>> raw;
  double peak = 0;
  for (auto b : sizes) {
    raw.emplace_back(b, raw_h2d_gbps(d, h, b, s, b > (100ull << 20) ? 9 : 25));
    peak = std::max(peak, raw.back().second);
  }

  // 2. the loader, on three model shapes (slots = expert_offload_limit)
  const std::vector<ModelShape> models = {{"Qwen3-30B-A3B", 128, 2048, 768, 8},
                                          {"Qwen1.5-MoE-A2.7B", 60, 2048, 1408, 8},
                                          {"Mixtral-8x7B", 8, 4096, 14336, 2}};
  std::vector<LoaderResult> lr;
  for (auto& m : models)
    for (auto& r : loader_rates(m, raw, 9)) lr.push_back(r);

  // 3. slowdown of compute-stream kernels while copies run
  const std::size_t n4 = (512ull << 20) / 16;  // 512 MiB in, 512 MiB out
  float4 *a = nullptr, *b = nullptr;
  AMOEBA_CUDA_CHECK(cudaMalloc(&a, n4 * 16));
  AMOEBA_CUDA_CHECK(cudaMalloc(&b, n4 * 16));
  AMOEBA_CUDA_CHECK(cudaMemset(a, 1, n4 * 16));
  std::vector<Slowdown> sd;
  sd.push_back(slowdown(
      "device copy 512 MiB (memory-bound)",
      [&](cudaStream_t cs) { device_copy<<<prop.multiProcessorCount * 8, 512, 0, cs>>>(a, b, n4); }, d, h,
      64ull << 20, 15));
  sd.push_back(slowdown(
      "FMA chain (compute-bound)",
      [&](cudaStream_t cs) {
        fma_chain<<<prop.multiProcessorCount * 16, 256, 0, cs>>>(reinterpret_cast<float*>(b), 20000);
      },
      d, h, 64ull << 20, 15));
  AMOEBA_CUDA_CHECK(cudaGetLastError());

  // ---- report
  FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) {
    std::perror(out_path.c_str());
    return 1;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"raw_h2d\": [\n", prop.name);
  for (std::size_t i = 0; i < raw.size(); ++i)
    std::fprintf(f, "    {\"bytes\": %llu, \"gbps\": %.2f}%s\n", (unsigned long long)raw[i].first,
                 raw[i].second, i + 1 < raw.size() ? "," : "");
  std::fprintf(f, "  ],\n  \"raw_h2d_peak_gbps\": %.2f,\n  \"loader\": [\n", peak);
  for (std::size_t i = 0; i < lr.size(); ++i)
    std::fprintf(
        f,
        "    {\"model\": \"%s\", \"mode\": \"%s\", \"matrix_bytes\": %llu, \"bytes_per_copy\": %llu, "
        "\"experts_per_batch\": %llu, \"gbps\": %.2f, \"raw_same_size_gbps\": %.2f, "
        "\"fraction_of_same_size\": %.3f, \"fraction_of_peak\": %.3f}%s\n",
        lr[i].model.c_str(), lr[i].mode.c_str(), (unsigned long long)lr[i].matrix_bytes,
        (unsigned long long)lr[i].bytes_per_copy, (unsigned long long)lr[i].experts_per_batch, lr[i].gbps,
        lr[i].raw_same_size_gbps, lr[i].gbps / lr[i].raw_same_size_gbps, lr[i].gbps / peak,
        i + 1 < lr.size() ? "," : "");
  std::fprintf(f, "  ],\n  \"compute_slowdown\": [\n");
  for (std::size_t i = 0; i < sd.size(); ++i)
    std::fprintf(
        f, "    {\"kernel\": \"%s\", \"alone_ms\": %.4f, \"with_copies_ms\": %.4f, \"slowdown\": %.4f}%s\n",
        sd[i].kernel.c_str(), sd[i].alone_ms, sd[i].with_copies_ms,
        sd[i].with_copies_ms / sd[i].alone_ms - 1.0, i + 1 < sd.size() ? "," : "");
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);

  std::printf("\n| transfer | raw pinned H2D GB/s |\n|---|---|\n");
  for (auto& [bytes, g] : raw) std::printf("| %.2f MB | %.1f |\n", bytes / 1e6, g);
  std::printf(
      "\n| model | mode | bytes/copy | experts | loader GB/s | raw same size | %% of same size | %% of peak "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto& r : lr)
    std::printf("| %s | %s | %.2f MB | %llu | %.1f | %.1f | %.1f%% | %.1f%% |\n", r.model.c_str(),
                r.mode.c_str(), r.bytes_per_copy / 1e6, (unsigned long long)r.experts_per_batch, r.gbps,
                r.raw_same_size_gbps, 100 * r.gbps / r.raw_same_size_gbps, 100 * r.gbps / peak);
  std::printf("\n| compute-stream kernel | alone ms | with copies ms | slowdown |\n|---|---|---|---|\n");
  for (auto& x : sd)
    std::printf("| %s | %.3f | %.3f | %+.2f%% |\n", x.kernel.c_str(), x.alone_ms, x.with_copies_ms,
                100 * (x.with_copies_ms / x.alone_ms - 1));
  cudaFree(a);
  cudaFree(b);
  cudaFree(d);
  cudaFreeHost(h);
  return 0;
}
