// Configurations of PagedMoe shared by the device tests (paged_moe_test.cu, quant_moe_test.cu) and
// benchmarks/device/paged_moe_bench.cu: the default table held to one path at every token count, with the
// quantized decode's down stage on other warps, and with another width or token tile of the sm_90 grouped
// GEMM's blocks. CUDA (the decode tiles' types: moe/paged_moe.cuh).
#pragma once

#include <tuple>

#include "moe/moe_config.hpp"
#include "moe/paged_moe.cuh"

namespace amoeba::testing {

// DefaultMoeConfig's choice held to kPath (kDecode: its decode tiles; kGrouped: the grouped GEMM) whatever
// the shape, for bf16 (select) and quantized experts (select_quantized).
template <kernels::MoePath kPath>
struct PathConfig {
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath) {
    return kernels::DefaultMoeConfig::select(s, kPath);
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath,
                                                       kernels::quant::Bits bits) {
    return kernels::DefaultMoeConfig::select_quantized(s, kPath, bits);
  }
};
using QuantGroupedConfig = PathConfig<kernels::MoePath::kGrouped>;

// Quantized experts on the grouped GEMM at every token count, held to blocks of kRows weight rows (0: the
// TMA kernel's 256 where H % 256 == 0, the two-block kernel's 128 elsewhere) and kTokens-token tiles.
// PagedMoe::config falls back to the two-block kernel's 128 rows and tokens where pages are off the TMA
// kernel's rows.
template <int kRows, int kTokens>
struct QuantGroupedBlocks : PathConfig<kernels::MoePath::kGrouped> {
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath,
                                                       kernels::quant::Bits bits) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select_quantized(s, kernels::MoePath::kGrouped, bits);
    c.grouped_rows = kRows != 0 ? kRows : s.hidden % 256 == 0 ? 256 : 128;
    return kernels::with_grouped_tile(c, kTokens);
  }
};
// The TMA kernel's 128-token units where H allows.
using QuantTmaConfig = QuantGroupedBlocks<0, 128>;
// The two-block grouped GEMM (128-row blocks dequantised in shared memory, 128-token tiles).
using QuantTwoBlockConfig = QuantGroupedBlocks<128, 128>;
// The TMA kernel's 32-token units (tile_tokens 32).
using QuantTmaSmallConfig = QuantGroupedBlocks<256, kernels::DefaultMoeConfig::kQuantTmaSmallTile>;

// The default table with the down stage of every quantized decode call on 8-token tiles split over kWarps
// warps (MoeConfig::decode_down_warps; gate/up keeps the row's warps); 0: over the row's warps (the table
// before its rows named down warps). Its tiles: the default's and the 8-token tiles' kWarps twins.
template <int kWarps, class... Ts>
auto with_down_warps(std::tuple<Ts...>) -> typename kernels::detail::with_tiles<
    std::tuple<Ts...>, kernels::decode::Tile<1, kWarps, Ts::kUnroll, Ts::kPrefetch, Ts::kStages>...>::type;
template <int kWarps>
struct DownWarpsConfig : kernels::DefaultMoeConfig {
  using DecodeTiles =
      decltype(with_down_warps < kWarps == 0 ? 4 : kWarps > (kernels::detail::DefaultQuantDecodeTiles{}));
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select_quantized(s, requested, bits);
    if (c.path == kernels::MoePath::kDecode && c.tile_tokens == 8) c.decode_down_warps = kWarps;
    return c;
  }
};

// DefaultMoeConfig's choice (held to kPath, or by shape with kAuto) with quantized experts' grouped stages on
// a bf16 copy at every token count (kernels::with_grouped_dequant; kernels::DequantPrefillMoeConfig does so
// from 16384 tokens only).
template <kernels::MoePath kPath = kernels::MoePath::kAuto>
struct DequantConfig {
  static constexpr bool kDequantWorkspace = true;
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath requested) {
    return kernels::DefaultMoeConfig::select(s, kPath == kernels::MoePath::kAuto ? requested : kPath);
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    return kernels::with_grouped_dequant(kernels::DefaultMoeConfig::select_quantized(
                                             s, kPath == kernels::MoePath::kAuto ? requested : kPath, bits),
                                         s);
  }
};

// DefaultMoeConfig's choice with the sm_90 grouped GEMM's blocks kRows weight rows wide (128: the two-block
// cp.async kernel; 256: the persistent TMA kernels, bf16 or quantized, on 128-token tiles).
template <int kRows>
struct GroupedRowsConfig {
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath requested) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select(s, requested);
    c.grouped_rows = kRows;
    if (kRows != 128 && c.path != kernels::MoePath::kDecode) c = kernels::with_grouped_tile(c, 128);
    return c;
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select_quantized(s, requested, bits);
    c.grouped_rows = kRows;
    return c;
  }
};

// DefaultMoeConfig's choice with the 128-row grouped GEMM on kTile-token tiles (64 or 128) wherever it takes
// kGrouped on bf16 experts: 128, the two-block cp.async kernel (the reference the other sm_90 grouped kernels
// are compared with bit for bit); 64, grouped::gemm_wgmma_small_kernel with kStages stages and kBlocks blocks
// per SM. Quantized experts keep the default's choice.
template <int kTile, int kStages = 4, int kBlocks = 2>
struct GroupedTileConfig {
  static constexpr int kSmallStages = kStages, kSmallBlocks = kBlocks;
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath requested) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select(s, requested);
    if (c.path == kernels::MoePath::kGrouped) {
      c.tile_tokens = kTile;
      c.grouped_rows = 128;
      c.small_deep = false;  // the 64-token tiles on this type's kStages / kBlocks
    }
    return c;
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    return kernels::DefaultMoeConfig::select_quantized(s, requested, bits);
  }
};
template <int kStages, int kBlocks>
using SmallGroupedConfig = GroupedTileConfig<64, kStages, kBlocks>;

// DefaultMoeConfig's choice (held to kPath, or by shape with kAuto) with the down blocks preloading their W2
// rows (MoeConfig::decode_preload) wherever it decodes bf16 experts on 8-token tiles and the rows fit a
// block's shared memory (32·(2F + 16) bytes plus the K split's reduction buffer, at most 8 KB, within sm_90's
// 227 KB: F up to ~3500, so not Mixtral); PagedMoe then preloads where all the blocks' rows fit the device at
// once (PagedMoe::decode_preloads) and streams elsewhere, where the default asks only where they fit an
// H200 (DefaultMoeConfig::kPreloadBytes). Quantized experts keep the default's choice.
template <kernels::MoePath kPath = kernels::MoePath::kAuto>
struct PreloadConfig {
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath requested) {
    kernels::MoeConfig c =
        kernels::DefaultMoeConfig::select(s, kPath == kernels::MoePath::kAuto ? requested : kPath);
    if (c.path == kernels::MoePath::kDecode && c.tile_tokens == 8 &&
        32 * kernels::decode::preload_pitch(s.intermediate) + 8 * 1024 <= 227 * 1024)
      c.decode_preload = true;
    return c;
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    return kernels::DefaultMoeConfig::select_quantized(s, requested, bits);
  }
};

// DefaultMoeConfig's choices, bf16 (select) and quantized (select_quantized) alike, held to kPath (kAuto: the
// call's path) and then passed through Tweak::apply(shape, config): a configuration that changes one field
// of the default for both precisions.
template <class Tweak, kernels::MoePath kPath = kernels::MoePath::kAuto>
struct DefaultWith {
  static constexpr kernels::MoePath held(kernels::MoePath requested) {
    return kPath == kernels::MoePath::kAuto ? requested : kPath;
  }
  static constexpr kernels::MoeConfig select(const kernels::MoeShape& s, kernels::MoePath requested) {
    return Tweak::apply(s, kernels::DefaultMoeConfig::select(s, held(requested)));
  }
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath requested,
                                                       kernels::quant::Bits bits) {
    return Tweak::apply(s, kernels::DefaultMoeConfig::select_quantized(s, held(requested), bits));
  }
};

// DefaultMoeConfig's choice with the shared chunks' grouped units spread over the first kSpread × their
// count of each call's units (MoeConfig::chunk_spread, moe/unit_order.hpp; 1: first, the tile list's order),
// bf16 and quantized experts.
template <int kSpread>
struct SpreadChunks {
  static constexpr kernels::MoeConfig apply(const kernels::MoeShape&, kernels::MoeConfig c) {
    c.chunk_spread = kSpread;
    return c;
  }
};
template <int kSpread>
using ChunkSpreadConfig = DefaultWith<SpreadChunks<kSpread>>;
inline constexpr int kSpreadAll = 1 << 20;  // chunk_spread past any call's units: over the whole call

// DefaultMoeConfig with the down stage issuing its first W2 loads only after it waits for the gate/up kernel
// (kEarlyWeights = false; PagedMoe's default issues them before in the small-batch grouped GEMM and the
// streaming decode tiles: grouped::gemm_wgmma_small_kernel, decode::gemv_kernel, PagedMoe::early_down).
struct LateWeightsConfig : kernels::DefaultMoeConfig {
  static constexpr bool kEarlyWeights = false;
};

// DefaultMoeConfig's choice with no W2 preloading (MoeConfig::decode_preload off where the default sets it).
struct NoPreload {
  static constexpr kernels::MoeConfig apply(const kernels::MoeShape&, kernels::MoeConfig c) {
    c.decode_preload = false;
    return c;
  }
};
using NoPreloadConfig = DefaultWith<NoPreload>;

// The split-K decode (MoeConfig::decode_splitk) asked for wherever the choice decodes at most kMaxTokens
// tokens.
template <int kMaxTokens>
struct SplitkUpTo {
  static constexpr kernels::MoeConfig apply(const kernels::MoeShape& s, kernels::MoeConfig c) {
    c.decode_splitk = c.path == kernels::MoePath::kDecode && s.num_tokens <= kMaxTokens;
    return c;
  }
};

// DefaultMoeConfig's choice (held to kPath, or by shape with kAuto; bf16 and quantized experts alike) with
// the split-K decode wherever it decodes at most kMaxTokens tokens (the default: at one token).
template <int kMaxTokens = 1, kernels::MoePath kPath = kernels::MoePath::kAuto>
using SplitkConfig = DefaultWith<SplitkUpTo<kMaxTokens>, kPath>;

// SplitkConfig<kMaxTokens, kPath> with the split-K kernel's forms held to kForm0, then kForm1 (0 features:
// none), for every precision (Config::splitk_shapes; the default's are DefaultMoeConfig::splitk_shapes). A
// call none of whose forms fits the device at once runs the decode tiles.
template <kernels::SplitkShape kForm0, kernels::SplitkShape kForm1 = kernels::SplitkShape{},
          int kMaxTokens = 1, kernels::MoePath kPath = kernels::MoePath::kAuto>
struct SplitkFormsConfig : SplitkConfig<kMaxTokens, kPath> {
  static constexpr kernels::SplitkShapes splitk_shapes(int) {
    return {kForm0, kForm1, kernels::SplitkShape{}};
  }
};

// DefaultMoeConfig's choice without the split-K decode (MoeConfig::decode_splitk off): the decode tiles at
// one token, as before the default took it.
struct NoSplitk {
  static constexpr kernels::MoeConfig apply(const kernels::MoeShape&, kernels::MoeConfig c) {
    c.decode_splitk = false;
    return c;
  }
};
using NoSplitkConfig = DefaultWith<NoSplitk>;

}  // namespace amoeba::testing
