// KvAppend: writes the K and V rows of a step's new tokens into their pool pages, so that attention in this
// step and in later ones reads them (PagedAttention reads whole contexts from the pages, new tokens
// included).
//
// Where a row goes comes from the step's page table alone (KvPageTableView, one device copy per step): the
// new rows of sequence s are query rows qo_indptr[s] .. qo_indptr[s+1]; its context after the step holds
// (pages - 1) x tokens_per_page + last_page_len tokens, so new row j sits at position
// p = context_after - new_tokens + j, in page layer_indices(layer)[kv_indptr[s] + p / tokens_per_page], slot
// p % tokens_per_page. Pages are [K block][V block], each [token][kv head][dim] (PoolKvCache::k / ::v).
// One block per sequence; 16-byte copies, so kv_heads x head_dim must be a multiple of 8 bf16. Nothing but
// the new rows' K and V slots is written. The CUDA backend appends through QkvPrologue
// (model/qkv_prologue.cuh: norm, RoPE and the append in one kernel, the same slots by the same rule,
// check_kv_target shared); KvAppend is the stand-alone form, and the reference QkvPrologue is tested against.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "amoeba/engine/kv_page_table.hpp"
#include "attention/pool_kv_cache.cuh"

namespace amoeba::kernels {

struct KvAppendArguments {
  PoolKvCache kv;
  KvPageTableView table;    // the device copy of this step's table
  std::uint32_t layer = 0;  // attention layer whose pages receive the rows
  const bf16* k = nullptr;  // [tokens][kv_heads][head_dim], rows in the table's query order
  const bf16* v = nullptr;  // same shape
};

// Where query row `row` of the step, a new row of sequence s, lands in attention layer `layer`: its page and
// the slot in it (the rule at the top of this file). Every kernel that writes new K/V rows uses it.
struct KvSlot {
  std::int32_t page;
  std::uint32_t slot;
};
__device__ __forceinline__ KvSlot new_row_slot(const KvPageTableView& t, std::uint32_t layer, std::uint32_t s,
                                               std::int32_t row) {
  const std::int32_t q0 = t.qo_indptr[s], q1 = t.qo_indptr[s + 1];
  const std::int32_t pg0 = t.kv_indptr[s], pg1 = t.kv_indptr[s + 1];
  const std::int64_t context_after =
      static_cast<std::int64_t>(pg1 - pg0 - 1) * t.tokens_per_page + t.kv_last_page_len[s];
  const std::int64_t pos = context_after - (q1 - q0) + (row - q0);
  return {t.layer_indices(layer)[pg0 + pos / t.tokens_per_page],
          static_cast<std::uint32_t>(pos % t.tokens_per_page)};
}

namespace detail {
// Static: each translation unit that includes this header gets its own copy.
static __global__ void kv_append_kernel(const __grid_constant__ KvAppendArguments a) {
  const std::uint32_t s = blockIdx.x;
  const KvPageTableView& t = a.table;
  const std::int32_t q0 = t.qo_indptr[s], q1 = t.qo_indptr[s + 1];
  const std::uint32_t row_vecs = a.kv.kv_heads * a.kv.head_dim / 8;  // 16-byte vectors per token row
  const std::uint32_t total = static_cast<std::uint32_t>(q1 - q0) * row_vecs;
  for (std::uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const std::uint32_t j = i / row_vecs, w = i % row_vecs;
    const KvSlot at = new_row_slot(t, a.layer, s, q0 + static_cast<std::int32_t>(j));
    const std::uint64_t src = (static_cast<std::uint64_t>(q0) + j) * row_vecs + w;
    reinterpret_cast<uint4*>(a.kv.k(at.page, at.slot, 0))[w] = reinterpret_cast<const uint4*>(a.k)[src];
    reinterpret_cast<uint4*>(a.kv.v(at.page, at.slot, 0))[w] = reinterpret_cast<const uint4*>(a.v)[src];
  }
}
}  // namespace detail

// The rules every kernel that writes a step's new K/V rows into their pages relies on (KvAppend,
// QkvPrologue): a valid page geometry, the device copy of the step's table, a layer it has, matching pages.
inline Status check_kv_target(const PoolKvCache& kv, const KvPageTableView& table, std::uint32_t layer) {
  if (Status st = kv.check(); !st) return st;
  if (table.qo_indptr == nullptr || table.kv_indptr == nullptr || table.kv_indices == nullptr ||
      table.kv_last_page_len == nullptr)
    return Status::error("table", "must point at the device copy of the step's page table");
  if (layer >= table.attention_layers)
    return Status::error("layer", static_cast<long long>(layer),
                         "must be below the table's attention layers");
  if (table.tokens_per_page != kv.tokens_per_page)
    return Status::error("table.tokens_per_page", static_cast<long long>(table.tokens_per_page),
                         "must equal kv.tokens_per_page");
  return Status::success();
}

class KvAppend {
 public:
  using Arguments = KvAppendArguments;

  static Status can_implement(const Arguments& a) {
    if (Status st = check_kv_target(a.kv, a.table, a.layer); !st) return st;
    if ((std::uint64_t{a.kv.kv_heads} * a.kv.head_dim) % 8 != 0)
      return Status::error("kv.head_dim", static_cast<long long>(a.kv.head_dim),
                           "kv_heads x head_dim must be a multiple of 8 (16-byte rows)");
    if (a.k == nullptr || a.v == nullptr) return Status::error("k/v", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(a.k) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.v) % 16 != 0)
      return Status::error("k/v", "must be 16-byte aligned");
    return Status::success();
  }

  static Status run(const Arguments& a, cudaStream_t stream) {
    if (Status st = can_implement(a); !st) return st;
    if (a.table.sequences == 0) return Status::success();
    detail::kv_append_kernel<<<a.table.sequences, 256, 0, stream>>>(a);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? Status::success() : Status::error("kv_append_kernel", cudaGetErrorString(e));
  }
};

}  // namespace amoeba::kernels
