// The Qwen MoE decoders' routing, and two small row operations beside their GEMMs (model/dense_gemm.cuh),
// rounding where the host reference decoder does (reference_engine/engine/decoder_reference.cpp).
// router_topk: per token, a float32 softmax over the router's bf16 logits, the k experts of highest
// probability (among equal probabilities the lowest index first, as the reference's stable sort), and their
// weights p, or p / sum(top-k p) with renormalize (Qwen3-MoE's norm_topk_prob), rounded to bf16.
// shared_gate: Qwen2-MoE's shared expert gate, bf16(sigmoid(g)) of the N = 1 gate GEMM's bf16 output.
// gather_rows: rows of a bf16 matrix picked by index (the tokens the LM head is computed for).
// Each launcher checks its arguments and returns a Status naming the bad one before anything is launched.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/decoder_ops.cuh"
#include "moe/moe_shape.hpp"

namespace amoeba::kernels::decoder {

inline constexpr int kRouterMaxExperts = 1024;  // 32 per lane of the token's warp
inline constexpr int kRouterMaxTopK = 16;       // one selected expert per lane at most
inline constexpr int kRouterWarpsPerBlock = 4;

// One warp per token; lane l holds experts l, l + 32, ... (kPerLane of them, the launcher picks the smallest
// count that covers E). The sums run in a fixed order (each lane's experts in index order, then an xor
// butterfly, which leaves the same bits in every lane) so a host model of the kernel can repeat them exactly;
// only expf differs from the host's exp, by an ulp or two of float. Divisions are IEEE (__fdiv_rn) whatever
// the flags; under -use_fast_math expf would become __expf, so do not build this with it.
template <int kPerLane>
__global__ void __launch_bounds__(kRouterWarpsPerBlock * 32)
    router_topk_kernel(const bf16* __restrict__ logits, int tokens, int experts, int ld, int k,
                       bool renormalize, std::int32_t* __restrict__ ids, float* __restrict__ weights,
                       float* __restrict__ gate) {
  const int lane = threadIdx.x % 32;
  const std::int64_t t = std::int64_t(blockIdx.x) * kRouterWarpsPerBlock + threadIdx.x / 32;
  if (t >= tokens) return;  // the whole warp: t is the same in every lane
  const bf16* row = logits + t * ld;
  // The shared expert's gate logit, where the router and gate GEMMs are one (column `experts`).
  if (gate != nullptr && lane == 0)
    gate[t] = round_bf16(__fdiv_rn(1.0f, 1.0f + expf(-__bfloat162float(row[experts]))));
  float p[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < experts ? __bfloat162float(row[e]) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float z = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (i * 32 + lane < experts) {
      p[i] = expf(p[i] - mx);
      z += p[i];
    }
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (i * 32 + lane < experts) p[i] = __fdiv_rn(p[i], z);
  // k rounds of a warp arg-max over (larger p, then lower index); the winner is taken out (-inf, below every
  // probability) and lane j keeps the j-th pick. Padding slots hold -inf and never win: k <= E.
  float mine_p = 0.0f, sum = 0.0f;
  int mine_id = 0;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int arg = experts;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (p[i] > best) best = p[i], arg = i * 32 + lane;  // ascending index: the first maximum wins
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (i * 32 + lane == arg) p[i] = -INFINITY;
    if (lane == j) mine_p = best, mine_id = arg;
    sum += best;  // in pick order, as the reference sums its top k
  }
  if (lane < k) {
    ids[t * k + lane] = mine_id;
    weights[t * k + lane] = round_bf16(renormalize ? __fdiv_rn(mine_p, sum) : mine_p);
  }
}

// out[t] = bf16(sigmoid(logits[t * ld + col])) widened to float. Static, as decoder_ops.cuh's kernels: one
// per translation unit.
static __global__ void shared_gate_kernel(const bf16* __restrict__ logits, int tokens, int ld, int col,
                                          float* __restrict__ out) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < tokens;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = round_bf16(__fdiv_rn(1.0f, 1.0f + expf(-__bfloat162float(logits[i * ld + col]))));
}

// dst[i] = src[rows[i]], rows of `row_elems` elements of V (uint4: 8 bf16, or one bf16 as uint16); one block
// per row.
template <class V>
__global__ void gather_rows_kernel(const V* __restrict__ src, const std::int32_t* __restrict__ rows,
                                   V* __restrict__ dst, int row_elems) {
  const V* s = src + static_cast<std::int64_t>(rows[blockIdx.x]) * row_elems;
  V* d = dst + static_cast<std::int64_t>(blockIdx.x) * row_elems;
  for (int i = threadIdx.x; i < row_elems; i += blockDim.x) d[i] = s[i];
}

inline Status launch_status(const char* kernel) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return Status::error(kernel, std::string("launch failed: ") + cudaGetErrorString(e));
  return Status::success();
}

// The rules of router_topk, checked on the host: T >= 0, 1 <= E <= 1024, 1 <= k <= min(16, E), and with
// T > 0 non-null logits, ids and weights.
inline Status router_topk_can_implement(const bf16* logits, int T, int E, int k, const std::int32_t* ids,
                                        const float* weights) {
  if (T < 0) return Status::error("T", T, "must be >= 0");
  if (E < 1 || E > kRouterMaxExperts) return Status::error("E", E, "must be in [1, 1024]");
  if (k < 1 || k > std::min(E, kRouterMaxTopK)) return Status::error("k", k, "must be in [1, min(16, E)]");
  if (T > 0) {
    if (logits == nullptr) return Status::error("logits", "must not be null");
    if (ids == nullptr) return Status::error("ids", "must not be null");
    if (weights == nullptr) return Status::error("weights", "must not be null");
  }
  return Status::success();
}

// logits [T][ld] bf16 (row t's router logits in its first E columns) → ids [T][k] (descending probability)
// and weights [T][k] (bf16 values as float). With `gate` non-null, the row's column E is Qwen2-MoE's shared
// expert gate logit (the router and gate GEMMs computed as one of N = E + 1, ld >= E + 1) and gate[t] gets
// what shared_gate gives for it.
inline Status router_topk(const bf16* logits, int T, int E, int ld, int k, bool renormalize,
                          std::int32_t* ids, float* weights, float* gate, cudaStream_t stream) {
  if (Status st = router_topk_can_implement(logits, T, E, k, ids, weights); !st) return st;
  if (ld < E + (gate != nullptr ? 1 : 0))
    return Status::error("ld", ld, gate != nullptr ? "must be >= E + 1 with a gate column" : "must be >= E");
  if (T == 0) return Status::success();
  const auto blocks =
      static_cast<unsigned>((std::int64_t(T) + kRouterWarpsPerBlock - 1) / kRouterWarpsPerBlock);
  constexpr unsigned kThreads = kRouterWarpsPerBlock * 32;
  auto go = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(logits, T, E, ld, k, renormalize, ids, weights, gate);
  };
  if (E <= 64)
    go(router_topk_kernel<2>);
  else if (E <= 128)
    go(router_topk_kernel<4>);
  else if (E <= 256)
    go(router_topk_kernel<8>);
  else
    go(router_topk_kernel<32>);
  return launch_status("router_topk_kernel");
}
inline Status router_topk(const bf16* logits, int T, int E, int k, bool renormalize, std::int32_t* ids,
                          float* weights, cudaStream_t stream) {
  return router_topk(logits, T, E, E, k, renormalize, ids, weights, nullptr, stream);
}

// logits [T][ld] bf16, the gate logit of row t in column col (the shared gate GEMM's N = 1 output: ld 1,
// col 0) → out [T] float.
inline Status shared_gate(const bf16* logits, int T, int ld, int col, float* out, cudaStream_t stream) {
  if (T < 0) return Status::error("T", T, "must be >= 0");
  if (col < 0 || ld <= col) return Status::error("ld", ld, "must be > col >= 0");
  if (T == 0) return Status::success();
  if (logits == nullptr) return Status::error("logits", "must not be null");
  if (out == nullptr) return Status::error("out", "must not be null");
  const int blocks = std::min((T + 255) / 256, 1024);
  shared_gate_kernel<<<blocks, 256, 0, stream>>>(logits, T, ld, col, out);
  return launch_status("shared_gate_kernel");
}
inline Status shared_gate(const bf16* logits, int T, float* out, cudaStream_t stream) {
  return shared_gate(logits, T, 1, 0, out, stream);
}

// dst [count][dim] = src rows `rows` [count] (each a valid row of src: not checked); 16-byte copies when dim
// is a multiple of 8 and src and dst are 16-byte aligned.
inline Status gather_rows(const bf16* src, const std::int32_t* rows, int count, int dim, bf16* dst,
                          cudaStream_t stream) {
  if (count < 0) return Status::error("count", count, "must be >= 0");
  if (dim <= 0) return Status::error("dim", dim, "must be > 0");
  if (count == 0) return Status::success();
  if (src == nullptr) return Status::error("src", "must not be null");
  if (rows == nullptr) return Status::error("rows", "must not be null");
  if (dst == nullptr) return Status::error("dst", "must not be null");
  const bool vec = dim % 8 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  if (vec)
    gather_rows_kernel<uint4><<<count, 128, 0, stream>>>(reinterpret_cast<const uint4*>(src), rows,
                                                         reinterpret_cast<uint4*>(dst), dim / 8);
  else
    gather_rows_kernel<std::uint16_t><<<count, 128, 0, stream>>>(
        reinterpret_cast<const std::uint16_t*>(src), rows, reinterpret_cast<std::uint16_t*>(dst), dim);
  return launch_status("gather_rows_kernel");
}

}  // namespace amoeba::kernels::decoder
