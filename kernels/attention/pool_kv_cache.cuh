// PoolKvCache: the pool's KV pages as the attention kernels and the K/V append kernel address them. Kept
// apart from paged_attention.cuh so that code writing pages needs no FlashInfer header.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "amoeba/core/host_device.hpp"
#include "moe/moe_shape.hpp"  // Status

namespace amoeba::kernels {

using bf16 = __nv_bfloat16;

// The pool's KV pages for one model, as attention reads them. A page holds `tokens_per_page` tokens of one
// attention layer: [K block][V block] (then padding up to page_bytes, if any), each block [token][kv
// head][dim] bf16. Trivially copyable; pass by value.
struct PoolKvCache {
  void* arena = nullptr;         // the pool's arena base: page p starts at arena + p * page_bytes
  std::uint64_t page_bytes = 0;  // the pool's KV page size
  std::uint32_t tokens_per_page = 16;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;

  AMOEBA_HOST_DEVICE constexpr std::uint64_t block_elems() const noexcept {
    return std::uint64_t{tokens_per_page} * kv_heads * head_dim;
  }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t kv_bytes() const noexcept {
    return 2 * block_elems() * sizeof(bf16);
  }
  AMOEBA_HOST_DEVICE bf16* k(std::int32_t page, std::uint32_t token, std::uint32_t head) const noexcept {
    return static_cast<bf16*>(arena) + static_cast<std::uint64_t>(page) * (page_bytes / sizeof(bf16)) +
           (std::uint64_t{token} * kv_heads + head) * head_dim;
  }
  AMOEBA_HOST_DEVICE bf16* v(std::int32_t page, std::uint32_t token, std::uint32_t head) const noexcept {
    return k(page, token, head) + block_elems();
  }

  // The geometry rules every kernel below relies on.
  Status check() const {
    if (arena == nullptr) return Status::error("kv.arena", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(arena) % 16 != 0)
      return Status::error("kv.arena", "must be 16-byte aligned");
    if (tokens_per_page == 0) return Status::error("kv.tokens_per_page", 0, "must be >= 1");
    if (kv_heads == 0) return Status::error("kv.kv_heads", 0, "must be >= 1");
    if (head_dim == 0) return Status::error("kv.head_dim", 0, "must be >= 1");
    if (page_bytes < kv_bytes())
      return Status::error("kv.page_bytes", static_cast<long long>(page_bytes),
                           "must hold K and V of tokens_per_page x kv_heads x head_dim bf16 = " +
                               std::to_string(kv_bytes()) + " bytes");
    if (page_bytes % 16 != 0)
      return Status::error("kv.page_bytes", static_cast<long long>(page_bytes), "must be a multiple of 16");
    if (page_bytes / sizeof(bf16) > 0xffffffffull)
      return Status::error("kv.page_bytes", static_cast<long long>(page_bytes),
                           "must be < 2^33 (FlashInfer's page stride is 32-bit, in elements)");
    return Status::success();
  }
};
static_assert(std::is_trivially_copyable_v<PoolKvCache>);

}  // namespace amoeba::kernels
