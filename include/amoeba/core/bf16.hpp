// bfloat16 storage type for host code (weights in host arenas, references, tests). Device code uses
// __nv_bfloat16, which has the same bit layout; this type never includes a CUDA header.
#pragma once

#include <bit>
#include <cstdint>

#include "amoeba/core/host_device.hpp"

namespace amoeba {

struct bf16 {
  std::uint16_t bits;

  // Round to nearest even, NaN kept quiet.
  static constexpr bf16 from_float(float f) noexcept {
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
      return bf16{std::uint16_t((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(u >> 16)};
  }
  constexpr float to_float() const noexcept { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
};
static_assert(sizeof(bf16) == 2);

}  // namespace amoeba
