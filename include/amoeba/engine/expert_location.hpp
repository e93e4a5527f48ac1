// The vocabulary that host and device share about expert weights: the three matrices of one expert and where
// the MoE kernel reads them from in one forward pass. The LoadPlanner writes ExpertLocation entries, the
// DoubleBufferLoader copies them into the device page table, and the PagedMoe kernel reads them: one type, so
// no layout has to be kept equal by hand. This header is valid C++20 for host compilers and for nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amoeba/core/host_device.hpp"

namespace amoeba {

// The weight matrices of one expert, each on its own expert page (paper: each expert = 3 expert pages, W1
// gate, W3 up, W2 down; the paged kernel addresses W1 and W3 by page, DESIGN §3.5).
enum class ExpertMatrix : std::uint8_t { kW1 = 0, kW3 = 1, kW2 = 2 };
inline constexpr std::size_t kMatricesPerExpert = 3;

// Where one expert of one layer is read from during a forward: three pool page ids (W1, W3, W2; a page id is
// the page's index in the pool's arena in units of the expert page), or, when buffer_slot >= 0, a load-buffer
// slot holding W1, W3, W2 back to back (page ids are then ignored), or absent (all -1).
struct ExpertLocation {
  std::int32_t page[kMatricesPerExpert] = {-1, -1, -1};
  std::int32_t buffer_slot = -1;

  AMOEBA_HOST_DEVICE constexpr bool in_buffer() const noexcept { return buffer_slot >= 0; }
  AMOEBA_HOST_DEVICE constexpr bool in_pages() const noexcept { return buffer_slot < 0 && page[0] >= 0; }
  AMOEBA_HOST_DEVICE constexpr bool absent() const noexcept { return buffer_slot < 0 && page[0] < 0; }
  AMOEBA_HOST_DEVICE constexpr std::int32_t page_of(ExpertMatrix m) const noexcept {
    return page[static_cast<std::size_t>(m)];
  }
};
// The device page table is an array of these, written by a kernel argument copy and read once per tile.
static_assert(std::is_trivially_copyable_v<ExpertLocation> && sizeof(ExpertLocation) == 16 &&
              alignof(ExpertLocation) == 4);

}  // namespace amoeba
