// Decode split over the intermediate size (MoeConfig::decode_splitk): the layer in two launches and no
// routing, for one or a few tokens, where the four-kernel decode (routing, gate/up, down, combine) spends
// several µs of its ~28 µs at one token on the chain of kernels rather than on its weight stream
// (docs/results/quantized_h200.md, "The layer's chain of kernels at 1–3 tokens"). One kernel template for
// every expert precision (moe/precision.cuh): bf16, int8 and int4 experts differ only in how a 16-byte load
// becomes products (Geometry below).
//
//  1. splitk::kernel: a cluster of kCluster (4) blocks per (token t, slot j, kFeatures features
//     [f0, f0 + kFeatures) of F): 64 or 128, the first of the configuration's forms that fits the call
//     (DefaultMoeConfig::splitk_shapes: bf16 and int4 128 in warp pairs where the call has 32 such clusters
//     or more, else 64; int8 64 in pairs, else 128). Block r of the cluster
//       - asks the L2 for W2's columns [f0, f0 + kFeatures) of its H / 4 rows before anything else, so that
//         they stream with W1 and W3;
//       - computes SiLU(gate)·up of its kFeatures / 4 features (each of its 4 feature warps: 4 features' W1
//         and W3 rows at a time over all of H, or, where the form pairs its warps, each warp of a
//         pair over its half of H, the second half's sums then added to the first's through shared memory;
//         16-byte loads, fp32 sums, a fixed shuffle reduction; rounded to bf16 as the decode kernels store
//         `act`) and writes them into every block of the cluster (distributed shared memory);
//       - after the cluster barrier, multiplies its W2 rows (shared by all its warps) by the kFeatures
//         values and writes the fp32 partial sums of its rows to partials[t][j][f0 / kFeatures][·].
//     So no block waits for any block outside its cluster. Copying the W2 columns into shared memory
//     instead (64 KB per block at H = 2048) left room for 92 clusters on an H100, fewer than Qwen3's 96 at
//     one token, and asking the L2 for the W1 / W3 rows at once (bulk prefetch) was slower on every shape
//     (docs/results/paged_moe_h200.md, "Split-K decode at one token").
//     Quantized experts: each 16-byte load's integers become exact floats (int8 through 2^23 + q, int4
//     through dequant::int4x8's bf16 pairs), are multiplied by the bf16 tokens in fp32, and the load's sum is
//     scaled by its group's scale (Σ_groups scale·Σ q·x, as the quantized decode GEMV; activations stay
//     bf16). On mma.sync instead (SplitkShape::mma; int4's default, 8 features per warp): lane (g, q) reads
//     16 bytes of feature g's W1 and W3 rows at q·kValuesPerLoad of each quantized k-step (4 lanes a row,
//     one scale group a step), dequantises them straight into the A fragment's rows g and g + 8 (exact bf16
//     integers, moe/precision.cuh's chunk), and the token's values at the same offsets are B, so that every
//     column of D holds the token's sums; each step's D is scaled by its rows' group scales. Where a lane's
//     load holds a quarter of a W2 row slice (int4 on 128 features) the down step does the same on 16 W2
//     rows at a time with the cluster's activations as B. Its products are exact in fp32 as the fmas', but
//     summed in the tensor cores' order. int4 issues about 0.58x the instructions this way (Qwen3-30B-A3B:
//     0.885x the scalar form's layer time on an H100; docs/results/quantized_h200.md, "int4's split-K on
//     mma.sync"); int8, whose bytes become bf16 through floats, does not gain.
//  2. splitk::combine_kernel: for each token and column, each slot's y = bf16(the sum of its F / kFeatures
//     partials, in order), then out = bf16(Σ_j w_j·y_j) in slot order, skipping slots routed outside
//     [0, E): the rounding steps of the four-kernel layer (y stored in bf16, then combine_kernel's sum).
//
// The F sum runs in another order than the decode GEMV's, so the outputs are not bit-identical to the
// four-kernel layer's (both within bf16 rounding of the references); Paged and Contiguous run the same
// instructions here too and agree bit for bit. A slot's expert is read straight from topk_ids, so an expert
// that two tokens (or two slots) name is read once per slot: the path suits one token, where the top-k
// experts are distinct.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "moe/moe_config.hpp"
#include "moe/moe_params.cuh"
#include "moe/precision.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::splitk {

inline constexpr int kCluster = 4;       // blocks per cluster
inline constexpr int kFeatureWarps = 4;  // warps of a block holding distinct features
inline constexpr int kFeatureGroup = 4;  // features whose W1 / W3 rows a warp reads at once
inline constexpr int kUnroll = 2;        // steps of each W1 / W3 row's loads in flight per lane (4: 1.01x)
inline constexpr int kRowBatch = 8;      // W2 rows a lane loads before it reduces them
inline constexpr int kCombineColumns = 128;  // columns of H per combine block (32 threads × 4)
inline constexpr int kMaxSlots = 32;         // slots per token at most (the combine block: 32 per slot)

// Bits per stored weight.
template <class P>
constexpr int bits_of() {
  if constexpr (P::kQuantized)
    return static_cast<int>(quant::bit_count(P::kBits));
  else
    return 16;
}

// DefaultMoeConfig's forms for a precision, in order (DefaultMoeConfig::splitk_shapes has them and their
// measurements; a configuration may name others: PagedMoe::kSplitkShapes).
template <class P>
constexpr SplitkShapes shape_choices() {
  return DefaultMoeConfig::splitk_shapes(bits_of<P>());
}

// What the precision and the kernel's form decide: values per 16-byte load, lanes per W2 row slice, warps,
// registers. The defaults: the precision's first form on fmas (a form on mma.sync is asked for by name,
// SplitkShape::mma, as PagedMoe's kSplitkKernel does).
template <class P, int kFeaturesT = shape_choices<P>()[0].features,
          int kHSplitT = shape_choices<P>()[0].h_split, int kStepsT = shape_choices<P>()[0].steps,
          bool kMmaT = false>
struct Geometry {
  static constexpr int kBits = bits_of<P>();
  static constexpr int kValuesPerLoad = 128 / kBits;  // 8 bf16, 16 int8, 32 int4
  static constexpr int kStep = 32 * kValuesPerLoad;   // values of H a warp reads per row per load
  static constexpr int kFeatures = kFeaturesT;
  static constexpr int kRowLanes =
      kFeatures * kBits / 128;                         // lanes per W2 row slice: 8 bf16, 4 / 8 int8, 2 int4
  static constexpr int kRowsPerStep = 32 / kRowLanes;  // W2 rows a warp reads per load
  static constexpr int kWarpFeatures = kFeatures / (kCluster * kFeatureWarps);  // 4, 8 (int8 on 128)
  static constexpr int kHSplit = kHSplitT;  // warps per feature group, each over its share of H
  static constexpr int kSteps = kStepsT;    // the form's SplitkShape::steps (0: kStepsInFlight's rule)
  static constexpr int kWarps = kFeatureWarps * kHSplit;
  static constexpr int kThreads = 32 * kWarps;
  // W1 / W3 steps of loads in flight per lane (the form's, SplitkShape::steps, else fewer with warp pairs,
  // whose registers hold two warps per feature group).
  static constexpr int kStepsInFlight = kStepsT != 0 ? kStepsT : kHSplit > 1 ? 1 : kUnroll;
  // Static shared memory: the cluster's bf16 activations, and with warp pairs the second warps' fp32 sums
  // (the dynamic part's attribute must leave room for it: PagedMoe::splitk_smem).
  static constexpr int kPairSumFloats = kHSplit > 1 ? kFeatureWarps * 2 * kWarpFeatures : 0;
  static constexpr int kStaticSmemBytes = 2 * kFeatures + 4 * kPairSumFloats;
  static constexpr int kW2Batch = kHSplit > 1 ? 4 : kRowBatch;
  // Blocks per SM the registers must leave room for (ptxas -v, no spills): 4-warp blocks: int8 on 128
  // features at 3 (167 registers; int4 on 128 took 254 unbounded), the 64-feature quantized kernels at 4
  // (capped at 128: their clusters are as many as bf16's), bf16 unbounded (110 registers, 4 blocks); warp
  // pairs: 64 features at 3 (int8 80 registers, bf16 76; int4 spills 40 bytes there), 128 at 3 for bf16 with
  // one step in flight (74 registers, 105 at 2: room for the 88 clusters of Qwen1.5-MoE with its shared
  // chunks, which then takes 0.85x the decode tiles' time on an H100: docs/results/paged_moe_h200.md,
  // "Three blocks per SM"), else at 2 (at 3 int8 and int4 spill 136 / 228 bytes; int8 and int4 128
  // registers; bf16 with two steps 127).
  static constexpr int kMinBlocks = [] {
    if (kHSplit > 1) return kFeatures == 64 || (kBits == 16 && kStepsInFlight == 1) ? 3 : 2;
    if (kBits == 16) return 1;
    return kFeatures == 64 ? 4 : 3;
  }();
  static_assert(kWarpFeatures % kFeatureGroup == 0 && kRowLanes >= 1 && 32 % kRowLanes == 0);
  static_assert(kHSplit == 1 || kHSplit == 2, "one warp or a warp pair per feature group");
  static_assert(kStepsInFlight >= 1 && kStepsInFlight <= 4, "1 to 4 steps of W1 / W3 loads in flight");
  static_assert(!P::kQuantized || kFeatures <= static_cast<int>(quant::kGroup),
                "a cluster's W2 row slice must lie inside one scale group");
  // gate/up on mma.sync (SplitkShape::mma): lane (g, q) reads W1 and W3 rows of feature g, 16 bytes at
  // q·kValuesPerLoad of each step of kMmaStep values (one quantized k-step, inside one scale group).
  static constexpr bool kMma = kMmaT;
  static constexpr int kMmaStep = 4 * kValuesPerLoad;
  // The down step on mma.sync too where one 16-byte load per lane holds a quarter of a W2 row slice (int4 on
  // 128 features): lane (g, q) reads rows g and g + 8 of each 16 rows of its warp's.
  static constexpr bool kMmaDown = kMma && kFeatures == 4 * kValuesPerLoad;
  static_assert(!kMma || (P::kQuantized && kWarpFeatures == 8),
                "the mma form: quantized experts, 8 features per warp (the A fragment's rows g and g + 8)");
};
// bf16's 256-value step is a rule (H a multiple of it: PagedMoe::can_implement); quantized experts run a
// last partial step instead.
inline constexpr int kStep = Geometry<Bf16>::kStep;

// Dynamic shared memory of a block: the token's input row (2H bytes), then its W2 rows' fp32 sums.
constexpr long long smem_bytes(int hidden) {
  return 2LL * hidden + 4LL * (hidden / kCluster);
}
// The smallest H a form serves: each warp's share of its block's H / 4 rows of W2 must hold one warp step of
// rows (kRowsPerStep), else its first rows, clamped to the warp's last ones, fall before the block's (out of
// the matrix in block 0) and its lanes part around the W2 loop's shuffles. 4 warps: 64 for bf16 and int8 on
// 128 features, 128 for int8 on 64, 256 for int4 on 64; warp pairs: 64 for bf16 on 128, 128 for int8 on 128,
// 256 for int8 on 64 and int4 on 128.
template <class G>  // a Geometry
constexpr int min_hidden() {
  return kCluster * G::kWarps * G::kRowsPerStep;
}

// The partial sums' workspace: [T][k + m][F / features][H] fp32.
constexpr long long partial_floats(long long tokens, int slots, int intermediate, int hidden, int features) {
  return tokens * slots * (intermediate / features) * hidden;
}

template <class Addressing>
struct Params {
  MoeParams<Addressing> moe;
  float* partials;  // [T][k + m][F / features per cluster][H]
};

// acc + Σ_i w_i·x_i over 8 bf16 pairs, in order.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const std::uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ws[c]));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[c]));
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// The bf16 pair of a 32-bit word as two floats (exact).
__device__ __forceinline__ float bf16_lo(std::uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(std::uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

// Σ_i q_i·x_i over one 16-byte load of packed values (16 int8 or 32 int4, in order), x as floats.
template <quant::Bits kBits>
__device__ __forceinline__ float dot_packed(const uint4& w, const float* x) {
  const std::uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if constexpr (kBits == quant::Bits::kInt8) {    // word c: values 4c .. 4c + 3
      const std::uint32_t u = ws[c] ^ 0x80808080u;  // two's complement -> q + 128
#pragma unroll
      for (int b = 0; b < 4; ++b)
        acc = fmaf(dequant::magic_byte(u, b) - (dequant::kMagic + 128.0f), x[4 * c + b], acc);
    } else {  // word c: values 8c .. 8c + 7, as bf16 pairs
      std::uint32_t pairs[4];
      dequant::int4x8(ws[c], pairs);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc = fmaf(bf16_lo(pairs[q]), x[8 * c + 2 * q], acc);
        acc = fmaf(bf16_hi(pairs[q]), x[8 * c + 2 * q + 1], acc);
      }
    }
  }
  return acc;
}

// D += chunk c (8 values) of two rows' 16-byte quantized loads, dequantised into the A fragment's rows g and
// g + 8, times the 8 bf16 values of B at the same offsets: the two m16n8k16 products of the fragment trick
// (k = 2q, 2q + 1 and 2q + 8, 2q + 9 of each are the lane's values 0-1 and 2-3, then 4-5 and 6-7).
template <quant::Bits kBits>
__device__ __forceinline__ void mma_chunk(float (&d)[4], const uint4& row_g, const uint4& row_g8, int c,
                                          const uint4& b) {
  const uint4 a = dequant::chunk<kBits>(row_g, c), u = dequant::chunk<kBits>(row_g8, c);
  ptx::mma_bf16_16816(d, a.x, u.x, a.y, u.y, b.x, b.y);
  ptx::mma_bf16_16816(d, a.z, u.z, a.w, u.w, b.z, b.w);
}

// n bf16 values from shared memory as floats.
template <int n>
__device__ __forceinline__ void shared_floats(const bf16* src, float (&out)[n]) {
#pragma unroll
  for (int i = 0; i < n / 8; ++i) {
    const uint4 v = ptx::ld_shared_16(ptx::smem_u32(src + 8 * i));
    const std::uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      out[8 * i + 2 * c] = bf16_lo(ws[c]);
      out[8 * i + 2 * c + 1] = bf16_hi(ws[c]);
    }
  }
}

// The bf16 scale at `p` as a float.
__device__ __forceinline__ float load_scale(const bf16* p) {
  return __uint_as_float(static_cast<std::uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

// One expert matrix as the kernel reads it: rows of `row_bytes` bytes from `rows`, and (quantized) the bf16
// scales [N][groups] from `scales`.
struct PackedMatrix {
  const unsigned char* rows;
  std::int64_t row_bytes;
  const bf16* scales;
  int groups;
};

template <class P>
__device__ __forceinline__ PackedMatrix packed_matrix(const bf16* base, long long n, long long k) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(base);
  if constexpr (P::kQuantized) {
    const quant::MatrixLayout L{static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(k), P::kBits};
    return {bytes, static_cast<std::int64_t>(L.row_bytes()),
            reinterpret_cast<const bf16*>(bytes + L.scale_offset()), static_cast<int>(L.groups_per_row())};
  } else {
    return {bytes, 2 * static_cast<std::int64_t>(k), nullptr, 0};
  }
}

template <class Addressing, class P = Bf16, int kFeaturesT = Geometry<P>::kFeatures,
          int kHSplitT = Geometry<P>::kHSplit, int kStepsT = Geometry<P>::kSteps, bool kMmaT = false>
__global__ void __launch_bounds__(Geometry<P, kFeaturesT, kHSplitT, kStepsT, kMmaT>::kThreads,
                                  Geometry<P, kFeaturesT, kHSplitT, kStepsT, kMmaT>::kMinBlocks)
    kernel(const __grid_constant__ Params<Addressing> sp) {
  using G = Geometry<P, kFeaturesT, kHSplitT, kStepsT, kMmaT>;
  constexpr int kBlockFeatures = G::kFeatures / kCluster;
  constexpr int kVpl = G::kValuesPerLoad;
  constexpr int kWarps = G::kWarps, kThreads = G::kThreads;
  namespace cg = cooperative_groups;
  const MoeParams<Addressing>& p = sp.moe;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) bf16 h[G::kFeatures];
  const int H = p.hidden, F = p.intermediate;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int chunk = blockIdx.x / kCluster, j = blockIdx.y, t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = H / kCluster, row0 = rank * rows, f0 = chunk * G::kFeatures;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  float* sums = reinterpret_cast<float*>(smem + 2 * H);

  ptx::cluster_arrive_relaxed();  // this block runs (the others wait for it before writing into it)
  ptx::grid_dependency_wait();    // topk_ids, topk_weights and the input: the previous kernels' output
  ptx::launch_dependents();       // the combine's blocks may take their SMs and wait
  const int e = slot_expert_of(p, j, slot_id(p, t, j));
  if (e < 0) return;  // a slot routed outside [0, E): the whole cluster (one slot) leaves, combine skips it
  const PackedMatrix w1 = packed_matrix<P>(Addressing::matrix_base(p.addr, e, 0), F, H);
  const PackedMatrix w3 = packed_matrix<P>(Addressing::matrix_base(p.addr, e, 1), F, H);
  const PackedMatrix w2m = packed_matrix<P>(Addressing::matrix_base(p.addr, e, 2), H, F);
  const unsigned char* w2 = w2m.rows + row0 * w2m.row_bytes + f0 * G::kBits / 8;

  // W2's columns of the block's rows (one line or half of one per row) asked of the L2 before the W1 / W3
  // loads, so that they stream with them; the down step below reads them from the L2.
  for (int r = threadIdx.x; r < rows; r += kThreads) ptx::prefetch_l2(w2 + r * w2m.row_bytes);
  const bf16* x = p.input + static_cast<std::int64_t>(t) * H;
  for (int i = threadIdx.x; i < H / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = ptx::ld_cached_16(x + i * 8);
  __syncthreads();

  // Gate/up: the warp's features' W1 and W3 rows, kFeatureGroup at a time, lane l reading values
  // [s + kVpl·l, +kVpl) of each step s of kStep values, kU steps of loads in flight (kUnroll, then 1 for the
  // rest; quantized experts' last step may be partial: its lanes past H load nothing).
  // (Warp pairs: warp w and w + kFeatureWarps share feature warp w's features, each over its part of H's
  // steps.)
  const int fwarp = G::kHSplit == 1 ? warp : warp % kFeatureWarps;
  const int part = G::kHSplit == 1 ? 0 : warp / kFeatureWarps;
  const int fw = f0 + rank * kBlockFeatures + fwarp * G::kWarpFeatures;
  const int part_steps = ((H + G::kStep - 1) / G::kStep + G::kHSplit - 1) / G::kHSplit;
  const int s_begin = G::kHSplit == 1 ? 0 : min(H, part * part_steps * G::kStep);
  const int s_end = G::kHSplit == 1 ? H : min(H, (part + 1) * part_steps * G::kStep);
  float acc[2][G::kWarpFeatures] = {};
  const int mg = lane / 4, mq = lane % 4;  // the mma form's fragment row (g) and column pair (q)
  if constexpr (G::kMma) {
    // Lane (g, q): W1 and W3 rows of feature fw + g as the A fragment's rows g and g + 8, 16 bytes at
    // q·kVpl of each step, dequantised straight into bf16 pairs; the token's values at the same offsets as B
    // (every column the same token, so every row of D holds the same sums); each step's D scaled by its
    // rows' group scales. Then acc[m][i] = feature i's sums, from lane 4i.
    constexpr int kMS = G::kMmaStep, kBatch = 8;
    const int n_steps = H / kMS, ps = (n_steps + G::kHSplit - 1) / G::kHSplit;
    const int st_end = G::kHSplit == 1 ? n_steps : min(n_steps, (part + 1) * ps);
    const unsigned char* rw[2] = {w1.rows + (fw + mg) * w1.row_bytes + mq * 16,
                                  w3.rows + (fw + mg) * w3.row_bytes + mq * 16};
    const bf16* rs[2] = {w1.scales + (fw + mg) * w1.groups, w3.scales + (fw + mg) * w3.groups};
    float mine[2] = {0.f, 0.f};
    auto steps = [&]<int kB>(int st) {
      uint4 wv[kB][2];
      float sc[kB][2];
#pragma unroll
      for (int b = 0; b < kB; ++b)
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          wv[b][m] = ptx::ld_stream_16(rw[m] + static_cast<std::int64_t>(st + b) * (kMS * G::kBits / 8));
          sc[b][m] = load_scale(rs[m] + (st + b) * kMS / static_cast<int>(quant::kGroup));
        }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        const bf16* xk = xs + (st + b) * kMS + mq * kVpl;
#pragma unroll
        for (int c = 0; c < kVpl / 8; ++c)
          mma_chunk<P::kBits>(d, wv[b][0], wv[b][1], c, ptx::ld_shared_16(ptx::smem_u32(xk + 8 * c)));
        mine[0] = fmaf(sc[b][0], d[0], mine[0]);  // D[g][2q]: W1's row
        mine[1] = fmaf(sc[b][1], d[2], mine[1]);  // D[g + 8][2q]: W3's row
      }
    };
    int st = G::kHSplit == 1 ? 0 : min(n_steps, part * ps);
    for (; st + kBatch <= st_end; st += kBatch) steps.template operator()<kBatch>(st);
    for (; st < st_end; ++st) steps.template operator()<1>(st);
#pragma unroll
    for (int i = 0; i < G::kWarpFeatures; ++i) {
      acc[0][i] = __shfl_sync(0xffffffffu, mine[0], 4 * i);
      acc[1][i] = __shfl_sync(0xffffffffu, mine[1], 4 * i);
    }
  } else {
#pragma unroll
    for (int fg = 0; fg < G::kWarpFeatures; fg += kFeatureGroup) {
      const unsigned char* w13[2] = {w1.rows + (fw + fg) * w1.row_bytes + lane * 16,
                                     w3.rows + (fw + fg) * w3.row_bytes + lane * 16};
      auto steps = [&]<int kU, bool kTail>(int s) {
        uint4 wv[kU][2][kFeatureGroup];
        [[maybe_unused]] float sc[kU][2][kFeatureGroup];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int k = s + u * G::kStep + lane * kVpl;
          if (kTail && k >= H) continue;
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int i = 0; i < kFeatureGroup; ++i) {
              wv[u][m][i] = ptx::ld_stream_16(w13[m] + i * w1.row_bytes + (s + u * G::kStep) * G::kBits / 8);
              if constexpr (P::kQuantized) {
                const PackedMatrix& w = m == 0 ? w1 : w3;
                sc[u][m][i] = load_scale(w.scales + (fw + fg + i) * w.groups + k / quant::kGroup);
              }
            }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int k = s + u * G::kStep + lane * kVpl;
          if (kTail && k >= H) continue;
          if constexpr (P::kQuantized) {
            float xf[kVpl];
            shared_floats(xs + k, xf);
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
              for (int i = 0; i < kFeatureGroup; ++i)
                acc[m][fg + i] = fmaf(sc[u][m][i], dot_packed<P::kBits>(wv[u][m][i], xf), acc[m][fg + i]);
          } else {
            const uint4 xv = ptx::ld_shared_16(ptx::smem_u32(xs + k));
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
              for (int i = 0; i < kFeatureGroup; ++i) acc[m][fg + i] = dot8(wv[u][m][i], xv, acc[m][fg + i]);
          }
        }
      };
      constexpr int kU = G::kStepsInFlight;
      int s = s_begin;
      if constexpr (kU > 1)
        for (; s + kU * G::kStep <= s_end; s += kU * G::kStep) steps.template operator()<kU, false>(s);
      for (; s + G::kStep <= s_end; s += G::kStep) steps.template operator()<1, false>(s);
      if (s < s_end)
        steps.template operator()<1, true>(s);  // quantized only (bf16: H % 256 == 0, can_implement)
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < G::kWarpFeatures; ++i)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[m][i] += __shfl_xor_sync(0xffffffffu, acc[m][i], o);
  }
  if constexpr (G::kHSplit > 1) {  // warp pairs: the second part's sums added to the first's
    __shared__ float half_sums[kFeatureWarps][2][G::kWarpFeatures];
    static_assert(sizeof(half_sums) == 4 * G::kPairSumFloats, "Geometry::kStaticSmemBytes counts these sums");
    if (part == 1 && lane == 0)
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < G::kWarpFeatures; ++i) half_sums[fwarp][m][i] = acc[m][i];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < G::kWarpFeatures; ++i) acc[m][i] += half_sums[fwarp][m][i];
  }

  // Down: row r of the block's W2 columns · the kFeatures activations, kRowLanes lanes per row (lane l:
  // values [kVpl·(l % kRowLanes), +kVpl)), kRowsPerStep rows per warp step, G::kW2Batch steps of loads in
  // flight and the next batch loaded before the current one is reduced; the first batch is loaded before
  // the activations are exchanged. Rows past the warp's end are clamped to its last rows (loaded, not
  // stored).
  constexpr int kR = G::kRowsPerStep;
  const int end = (warp + 1) * (rows / kWarps);
  const int sub = lane % G::kRowLanes;
  int r0 = warp * (rows / kWarps) + lane / G::kRowLanes;
  // Row r's scale (quantized experts: the cluster's features lie in one scale group of W2's rows).
  auto w2_scale = [&](int r) {
    return load_scale(w2m.scales + (row0 + r) * w2m.groups + f0 / static_cast<int>(quant::kGroup));
  };
  uint4 next[G::kW2Batch];
  float next_scale[G::kW2Batch];
  auto load_batch = [&](int first) {
#pragma unroll
    for (int i = 0; i < G::kW2Batch; ++i) {
      const int r = min(first + kR * i, end - kR + lane / G::kRowLanes);
      next[i] = ptx::ld_stream_16(w2 + r * w2m.row_bytes + sub * 16);
      if constexpr (P::kQuantized) next_scale[i] = w2_scale(r);
    }
  };
  // The mma down step: 16 rows of W2 per group (rows past the warp's end clamped to its last, loaded, not
  // stored), kMmaGroups groups of loads in flight, the first before the activations are exchanged.
  constexpr int kMmaGroups = 4;
  // The warp's rows [wr0, wend): the same rows as the scalar step's [first r0, end), written apart because
  // one expression for both changes the measured kernels' SASS (benchmarks/device/splitk_sass_same.py
  // --all-forms).
  const int wr0 = warp * (rows / kWarps), wend = wr0 + rows / kWarps;
  [[maybe_unused]] uint4 mw[kMmaGroups][2];
  [[maybe_unused]] float msc[kMmaGroups][2];
  auto mma_load = [&](int rg) {
#pragma unroll
    for (int b = 0; b < kMmaGroups; ++b)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int r = min(rg + 16 * b + 8 * m + mg, wend - 1);
        mw[b][m] = ptx::ld_stream_16(w2 + r * w2m.row_bytes + mq * 16);
        msc[b][m] = w2_scale(r);
      }
  };
  if constexpr (G::kMmaDown)
    mma_load(wr0);
  else
    load_batch(r0);

  // Lane i < kWarpFeatures hands feature i's activation to every block of the cluster.
  ptx::cluster_wait();  // every block of the cluster has started
  if (part == 0 && lane < G::kWarpFeatures) {
    float g = acc[0][0], u = acc[1][0];
#pragma unroll
    for (int i = 1; i < G::kWarpFeatures; ++i)
      if (lane == i) g = acc[0][i], u = acc[1][i];
    const bf16 v = __float2bfloat16_rn(silu(g) * u);
    const int idx = rank * kBlockFeatures + fwarp * G::kWarpFeatures + lane;
#pragma unroll
    for (int q = 0; q < kCluster; ++q) cluster.map_shared_rank(h, q)[idx] = v;
  }
  cluster.sync();  // every block's activations written (release / acquire at cluster scope)

  if constexpr (G::kMmaDown) {
    // B: the cluster's activations at lane q's quarter, the same for every row group.
    uint4 hb[kVpl / 8];
#pragma unroll
    for (int c = 0; c < kVpl / 8; ++c) hb[c] = ptx::ld_shared_16(ptx::smem_u32(h + mq * kVpl + 8 * c));
    for (int rg = wr0; rg < wend; rg += 16 * kMmaGroups) {
      uint4 cw[kMmaGroups][2];
      float cs[kMmaGroups][2];
#pragma unroll
      for (int b = 0; b < kMmaGroups; ++b)
#pragma unroll
        for (int m = 0; m < 2; ++m) cw[b][m] = mw[b][m], cs[b][m] = msc[b][m];
      if (rg + 16 * kMmaGroups < wend) mma_load(rg + 16 * kMmaGroups);
#pragma unroll
      for (int b = 0; b < kMmaGroups; ++b) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c = 0; c < kVpl / 8; ++c) mma_chunk<P::kBits>(d, cw[b][0], cw[b][1], c, hb[c]);
        const int ra = rg + 16 * b + mg, rb = ra + 8;
        if (mq == 0) {
          if (ra < wend) sums[ra] = cs[b][0] * d[0];
          if (rb < wend) sums[rb] = cs[b][1] * d[2];
        }
      }
    }
  } else {
    [[maybe_unused]] uint4 hv;
    [[maybe_unused]] float hf[P::kQuantized ? kVpl : 1];
    if constexpr (P::kQuantized)
      shared_floats(h + sub * kVpl, hf);
    else
      hv = ptx::ld_shared_16(ptx::smem_u32(h + sub * kVpl));
    for (; r0 < end; r0 += kR * G::kW2Batch) {
      uint4 wv[G::kW2Batch];
      [[maybe_unused]] float scale[G::kW2Batch];
#pragma unroll
      for (int i = 0; i < G::kW2Batch; ++i) {
        wv[i] = next[i];
        if constexpr (P::kQuantized) scale[i] = next_scale[i];
      }
      if (r0 + kR * G::kW2Batch < end) load_batch(r0 + kR * G::kW2Batch);
      float v[G::kW2Batch];
#pragma unroll
      for (int i = 0; i < G::kW2Batch; ++i) {
        if constexpr (P::kQuantized)
          v[i] = scale[i] * dot_packed<P::kBits>(wv[i], hf);
        else
          v[i] = dot8(wv[i], hv, 0.f);
#pragma unroll
        for (int o = 1; o < G::kRowLanes; o <<= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
      }
      if (sub == 0) {
#pragma unroll
        for (int i = 0; i < G::kW2Batch; ++i)
          if (r0 + kR * i < end) sums[r0 + kR * i] = v[i];
      }
    }
  }
  __syncthreads();
  const int slots = p.slots_per_token, chunks = F / G::kFeatures;
  float* out = sp.partials + ((static_cast<std::int64_t>(t) * slots + j) * chunks + chunk) * H + row0;
  for (int i = threadIdx.x; i < rows / 4; i += kThreads)
    reinterpret_cast<float4*>(out)[i] = reinterpret_cast<const float4*>(sums)[i];
}

// Block (columns [128·blockIdx.x, +128), token blockIdx.y), 32 threads per slot: thread (j, c) sums slot j's
// F / kFeatures partials of its 4 columns in order and rounds them to bf16; then the first 32 threads sum
// the slots in slot order with their weights.
template <class Addressing, int kFeaturesT>
__global__ void __launch_bounds__(32 * kMaxSlots)
    combine_kernel(const __grid_constant__ Params<Addressing> sp) {
  const MoeParams<Addressing>& p = sp.moe;
  __shared__ __align__(16) float ys[kMaxSlots][kCombineColumns];
  __shared__ float weight[kMaxSlots];
  __shared__ bool used[kMaxSlots];
  const int H = p.hidden, slots = p.slots_per_token, chunks = p.intermediate / kFeaturesT;
  const int c = threadIdx.x % 32, j = threadIdx.x / 32, t = blockIdx.y;
  const int col = blockIdx.x * kCombineColumns + c * 4;
  ptx::grid_dependency_wait();  // the partial sums
  ptx::launch_dependents();     // the next layer's first kernel may take its SM and wait
  const bool live = slot_expert_of(p, j, slot_id(p, t, j)) >= 0;
  if (c == 0) {
    used[j] = live;
    weight[j] = slot_weight(p, t, j);
  }
  float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
  if (live) {
    const float* base = sp.partials + (static_cast<std::int64_t>(t) * slots + j) * chunks * H + col;
    constexpr int kBatch = 8;
    for (int q0 = 0; q0 < chunks; q0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        v[i] = q0 + i < chunks
                   ? __ldcg(reinterpret_cast<const float4*>(base + static_cast<std::int64_t>(q0 + i) * H))
                   : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (q0 + i >= chunks) break;
        y.x += v[i].x, y.y += v[i].y, y.z += v[i].z, y.w += v[i].w;
      }
    }
  }
  // y in bf16, as the down stage stores it.
  ys[j][c * 4 + 0] = __bfloat162float(__float2bfloat16_rn(y.x));
  ys[j][c * 4 + 1] = __bfloat162float(__float2bfloat16_rn(y.y));
  ys[j][c * 4 + 2] = __bfloat162float(__float2bfloat16_rn(y.z));
  ys[j][c * 4 + 3] = __bfloat162float(__float2bfloat16_rn(y.w));
  __syncthreads();
  if (j != 0) return;
  float acc[4] = {};
  for (int s = 0; s < slots; ++s) {
    if (!used[s]) continue;
    const float w = weight[s];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += w * ys[s][c * 4 + i];
  }
  uint2 o;
  o.x = ptx::pack_bf16x2(acc[0], acc[1]);
  o.y = ptx::pack_bf16x2(acc[2], acc[3]);
  *reinterpret_cast<uint2*>(p.output + static_cast<std::int64_t>(t) * H + col) = o;
}

}  // namespace amoeba::kernels::splitk
