// QkvPrologue: everything between the fused q/k/v projection and attention, in one kernel. The projection is
// one GEMM whose output row t is [q heads | k heads | v heads] (qkv, row stride ld). Per token:
//   q and k heads: the per-head RMSNorm (Qwen3-MoE's q_norm / k_norm; skipped when the weights are null),
//                  then rotate-half RoPE at positions[t] (rounded as rope_kernel: each product and sum to
//                  bf16);
//   q heads  -> q_out [tokens][heads][head_dim] (what PagedAttention reads);
//   k, v     -> the token's slot in its KV page of `layer` (as KvAppend: the slot follows from the step's
//               page table alone).
// It replaces rms_norm_kernel ×2 (Qwen3), rope_kernel ×2 and KvAppend: the values are the same formulas as
// those kernels (decoder_ops.cuh, kv_append.cuh); only the per-head norm's float sum runs in another order
// (one warp per head: lane l sums elements l, l + 32, ... then an xor butterfly), so a bf16 result can differ
// by one rounding step where the sum sits on a boundary.
//
// One block of kQkvPrologueWarps warps per token; warp w takes heads w, w + warps, ... of q, k and v; lane l
// holds the RoPE pairs (j, j + head_dim / 2) for j = l, l + 32, ... Head dim: a multiple of 64, at most
// 64 · kQkvMaxPairs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "amoeba/engine/kv_page_table.hpp"
#include "attention/kv_append.cuh"  // check_kv_target, new_row_slot
#include "attention/pool_kv_cache.cuh"
#include "model/decoder_ops.cuh"

namespace amoeba::kernels {

inline constexpr int kQkvPrologueWarps = 8;
inline constexpr int kQkvMaxPairs = 4;  // RoPE pairs per lane: head_dim <= 256

struct QkvPrologueArguments {
  const bf16* qkv = nullptr;     // [tokens][ld]: q heads, then k heads, then v heads, each head_dim wide
  std::uint32_t ld = 0;          // elements between rows of qkv, >= (heads + 2 kv_heads) head_dim
  std::uint32_t heads = 0;       // query heads (kv heads and head_dim: kv)
  bf16* q_out = nullptr;         // [tokens][heads][head_dim]
  const bf16* q_norm = nullptr;  // [head_dim] or null (no per-head norm)
  const bf16* k_norm = nullptr;  // [head_dim] or null; both or neither
  float eps = 1e-6f;
  const std::int32_t* positions = nullptr;  // [tokens] RoPE positions
  const float* inv_freq = nullptr;          // [head_dim / 2]
  PoolKvCache kv;
  KvPageTableView table;    // the device copy of this step's table: tokens rows in its query order
  std::uint32_t layer = 0;  // attention layer whose pages receive K and V
};

namespace detail {

static __global__ void __launch_bounds__(kQkvPrologueWarps * 32)
    qkv_prologue_kernel(const __grid_constant__ QkvPrologueArguments a) {
  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const KvPageTableView& tb = a.table;
  // The token's sequence: the last s with qo_indptr[s] <= t (binary search over the step's sequences).
  std::uint32_t lo = 0, hi = tb.sequences;  // invariant: qo_indptr[lo] <= t < qo_indptr[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (tb.qo_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  const KvSlot at = new_row_slot(tb, a.layer, lo, t);

  const int hd = static_cast<int>(a.kv.head_dim), half = hd / 2, pairs = half / 32;
  const int heads = static_cast<int>(a.heads), kvh = static_cast<int>(a.kv.kv_heads);
  const bf16* row = a.qkv + static_cast<std::int64_t>(t) * a.ld;
  const float pos = float(a.positions[t]);
  float c[kQkvMaxPairs], s[kQkvMaxPairs];
#pragma unroll
  for (int i = 0; i < kQkvMaxPairs; ++i)
    if (i < pairs) {
      const float angle = pos * a.inv_freq[lane + 32 * i];
      c[i] = decoder::round_bf16(cosf(angle));
      s[i] = decoder::round_bf16(sinf(angle));
    }
  for (int h = warp; h < heads + 2 * kvh; h += kQkvPrologueWarps) {
    const bf16* src = row + static_cast<std::int64_t>(h) * hd;
    if (h >= heads + kvh) {  // v: copied as is
      bf16* dst = a.kv.v(at.page, at.slot, static_cast<std::uint32_t>(h - heads - kvh));
      for (int d = lane; d < hd; d += 32) dst[d] = src[d];
      continue;
    }
    const bool is_q = h < heads;
    float x0[kQkvMaxPairs], x1[kQkvMaxPairs];
#pragma unroll
    for (int i = 0; i < kQkvMaxPairs; ++i)
      if (i < pairs) {
        x0[i] = __bfloat162float(src[lane + 32 * i]);
        x1[i] = __bfloat162float(src[lane + 32 * i + half]);
      }
    const bf16* nw = is_q ? a.q_norm : a.k_norm;
    if (nw != nullptr) {  // per-head RMSNorm, as rms_norm_kernel over head_dim
      float sum = 0;
#pragma unroll
      for (int i = 0; i < kQkvMaxPairs; ++i)
        if (i < pairs) sum += x0[i] * x0[i] + x1[i] * x1[i];
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float inv = 1.0f / sqrtf(sum / float(hd) + a.eps);
#pragma unroll
      for (int i = 0; i < kQkvMaxPairs; ++i)
        if (i < pairs) {
          const int j = lane + 32 * i;
          x0[i] = decoder::round_bf16(__bfloat162float(nw[j]) * decoder::round_bf16(x0[i] * inv));
          x1[i] = decoder::round_bf16(__bfloat162float(nw[j + half]) * decoder::round_bf16(x1[i] * inv));
        }
    }
    bf16* dst = is_q ? a.q_out + (static_cast<std::int64_t>(t) * heads + h) * hd
                     : a.kv.k(at.page, at.slot, static_cast<std::uint32_t>(h - heads));
#pragma unroll
    for (int i = 0; i < kQkvMaxPairs; ++i)
      if (i < pairs) {
        const int j = lane + 32 * i;
        const float u = x0[i], w = x1[i];
        dst[j] = __float2bfloat16_rn(decoder::round_bf16(u * c[i]) + decoder::round_bf16(-w * s[i]));
        dst[j + half] = __float2bfloat16_rn(decoder::round_bf16(w * c[i]) + decoder::round_bf16(u * s[i]));
      }
  }
}

}  // namespace detail

class QkvPrologue {
 public:
  using Arguments = QkvPrologueArguments;

  static Status can_implement(const Arguments& a) {
    if (Status st = check_kv_target(a.kv, a.table, a.layer); !st) return st;
    if (a.kv.head_dim % 64 != 0 || a.kv.head_dim > 64u * kQkvMaxPairs)
      return Status::error("kv.head_dim", static_cast<long long>(a.kv.head_dim),
                           "must be a multiple of 64, at most 256");
    if (a.heads == 0) return Status::error("heads", 0, "must be >= 1");
    if (a.ld < (a.heads + 2ull * a.kv.kv_heads) * a.kv.head_dim)
      return Status::error("ld", static_cast<long long>(a.ld), "must be >= (heads + 2 kv_heads) x head_dim");
    if (a.qkv == nullptr || a.q_out == nullptr || a.positions == nullptr || a.inv_freq == nullptr)
      return Status::error("qkv/q_out/positions/inv_freq", "must not be null");
    if ((a.q_norm == nullptr) != (a.k_norm == nullptr))
      return Status::error("q_norm/k_norm", "must be both given or both null");
    return Status::success();
  }

  static Status run(const Arguments& a, cudaStream_t stream) {
    if (Status st = can_implement(a); !st) return st;
    if (a.table.tokens == 0) return Status::success();
    detail::qkv_prologue_kernel<<<a.table.tokens, kQkvPrologueWarps * 32, 0, stream>>>(a);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::success() : Status::error("qkv_prologue_kernel", cudaGetErrorString(e));
  }
};

}  // namespace amoeba::kernels
