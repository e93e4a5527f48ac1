// Typed, non-owning views of pool pages (DESIGN §3.1 "memory views"). One arena, many interpretations: an
// expert page read as a bf16 [F, H] matrix, the same bytes later read as a KV page [2, tokens, kv_heads,
// head_dim], an SSM state page or a conv state page. A view is a base pointer, the page size in bytes and an
// element shape; it is trivially copyable and callable from device code, so kernels take it by value (in a
// __grid_constant__ Params struct). Element (page, i, j, ...) is at base + page * page_bytes + row-major(i,
// j, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "amoeba/core/host_device.hpp"
#include "amoeba/pool/page_kinds.hpp"

namespace amoeba {

template <class T, std::size_t Rank>
struct PageView {
  static_assert(Rank >= 1, "a page view has at least one dimension");
  using element_type = T;
  static constexpr std::size_t rank = Rank;

  std::byte* base = nullptr;
  std::uint64_t page_bytes = 0;
  std::uint32_t extents[Rank] = {};

  AMOEBA_HOST_DEVICE constexpr std::uint64_t elements_per_page() const noexcept {
    std::uint64_t n = 1;
    for (std::size_t r = 0; r < Rank; ++r) n *= extents[r];
    return n;
  }
  AMOEBA_HOST_DEVICE T* page(std::uint32_t index) const noexcept {
    return reinterpret_cast<T*>(base + std::uint64_t(index) * page_bytes);
  }
  template <class... I>
  AMOEBA_HOST_DEVICE T& operator()(std::uint32_t page_index, I... idx) const noexcept {
    static_assert(sizeof...(I) == Rank, "one index per dimension");
    const std::uint64_t ix[Rank] = {static_cast<std::uint64_t>(idx)...};
    std::uint64_t off = 0;
    for (std::size_t r = 0; r < Rank; ++r) off = off * extents[r] + ix[r];
    return page(page_index)[off];
  }
};

// Ready-made shapes. The caller fills extents from the model.
template <class T>
using ExpertMatrixView = PageView<T, 2>;  // [rows, cols]: W1/W3 are [F, H], W2 is [H, F]
template <class T>
using KvPageView = PageView<T, 4>;  // [2 (K,V), tokens, kv_heads, head_dim]
template <class T>
using SsmStateView = PageView<T, 3>;  // [heads, head_dim, state_dim]
template <class T>
using ConvStateView = PageView<T, 2>;  // [channels, kernel_width - 1]

static_assert(std::is_trivially_copyable_v<ExpertMatrixView<float>>);
static_assert(std::is_trivially_copyable_v<KvPageView<float>>);

// A view of `kind` pages of `pool` with the given element shape, or nothing if the pool has no memory behind
// it (bookkeeping-only arena) or the shape does not fit in the kind's payload bytes.
template <class T, class Pool, class... Ext>
std::optional<PageView<T, sizeof...(Ext)>> make_page_view(const Pool& pool, std::uint8_t kind,
                                                          Ext... extents) {
  PageView<T, sizeof...(Ext)> v{};
  v.base = pool.arena().base;
  v.page_bytes = pool.page_bytes(kind);
  std::size_t r = 0;
  ((v.extents[r++] = static_cast<std::uint32_t>(extents)), ...);
  if (v.base == nullptr || v.elements_per_page() * sizeof(T) > pool.layout()[kind].payload())
    return std::nullopt;
  return v;
}

}  // namespace amoeba
