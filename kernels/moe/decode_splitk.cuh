// Decode split over the intermediate size (bf16 experts, MoeConfig::decode_splitk): the layer in two
// launches and no routing, for one or a few tokens, where the four-kernel decode (routing, gate/up, down,
// combine) spends several µs of its ~28 µs at one token on the chain of kernels rather than on its weight
// stream (docs/results/quantized_h200.md, "The layer's chain of kernels at 1–3 tokens").
//
//  1. splitk::kernel: a cluster of kCluster (4) blocks per (token t, slot j, 64 features [f0, f0 + 64) of
//     F). Block r of the cluster
//       - asks the L2 for W2's columns [f0, f0 + 64) of its H / 4 rows (128 bytes each, whole lines) before
//         anything else, so that they stream with W1 and W3;
//       - computes SiLU(gate)·up of its 16 features (each warp: its 4 features' W1 and W3 rows over all of
//         H, 16-byte loads, fp32 sums, a fixed shuffle reduction; rounded to bf16 as the decode kernels
//         store `act`) and writes them into every block of the cluster (distributed shared memory);
//       - after the cluster barrier, multiplies its W2 rows by the 64 values and writes the fp32 partial
//         sums of its rows to partials[t][j][f0 / 64][·].
//     So no block waits for any block outside its cluster. Copying the W2 columns into shared memory
//     instead (64 KB per block at H = 2048) left room for 92 clusters on an H100, fewer than Qwen3's 96 at
//     one token, and asking the L2 for the W1 / W3 rows at once (bulk prefetch) was slower on every shape
//     (docs/results/paged_moe_h200.md, "Split-K decode at one token").
//  2. splitk::combine_kernel: for each token and column, each slot's y = bf16(the sum of its F / 64
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

#include <cstdint>

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::splitk {

inline constexpr int kFeatures = 64;  // features of F per cluster (W2 rows of 128 bytes)
inline constexpr int kCluster = 4;    // blocks per cluster
inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kStep = 256;    // values of H a warp reads per row per load (32 lanes × 8)
inline constexpr int kUnroll = 2;    // steps of each W1 / W3 row's loads in flight per lane (4: 1.01x)
inline constexpr int kRowBatch = 8;  // W2 rows a lane loads before it reduces them
inline constexpr int kCombineColumns = 128;  // columns of H per combine block (32 threads × 4)
inline constexpr int kMaxSlots = 32;         // slots per token at most (the combine block: 32 per slot)

// Dynamic shared memory of a block: the token's input row (2H bytes), then its W2 rows' fp32 sums.
constexpr long long smem_bytes(int hidden) {
  return 2LL * hidden + 4LL * (hidden / kCluster);
}

// The partial sums' workspace: [T][k + m][F / 64][H] fp32.
constexpr long long partial_floats(long long tokens, int slots, int intermediate, int hidden) {
  return tokens * slots * (intermediate / kFeatures) * hidden;
}

template <class Addressing>
struct Params {
  MoeParams<Addressing> moe;
  float* partials;  // [T][k + m][F / 64][H]
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

template <class Addressing>
__global__ void __launch_bounds__(kThreads) kernel(const __grid_constant__ Params<Addressing> sp) {
  constexpr int kBlockFeatures = kFeatures / kCluster;    // 16
  constexpr int kWarpFeatures = kBlockFeatures / kWarps;  // 4
  namespace cg = cooperative_groups;
  const MoeParams<Addressing>& p = sp.moe;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) bf16 h[kFeatures];
  const int H = p.hidden, F = p.intermediate;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int chunk = blockIdx.x / kCluster, j = blockIdx.y, t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = H / kCluster, row0 = rank * rows, f0 = chunk * kFeatures;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  float* sums = reinterpret_cast<float*>(smem + 2 * H);

  ptx::cluster_arrive_relaxed();  // this block runs (the others wait for it before writing into it)
  ptx::grid_dependency_wait();    // topk_ids, topk_weights and the input: the previous kernels' output
  ptx::launch_dependents();       // the combine's blocks may take their SMs and wait
  const int e = slot_expert_of(p, j, slot_id(p, t, j));
  if (e < 0) return;  // a slot routed outside [0, E): the whole cluster (one slot) leaves, combine skips it
  const bf16* w1 = Addressing::matrix_base(p.addr, e, 0);
  const bf16* w3 = Addressing::matrix_base(p.addr, e, 1);
  const bf16* w2 = Addressing::matrix_base(p.addr, e, 2) + static_cast<std::int64_t>(row0) * F + f0;

  // W2's 64 columns of the block's rows (one 128-byte line per row) asked of the L2 before the W1 / W3
  // loads, so that they stream with them; the down step below reads them from the L2.
  for (int r = threadIdx.x; r < rows; r += kThreads) ptx::prefetch_l2(w2 + static_cast<std::int64_t>(r) * F);
  const bf16* x = p.input + static_cast<std::int64_t>(t) * H;
  for (int i = threadIdx.x; i < H / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = ptx::ld_cached_16(x + i * 8);
  __syncthreads();

  // Gate/up: the warp's features' W1 and W3 rows, lane l reading values [s + 8l, +8) of each step s of 256
  // values, kU steps of loads in flight (kUnroll, then 1 for the last H % (kUnroll·256) values).
  const int fw = f0 + rank * kBlockFeatures + warp * kWarpFeatures;
  const bf16* w13[2] = {w1 + static_cast<std::int64_t>(fw) * H + lane * 8,
                        w3 + static_cast<std::int64_t>(fw) * H + lane * 8};
  float acc[2][kWarpFeatures] = {};
  auto steps = [&]<int kU>(int s) {
    uint4 wv[kU][2][kWarpFeatures];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < kWarpFeatures; ++i)
          wv[u][m][i] = ptx::ld_stream_16(w13[m] + static_cast<std::int64_t>(i) * H + s + u * kStep);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint4 xv = ptx::ld_shared_16(ptx::smem_u32(xs + s + u * kStep + lane * 8));
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < kWarpFeatures; ++i) acc[m][i] = dot8(wv[u][m][i], xv, acc[m][i]);
    }
  };
  int s = 0;
  for (; s + kUnroll * kStep <= H; s += kUnroll * kStep) steps.template operator()<kUnroll>(s);
  for (; s < H; s += kStep) steps.template operator()<1>(s);  // H % 256 == 0 (can_implement)
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < kWarpFeatures; ++i)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[m][i] += __shfl_xor_sync(0xffffffffu, acc[m][i], o);

  // Down: row r of the block's W2 columns · the 64 activations, 8 lanes per row (lane l: columns
  // [8(l % 8), +8)), 4 rows per warp step, kRowBatch steps of loads in flight and the next batch loaded
  // before the current one is reduced; the first batch is loaded before the activations are exchanged.
  // Rows past the warp's end are clamped to its last row (loaded, not stored).
  const int end = (warp + 1) * (rows / kWarps);
  int r0 = warp * (rows / kWarps) + lane / 8;
  uint4 next[kRowBatch];
  auto load_batch = [&](int first) {
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      const int r = min(first + 4 * i, end - 4 + lane / 8);
      next[i] = ptx::ld_stream_16(w2 + static_cast<std::int64_t>(r) * F + (lane % 8) * 8);
    }
  };
  load_batch(r0);

  // Lane i < kWarpFeatures hands feature i's activation to every block of the cluster.
  ptx::cluster_wait();  // every block of the cluster has started
  if (lane < kWarpFeatures) {
    float g = acc[0][0], u = acc[1][0];
#pragma unroll
    for (int i = 1; i < kWarpFeatures; ++i)
      if (lane == i) g = acc[0][i], u = acc[1][i];
    const bf16 v = __float2bfloat16_rn(silu(g) * u);
    const int idx = rank * kBlockFeatures + warp * kWarpFeatures + lane;
#pragma unroll
    for (int q = 0; q < kCluster; ++q) cluster.map_shared_rank(h, q)[idx] = v;
  }
  cluster.sync();  // every block's activations written (release / acquire at cluster scope)

  const uint4 hv = ptx::ld_shared_16(ptx::smem_u32(h + (lane % 8) * 8));
  for (; r0 < end; r0 += 4 * kRowBatch) {
    uint4 wv[kRowBatch];
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) wv[i] = next[i];
    if (r0 + 4 * kRowBatch < end) load_batch(r0 + 4 * kRowBatch);
    float v[kRowBatch];
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      v[i] = dot8(wv[i], hv, 0.f);
      v[i] += __shfl_xor_sync(0xffffffffu, v[i], 1);
      v[i] += __shfl_xor_sync(0xffffffffu, v[i], 2);
      v[i] += __shfl_xor_sync(0xffffffffu, v[i], 4);
    }
    if (lane % 8 == 0) {
#pragma unroll
      for (int i = 0; i < kRowBatch; ++i)
        if (r0 + 4 * i < end) sums[r0 + 4 * i] = v[i];
    }
  }
  __syncthreads();
  const int slots = p.slots_per_token, chunks = F / kFeatures;
  float* out = sp.partials + ((static_cast<std::int64_t>(t) * slots + j) * chunks + chunk) * H + row0;
  for (int i = threadIdx.x; i < rows / 4; i += kThreads)
    reinterpret_cast<float4*>(out)[i] = reinterpret_cast<const float4*>(sums)[i];
}

// Block (columns [128·blockIdx.x, +128), token blockIdx.y), 32 threads per slot: thread (j, c) sums slot j's
// F / 64 partials of its 4 columns in order and rounds them to bf16; then the first 32 threads sum the slots
// in slot order with their weights.
template <class Addressing>
__global__ void __launch_bounds__(32 * kMaxSlots)
    combine_kernel(const __grid_constant__ Params<Addressing> sp) {
  const MoeParams<Addressing>& p = sp.moe;
  __shared__ __align__(16) float ys[kMaxSlots][kCombineColumns];
  __shared__ float weight[kMaxSlots];
  __shared__ bool used[kMaxSlots];
  const int H = p.hidden, slots = p.slots_per_token, chunks = p.intermediate / kFeatures;
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
