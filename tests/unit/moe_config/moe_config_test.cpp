// DefaultMoeConfig (kernels/moe/moe_config.hpp) on the model shapes the kernels are measured on, at every
// token count from 1 to 32768: the rules its comments state hold for every choice, not only for the
// static_assert examples in the header (which this file also compiles on machines without CUDA).
#include "moe/moe_config.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using amoeba::kernels::decode_tile_of;
using amoeba::kernels::DefaultMoeConfig;
using amoeba::kernels::MoeConfig;
using amoeba::kernels::MoePath;
using amoeba::kernels::MoeShape;
using Bits = amoeba::kernels::quant::Bits;

struct Model {
  const char* name;
  MoeShape shape;  // num_tokens set per case
};

const std::vector<Model>& models() {
  static const std::vector<Model> m = {
      {"qwen1.5-moe-a2.7b", {0, 2048, 1408, 60, 4, 0}},
      {"qwen1.5-moe-a2.7b+shared", {0, 2048, 1408, 60, 4, 4}},
      {"qwen3-30b-a3b", {0, 2048, 768, 128, 8, 0}},
      {"mixtral-8x7b", {0, 4096, 14336, 8, 2, 0}},
  };
  return m;
}

// PagedMoe instantiates exactly DefaultMoeConfig::kDecodeTiles / kQuantDecodeTiles by default
// (kernels/moe/paged_moe.cuh, detail::DefaultDecodeTiles and DefaultQuantDecodeTiles).
bool bf16_tile_instantiated(const MoeConfig& c) {
  return DefaultMoeConfig::kDecodeTiles.contains(decode_tile_of(c));
}
bool quant_tile_instantiated(const MoeConfig& c) {
  return DefaultMoeConfig::kQuantDecodeTiles.contains(decode_tile_of(c));
}

}  // namespace

TEST_CASE("bf16: decode below one token per routed expert, grouped from there, never back", "[moe_config]") {
  for (const Model& m : models()) {
    INFO(m.name);
    bool grouped_seen = false, wide_seen = false;
    int last_grouped_tile = 0;
    for (int t = 1; t <= 32768; ++t) {
      MoeShape s = m.shape;
      s.num_tokens = t;
      const MoeConfig c = DefaultMoeConfig::select(s, MoePath::kAuto);
      INFO("T=" << t);
      const bool below_one = static_cast<long long>(t) * s.top_k < s.num_experts;
      CHECK((c.path == MoePath::kDecode) == below_one);
      CHECK(c.decode_stages == 0);  // bf16 tiles are never staged
      if (c.path == MoePath::kDecode) {
        CHECK_FALSE(grouped_seen);
        CHECK(bf16_tile_instantiated(c));
        // A tile smaller than the largest decode tile must hold any expert's batch, which can reach T (shared
        // chunks always do): an expert that overflows it is read once per tile.
        if (c.tile_tokens < DefaultMoeConfig::kDecodeTile) CHECK(t <= c.tile_tokens);
        // K is split over the warps in 32-value steps.
        CHECK(s.hidden % (32 * c.decode_warps) == 0);
        CHECK(s.intermediate % (32 * c.decode_warps) == 0);
        // W2 preloaded on 8-token tiles where every down block's padded rows (one tile per routed expert and
        // shared chunk) fit kPreloadBytes at once: here Qwen3 and Qwen1.5's routed experts at 1 token only.
        const long long tiles =
            std::min<long long>(static_cast<long long>(t) * s.top_k, s.num_experts) + s.num_shared_chunks;
        const bool fits = tiles * s.hidden * (2LL * s.intermediate + 16) <= DefaultMoeConfig::kPreloadBytes;
        CHECK(c.decode_preload == (c.tile_tokens == 8 && fits));
        CHECK(c.decode_preload == (t == 1 && s.num_shared_chunks == 0 && s.intermediate < 8192));
        // The split-K decode is asked for at one token on every measured model (H a multiple of 256, at most
        // 32 slots); PagedMoe takes it where its clusters fit the device at once.
        CHECK(c.decode_splitk == (t == 1));
      } else {
        CHECK_FALSE(c.decode_preload);
        CHECK_FALSE(c.decode_splitk);
        // 64-token tiles while a uniform router's largest batch (mean + 3σ + 1) fits them, on 128-row blocks;
        // 128-token tiles on the TMA kernel's 256-row blocks (H a multiple of 256) from there on, never back.
        const double mean = static_cast<double>(t) * s.top_k / s.num_experts;
        const bool fits64 = mean + 3.0 * std::sqrt(mean) + 1.0 <= 64.0;
        CHECK(c.tile_tokens == (fits64 ? 64 : 128));
        CHECK(c.grouped_rows == (fits64 || s.hidden % 256 != 0 ? 128 : 256));
        // 64-token tiles of huge experts (Mixtral) from a mean batch of 2 on 8 stages, one block per SM.
        CHECK(c.small_deep == (fits64 && s.intermediate >= DefaultMoeConfig::kDeepSmallIntermediate &&
                               mean >= DefaultMoeConfig::kDeepSmallMeanBatch));
        if (grouped_seen && c.tile_tokens == 64) CHECK(last_grouped_tile == 64);
        last_grouped_tile = c.tile_tokens;
        grouped_seen = true;
        if (wide_seen) CHECK(c.grouped_rows == 256);
        wide_seen = wide_seen || c.grouped_rows == 256;
      }
    }
    CHECK(grouped_seen);
  }
}

TEST_CASE("bf16: the decode path asked for at any size names an instantiated tile", "[moe_config]") {
  for (const Model& m : models())
    for (int t : {1, 3, 8, 14, 16, 33, 64, 256, 1024, 4096, 16384}) {
      MoeShape s = m.shape;
      s.num_tokens = t;
      const MoeConfig c = DefaultMoeConfig::select(s, MoePath::kDecode);
      INFO(m.name << " T=" << t);
      CHECK(c.path == MoePath::kDecode);
      CHECK(bf16_tile_instantiated(c));
      CHECK(s.hidden % (32 * c.decode_warps) == 0);
      CHECK(s.intermediate % (32 * c.decode_warps) == 0);
    }
}

TEST_CASE("quantized: decode up to a crossover, grouped from there, never back", "[moe_config]") {
  for (const Model& m : models())
    for (const Bits bits : {Bits::kInt8, Bits::kInt4}) {
      INFO(m.name << " int" << amoeba::kernels::quant::bit_count(bits));
      bool grouped_seen = false;
      int last_decoded = 0;
      for (int t = 1; t <= 32768; ++t) {
        MoeShape s = m.shape;
        s.num_tokens = t;
        const MoeConfig c = DefaultMoeConfig::select_quantized(s, MoePath::kAuto, bits);
        INFO("T=" << t);
        if (c.path == MoePath::kDecode) {
          CHECK_FALSE(grouped_seen);
          CHECK(quant_tile_instantiated(c));
          CHECK_FALSE(c.decode_preload);  // bf16 only
          // The split-K decode: int8 and int4 at one token (where H % 256 == 0, as bf16's rule).
          CHECK(c.decode_splitk == (t == 1 && s.hidden % 256 == 0));
          // Staged: int8 on every decode tile, 2-4 k-steps in flight, more where fewer slots are routed (3
          // only on 8-token tiles: Mixtral's 16-token tiles from 17 tokens take 2).
          if (bits == Bits::kInt8) {
            const long long slots = static_cast<long long>(t) * s.top_k;
            CHECK(c.decode_unroll == 1);
            CHECK(c.decode_stages == (slots <= 8 ? 4 : slots <= 64 && c.tile_tokens == 8 ? 3 : 2));
          } else {  // int4: 2 stages on huge experts' 8-token rows only
            CHECK(c.decode_stages == (s.intermediate >= 8192 && c.tile_tokens == 8 ? 2 : 0));
          }
          // The down stage on its own warps: on 8-token tiles only, its tile instantiated too.
          if (c.decode_down_warps != 0) {
            CHECK(c.tile_tokens == 8);
            CHECK(quant_tile_instantiated(amoeba::kernels::down_tile_config(c)));
          }
          // int8 and int4 run the same tile, stages and down warps apart, but for int4 on experts below
          // F = 8192 past 64 routed slots: 8-token tiles on 2 warps in both stages.
          const long long slots = static_cast<long long>(t) * s.top_k;
          const bool int4_row = s.intermediate < 8192 && slots > 64;
          MoeConfig other = DefaultMoeConfig::select_quantized(
              s, MoePath::kAuto, bits == Bits::kInt8 ? Bits::kInt4 : Bits::kInt8);
          const MoeConfig& int4 = bits == Bits::kInt4 ? c : other;
          if (int4_row) {
            CHECK(int4 == MoeConfig{MoePath::kDecode, 8, 2, 1});
          } else {
            other.decode_stages = c.decode_stages;
            other.decode_down_warps = c.decode_down_warps;
            other.decode_splitk = c.decode_splitk;
            CHECK(other == c);
          }
          last_decoded = t;
        } else {
          CHECK(c.path == MoePath::kGrouped);
          // bf16's rule: the TMA kernel (256 rows) past a mean routed batch of 64 where H % 256 == 0; below
          // it, up to a mean of 36, the same kernel on 32-token units (grouped from a mean of 14, or where
          // shared chunks end the decode path; with shared chunks up to 256 tokens); the two-block kernel
          // between and where H is no multiple of 256.
          const double mean = static_cast<double>(t) * s.top_k / s.num_experts;
          const bool fits64 = mean + 3.0 * std::sqrt(mean) + 1.0 <= 64.0;
          const bool tma = s.hidden % 256 == 0;
          const bool small =
              tma && fits64 && mean <= DefaultMoeConfig::kQuantTmaSmallMaxMeanBatch &&
              (m.shape.num_shared_chunks == 0 || t <= DefaultMoeConfig::kQuantTmaSmallSharedTokens);
          CHECK(c.grouped_rows == (tma && (!fits64 || small) ? 256 : 128));
          CHECK(c.tile_tokens == (small ? DefaultMoeConfig::kQuantTmaSmallTile : 128));
          if (m.shape.num_shared_chunks == 0 && small)
            CHECK(mean >= DefaultMoeConfig::kQuantTmaSmallMeanBatch);
          grouped_seen = true;
        }
      }
      // Shared chunks take every token: decoded up to kQuantSharedDecodeTokens at most.
      if (m.shape.num_shared_chunks > 0) CHECK(last_decoded <= DefaultMoeConfig::kQuantSharedDecodeTokens);
      CHECK(last_decoded > 0);
      CHECK(grouped_seen);
    }
}

// The shared chunks' unit order (MoeConfig::chunk_spread): spread over twice their units only on the grouped
// path of a layer with chunks, at kChunkSpreadMinTokens..kChunkSpreadMaxTokens tokens (bf16) and
// ..kQuantChunkSpreadMaxTokens (int8, int4); first (1) everywhere else, every precision, every path.
TEST_CASE("chunk spread: twice the chunks' units inside the measured ranges, first elsewhere",
          "[moe_config]") {
  for (const Model& m : models()) {
    for (int t = 1; t <= 32768; ++t) {
      MoeShape s = m.shape;
      s.num_tokens = t;
      for (MoePath requested : {MoePath::kAuto, MoePath::kDecode, MoePath::kGrouped}) {
        INFO(m.name << " T=" << t << " path " << static_cast<int>(requested));
        const MoeConfig b = DefaultMoeConfig::select(s, requested);
        const bool bf16_range =
            t >= DefaultMoeConfig::kChunkSpreadMinTokens && t <= DefaultMoeConfig::kChunkSpreadMaxTokens;
        const bool quant_range =
            t >= DefaultMoeConfig::kChunkSpreadMinTokens && t <= DefaultMoeConfig::kQuantChunkSpreadMaxTokens;
        const bool chunks = s.num_shared_chunks > 0;
        REQUIRE(b.chunk_spread == (chunks && b.path != MoePath::kDecode && bf16_range ? 2 : 1));
        for (Bits bits : {Bits::kInt8, Bits::kInt4}) {
          const MoeConfig q = DefaultMoeConfig::select_quantized(s, requested, bits);
          REQUIRE(q.chunk_spread == (chunks && q.path != MoePath::kDecode && quant_range ? 2 : 1));
        }
      }
    }
  }
}

TEST_CASE("DequantPrefillMoeConfig: the default's choice, on a bf16 copy only for grouped prefills >= 16384",
          "[moe_config]") {
  using amoeba::kernels::DequantPrefillMoeConfig;
  static_assert(DequantPrefillMoeConfig::kDequantWorkspace);
  std::vector<Model> all = models();
  all.push_back({"h2176", {0, 2176, 768, 128, 8, 0}});  // H not a multiple of 256: never copied
  for (const Model& m : all)
    for (const Bits bits : {Bits::kInt8, Bits::kInt4})
      for (int t : {1, 64, 1024, 4096, 16383, 16384, 32768, 65536}) {
        MoeShape s = m.shape;
        s.num_tokens = t;
        INFO(m.name << " int" << amoeba::kernels::quant::bit_count(bits) << " T=" << t);
        const MoeConfig base = DefaultMoeConfig::select_quantized(s, MoePath::kAuto, bits);
        const MoeConfig c = DequantPrefillMoeConfig::select_quantized(s, MoePath::kAuto, bits);
        const bool copied = base.path == MoePath::kGrouped && t >= 16384 && s.hidden % 256 == 0;
        CHECK(c.grouped_dequant == copied);
        if (copied) {  // the bf16 TMA kernel's blocks and tiles; everything else the default's
          CHECK(c.grouped_rows == 256);
          CHECK(c.tile_tokens == 128);
          MoeConfig rest = c;
          rest.grouped_dequant = false;
          rest.grouped_rows = base.grouped_rows;
          rest.tile_tokens = base.tile_tokens;
          CHECK(rest == base);
        } else {
          CHECK(c == base);
        }
        // bf16 experts keep the default's choice (select is DefaultMoeConfig's).
        CHECK(DequantPrefillMoeConfig::select(s, MoePath::kAuto) ==
              DefaultMoeConfig::select(s, MoePath::kAuto));
        // The decode path when asked for stays the decode path.
        CHECK_FALSE(DequantPrefillMoeConfig::select_quantized(s, MoePath::kDecode, bits).grouped_dequant);
      }
}

// A configuration that names its own split-K forms, and one that names none (DefaultMoeConfig's then).
struct OneSplitkForm {
  static constexpr amoeba::kernels::SplitkShapes splitk_shapes(int bits) {
    return {amoeba::kernels::SplitkShape{bits == 16 ? 64 : 128, 2, 7}, {}, {}};
  }
};
struct NoSplitkForms {};

TEST_CASE("split-K forms: the configuration's where it names them, else the default's", "[moe_config]") {
  using amoeba::kernels::splitk_shapes_of;
  using amoeba::kernels::SplitkShape;
  STATIC_REQUIRE(amoeba::kernels::splitk_shapes_config<OneSplitkForm>);
  STATIC_REQUIRE_FALSE(amoeba::kernels::splitk_shapes_config<NoSplitkForms>);
  CHECK(splitk_shapes_of<OneSplitkForm>(16)[0] == SplitkShape{64, 2, 7});
  CHECK(splitk_shapes_of<OneSplitkForm>(4)[0] == SplitkShape{128, 2, 7});
  CHECK(splitk_shapes_of<OneSplitkForm>(8)[1].features == 0);
  for (int bits : {16, 8, 4}) {
    INFO("bits " << bits);
    CHECK(splitk_shapes_of<NoSplitkForms>(bits) == DefaultMoeConfig::splitk_shapes(bits));
    // Every default form is one the kernel has: 64 or 128 features (0: none), one warp or a pair per
    // feature group.
    const auto forms = DefaultMoeConfig::splitk_shapes(bits);
    CHECK(forms[0].features != 0);
    for (const SplitkShape& f : forms) {
      CHECK((f.features == 0 || f.features == 64 || f.features == 128));
      CHECK((f.h_split == 1 || f.h_split == 2));
      CHECK(f.min_clusters >= 0);
      // mma.sync only for quantized experts on 8 features per warp (128 features).
      CHECK((!f.mma || (bits != 16 && f.features == 128)));
    }
  }
  // bf16 and int4: 128 features in pairs from 32 clusters (int4's on mma.sync), else 64 on 4 warps; int8:
  // 64 in pairs, 128 in pairs, 128 on 4 warps, all on fmas.
  CHECK(DefaultMoeConfig::splitk_shapes(16)[0] == SplitkShape{128, 2, 32});
  CHECK(DefaultMoeConfig::splitk_shapes(4)[0] == SplitkShape{128, 2, 32, 0, true});
  CHECK(DefaultMoeConfig::splitk_shapes(4)[0].kernel_form() == SplitkShape{128, 2, 0, 0, true});
  for (int bits : {16, 4}) CHECK(DefaultMoeConfig::splitk_shapes(bits)[1] == SplitkShape{64, 1, 0});
  CHECK(DefaultMoeConfig::splitk_shapes(8) ==
        amoeba::kernels::SplitkShapes{SplitkShape{64, 2}, SplitkShape{128, 2}, SplitkShape{128, 1}});
}

TEST_CASE("split-K forms: a call takes the first that divides F, serves H, reaches min_clusters and fits",
          "[moe_config]") {
  using amoeba::kernels::splitk_form_for;
  using amoeba::kernels::SplitkShape;
  using amoeba::kernels::SplitkShapes;
  const SplitkShapes bf16 = DefaultMoeConfig::splitk_shapes(16);  // {128, 2, 32}, {64, 1}
  auto hidden_of = [](int) { return 64; };
  std::vector<int> asked;  // the forms whose capacity was asked, in order
  auto at_once = [&](long long c0, long long c1) {
    return [&asked, c0, c1](int i) {
      asked.push_back(i);
      return i == 0 ? c0 : c1;
    };
  };
  const MoeShape qwen3{1, 2048, 768, 128, 8, 0};  // 48 clusters of 128, 96 of 64
  CHECK(splitk_form_for(bf16, qwen3, hidden_of, at_once(62, 124)) == 0);
  CHECK(splitk_form_for(bf16, qwen3, hidden_of, at_once(47, 124)) == 1);  // 48 of 128 do not fit
  CHECK(splitk_form_for(bf16, qwen3, hidden_of, at_once(47, 95)) == -1);  // nor 96 of 64: decode tiles
  asked.clear();
  const MoeShape tiny{1, 256, 128, 128, 8, 0};  // 8 clusters of 128: below min_clusters, 16 of 64
  CHECK(splitk_form_for(bf16, tiny, hidden_of, at_once(62, 124)) == 1);
  CHECK(asked == std::vector<int>{1});  // the device is asked only about a form that passes the rest
  asked.clear();
  const MoeShape f192{1, 2048, 192, 128, 8, 0};  // 192 is no multiple of 128
  CHECK(splitk_form_for(bf16, f192, hidden_of, at_once(1000, 1000)) == 1);
  CHECK(asked == std::vector<int>{1});
  // A form whose min_hidden H does not reach is skipped (int8 on 64 features in pairs needs 256).
  const SplitkShapes int8 = DefaultMoeConfig::splitk_shapes(8);
  auto int8_hidden = [](int i) { return i == 0 ? 256 : 128; };
  CHECK(splitk_form_for(int8, MoeShape{1, 128, 128, 8, 2, 0}, int8_hidden, at_once(100, 100)) == 1);
  CHECK(splitk_form_for(int8, MoeShape{1, 64, 128, 8, 2, 0}, int8_hidden, at_once(100, 100)) == -1);

  // Randomized: the form returned meets every condition, and every earlier form fails one.
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  auto next = [&x](int n) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<int>(x % static_cast<std::uint64_t>(n));
  };
  for (int trial = 0; trial < 2000; ++trial) {
    SplitkShapes forms{};
    for (SplitkShape& f : forms)
      f = {next(4) == 0 ? 0 : 64 << next(3), 1 + next(2), next(3) == 0 ? 0 : next(64)};
    const std::array<int, 3> min_h{64 << next(3), 64 << next(3), 64 << next(3)};
    const std::array<long long, 3> cap{next(200), next(200), next(200)};
    const MoeShape s{1 + next(3), 128 * (1 + next(8)), 64 * (1 + next(24)), 64, 1 + next(8), next(3)};
    auto conditions = [&](int i) {
      const SplitkShape& f = forms[static_cast<std::size_t>(i)];
      if (f.features == 0 || s.intermediate % f.features != 0 ||
          s.hidden < min_h[static_cast<std::size_t>(i)])
        return false;
      const long long need =
          static_cast<long long>(s.num_tokens) * s.slots_per_token() * (s.intermediate / f.features);
      return need >= f.min_clusters && need <= cap[static_cast<std::size_t>(i)];
    };
    const int got = splitk_form_for(
        forms, s, [&](int i) { return min_h[static_cast<std::size_t>(i)]; },
        [&](int i) { return cap[static_cast<std::size_t>(i)]; });
    INFO("trial " << trial);
    REQUIRE(got >= -1);
    REQUIRE(got < 3);
    for (int i = 0; i < (got < 0 ? 3 : got); ++i) CHECK_FALSE(conditions(i));
    if (got >= 0) CHECK(conditions(got));
  }
}
