// What bounds the quantized TMA kernel's consumer loop (a probe, not a kernel of the library): cycles per
// k-step of its two consumer warpgroups with no loads from global memory, piece by piece. One block per SM
// (384 threads: an idle producer warpgroup and two consumer warpgroups, as gemm_tma_quant_kernel), each
// consumer warpgroup owning two 64-row m-tiles against `kTokens` token rows, so one k-step (64 k) is 16
// multiply instructions of m64 × n × k16 per SM, and each consumer thread turns 4 rows × 16 packed int8
// values into bf16 fragments (moe/grouped_gemm_tma_quant.cuh's PackedRow). Modes:
//   pipe:     the kernel's loop minus its mbarriers: issue half 0, wait for half 1 of the step before,
//             dequantise half 1, issue it, wait for half 0, shared loads of the next step's packed rows and
//             dequantise its half 0 (int8, one fma per value);
//   pipe-raw: the same with the packed words moved into the fragments unconverted (the loop's shape, the
//             shared loads and the wgmma alone);
//   rs:       the 16 wgmma with A from registers per step, committed and waited for per half as in pipe;
//             fragments fixed (no loads, no conversion);
//   rs-deep:  the same, waited for one step behind (wait_group 2 of 4 halves);
//   ss:       as rs with A from shared memory (wgmma's other form);
//   mma:      mma.sync.m16n8k16 instead (the decode tiles' instruction): per warp 32 rows × kTokens tokens ×
//             64 k = 2 × (kTokens / 8) × 4 instructions per step, the token fragments by ldmatrix;
//   mma-dq:   mma plus pipe's shared loads and conversion of the same 64 values per thread;
//   pipe-ahead: pipe with the next step's shared loads issued before this step's second half is dequantised;
//   rs-cvt:   rs plus pipe's shared loads and conversions, whose results feed no wgmma (can the conversion
//             overlap the tensor cores when it is off their operands' path?).
// pipe, pipe-ahead and mma-dq run on int8 and int4 rows (the kernel's conversions: PackedRow).
// The measured kernel at Qwen3 256 tokens (int8 gate/up, 32 tokens) took about 1,240 cycles per k-step
// (docs/results/quantized_h200.md, "One fma per int8 value in the TMA kernel").
//
//   wgmma_probe [--steps 4096] [--reps 5]     (every mode at 32 tokens; the wgmma modes at 128)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "loader/cuda_check.cuh"
#include "moe/addressing.cuh"
#include "moe/grouped_gemm_tma_quant.cuh"

namespace {

using namespace amoeba::kernels;
namespace gw = amoeba::kernels::grouped::wgmma;

enum class Mode { kPipe, kPipeRaw, kRs, kRsDeep, kSs, kMma, kMmaDq, kPipeAhead, kRsCvt };
constexpr const char* kModeNames[] = {"pipe", "pipe-raw", "rs",         "rs-deep", "ss",
                                      "mma",  "mma-dq",   "pipe-ahead", "rs-cvt"};
constexpr int kThreads = 384, kSmem = 96 * 1024;

// D(64×N) += A(64×16, smem) · B(N×16, smem)ᵀ for N = 32 (128: grouped_gemm_sm90.cuh's mma_m64n128k16).
__device__ __forceinline__ void mma_ss32(float (&d)[16], std::uint64_t da, std::uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(1));
#else
  __trap();
#endif
}
template <int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], std::uint64_t da, std::uint64_t db) {
  if constexpr (N == 32)
    mma_ss32(d, da, db);
  else
    gw::mma_m64n128k16(d, da, db);
}

template <Mode kMode, int kTokens, class Prec>
__global__ void __launch_bounds__(kThreads, 1) probe(int steps, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_dyn) + 1023) &
                                                         ~std::uintptr_t{1023});
  unsigned char* tokens = base;              // [kTokens][64] bf16, wgmma's swizzled tile (ldmatrix: any rows)
  unsigned char* packed = base + 16 * 1024;  // 256 packed rows of one k-step (64 bytes int8, 32 int4)
  unsigned char* atile = base + 32 * 1024;   // 64 × 64 bf16 A tile for ss (8 KiB)
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  for (int i = tid; i < 48 * 1024 / 4; i += kThreads)
    reinterpret_cast<std::uint32_t*>(base)[i] = (i * 2654435761u) & 0x3C3C3C3Cu;  // small finite values
  __syncthreads();
  if (wg == 0) {
    tma::release_registers<grouped::kTmaProducerRegs>();
    return;
  }
  tma::claim_registers<grouped::kTmaConsumerRegs>();
  const int cw = wg - 1, warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  constexpr int kAcc = kTokens / 2;
  using Row = grouped::PackedRow<Prec>;
  constexpr int kStep = grouped::kPackedStepBytes<Prec>;
  const typename Row::Scale scale = Row::scale_of(0x3C00);  // 2^-7
  int srow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) srow[mt][h] = 128 * cw + 64 * mt + 16 * warp + g + 8 * h;
  const std::uint32_t pbase = ptx::smem_u32(packed) + q * (kStep / 4), tb = ptx::smem_u32(tokens),
                      ab = ptx::smem_u32(atile);
  float acc[2][kAcc];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[mt][i] = 0.f;
  Row raw[2][2], ahead[2][2];  // ahead: pipe-ahead's second buffer of packed rows
  std::uint32_t frag[2][2][2][4];
  std::uint32_t cvt_sink = 0;  // rs-cvt's conversions, kept off the wgmma's operands
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int d = 0; d < 4; ++d) frag[a][b][c][d] = 0x3C003C00u ^ (lane * 0x00010001u);

  auto read_into = [&](Row(&rows)[2][2]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) rows[mt][h].load(pbase + srow[mt][h] * kStep);
  };
  auto read_step = [&] { read_into(raw); };
  const typename Row::Scale scales[2] = {scale, scale};  // rows g and g + 8
  auto dequant_from = [&](const Row(&rows)[2][2], int half) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int ss = 0; ss < 2; ++ss) Row::fragment(rows[mt], 2 * half + ss, scales, frag[half][mt][ss]);
  };
  auto dequant_half = [&](int half) {
    if constexpr (kMode == Mode::kPipeRaw) {
      static_assert(Row::kInt8, "pipe-raw moves int8 rows' four words");
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int ss = 0; ss < 2; ++ss) {
          // one lop3 per word, so the fragments are registers of their own as the converted ones are
          std::uint32_t(&a)[4] = frag[half][mt][ss];
          a[0] = raw[mt][0].w[2 * half + ss] ^ 0x80808080u, a[2] = raw[mt][0].w[(2 * half + ss + 1) % 4] ^ 1u;
          a[1] = raw[mt][1].w[2 * half + ss] ^ 0x80808080u, a[3] = raw[mt][1].w[(2 * half + ss + 1) % 4] ^ 1u;
        }
    } else {
      dequant_from(raw, half);
    }
  };
  auto issue_half = [&](int half) {
    gw::pin(acc[0]);
    gw::pin(acc[1]);
    gw::fence();
#pragma unroll
    for (int ss = 0; ss < 2; ++ss) {
      const std::uint64_t desc = gw::descriptor(tb + (2 * half + ss) * 32);
      if constexpr (kMode == Mode::kSs) {
        mma_ss<kTokens>(acc[0], gw::descriptor(ab + (2 * half + ss) * 32), desc);
        mma_ss<kTokens>(acc[1], gw::descriptor(ab + (2 * half + ss) * 32), desc);
      } else {
        gw::mma_rs<kTokens>(acc[0], frag[half][0][ss], desc);
        gw::mma_rs<kTokens>(acc[1], frag[half][1][ss], desc);
      }
    }
    gw::commit();
  };
  auto pin_frags = [&](int half) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) gw::pin(frag[half][mt][0]), gw::pin(frag[half][mt][1]);
  };

  // rs's step after its first half is issued (fixed fragments): wait for the step before, issue the second.
  auto second_half = [&] {
    gw::wait<1>();
    pin_frags(1);
    issue_half(1);
    gw::wait<1>();
    pin_frags(0);
  };

  const long long start = clock64();
  if constexpr (kMode == Mode::kPipe || kMode == Mode::kPipeRaw) {
    read_step();
    dequant_half(0);
    for (int kt = 0; kt < steps; ++kt) {
      issue_half(0);
      gw::wait<1>();
      pin_frags(1);
      dequant_half(1);
      issue_half(1);
      gw::wait<1>();
      pin_frags(0);
      read_step();
      dequant_half(0);
    }
    gw::wait<0>();
  } else if constexpr (kMode == Mode::kPipeAhead) {
    // pipe with the next step's shared loads issued before this step's second half is dequantised
    read_into(raw);
    dequant_from(raw, 0);
    auto body = [&](Row(&cur)[2][2], Row(&nxt)[2][2]) {
      issue_half(0);
      gw::wait<1>();
      pin_frags(1);
      read_into(nxt);
      dequant_from(cur, 1);
      issue_half(1);
      gw::wait<1>();
      pin_frags(0);
      dequant_from(nxt, 0);
    };
    for (int kt = 0; kt < steps; kt += 2) {
      body(raw, ahead);
      body(ahead, raw);
    }
    gw::wait<0>();
  } else if constexpr (kMode == Mode::kRsCvt) {
    // rs plus pipe's shared loads and conversions, whose results feed no wgmma
    for (int kt = 0; kt < steps; ++kt) {
      read_step();
      issue_half(0);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          std::uint32_t lo, hi, lo2, hi2;
          raw[mt][0].pairs(s4, scale, lo, hi);
          raw[mt][1].pairs(s4, scale, lo2, hi2);
          cvt_sink ^= lo ^ hi ^ lo2 ^ hi2;
        }
      second_half();
    }
    gw::wait<0>();
  } else if constexpr (kMode == Mode::kRs || kMode == Mode::kSs) {
    for (int kt = 0; kt < steps; ++kt) {
      issue_half(0);
      second_half();
    }
    gw::wait<0>();
  } else if constexpr (kMode == Mode::kRsDeep) {
    for (int kt = 0; kt < steps; ++kt) {
      issue_half(0);
      issue_half(1);
      gw::wait<2>();
      pin_frags(0);
      pin_frags(1);
    }
    gw::wait<0>();
  } else {  // mma.sync: this warp's 2 × 16 rows (the wgmma fragments' rows) × kTokens tokens
    float d[2][kTokens / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTokens / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) d[mt][nt][i] = 0.f;
    // ldmatrix.x4 of 4 8×8 tiles: tokens 8·nt..8·nt + 7 at k 16·ss + {0, 8} and the next ss.
    const std::uint32_t lrow = tb + (lane % 8) * 144 + (lane / 8) * 16;
    for (int kt = 0; kt < steps; ++kt) {
      if constexpr (kMode == Mode::kMmaDq) {
        read_step();
        dequant_half(0);
        dequant_half(1);
      }
#pragma unroll
      for (int nt = 0; nt < kTokens / 8; ++nt) {
#pragma unroll
        for (int sp = 0; sp < 2; ++sp) {
          std::uint32_t b[4];
          ptx::ldmatrix_x4(b, lrow + nt * 8 * 144 + sp * 64);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const std::uint32_t(&a0)[4] = frag[sp][mt][0];
            const std::uint32_t(&a1)[4] = frag[sp][mt][1];
            ptx::mma_bf16_16816(d[mt][nt], a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
            ptx::mma_bf16_16816(d[mt][nt], a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
          }
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTokens / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][(4 * nt + i) % kAcc] += d[mt][nt][i];
  }
  const long long stop = clock64();
  float s = 0.f;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) s += acc[mt][i];
  if (s == 1234.5f || cvt_sink == 0x12345u) sink[blockIdx.x] = s;
  if (t == 0) cycles[2 * blockIdx.x + cw] = stop - start;
}

struct Result {
  double cycles_per_step, ns_per_step;
};

template <Mode kMode, int kTokens, class Prec = Int8>
Result run(int sms, int steps, int reps, long long* d_cycles, float* d_sink) {
  auto kernel = &probe<kMode, kTokens, Prec>;
  AMOEBA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaEvent_t a, b;
  AMOEBA_CUDA_CHECK(cudaEventCreate(&a));
  AMOEBA_CUDA_CHECK(cudaEventCreate(&b));
  kernel<<<sms, kThreads, kSmem>>>(steps / 8, d_cycles, d_sink);  // warm-up
  AMOEBA_CUDA_CHECK(cudaGetLastError());
  std::vector<double> cyc, ns;
  std::vector<long long> h(2 * static_cast<std::size_t>(sms));
  for (int r = 0; r < reps; ++r) {
    AMOEBA_CUDA_CHECK(cudaEventRecord(a));
    kernel<<<sms, kThreads, kSmem>>>(steps, d_cycles, d_sink);
    AMOEBA_CUDA_CHECK(cudaEventRecord(b));
    AMOEBA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    AMOEBA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    AMOEBA_CUDA_CHECK(cudaMemcpy(h.data(), d_cycles, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    cyc.push_back(static_cast<double>(*std::max_element(h.begin(), h.end())) / steps);
    ns.push_back(1e6 * ms / steps);
  }
  std::sort(cyc.begin(), cyc.end());
  std::sort(ns.begin(), ns.end());
  AMOEBA_CUDA_CHECK(cudaEventDestroy(a));
  AMOEBA_CUDA_CHECK(cudaEventDestroy(b));
  return {cyc[cyc.size() / 2], ns[ns.size() / 2]};
}

struct Row {
  Mode mode;
  const char* precision;
  Result r;
};

template <int kTokens>
void run_all(int sms, int steps, int reps, long long* dc, float* ds) {
  std::vector<Row> r = {
      {Mode::kPipe, "int8", run<Mode::kPipe, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kPipe, "int4", run<Mode::kPipe, kTokens, Int4>(sms, steps, reps, dc, ds)},
      {Mode::kPipeRaw, "int8", run<Mode::kPipeRaw, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kRs, "-", run<Mode::kRs, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kRsDeep, "-", run<Mode::kRsDeep, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kSs, "-", run<Mode::kSs, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kPipeAhead, "int8", run<Mode::kPipeAhead, kTokens>(sms, steps, reps, dc, ds)},
      {Mode::kPipeAhead, "int4", run<Mode::kPipeAhead, kTokens, Int4>(sms, steps, reps, dc, ds)},
      {Mode::kRsCvt, "int8", run<Mode::kRsCvt, kTokens>(sms, steps, reps, dc, ds)}};
  if constexpr (kTokens == 32) {  // mma.sync at 128 tokens would hold 128 more accumulators per thread
    r.push_back({Mode::kMma, "-", run<Mode::kMma, kTokens>(sms, steps, reps, dc, ds)});
    r.push_back({Mode::kMmaDq, "int8", run<Mode::kMmaDq, kTokens>(sms, steps, reps, dc, ds)});
    r.push_back({Mode::kMmaDq, "int4", run<Mode::kMmaDq, kTokens, Int4>(sms, steps, reps, dc, ds)});
  }
  // Multiply-adds per k-step and SM: 2 warpgroups × 2 m-tiles × 64 rows × kTokens × 64 k.
  const double macs = 2.0 * 2 * 64 * kTokens * 64;
  for (const Row& x : r)
    std::printf("| %d | %s | %s | %.0f | %.1f | %.0f |\n", kTokens, kModeNames[static_cast<int>(x.mode)],
                x.precision, x.r.cycles_per_step, x.r.ns_per_step, macs / x.r.cycles_per_step);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4096, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "wgmma_probe: unknown flag %s (flags: --steps N, --reps N)\n", argv[i]);
      return 2;
    }
  }
  if (steps < 8 || steps % 2 != 0 || reps < 1) {
    std::fprintf(stderr, "wgmma_probe: --steps must be even and >= 8, --reps >= 1 (got %d, %d)\n", steps,
                 reps);
    return 2;
  }
  int dev = 0, sms = 0;
  AMOEBA_CUDA_CHECK(cudaGetDevice(&dev));
  AMOEBA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  long long* dc = nullptr;
  float* ds = nullptr;
  AMOEBA_CUDA_CHECK(cudaMalloc(&dc, 2 * sms * sizeof(long long)));
  AMOEBA_CUDA_CHECK(cudaMalloc(&ds, sms * sizeof(float)));
  std::printf("%d blocks of %d threads, %d k-steps, median of %d launches\n", sms, kThreads, steps, reps);
  std::printf(
      "| tokens | mode | weights | cycles per k-step and SM (slowest warpgroup) | ns per k-step | "
      "multiply-adds per cycle and SM |\n|---:|---|---|---:|---:|---:|\n");
  run_all<32>(sms, steps, reps, dc, ds);
  run_all<128>(sms, steps, reps, dc, ds);
  AMOEBA_CUDA_CHECK(cudaFree(dc));
  AMOEBA_CUDA_CHECK(cudaFree(ds));
  return 0;
}
