// How PagedMoe tiles one call: which collective runs the two GEMM stages and how many tokens a work tile
// holds, chosen from the shape alone by a constexpr table (no run-time tuning state). A configuration is a
// policy type (`moe_config`): PagedMoe<Addressing, Config> takes DefaultMoeConfig unless told otherwise, so a
// benchmark compares configurations by instantiating another type, never by setting a global.
// Host-only (no CUDA header): the table and its examples are checked at compile time on any machine.
#pragma once

#include <concepts>

#include "moe/moe_shape.hpp"

namespace amoeba::kernels {

// Which collective runs the gate/up and down stages. kAuto lets the configuration choose; kGrouped is the
// wgmma grouped GEMM on sm_90 devices (mma.sync elsewhere); kGroupedMma forces the mma.sync grouped GEMM.
enum class MoePath { kAuto, kDecode, kGrouped, kGroupedMma };

struct MoeConfig {
  MoePath path = MoePath::kDecode;
  int tile_tokens = 8;   // tokens per work tile: 8, 16 or 32 (decode), 128 (grouped)
  int decode_warps = 4;  // decode: consumer warps per block (2 or 4), each owning 16 weight rows of an item
  friend constexpr bool operator==(const MoeConfig&, const MoeConfig&) = default;
};

template <class C>
concept moe_config = requires(const MoeShape& s, MoePath requested) {
  { C::select(s, requested) } -> std::same_as<MoeConfig>;
};

namespace config_detail {

// mean + 3·sqrt(mean) + 1 <= limit, without a constexpr sqrt: 3·sqrt(mean) <= limit - 1 - mean.
constexpr bool fits(double mean, double limit) {
  const double room = limit - 1.0 - mean;
  return room >= 0.0 && 9.0 * mean <= room * room;
}

}  // namespace config_detail

// The default table. Decode while the expected largest per-expert batch of a uniform router (mean + 3σ + 1
// tokens, routed experts only) fits a 32-token tile, in the smallest tile that holds it; grouped GEMM
// (128-token tiles) beyond. Skewed routing stays correct on either path: an expert with more tokens than a
// tile gets several tiles.
struct DefaultMoeConfig {
  static constexpr int kDecodeTiles[] = {8, 16, 32};
  static constexpr int kGroupedTile = 128;
  static constexpr int kDecodeWarps = 4;

  static constexpr MoeConfig select(const MoeShape& s, MoePath requested) {
    const double mean = s.num_experts > 0 ? static_cast<double>(s.num_tokens) * s.top_k / s.num_experts : 0.0;
    MoePath path = requested;
    if (path == MoePath::kAuto)
      path = config_detail::fits(mean, kDecodeTiles[2]) ? MoePath::kDecode : MoePath::kGrouped;
    if (path != MoePath::kDecode) return {path, kGroupedTile, kDecodeWarps};
    for (const int tile : kDecodeTiles)
      if (config_detail::fits(mean, tile)) return {path, tile, kDecodeWarps};
    return {path, kDecodeTiles[2], kDecodeWarps};
  }
};
static_assert(moe_config<DefaultMoeConfig>);
// Examples (T, H, F, E, k, m): Qwen3-30B-A3B decodes 16 tokens in 8-token tiles and 256 in 32-token tiles,
// Mixtral 16 tokens in 16-token tiles and 256 through the grouped GEMM.
static_assert(DefaultMoeConfig::select({16, 2048, 768, 128, 8, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 4});
static_assert(DefaultMoeConfig::select({256, 2048, 768, 128, 8, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 32, 4});
static_assert(DefaultMoeConfig::select({16, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 16, 4});
static_assert(DefaultMoeConfig::select({256, 4096, 14336, 8, 2, 0}, MoePath::kAuto).path ==
              MoePath::kGrouped);
static_assert(DefaultMoeConfig::select({4096, 2048, 1408, 60, 4, 4}, MoePath::kDecode).tile_tokens == 32);

}  // namespace amoeba::kernels
