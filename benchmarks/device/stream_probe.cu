// How the order in which a decode GEMV reads its weight rows changes the DRAM rate (a probe, not a kernel of
// the library). Every pattern reads the same bytes with the same loads in flight per thread (kLoads 16-byte
// loads issued before any is used) on the same grid as the decode gate/up kernel (moe/decode_gemv.cuh): a
// block of 4 warps owns 32 rows of `row_bytes`, the blocks' rows consecutive. Patterns:
//   gemv:  the decode GEMV's: warp w reads K quarter w of every row; thread (g, q) rows g, g + 8 of both
//          16-row tiles, a pair of steps one 128-byte line (sector q of it), through L1 evict-first;
//   rows:  each warp reads whole rows: 8 rows per warp, 4 KB of a row per iteration (32 lanes × kLoads × 16
//   B)
//          (each warp instruction 512 contiguous bytes), past L1;
//   block: the block's 32 rows as one contiguous span, thread t chunks t, t + 128, ... (each iteration 16 KB
//          contiguous per block), past L1.
// Each launch reads one of `buffers` copies in turn (more than the L2 holds), the time per launch is the
// median over batches of a CUDA graph of `launches` launches; the read rate is bytes / time.
//
//   stream_probe [--blocks 352] [--row-bytes 4096] [--buffers 4] [--launches 32] [--batches 15]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "loader/cuda_check.cuh"
#include "moe/ptx.cuh"

namespace {

using amoeba::kernels::ptx::ld_stream_16;
constexpr int kThreads = 128, kRows = 32, kLoads = 8;

__device__ __forceinline__ unsigned fold(const uint4& v) {
  return v.x ^ v.y ^ v.z ^ v.w;
}

// The decode GEMV's order (bf16_k of moe/decode_steps.hpp with unroll 2: each iteration two step pairs'
// worth = kLoads loads per thread: 2 row tiles × (g, g + 8) × 2 steps).
__global__ void __launch_bounds__(kThreads)
    gemv_order(const unsigned char* base, int row_bytes, unsigned* sink) {
  const unsigned char* block = base + static_cast<long long>(blockIdx.x) * kRows * row_bytes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int lines = row_bytes / 128, begin = 128 * (warp * lines / 4), end = 128 * ((warp + 1) * lines / 4);
  unsigned acc = 0;
  for (int b = begin; b < end; b += 128) {  // one line of each of the thread's 4 rows: 2 steps
    uint4 v[kLoads];
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const unsigned char* lo =
            block + static_cast<long long>(16 * r + g) * row_bytes + b + 32 * q + 16 * s;
        v[4 * s + 2 * r] = ld_stream_16<128, true>(lo);
        v[4 * s + 2 * r + 1] = ld_stream_16<128, true>(lo + 8LL * row_bytes);
      }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) acc += fold(v[i]);
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

// Whole rows per warp: warp w rows w, w + 4, ...; 32 · kLoads · 16 = 4 KB of a row per iteration.
__global__ void __launch_bounds__(kThreads)
    rows_order(const unsigned char* base, int row_bytes, unsigned* sink) {
  const unsigned char* block = base + static_cast<long long>(blockIdx.x) * kRows * row_bytes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned acc = 0;
  for (int row = warp; row < kRows; row += 4)
    for (int b = 0; b < row_bytes; b += 32 * kLoads * 16) {
      uint4 v[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i)
        v[i] = ld_stream_16(block + static_cast<long long>(row) * row_bytes + b + 512 * i + 16 * lane);
#pragma unroll
      for (int i = 0; i < kLoads; ++i) acc += fold(v[i]);
    }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

// The block's span in order: each iteration kLoads chunks of 16 bytes per thread, 16 KB per block.
__global__ void __launch_bounds__(kThreads)
    block_order(const unsigned char* base, int row_bytes, unsigned* sink) {
  const long long span = static_cast<long long>(kRows) * row_bytes;
  const unsigned char* block = base + blockIdx.x * span;
  unsigned acc = 0;
  for (long long b = 0; b < span; b += kThreads * kLoads * 16) {
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) v[i] = ld_stream_16(block + b + 16 * (kThreads * i + threadIdx.x));
#pragma unroll
    for (int i = 0; i < kLoads; ++i) acc += fold(v[i]);
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

struct Options {
  int blocks = 352, row_bytes = 4096, buffers = 4, launches = 32, batches = 15;
};
// "--name value" pairs, each value a positive integer; an unknown option or a bad value is refused, named.
bool parse(int argc, char** argv, Options& o) {
  const std::pair<const char*, int*> known[] = {{"--blocks", &o.blocks},
                                                {"--row-bytes", &o.row_bytes},
                                                {"--buffers", &o.buffers},
                                                {"--launches", &o.launches},
                                                {"--batches", &o.batches}};
  for (int i = 1; i < argc; i += 2) {
    int* slot = nullptr;
    for (const auto& [name, p] : known)
      if (std::strcmp(argv[i], name) == 0) slot = p;
    if (slot == nullptr) {
      std::fprintf(stderr, "unknown option %s (--blocks, --row-bytes, --buffers, --launches, --batches)\n",
                   argv[i]);
      return false;
    }
    char* end = nullptr;
    const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (i + 1 >= argc || *end != '\0' || v <= 0 || v > (1L << 30)) {
      std::fprintf(stderr, "%s %s: must be a positive integer\n", argv[i],
                   i + 1 < argc ? argv[i + 1] : "(missing)");
      return false;
    }
    *slot = static_cast<int>(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  const int blocks = o.blocks, row_bytes = o.row_bytes, buffers = o.buffers, launches = o.launches,
            batches = o.batches;
  if (row_bytes % (32 * kLoads * 16) != 0) {
    std::fprintf(stderr, "--row-bytes %d: must be a multiple of %d (a warp's whole-row iteration)\n",
                 row_bytes, 32 * kLoads * 16);
    return 2;
  }
  const long long bytes = static_cast<long long>(blocks) * kRows * row_bytes;
  std::vector<unsigned char*> buf(buffers);
  for (auto& b : buf) {
    AMOEBA_CUDA_CHECK(cudaMalloc(&b, bytes));
    AMOEBA_CUDA_CHECK(cudaMemset(b, 1, bytes));
  }
  unsigned* sink;
  AMOEBA_CUDA_CHECK(cudaMalloc(&sink, kThreads * sizeof(unsigned)));
  cudaStream_t stream;
  AMOEBA_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t ev[2];
  for (auto& e : ev) AMOEBA_CUDA_CHECK(cudaEventCreate(&e));
  using Kernel = void (*)(const unsigned char*, int, unsigned*);
  const std::pair<const char*, Kernel> patterns[] = {
      {"gemv", gemv_order}, {"rows", rows_order}, {"block", block_order}};
  std::printf("{\"blocks\": %d, \"row_bytes\": %d, \"bytes\": %lld, \"patterns\": [", blocks, row_bytes,
              bytes);
  bool first = true;
  for (const auto& [name, kernel] : patterns) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    AMOEBA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < launches; ++i)
      kernel<<<blocks, kThreads, 0, stream>>>(buf[i % buffers], row_bytes, sink);
    AMOEBA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    AMOEBA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    AMOEBA_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    std::vector<float> us;
    for (int b = 0; b < batches; ++b) {
      AMOEBA_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      AMOEBA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      AMOEBA_CUDA_CHECK(cudaEventRecord(ev[1], stream));
      AMOEBA_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float ms;
      AMOEBA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      us.push_back(ms * 1000.0f / launches);
    }
    std::sort(us.begin(), us.end());
    const float med = us[us.size() / 2];
    std::printf("%s{\"pattern\": \"%s\", \"us\": %.3f, \"gbs\": %.1f}", first ? "" : ", ", name, med,
                bytes / (med * 1e-6) / 1e9);
    std::fprintf(stderr, "%-6s blocks=%-5d %8.2f us  %7.1f GB/s\n", name, blocks, med,
                 bytes / (med * 1e-6) / 1e9);
    first = false;
    AMOEBA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    AMOEBA_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  std::printf("]}\n");
  return 0;
}
