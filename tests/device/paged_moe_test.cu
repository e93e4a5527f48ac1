// Device tests of PagedMoe: paged and contiguous addressing, decode and grouped paths, against the double CPU
// reference (small token counts) and the fp32 GPU reference (sampled tokens), on random data with poisoned
// outputs, experts on shuffled pool pages and in a load buffer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "moe/paged_moe.cuh"
#include "moe_configs.hpp"
#include "moe_device_fixture.cuh"
#include "moe_runner.cuh"
#include "reference/moe_reference.hpp"
#include "reference/moe_reference_kernel.cuh"

namespace {

using namespace amoeba;
using namespace amoeba::testing;
using kernels::MoePath;
using kernels::PagedMoe;
using reference::bf16_to_float;

std::size_t count_nonfinite(const std::vector<std::uint16_t>& v) {
  std::size_t n = 0;
  for (std::uint16_t b : v) n += !std::isfinite(bf16_to_float(b));
  return n;
}

// Double CPU reference over all tokens.
std::vector<double> cpu_reference(ExpertStore& store, const RoutingSet& r, const MoeShape& shape,
                                  bool with_shared_weights) {
  std::vector<std::uint16_t> x(static_cast<std::size_t>(shape.num_tokens) * shape.hidden);
  AMOEBA_CUDA_CHECK(cudaMemcpy(x.data(), r.x.get(), x.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<reference::ExpertMatrices> experts(shape.total_experts());
  std::vector<char> needed(shape.total_experts(), 0);
  for (int id : r.ids_host) needed[id] = 1;
  for (int e = shape.num_experts; e < shape.total_experts(); ++e) needed[e] = 1;
  static const std::uint16_t dummy[1] = {0};
  for (int e = 0; e < shape.total_experts(); ++e) {
    if (!needed[e]) {
      experts[e] = {dummy, dummy, dummy};
      continue;
    }
    const auto& m = store.host_expert(e);
    const std::size_t me = store.matrix_elems();
    experts[e] = {m.data(), m.data() + me, m.data() + 2 * me};
  }
  reference::MoeReferenceInputs in{
      shape,
      x,
      r.ids_host,
      r.weights_host,
      with_shared_weights ? std::span<const float>(r.shared_host) : std::span<const float>(),
      experts};
  REQUIRE(reference::check(in).ok);
  std::vector<double> out(x.size());
  reference::moe_reference(in, out);
  return out;
}

// fp32 GPU reference over sampled tokens; returns {sampled token ids, [n, H] values}.
std::pair<std::vector<int>, std::vector<float>> gpu_reference(const ExpertStore& store, const RoutingSet& r,
                                                              const MoeShape& shape, bool with_shared_weights,
                                                              int max_samples) {
  std::vector<int> tokens;
  const int n = std::min(shape.num_tokens, max_samples);
  for (int i = 0; i < n; ++i)
    tokens.push_back(
        static_cast<int>(static_cast<long long>(i) * (shape.num_tokens - 1) / std::max(1, n - 1)));
  DeviceBuffer<int> d_tokens(tokens.size());
  d_tokens.upload(tokens);
  DeviceBuffer<float> act(static_cast<std::size_t>(n) * shape.slots_per_token() * shape.intermediate);
  DeviceBuffer<float> out(static_cast<std::size_t>(n) * shape.hidden);
  reference::GpuReferenceParams p{store.reference_table(),
                                  r.x.get(),
                                  r.ids.get(),
                                  r.weights.get(),
                                  with_shared_weights ? r.shared.get() : nullptr,
                                  d_tokens.get(),
                                  n,
                                  shape.hidden,
                                  shape.intermediate,
                                  shape.num_experts,
                                  shape.top_k,
                                  shape.slots_per_token(),
                                  act.get(),
                                  out.get()};
  AMOEBA_CUDA_CHECK(reference::run_reference(p, nullptr));
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  return {tokens, out.download()};
}

double rel_error_rows(const std::vector<std::uint16_t>& out, const std::vector<int>& tokens,
                      const std::vector<float>& ref, int hidden) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int h = 0; h < hidden; ++h) {
      const double a = bf16_to_float(out[static_cast<std::size_t>(tokens[i]) * hidden + h]);
      const double b = ref[i * hidden + h];
      num += (a - b) * (a - b);
      den += b * b;
    }
  return std::sqrt(num / den);
}

// Per element: |out - ref| <= kAbs·rms(ref) + kRel·|ref|. Returns the largest left/right ratio (must be <=
// 1). bf16 rounding of the intermediate, of each slot's down projection and of the output gives errors of a
// few 1e-3 of the typical magnitude; a wrong or missing element is off by O(rms).
constexpr double kAbs = 4e-2, kRel = 1e-2;
double worst_element(const std::vector<std::uint16_t>& out, const std::vector<int>& tokens,
                     const std::vector<double>& ref, int hidden) {
  double sq = 0;
  for (double v : ref) sq += v * v;
  const double rms = std::sqrt(sq / static_cast<double>(ref.size()));
  double worst = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int h = 0; h < hidden; ++h) {
      const double a = bf16_to_float(out[static_cast<std::size_t>(tokens[i]) * hidden + h]);
      const double b = ref[i * hidden + h];
      worst = std::max(worst, std::abs(a - b) / (kAbs * rms + kRel * std::abs(b)));
    }
  return worst;
}

double rel_error_all(const std::vector<std::uint16_t>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double a = bf16_to_float(out[i]);
    num += (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

const char* path_name(MoePath p) {
  return p == MoePath::kDecode       ? "decode"
         : p == MoePath::kGrouped    ? "grouped"
         : p == MoePath::kGroupedMma ? "mma"
                                     : "auto";
}

// Runs one case on both addressings and checks everything; returns the paged output.
// With `hot_expert` >= 0, half the tokens route to that expert (skewed routing).
template <class Config = kernels::DefaultMoeConfig>
std::vector<std::uint16_t> check_case(ExpertStore& store, const MoeShape& shape, MoePath path, bool cpu_check,
                                      int gpu_samples, std::uint64_t seed, int hot_expert = -1) {
  const bool with_shared_weights = shape.num_shared_chunks > 0;
  RoutingSet r = make_routing(store.spec(), shape.num_tokens, seed, hot_expert);
  Runner<kernels::Paged, Config> paged;
  Runner<kernels::Contiguous, Config> contiguous;
  const auto out_p = paged.run(r, shape, store.paged_args(), path, with_shared_weights);
  const auto out_c = contiguous.run(r, shape, store.contiguous_args(), path, with_shared_weights);
  const kernels::MoeConfig chosen = PagedMoe<kernels::Paged, Config>::config(paged.args);
  INFO(store.spec().name << " T=" << shape.num_tokens << " path=" << path_name(chosen.path)
                         << " tile=" << chosen.tile_tokens);
  CHECK(count_nonfinite(out_p) == 0);
  CHECK(count_nonfinite(out_c) == 0);
  // Same instructions on the same values: paged and contiguous agree bit for bit.
  CHECK(std::memcmp(out_p.data(), out_c.data(), out_p.size() * 2) == 0);
  const auto [tokens, gref] = gpu_reference(store, r, shape, with_shared_weights, gpu_samples);
  const double err_gpu = rel_error_rows(out_p, tokens, gref, shape.hidden);
  const double worst_gpu =
      worst_element(out_p, tokens, std::vector<double>(gref.begin(), gref.end()), shape.hidden);
  double err_cpu = -1, worst_cpu = -1;
  if (cpu_check) {
    const auto cref = cpu_reference(store, r, shape, with_shared_weights);
    err_cpu = rel_error_all(out_p, cref);
    std::vector<int> all(shape.num_tokens);
    std::iota(all.begin(), all.end(), 0);
    worst_cpu = worst_element(out_p, all, cref, shape.hidden);
    CHECK(worst_cpu <= 1.0);
    // The fp32 GPU reference itself agrees with the double one far below bf16 rounding.
    std::vector<double> sampled;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      for (int h = 0; h < shape.hidden; ++h)
        sampled.push_back(cref[static_cast<std::size_t>(tokens[i]) * shape.hidden + h]);
    CHECK(reference::relative_l2_error(gref, sampled) < 1e-4);
    CHECK(err_cpu <= 1e-2);
  }
  std::printf(
      "  %-26s T=%-6d path=%-8s tile=%-4d%s rel_err gpu_ref=%.3e cpu_ref=%.3e  worst element/tol gpu=%.3f "
      "cpu=%.3f\n",
      store.spec().name, shape.num_tokens, path_name(chosen.path), chosen.tile_tokens,
      hot_expert >= 0 ? " skewed" : "", err_gpu, err_cpu, worst_gpu, worst_cpu);
  CHECK(err_gpu <= 1e-2);
  CHECK(worst_gpu <= 1.0);
  return out_p;
}

}  // namespace

TEST_CASE("small shapes against the CPU reference, both paths and addressings", "[gpu][small]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  const ModelSpec tiny_routed{"tiny", 8, 2, 256, 128, 0};
  // More than 8 slots per token (the combine's second batch of 8): routed slots 8 and 9 and the chunk there
  // (k = 10, m = 1), or chunks in both batches (k = 6, m = 4).
  const ModelSpec tiny_k10{"tiny-k10-shared", 16, 10, 256, 128, 1};
  const ModelSpec tiny_m4{"tiny-k6-m4", 16, 6, 256, 128, 4};
  for (const ModelSpec& spec : {tiny, tiny_routed, tiny_k10, tiny_m4}) {
    ExpertStore store(spec, 7, 3);
    for (int tokens : {1, 5, 37, 300})
      for (MoePath path : {MoePath::kDecode, MoePath::kGrouped, MoePath::kGroupedMma})
        check_case(store, shape_of(spec, tokens), path, true, 64, 100 + tokens);
  }
}

TEST_CASE("model shapes at every token count", "[gpu][models]") {
  struct Case {
    ModelSpec spec;
    int cpu_max_tokens;
  };
  for (const Case& c :
       {Case{kQwen15, 16}, Case{kQwen3, 16}, Case{kMixtral, 3}, Case{kQwen3Next, 16}, Case{kQwen2Large, 3}}) {
    ExpertStore store(c.spec, 11);
    std::printf("%s: %d of %d experts in the load buffer\n", c.spec.name, store.num_buffered(),
                shape_of(c.spec, 0).total_experts());
    for (int tokens : {1, 3, 16, 33, 64, 256, 1024, 4096, 16384}) {
      const MoeShape shape = shape_of(c.spec, tokens);
      check_case(store, shape, MoePath::kAuto, tokens <= c.cpu_max_tokens, 48, 1000 + tokens);
      if (tokens == 33 || tokens == 1024) {  // the other paths too, where they are plausible
        check_case(store, shape, tokens == 33 ? MoePath::kGrouped : MoePath::kDecode, false, 48,
                   2000 + tokens);
        check_case(store, shape, MoePath::kGroupedMma, false, 48, 3000 + tokens);
      }
    }
  }
}

// One routing call's device buffers and parameters, as the routing tests set them up: the top-k `ids` of T
// tokens over E routed experts, m shared chunks, tiles of `tile` rows, contiguous experts at a base that is
// never dereferenced (the tiles' matrices are compared as addresses). `large`: with the large path's keys and
// per-block counts.
struct RoutingCall {
  static constexpr std::int64_t kElems = 1024;
  const bf16* weights = reinterpret_cast<const bf16*>(std::uintptr_t{1} << 20);
  DeviceBuffer<std::int32_t> ids;
  DeviceBuffer<int> sorted, offsets, num_tiles{1}, counters{2}, keys, vals;
  DeviceBuffer<kernels::WorkTile> tiles;
  kernels::routing::RoutingParams<kernels::Contiguous> r{};

  RoutingCall(const std::vector<std::int32_t>& h_ids, int E, int m, int k, int T, int tile, bool large)
      : ids(h_ids.size()),
        sorted(static_cast<std::size_t>(T) * (k + m)),
        offsets(E + m + 1),
        keys(large ? static_cast<std::size_t>(T) * (k + m) : 0),
        vals(large ? static_cast<std::size_t>(T) * (k + m) : 0),
        tiles(static_cast<std::size_t>(T) * (k + m) / tile + E + m + 1) {
    ids.upload(h_ids);
    r.moe.addr = kernels::Contiguous::make_params({weights}, kElems);
    r.moe.topk_ids = ids.get();
    r.moe.num_tokens = T;
    r.moe.num_experts = E;
    r.moe.top_k = k;
    r.moe.slots_per_token = k + m;
    r.moe.num_slots = T * (k + m);
    r.moe.unit_counters = counters.get();
    r.total_experts = E + m;
    r.tile_rows = tile;
    r.sorted_slot = sorted.get();
    r.expert_offset = offsets.get();
    r.tiles = tiles.get();
    r.num_tiles = num_tiles.get();
    r.keys = keys.get();
    r.vals = vals.get();
  }
  const bf16* matrix(int e, int j) const { return weights + (3 * e + j) * kElems; }

  // After the call, the tile list against each expert's row count: the shared chunks' tiles first, then the
  // routed experts' in order; each expert's tiles consecutive, covering its rows from its offset in
  // tile-sized pieces, with its matrices; and the number of tiles.
  void check_tiles(const std::vector<int>& count) const {
    const auto list = tiles.download();
    const auto offset = offsets.download();
    const int E = r.moe.num_experts, m = r.total_experts - E, tile = r.tile_rows;
    std::vector<int> order;  // E, ..., E+m-1, 0, ..., E-1
    for (int c = 0; c < m; ++c) order.push_back(E + c);
    for (int e = 0; e < E; ++e) order.push_back(e);
    int next = 0;
    for (const int e : order) {
      INFO("tiles of expert " << e);
      const int n = (count[e] + tile - 1) / tile;
      for (int i = 0; i < n; ++i) {
        const kernels::WorkTile& t = list[next + i];
        CHECK(t.expert == e);
        CHECK(t.first_tile == next);
        CHECK(t.expert_tiles == n);
        CHECK(t.row_start == offset[e] + i * tile);
        CHECK(t.count == std::min(tile, count[e] - i * tile));
        for (int j = 0; j < 3; ++j) CHECK(t.matrix[j] == matrix(e, j));
      }
      next += n;
    }
    CHECK(num_tiles.download()[0] == next);
  }
};

// The routing kernel's tile list: the shared chunks' tiles first, then the routed experts' in order; each
// expert's tiles consecutive, covering its rows of the expert-sorted order in tile-sized pieces, with its
// resolved matrices.
TEST_CASE("routing lists the shared chunks' tiles first, then the routed experts' in order", "[gpu][small]") {
  constexpr int E = 6, m = 2, k = 2, T = 50, kTile = 8;
  std::vector<std::int32_t> ids(T * k);
  for (int i = 0; i < T * k; ++i) ids[i] = (i * 7 + i / 3) % (E + 1);  // id E: outside [0, E), dropped
  std::vector<int> count(E + m, 0);
  for (const int id : ids)
    if (id < E) ++count[id];
  for (int c = 0; c < m; ++c) count[E + c] = T;
  const RoutingCall call(ids, E, m, k, T, kTile, false);
  kernels::routing::small_kernel<kernels::Contiguous><<<1, kernels::routing::kThreads>>>(call.r);
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto offset = call.offsets.download();
  for (int e = 0; e < E + m; ++e) {
    INFO("expert " << e);
    CHECK(offset[e] == std::accumulate(count.begin(), count.begin() + e, 0));  // rows stay in expert order
  }
  call.check_tiles(count);
}

TEST_CASE("the large routing path: offsets, tiles and each expert's slots, with drops and a hot expert",
          "[gpu][small]") {
  // Above routing::kSmallSlots: routing::launch_large (count_kernel, then place_kernel), over a slot count
  // that is not a multiple of routing::kCountSlots. Expert 3 takes about half the routed slots; ids E and -1
  // are dropped.
  constexpr int E = 40, m = 2, k = 4, T = 5003, kTile = 128;
  constexpr int S = T * (k + m);
  static_assert(S > kernels::routing::kSmallSlots && S % kernels::routing::kCountSlots != 0);
  std::vector<std::int32_t> ids(T * k);
  std::uint32_t x = 12345;
  for (auto& id : ids) {
    x = x * 1664525u + 1013904223u;
    const int v = static_cast<int>(x >> 8) % (2 * E + 2);
    id = v < E ? 3 : v < 2 * E ? v - E : (v == 2 * E ? E : -1);
  }
  std::vector<std::vector<int>> slots_of(E + m);  // the slots of each expert, in slot order
  for (int s = 0; s < S; ++s) {
    const int t = s / (k + m), j = s % (k + m);
    const int e = j < k ? ids[t * k + j] : E + (j - k);
    if (e >= 0 && e < E + m && (j >= k || e < E)) slots_of[e].push_back(s);
  }
  const RoutingCall call(ids, E, m, k, T, kTile, true);
  const int blocks = kernels::routing::count_blocks(S);
  REQUIRE(static_cast<long long>(blocks) * (E + m) <= S);  // the per-block counts fit in vals
  AMOEBA_CUDA_CHECK(kernels::routing::launch_large(call.r, nullptr));
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto offset = call.offsets.download();
  const auto order_out = call.sorted.download();
  CHECK(slots_of[3].size() > static_cast<std::size_t>(T * k / 3));  // the hot expert
  int before = 0;
  for (int e = 0; e < E + m; ++e) {
    INFO("expert " << e);
    REQUIRE(offset[e] == before);  // rows in expert order
    std::vector<int> got(order_out.begin() + before, order_out.begin() + before + slots_of[e].size());
    std::sort(got.begin(), got.end());
    CHECK(got == slots_of[e]);  // the expert's rows are exactly its slots, in any order
    before += static_cast<int>(slots_of[e].size());
  }
  CHECK(offset[E + m] == S);
  std::vector<int> count;
  for (const auto& slots : slots_of) count.push_back(static_cast<int>(slots.size()));
  call.check_tiles(count);
}

TEST_CASE("ids outside [0, E) contribute nothing, zero tokens is a no-op", "[gpu][small]") {
  const ModelSpec spec{"tiny", 8, 2, 256, 128, 0};
  ExpertStore store(spec, 3, 0);
  RoutingSet r = make_routing(spec, 9, 5);
  Runner<kernels::Contiguous> run;
  const MoeShape shape = shape_of(spec, 9);
  const auto full = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  // Drop slot 1 of every token by marking it -1 (and 99): the result equals slot 0 alone with its weight.
  std::vector<std::int32_t> ids = r.ids_host;
  for (int t = 0; t < 9; ++t) ids[2 * t + 1] = (t % 2) ? -1 : 99;
  r.ids.upload(ids);
  const auto dropped = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  std::vector<std::int32_t> single = ids;
  std::vector<float> w = r.weights_host;
  for (int t = 0; t < 9; ++t) single[2 * t + 1] = single[2 * t], w[2 * t + 1] = 0.f;
  r.ids.upload(single);
  r.weights.upload(w);
  const auto ref = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  CHECK(std::memcmp(dropped.data(), ref.data(), ref.size() * 2) == 0);
  CHECK(std::memcmp(dropped.data(), full.data(), full.size() * 2) != 0);

  PagedMoe<kernels::Contiguous>::Arguments empty{};
  empty.shape = shape_of(spec, 0);
  empty.weights = store.contiguous_args();
  REQUIRE(PagedMoe<kernels::Contiguous>::can_implement(empty).ok);
  CHECK(PagedMoe<kernels::Contiguous>{}.run(empty, nullptr, 0, nullptr).ok);
}

// Configuration policies can_implement must refuse: a decode tile the kernels do not have, 8 warps where H or
// F is not a multiple of 256, a grouped tile other than 128 or 64 (64: kGrouped, 128-row blocks, bf16 only),
// a staged decode tile on bf16 experts ...
struct BadTileConfig {
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) { return {MoePath::kDecode, 24}; }
};
struct EightWarpsConfig {  // an instantiated tile (DefaultDecodeTiles): 8 tokens, 8 warps, 2 k-steps
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) { return {MoePath::kDecode, 8, 8, 2}; }
};
struct BadGroupedConfig {
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) { return {MoePath::kGrouped, 96}; }
};
template <MoePath kPath, int kRows>
struct SmallTileConfig {
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) {
    return {kPath, 64, 4, 1, 128, kRows};
  }
  static constexpr kernels::MoeConfig select_quantized(const MoeShape&, MoePath, kernels::quant::Bits) {
    return {kPath, 64, 4, 1, 128, kRows};
  }
};
struct StagedBf16Config {
  using DecodeTiles = std::tuple<kernels::decode::Tile<1, 4, 1, 128, 3>>;
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) {
    return {MoePath::kDecode, 8, 4, 1, 128, 128, 3};
  }
};
template <int kTile>
struct PreloadRuleConfig {  // W2 preloading asked for on a kTile-token decode tile
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) {
    kernels::MoeConfig c{MoePath::kDecode, kTile, 4, kTile == 8 ? 2 : 1};
    c.decode_preload = true;
    return c;
  }
};
struct AlwaysSplitk {  // the split-K decode asked for whatever the path
  static constexpr kernels::MoeConfig apply(const MoeShape&, kernels::MoeConfig c) {
    c.decode_splitk = true;
    return c;
  }
};
// The split-K decode asked for on kPath, for bf16 and for quantized experts.
template <MoePath kPath = MoePath::kDecode>
using SplitkRuleConfig = DefaultWith<AlwaysSplitk, kPath>;
// A configuration with bf16 choices only (no select_quantized): quantized layers take select()'s choice
// without its split-K decode (whose rule select() measured on bf16 experts).
struct Bf16OnlyConfig {
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    return kernels::DefaultMoeConfig::select(s, requested);
  }
};
static_assert(
    PagedMoe<kernels::Paged, Bf16OnlyConfig>::config({.shape = {1, 2048, 768, 128, 8, 0}}).decode_splitk);
static_assert(!PagedMoe<kernels::Paged, Bf16OnlyConfig, kernels::Int8>::config({.shape = {1, 2048, 768, 128,
                                                                                          8, 0}})
                   .decode_splitk);
struct DeepDecodeConfig {  // 8-stage 64-token grouped tiles asked for on the decode path
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) {
    return {MoePath::kDecode, 8, 4, 2, 128, 128, 0, false, true};
  }
};
// ... and (moe_configs.hpp's GroupedRowsConfig) grouped blocks of other than 128 or 256 weight rows, 256 on
// quantized experts or where H % 256 != 0.

TEST_CASE("can_implement names the field, the value and the rule, for every rule", "[gpu][small]") {
  using P = PagedMoe<kernels::Paged>;
  using C = PagedMoe<kernels::Contiguous>;
  // Aligned, non-null stand-ins: can_implement never dereferences them.
  alignas(16) static bf16 x[16];
  alignas(16) static std::int32_t ids[16];
  alignas(16) static float w[16];
  alignas(16) static ExpertLocation loc[1];
  P::Arguments good{};
  good.shape = MoeShape{4, 2048, 1408, 60, 4, 4};
  good.input = x;
  good.output = x;
  good.topk_ids = ids;
  good.topk_weights = w;
  good.weights = {x, x, loc};
  REQUIRE(P::can_implement(good).ok);

  struct Rule {
    const char* field;
    const char* words;  // part of the message that states the rule
    void (*mutate)(P::Arguments&);
  };
  const char* odd = reinterpret_cast<const char*>(x) + 2;
  static const bf16* misaligned;
  misaligned = reinterpret_cast<const bf16*>(odd);
  const Rule rules[] = {
      {"num_tokens", ">= 0", [](P::Arguments& a) { a.shape.num_tokens = -1; }},
      {"hidden", "> 0", [](P::Arguments& a) { a.shape.hidden = 0; }},
      {"intermediate", "> 0", [](P::Arguments& a) { a.shape.intermediate = 0; }},
      {"num_experts", "> 0", [](P::Arguments& a) { a.shape.num_experts = 0; }},
      {"top_k", "[1, num_experts]", [](P::Arguments& a) { a.shape.top_k = 61; }},
      {"top_k", "[1, num_experts]", [](P::Arguments& a) { a.shape.top_k = 0; }},
      {"num_shared_chunks", ">= 0", [](P::Arguments& a) { a.shape.num_shared_chunks = -1; }},
      {"shape.hidden", "multiple of 128", [](P::Arguments& a) { a.shape.hidden = 2000; }},
      {"shape.intermediate", "multiple of 128", [](P::Arguments& a) { a.shape.intermediate = 1400; }},
      {"shape.num_experts + shape.num_shared_chunks", "<= 1024",
       [](P::Arguments& a) { a.shape.num_experts = 1021; }},
      {"shape.num_tokens", "<= 2^30", [](P::Arguments& a) { a.shape.num_tokens = 1 << 28; }},
      {"shape.num_tokens", "work tiles", [](P::Arguments& a) { a.shape.num_tokens = 100000; }},
      {"input", "must not be null", [](P::Arguments& a) { a.input = nullptr; }},
      {"output", "must not be null", [](P::Arguments& a) { a.output = nullptr; }},
      {"topk_ids", "must not be null", [](P::Arguments& a) { a.topk_ids = nullptr; }},
      {"topk_weights", "must not be null", [](P::Arguments& a) { a.topk_weights = nullptr; }},
      {"input", "16-byte aligned", [](P::Arguments& a) { a.input = misaligned; }},
      {"output", "16-byte aligned", [](P::Arguments& a) { a.output = const_cast<bf16*>(misaligned); }},
      {"weights.pool_base", "must not be null", [](P::Arguments& a) { a.weights.pool_base = nullptr; }},
      {"weights.locations", "must not be null", [](P::Arguments& a) { a.weights.locations = nullptr; }},
      {"weights.pool_base", "16-byte aligned", [](P::Arguments& a) { a.weights.pool_base = misaligned; }},
      {"weights.load_buffer", "16-byte aligned", [](P::Arguments& a) { a.weights.load_buffer = misaligned; }},
  };
  for (const Rule& rule : rules) {
    P::Arguments a = good;
    rule.mutate(a);
    const kernels::Status st = P::can_implement(a);
    INFO("rule " << rule.field << " " << rule.words << ": got '" << st.message << "'");
    CHECK_FALSE(st.ok);
    CHECK(st.field == rule.field);
    CHECK(st.message.find(rule.words) != std::string::npos);
  }
  // The message carries the offending value.
  P::Arguments a = good;
  a.shape.intermediate = 1400;
  CHECK(P::can_implement(a).message.find("1400") != std::string::npos);
  // Zero tokens need no buffers; a load buffer may be null.
  a = good;
  a.shape.num_tokens = 0;
  a.input = nullptr;
  a.output = nullptr;
  a.topk_ids = nullptr;
  a.topk_weights = nullptr;
  a.weights.load_buffer = nullptr;
  CHECK(P::can_implement(a).ok);

  // Contiguous addressing's own rules.
  C::Arguments c{};
  c.shape = good.shape;
  c.input = x;
  c.output = x;
  c.topk_ids = ids;
  c.topk_weights = w;
  c.weights = {x};
  REQUIRE(C::can_implement(c).ok);
  c.weights = {nullptr};
  CHECK(C::can_implement(c).field == "weights.weights");
  c.weights = {misaligned};
  CHECK(C::can_implement(c).message.find("16-byte aligned") != std::string::npos);

  // A configuration policy's tile must be one the kernels have.
  auto fill = [&](auto& args) {
    args.shape = good.shape;
    args.input = x;
    args.output = x;
    args.topk_ids = ids;
    args.topk_weights = w;
    args.weights = good.weights;
  };
  PagedMoe<kernels::Paged, BadTileConfig>::Arguments bad{};
  fill(bad);
  const kernels::Status st = PagedMoe<kernels::Paged, BadTileConfig>::can_implement(bad);
  CHECK(st.field == "config.tile_tokens");
  CHECK(st.message.find("24") != std::string::npos);
  PagedMoe<kernels::Paged, EightWarpsConfig>::Arguments eight{};
  fill(eight);
  const kernels::Status st8 = PagedMoe<kernels::Paged, EightWarpsConfig>::can_implement(eight);  // F = 1408
  CHECK(st8.field == "config.decode_warps");
  CHECK(st8.message.find("32·decode_warps") != std::string::npos);
  eight.shape.intermediate = 1536;
  CHECK(PagedMoe<kernels::Paged, EightWarpsConfig>::can_implement(eight).ok);
  PagedMoe<kernels::Paged, BadGroupedConfig>::Arguments grouped{};
  fill(grouped);
  const kernels::Status stg = PagedMoe<kernels::Paged, BadGroupedConfig>::can_implement(grouped);
  CHECK(stg.field == "config.tile_tokens");
  CHECK(stg.message.find("96") != std::string::npos);
  CHECK(stg.message.find("128") != std::string::npos);
  // 64-token tiles: the sm_90 grouped GEMM's on 128-row blocks of bf16 experts, nowhere else.
  using Small = PagedMoe<kernels::Paged, SmallTileConfig<MoePath::kGrouped, 128>>;
  Small::Arguments small{};
  fill(small);
  CHECK(Small::can_implement(small).ok);
  using SmallMma = PagedMoe<kernels::Paged, SmallTileConfig<MoePath::kGroupedMma, 128>>;
  const kernels::Status stm = SmallMma::can_implement(small);
  CHECK(stm.field == "config.tile_tokens");
  CHECK(stm.message.find("on kGrouped") != std::string::npos);
  using SmallWide = PagedMoe<kernels::Paged, SmallTileConfig<MoePath::kGrouped, 256>>;
  const kernels::Status stw = SmallWide::can_implement(small);
  CHECK(stw.field == "config.grouped_rows");
  CHECK(stw.message.find("64-token") != std::string::npos);
  using SmallInt8 = PagedMoe<kernels::Paged, SmallTileConfig<MoePath::kGrouped, 128>, kernels::Int8>;
  const kernels::Status sts = SmallInt8::can_implement(small);
  CHECK(sts.field == "config.tile_tokens");
  CHECK(sts.message.find("quantized") != std::string::npos);
  using StagedBf16 = PagedMoe<kernels::Paged, StagedBf16Config>;
  const kernels::Status sgd = StagedBf16::can_implement(small);
  CHECK(sgd.field == "config.decode_stages");
  CHECK(sgd.message.find("decode_stages = 3") != std::string::npos);
  CHECK(sgd.message.find("quantized experts only") != std::string::npos);
  // The shared chunks' unit order: chunk_spread at least 1 (1: the tile list's order).
  REQUIRE(PagedMoe<kernels::Paged, ChunkSpreadConfig<1>>::can_implement(small).ok);
  const kernels::Status scs = PagedMoe<kernels::Paged, ChunkSpreadConfig<0>>::can_implement(small);
  CHECK(scs.field == "config.chunk_spread");
  CHECK(scs.message.find("chunk_spread = 0") != std::string::npos);
  CHECK(scs.message.find(">= 1") != std::string::npos);
  // W2 preloading: bf16 experts on 8-token decode tiles whose down block's rows fit its shared memory.
  REQUIRE(PagedMoe<kernels::Paged, PreloadRuleConfig<8>>::can_implement(small).ok);  // F = 1408: 90 KB
  const kernels::Status spt = PagedMoe<kernels::Paged, PreloadRuleConfig<32>>::can_implement(small);
  CHECK(spt.field == "config.decode_preload");
  CHECK(spt.message.find("8-token decode tiles") != std::string::npos);
  const kernels::Status spq =
      PagedMoe<kernels::Paged, PreloadRuleConfig<8>, kernels::Int8>::can_implement(small);
  CHECK(spq.field == "config.decode_preload");
  CHECK(spq.message.find("bf16 experts") != std::string::npos);
  PagedMoe<kernels::Paged, PreloadRuleConfig<8>>::Arguments huge = small;
  huge.shape.intermediate = 14336;  // Mixtral: 32 rows of 28 KB
  const kernels::Status sph = PagedMoe<kernels::Paged, PreloadRuleConfig<8>>::can_implement(huge);
  CHECK(sph.field == "config.decode_preload");
  CHECK(sph.message.find("intermediate = 14336") != std::string::npos);
  CHECK(sph.message.find("shared memory") != std::string::npos);
  // The split-K decode: the decode path, H a multiple of 256 on bf16 experts, at most 32 slots per token,
  // its blocks' shared memory (the input row and its W2 rows' sums) within 227 KB.
  using Splitk = PagedMoe<kernels::Paged, SplitkConfig<4, MoePath::kDecode>>;
  REQUIRE(Splitk::can_implement(small).ok);  // T = 4, H = 2048
  CHECK(Splitk::config(small).decode_splitk);
  CHECK(Splitk::workspace_size(small) >= 4ull * 8 * (1408 / 64) * 2048 * sizeof(float));
  CHECK(Splitk::workspace_size(small) > P::workspace_size(small));
  CHECK(PagedMoe<kernels::Paged, SplitkRuleConfig<>, kernels::Int8>::can_implement(small).ok);
  CHECK(PagedMoe<kernels::Paged, SplitkRuleConfig<>, kernels::Int8>::config(small).decode_splitk);
  CHECK(PagedMoe<kernels::Paged, SplitkRuleConfig<>, kernels::Int4>::workspace_size(small) >=
        4ull * 8 * (1408 / 128) * 2048 * sizeof(float));  // at least 128 features' partials
  const kernels::Status skg =
      PagedMoe<kernels::Paged, SplitkRuleConfig<MoePath::kGrouped>>::can_implement(small);
  CHECK(skg.field == "config.decode_splitk");
  CHECK(skg.message.find("decode path") != std::string::npos);
  Splitk::Arguments odd_h = small;
  odd_h.shape.hidden = 2176;  // a multiple of 128, not of 256
  const kernels::Status skh = Splitk::can_implement(odd_h);
  CHECK(skh.field == "shape.hidden");
  CHECK(skh.message.find("2176") != std::string::npos);
  CHECK(skh.message.find("multiple of 256") != std::string::npos);
  // Quantized experts run a partial last step along H instead.
  CHECK(PagedMoe<kernels::Paged, SplitkRuleConfig<>, kernels::Int4>::can_implement(odd_h).ok);
  Splitk::Arguments many = small;
  many.shape.num_experts = 64;
  many.shape.top_k = 30;  // 30 + 4 chunks = 34 slots
  const kernels::Status sks = Splitk::can_implement(many);
  CHECK(sks.field == "shape.top_k + shape.num_shared_chunks");
  CHECK(sks.message.find("34") != std::string::npos);
  Splitk::Arguments wide_h = small;
  wide_h.shape.hidden = 81920;  // 160 KB of input row and 80 KB of sums per block
  const kernels::Status skm = Splitk::can_implement(wide_h);
  CHECK(skm.field == "shape.hidden");
  CHECK(skm.message.find("shared memory") != std::string::npos);
  // The partials' combine takes one grid row per token: at most 65535 tokens (one slot each, so that the
  // work-tile limit, checked first, holds).
  using SplitkMany = PagedMoe<kernels::Paged, SplitkConfig<1 << 20, MoePath::kDecode>>;
  SplitkMany::Arguments tall = small;
  tall.shape.top_k = 1;
  tall.shape.num_shared_chunks = 0;
  tall.shape.num_tokens = 65535;
  REQUIRE(SplitkMany::can_implement(tall).ok);
  CHECK(SplitkMany::config(tall).decode_splitk);
  tall.shape.num_tokens = 65536;
  const kernels::Status skt = SplitkMany::can_implement(tall);
  CHECK(skt.field == "shape.num_tokens");
  CHECK(skt.message.find("65536") != std::string::npos);
  CHECK(skt.message.find("<= 65535 with config.decode_splitk") != std::string::npos);
  using DeepDecode = PagedMoe<kernels::Paged, DeepDecodeConfig>;
  const kernels::Status sdd = DeepDecode::can_implement(small);
  CHECK(sdd.field == "config.small_deep");
  CHECK(sdd.message.find("64-token tiles") != std::string::npos);

  PagedMoe<kernels::Paged, GroupedRowsConfig<192>>::Arguments rows{};
  fill(rows);
  const kernels::Status str = PagedMoe<kernels::Paged, GroupedRowsConfig<192>>::can_implement(rows);
  CHECK(str.field == "config.grouped_rows");
  CHECK(str.message.find("192") != std::string::npos);
  CHECK(str.message.find("128 or 256") != std::string::npos);
  using Wide = PagedMoe<kernels::Paged, GroupedRowsConfig<256>>;
  Wide::Arguments wide{};
  fill(wide);
  wide.path = MoePath::kGrouped;          // the width matters on the grouped path
  REQUIRE(Wide::can_implement(wide).ok);  // H = 2048
  wide.shape.hidden = 2176;               // a multiple of 128, not of 256
  const kernels::Status sth = Wide::can_implement(wide);
  CHECK(sth.field == "shape.hidden");
  CHECK(sth.message.find("2176") != std::string::npos);
  CHECK(sth.message.find("multiple of 256") != std::string::npos);
  // Quantized experts run 256-row blocks too (the TMA kernel that dequantises in registers), under the
  // same rule on H; pages off a packed row take 128-row blocks.
  using WideInt8 = PagedMoe<kernels::Paged, GroupedRowsConfig<256>, kernels::Int8>;
  WideInt8::Arguments wide8{};
  fill(wide8);
  wide8.path = MoePath::kGrouped;
  REQUIRE(WideInt8::can_implement(wide8).ok);
  CHECK(WideInt8::config(wide8).grouped_rows == 256);
  wide8.matrix_stride_bytes = kernels::Int8::matrix_bytes(wide8.shape.intermediate, wide8.shape.hidden) + 16;
  CHECK(WideInt8::config(wide8).grouped_rows == 128);
  wide8.matrix_stride_bytes = 0;
  wide8.shape.hidden = 2176;
  const kernels::Status stq = WideInt8::can_implement(wide8);
  CHECK(stq.field == "shape.hidden");
  CHECK(stq.message.find("multiple of 256") != std::string::npos);

  // The TMA kernel (256-row blocks) needs every matrix on a tensor-map row; config() takes 128-row blocks
  // where pages are padded off them.
  wide.shape.hidden = 2048;
  REQUIRE(Wide::config(wide).grouped_rows == 256);
  wide.matrix_stride_bytes = 2LL * wide.shape.hidden * wide.shape.intermediate + 16;  // padded off a row
  CHECK(Wide::config(wide).grouped_rows == 128);
  CHECK(Wide::can_implement(wide).ok);
  wide.matrix_stride_bytes =
      4LL * wide.shape.hidden * wide.shape.intermediate;  // padded by whole rows of both
  CHECK(Wide::config(wide).grouped_rows == 256);
  // run() checks the workspace it is given.
  std::size_t bytes = P::workspace_size(good);
  CHECK(P{}.run(good, nullptr, bytes, nullptr).field == "workspace");
  CHECK(P{}.run(good, x, bytes - 1, nullptr).field == "workspace_bytes");
}

TEST_CASE("skewed routing: one hot expert takes half the tokens", "[gpu][small]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  ExpertStore store(tiny, 17, 3);
  for (int tokens : {37, 300, 3000})
    for (MoePath path : {MoePath::kDecode, MoePath::kGrouped, MoePath::kGroupedMma})
      check_case(store, shape_of(tiny, tokens), path, tokens <= 300, 64, 700 + tokens, 5);
}

TEST_CASE("skewed routing on model shapes", "[gpu][models]") {
  struct Case {
    ModelSpec spec;
    int tokens;
  };
  for (const Case& c : {Case{kQwen3, 64}, Case{kQwen3, 256}, Case{kQwen3, 1024}, Case{kQwen15, 33},
                        Case{kMixtral, 16}, Case{kMixtral, 64}}) {
    ExpertStore store(c.spec, 23);
    check_case(store, shape_of(c.spec, c.tokens), MoePath::kAuto, false, 48, 5000 + c.tokens,
               c.spec.num_experts / 2);
  }
}

// Small enough for compute-sanitizer (memcheck, racecheck): both paths, both routing paths (S <= 8192 and
// not); kGrouped runs the 64-token tiles at 5 tokens and the TMA kernel at 3000.
TEST_CASE("sanitizer case: both GEMM paths and both routing paths", "[gpu][sanitize]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  ExpertStore store(tiny, 5, 3);
  for (int tokens : {5, 3000})
    for (MoePath path : {MoePath::kDecode, MoePath::kGrouped, MoePath::kGroupedMma})
      check_case(store, shape_of(tiny, tokens), path, false, 16, 300 + tokens);
}

// Every default decode tile (detail::DefaultDecodeTiles) and the others measured against them are checked,
// whichever shapes the table gives them (a tile the default lacks is added to the configuration's own).
template <int kTile, int kWarps, int kUnroll, int kPrefetch = 128>
struct DecodeTileConfig {
  using DecodeTiles = kernels::DecodeTilesWith<kernels::decode::Tile<kTile / 8, kWarps, kUnroll, kPrefetch>>;
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select(s, requested);
    if (c.path == MoePath::kDecode) c = {MoePath::kDecode, kTile, kWarps, kUnroll, kPrefetch};
    return c;
  }
};

TEST_CASE("decode tiles", "[gpu][small][sanitize]") {
  const ModelSpec tiny{"tiny-f256", 8, 2, 256, 256, 1};
  ExpertStore store(tiny, 19, 3);
  for (int tokens : {1, 5, 37, 300}) {
    const MoeShape shape = shape_of(tiny, tokens);
    check_case<DecodeTileConfig<8, 4, 2>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<32, 4, 1>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<32, 8, 2>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<8, 4, 2, 256>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<32, 4, 1, 256>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<32, 8, 2, 256>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
    check_case<DecodeTileConfig<8, 8, 2>>(store, shape, MoePath::kDecode, true, 64, 900 + tokens);
  }
  // The bf16 loop splits K over the warps at 128-byte lines (64 values) and reads them in step pairs: above,
  // 8 warps split 4 lines (K = 256: half the warps idle); here 4 warps split 6 lines (F = 384: 1, 2, 1, 2
  // each) and 10 (F = 640: 2, 3, 2, 3); unroll 1, 2 and 3 split the pairs differently over the loop's
  // iterations.
  for (const ModelSpec& uneven :
       {ModelSpec{"tiny-f384", 8, 2, 256, 384, 1}, ModelSpec{"tiny-f640", 8, 2, 256, 640, 1}}) {
    ExpertStore uneven_store(uneven, 23, 3);
    for (int tokens : {1, 5, 37}) {
      const MoeShape shape = shape_of(uneven, tokens);
      check_case<DecodeTileConfig<8, 4, 2>>(uneven_store, shape, MoePath::kDecode, true, 64, 920 + tokens);
      check_case<DecodeTileConfig<32, 4, 1>>(uneven_store, shape, MoePath::kDecode, true, 64, 920 + tokens);
      check_case<DecodeTileConfig<8, 4, 3>>(uneven_store, shape, MoePath::kDecode, true, 64, 920 + tokens);
      check_case<DecodeTileConfig<8, 4, 2, 256>>(uneven_store, shape, MoePath::kDecode, true, 64,
                                                 920 + tokens);
    }
  }
}

// The down blocks preloading their W2 rows into shared memory (MoeConfig::decode_preload) read the same
// values in the same k order as the streaming loop: outputs equal the streaming tile's bit for bit (and the
// references, in check_case).
template <int kWarps, int kUnroll>
struct PreloadTileConfig {
  using DecodeTiles = kernels::DecodeTilesWith<kernels::decode::Tile<1, kWarps, kUnroll>>;
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    kernels::MoeConfig c = DecodeTileConfig<8, kWarps, kUnroll>::select(s, requested);
    c.decode_preload = c.path == MoePath::kDecode;
    return c;
  }
};
// `preloads`: whether the call must preload on this device (PagedMoe::decode_preloads: every down block's
// rows fit the device's shared memory at once); -1: either.
template <int kWarps, int kUnroll>
void check_preload_case(ExpertStore& store, int tokens, std::uint64_t seed, bool cpu, int preloads,
                        int hot_expert = -1) {
  using Moe = PagedMoe<kernels::Paged, PreloadTileConfig<kWarps, kUnroll>>;
  const MoeShape shape = shape_of(store.spec(), tokens);
  REQUIRE(Moe::config({.shape = shape, .path = MoePath::kDecode}).decode_preload);
  const bool got = Moe::decode_preloads({.shape = shape, .path = MoePath::kDecode});
  INFO(store.spec().name << " T=" << tokens << " warps=" << kWarps << " unroll=" << kUnroll
                         << (hot_expert >= 0 ? " skewed" : "")
                         << (got ? ": preloaded" : ": streamed (no room)") << " W2 against streamed");
  if (preloads >= 0) CHECK(got == (preloads == 1));
  const auto preload = check_case<PreloadTileConfig<kWarps, kUnroll>>(store, shape, MoePath::kDecode, cpu, 32,
                                                                      seed, hot_expert);
  const auto streamed = check_case<DecodeTileConfig<8, kWarps, kUnroll>>(store, shape, MoePath::kDecode,
                                                                         false, 8, seed, hot_expert);
  CHECK(std::memcmp(preload.data(), streamed.data(), preload.size() * 2) == 0);
}

TEST_CASE("decode tiles preloading the down weights equal the streaming ones", "[gpu][small][sanitize]") {
  // K = F: 4 and 8 warps over 4 lines (F = 256), uneven splits (F = 384, 640), unroll 1-3; small enough that
  // every block's rows fit any device at once.
  for (const ModelSpec& tiny :
       {ModelSpec{"tiny-shared", 8, 2, 256, 256, 1}, ModelSpec{"tiny-f384", 8, 2, 256, 384, 1},
        ModelSpec{"tiny-f640", 8, 2, 256, 640, 1}}) {
    ExpertStore store(tiny, 41, 3);
    for (int tokens : {1, 5, 37}) {
      check_preload_case<4, 2>(store, tokens, 1800 + tokens, true, 1);
      check_preload_case<4, 1>(store, tokens, 1800 + tokens, true, 1);
      check_preload_case<4, 3>(store, tokens, 1800 + tokens, true, 1);
    }
    if (tiny.intermediate % 256 == 0) check_preload_case<8, 2>(store, 5, 1810, true, 1);  // 8 warps: K % 256
    check_preload_case<4, 2>(store, 37, 1820, true, 1, 3);  // one hot expert: several 8-token tiles of one
  }
}

TEST_CASE("decode tiles preloading the down weights on model shapes", "[gpu][small]") {
  // Where every block's rows fit at once on a device of 132 SMs with 228 KB each (the H200): Qwen3 and
  // Qwen1.5's routed experts at 1 token (25 and 23 MB of rows). Qwen1.5 with its shared chunks (46 MB) and
  // more tokens fit no device; those calls stream (and still equal the streaming tile).
  int device = 0, sms = 0, smem = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess);
  const int h200_class = sms >= 132 && smem >= 228 * 1024 ? 1 : -1;
  ExpertStore qwen15(kQwen15, 43), qwen15_routed(kQwen15Routed, 44), qwen3(kQwen3, 45);
  check_preload_case<4, 2>(qwen15_routed, 1, 1901, false, h200_class);
  check_preload_case<4, 2>(qwen3, 1, 1902, false, h200_class);
  check_preload_case<4, 2>(qwen15, 1, 1903, false, 0);
  check_preload_case<4, 2>(qwen15, 3, 1904, false, 0);
  check_preload_case<4, 2>(qwen3, 3, 1905, false, 0);
  check_preload_case<4, 2>(qwen15_routed, 33, 1906, false, 0, 7);
}

// The split-K decode (MoeConfig::decode_splitk) at `tokens`, whether or not its clusters fit the device at
// once: check_case's references and paged = contiguous bit for bit.
template <class Config = SplitkConfig<4, MoePath::kDecode>>
void check_splitk_case(ExpertStore& store, int tokens, std::uint64_t seed, bool cpu, int samples = 32) {
  const MoeShape shape = shape_of(store.spec(), tokens);
  INFO(store.spec().name << " T=" << tokens << " split-K");
  REQUIRE(PagedMoe<kernels::Paged, Config>::config({.shape = shape, .path = MoePath::kDecode}).decode_splitk);
  check_case<Config>(store, shape, MoePath::kDecode, cpu, samples, seed);
}

TEST_CASE("split-K decode against the references, paged = contiguous", "[gpu][small][sanitize]") {
  // Routed experts alone and with shared chunks (one, four), F of 2, 4, 6 and 10 chunks of 64 features, H of
  // 1, 2, 3 and 5 loads per row (whole loop steps of 2 loads, a single step after them), 1 to 4 tokens (an
  // expert two tokens name is read twice, correctly).
  for (const ModelSpec& spec :
       {ModelSpec{"tiny-shared", 8, 2, 256, 256, 1}, ModelSpec{"tiny", 8, 2, 512, 128, 0},
        ModelSpec{"tiny-f384-h768", 8, 2, 768, 384, 1}, ModelSpec{"tiny-k6-m4", 16, 6, 256, 128, 4},
        ModelSpec{"tiny-f640", 8, 2, 512, 640, 1}, ModelSpec{"tiny-h1280", 8, 2, 1280, 128, 1}}) {
    ExpertStore store(spec, 71, 3);
    for (int tokens : {1, 2, 4}) check_splitk_case(store, tokens, 3100 + tokens, true, 64);
  }

  // Ids outside [0, E) and an expert named twice by one token: equal to the four-kernel decode within the
  // tolerance, paged = contiguous bit for bit; every routed slot dropped leaves the shared chunk's output.
  const ModelSpec spec{"tiny-k4", 8, 4, 256, 128, 1};
  ExpertStore store(spec, 73, 3);
  const MoeShape shape = shape_of(spec, 1);
  for (const std::vector<std::int32_t>& ids :
       {std::vector<std::int32_t>{3, -1, 5, 99}, std::vector<std::int32_t>{6, 6, 1, 6},
        std::vector<std::int32_t>{-1, 8, -5, 100}}) {
    RoutingSet r = make_routing(spec, 1, 3140);
    r.ids.upload(ids);
    Runner<kernels::Paged, SplitkConfig<>> split;
    Runner<kernels::Contiguous, SplitkConfig<>> split_c;
    Runner<kernels::Paged> four;
    const auto out_s = split.run(r, shape, store.paged_args(), MoePath::kDecode, true);
    const auto out_c = split_c.run(r, shape, store.contiguous_args(), MoePath::kDecode, true);
    const auto out_f = four.run(r, shape, store.paged_args(), MoePath::kDecode, true);
    INFO("ids " << ids[0] << " " << ids[1] << " " << ids[2] << " " << ids[3]);
    CHECK(count_nonfinite(out_s) == 0);
    CHECK(std::memcmp(out_s.data(), out_c.data(), out_s.size() * 2) == 0);
    std::vector<double> ref(out_f.size());
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = bf16_to_float(out_f[i]);
    CHECK(worst_element(out_s, {0}, ref, spec.hidden) <= 1.0);
    CHECK(rel_error_all(out_s, ref) <= 1e-2);
  }
}

// A configuration that names its own split-K forms (Config::splitk_shapes) on bf16 experts: the call takes
// the first that fits, and every form meets the references with paged = contiguous bit for bit.
template <kernels::SplitkShape form>
void check_splitk_form() {
  using Config = SplitkFormsConfig<form, kernels::SplitkShape{}, 4, MoePath::kDecode>;
  using Layer = PagedMoe<kernels::Paged, Config>;
  constexpr int kFeatures = form.features, kHSplit = form.h_split, kSteps = form.steps;
  INFO("form: " << kFeatures << " features, " << kHSplit << " warps per feature group, " << kSteps
                << " steps in flight (0: the kernel's own)");
  // F a multiple of 128 (both widths), H of 1, 3 and 5 steps of 256 (warp pairs: 1 / 0, 2 / 1, 3 / 2 steps),
  // shared chunks or none, 1 to 4 tokens; every form's clusters (at most 80) fit an H100 or H200 at once.
  for (const ModelSpec& spec :
       {ModelSpec{"tiny-shared", 8, 2, 256, 256, 1}, ModelSpec{"tiny", 8, 2, 768, 128, 0},
        ModelSpec{"tiny-k6-m4", 16, 6, 1280, 128, 4}}) {
    ExpertStore store(spec, 75, 3);
    for (int tokens : {1, 2, 4}) {
      const MoeShape shape = shape_of(spec, tokens);
      const long long clusters =
          static_cast<long long>(tokens) * shape.slots_per_token() * (shape.intermediate / kFeatures);
      INFO(spec.name << " T=" << tokens << ": " << clusters << " clusters");
      // They fit an H100 or H200 at once; a device that holds fewer (or none, before sm_90) runs the
      // decode tiles, which check_splitk_case checks the same way.
      const bool fits = clusters <= Layer::splitk_clusters_at_once(shape.hidden, form);
      CHECK(Layer::decode_split_shape({.shape = shape, .path = MoePath::kDecode}) ==
            (fits ? form : kernels::SplitkShape{}));
      check_splitk_case<Config>(store, tokens, 3300 + tokens, true, 64);
    }
  }
  // Qwen3-30B-A3B at one token: the form where its clusters fit, the decode tiles where they do not.
  ExpertStore qwen3(kQwen3, 45);
  const MoeShape shape = shape_of(kQwen3, 1);
  const bool fits = 8LL * (shape.intermediate / kFeatures) <= Layer::splitk_clusters_at_once(2048, form);
  CHECK(Layer::decode_split_shape({.shape = shape, .path = MoePath::kDecode}) ==
        (fits ? form : kernels::SplitkShape{}));
  check_splitk_case<Config>(qwen3, 1, 3310, false);
  // A form the layer does not name has no clusters.
  CHECK(Layer::splitk_clusters_at_once(2048, kernels::SplitkShape{kFeatures == 64 ? 128 : 64, kHSplit}) == 0);
  CHECK(Layer::splitk_clusters_at_once(
            2048, kernels::SplitkShape{kFeatures, kHSplit, 0, kSteps == 0 ? 2 : 0}) == 0);
}

TEST_CASE("split-K decode in the forms a configuration names", "[gpu][small]") {
  check_splitk_form<kernels::SplitkShape{64, 2}>();
  check_splitk_form<kernels::SplitkShape{128, 2}>();
  check_splitk_form<kernels::SplitkShape{128, 1}>();
  // Two W1 / W3 steps in flight per lane of a pair (H = 1280: 2, then 1).
  check_splitk_form<kernels::SplitkShape{128, 2, 0, 2}>();
}

TEST_CASE("split-K decode on model shapes", "[gpu][small]") {
  ExpertStore qwen15(kQwen15, 43), qwen15_routed(kQwen15Routed, 44), qwen3(kQwen3, 45), mixtral(kMixtral, 46);
  check_splitk_case(qwen3, 1, 3201, true);
  check_splitk_case(qwen15_routed, 1, 3202, true);
  check_splitk_case(qwen15, 1, 3203, false);
  check_splitk_case(mixtral, 1, 3206, false);
  check_splitk_case(qwen3, 3, 3207, false);
  // The default takes it at one token where its clusters fit the device at once, on 128 features in warp
  // pairs where the call has 32 such clusters or more (Qwen3's 48, Qwen1.5's 44, and its 88 with the shared
  // chunks; the pairs' 3 blocks per SM hold 92 on an H200), else on 64 features (a tiny shape's 8), not
  // Mixtral's 224 / 448; never at 2 tokens.
  int device = 0, sms = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  using Default = PagedMoe<kernels::Paged>;
  const kernels::SplitkShape pairs128{128, 2}, quads64{64, 1};
  const int pairs_2048 = Default::splitk_clusters_at_once(2048, pairs128),
            at_once_2048 = Default::splitk_clusters_at_once(2048, quads64),
            at_once_4096 = Default::splitk_clusters_at_once(4096, quads64);
  std::printf(
      "  split-K clusters at once on this device: %d at H = 2048, %d at H = 4096 (64 features, 4 warps); %d "
      "at "
      "H = 2048 (128 features, warp pairs)\n",
      at_once_2048, at_once_4096, pairs_2048);
  if (sms >= 132) {
    const kernels::SplitkShape q3 = Default::decode_split_shape({.shape = shape_of(kQwen3, 1)});
    const kernels::SplitkShape q15 = Default::decode_split_shape({.shape = shape_of(kQwen15Routed, 1)});
    CHECK((q3.features == 128 && q3.h_split == 2));
    CHECK((q15.features == 128 && q15.h_split == 2));
    const kernels::SplitkShape q15_shared = Default::decode_split_shape({.shape = shape_of(kQwen15, 1)});
    CHECK((q15_shared.features == (pairs_2048 >= 88 ? 128 : 0) &&
           q15_shared.h_split == (pairs_2048 >= 88 ? 2 : 1)));
  }
  const kernels::SplitkShape tiny =
      Default::decode_split_shape({.shape = shape_of(ModelSpec{"tiny", 128, 8, 256, 128, 0}, 1)});
  CHECK((tiny.features == 64 && tiny.h_split == 1));  // 8 clusters of 128: below min_clusters
  CHECK_FALSE(Default::decode_splits({.shape = shape_of(kMixtral, 1)}));
  CHECK_FALSE(Default::decode_splits({.shape = shape_of(kQwen3, 2)}));
  // Where it is turned away the call runs the decode tiles: equal to the layer without split-K bit for bit.
  RoutingSet r = make_routing(kMixtral, 1, 3210);
  const MoeShape shape = shape_of(kMixtral, 1);
  Runner<kernels::Paged> with;
  Runner<kernels::Paged, NoSplitkConfig> without;
  const auto out_w = with.run(r, shape, mixtral.paged_args(), MoePath::kAuto, false);
  const auto out_o = without.run(r, shape, mixtral.paged_args(), MoePath::kAuto, false);
  CHECK(std::memcmp(out_w.data(), out_o.data(), out_w.size() * 2) == 0);
}

TEST_CASE("decode tiles on model shapes", "[gpu][small]") {
  for (const ModelSpec& spec : {kQwen3, kMixtral}) {
    ExpertStore store(spec, 21);
    for (int tokens : {3, 33}) {
      const MoeShape shape = shape_of(spec, tokens);
      check_case<DecodeTileConfig<8, 4, 2>>(store, shape, MoePath::kDecode, false, 48, 950 + tokens);
      check_case<DecodeTileConfig<32, 4, 1>>(store, shape, MoePath::kDecode, false, 48, 950 + tokens);
      check_case<DecodeTileConfig<32, 8, 2>>(store, shape, MoePath::kDecode, false, 48, 950 + tokens);
      check_case<DecodeTileConfig<8, 8, 2>>(store, shape, MoePath::kDecode, false, 48, 950 + tokens);
    }
  }
}

// The small-batch kernel (64-token tiles, grouped::gemm_wgmma_small_kernel) and the TMA kernel
// (grouped::gemm_tma_kernel, 256-row blocks) run the two-block kernel's wgmma steps on the same token and
// weight rows, only copied and scheduled differently: Config's outputs must equal the two-block kernel's
// (GroupedTileConfig<128>) bit for bit.
// Whether check_case also runs the CPU reference for `tokens` tokens of `store` (tiny shapes only: it is
// slow).
bool cpu_reference_fits(const ExpertStore& store, int tokens) {
  return store.spec().hidden <= 256 && tokens <= 300;
}
template <class Config>
void check_against_two_block(ExpertStore& store, int tokens, std::uint64_t seed, const std::string& what,
                             int hot_expert = -1) {
  const MoeShape shape = shape_of(store.spec(), tokens);
  const bool cpu = cpu_reference_fits(store, tokens);
  const auto out = check_case<Config>(store, shape, MoePath::kGrouped, cpu, 32, seed, hot_expert);
  const auto two_block =
      check_case<GroupedTileConfig<128>>(store, shape, MoePath::kGrouped, false, 8, seed, hot_expert);
  INFO(store.spec().name << " T=" << tokens << " " << what << " against the two-block grouped GEMM");
  CHECK(std::memcmp(out.data(), two_block.data(), out.size() * 2) == 0);
}
template <int kStages, int kBlocks>
void check_small_case(ExpertStore& store, int tokens, std::uint64_t seed, int hot_expert = -1) {
  check_against_two_block<SmallGroupedConfig<kStages, kBlocks>>(
      store, tokens, seed,
      "small (" + std::to_string(kStages) + " stages, " + std::to_string(kBlocks) + " blocks)", hot_expert);
}
void check_tma_case(ExpertStore& store, int tokens, std::uint64_t seed, int hot_expert = -1) {
  check_against_two_block<GroupedRowsConfig<256>>(store, tokens, seed, "TMA", hot_expert);
}

TEST_CASE("the small-batch grouped GEMM equals the two-block grouped GEMM", "[gpu][small]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};  // 2 and 4 k-steps: fewer than the stages
  ExpertStore small(tiny, 35, 3);
  for (int tokens : {1, 37, 300}) {
    check_small_case<4, 2>(small, tokens, 1400 + tokens);
    check_small_case<3, 3>(small, tokens, 1400 + tokens);
    check_small_case<8, 1>(small, tokens, 1400 + tokens);
  }
  check_small_case<4, 2>(small, 300, 1500, 5);  // one hot expert: several 64-token tiles of one expert
  for (const ModelSpec& spec : {kQwen15, kQwen3, kMixtral}) {
    ExpertStore store(spec, 37);
    for (int tokens : {16, 64, 256}) check_small_case<4, 2>(store, tokens, 1600 + tokens);
  }
  // The default table's 8-stage tiles on huge experts (MoeConfig::small_deep: Mixtral at 8–128 tokens).
  ExpertStore mixtral(kMixtral, 38);
  for (int tokens : {16, 128}) {
    REQUIRE(PagedMoe<kernels::Paged>::config({.shape = shape_of(kMixtral, tokens)}).small_deep);
    check_against_two_block<kernels::DefaultMoeConfig>(mixtral, tokens, 1700 + tokens, "default (8 stages)");
  }
}

// The shared chunks' units spread among the routed experts' (MoeConfig::chunk_spread, moe/unit_order.hpp):
// the same units in another order, so equal to the tile list's order (chunk_spread 1) bit for bit, paged =
// contiguous (and against the CPU reference on the tiny shape: check_case), on the small-batch kernel (37
// tokens; Qwen1.5-MoE's 4 chunks at 256, the default's spread) and the TMA kernel (300, 3000; Qwen1.5-MoE at
// 1024), over twice the chunks' units (the default's) and over the whole call.
template <int kSpread>
void check_spread_case(ExpertStore& store, int tokens, std::uint64_t seed, int hot_expert = -1) {
  const MoeShape shape = shape_of(store.spec(), tokens);
  const bool cpu = cpu_reference_fits(store, tokens);
  const auto spread =
      check_case<ChunkSpreadConfig<kSpread>>(store, shape, MoePath::kGrouped, cpu, 32, seed, hot_expert);
  const auto listed =
      check_case<ChunkSpreadConfig<1>>(store, shape, MoePath::kGrouped, false, 8, seed, hot_expert);
  INFO(store.spec().name << " T=" << tokens << " chunks spread over " << kSpread
                         << "x their units against the list's order");
  CHECK(std::memcmp(spread.data(), listed.data(), spread.size() * 2) == 0);
}

TEST_CASE("shared chunks' units spread among the routed ones equal the list's order bit for bit",
          "[gpu][small]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  ExpertStore small(tiny, 45, 3);
  for (int tokens : {37, 300, 3000}) {
    check_spread_case<2>(small, tokens, 2000 + tokens);
    check_spread_case<kSpreadAll>(small, tokens, 2000 + tokens);
  }
  check_spread_case<kSpreadAll>(small, 300, 2100, 5);  // one hot expert
  ExpertStore qwen15(kQwen15, 47);
  for (int tokens : {256, 1024}) {
    REQUIRE(PagedMoe<kernels::Paged>::config({.shape = shape_of(kQwen15, tokens)}).chunk_spread == 2);
    check_spread_case<2>(qwen15, tokens, 2200 + tokens);
    check_spread_case<kSpreadAll>(qwen15, tokens, 2200 + tokens);
  }
}

TEST_CASE("the TMA grouped GEMM equals the two-block grouped GEMM", "[gpu][tma]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};  // 2 and 4 k-steps: fewer than the stages
  ExpertStore small(tiny, 41, 3);
  for (int tokens : {1, 37, 300, 3000}) check_tma_case(small, tokens, 1700 + tokens);
  check_tma_case(small, 3000, 1800, 5);  // one hot expert: many tiles of one expert
  for (const ModelSpec& spec : {kQwen15, kQwen3, kMixtral}) {
    ExpertStore store(spec, 43);
    for (int tokens : {64, 1024, 4096}) check_tma_case(store, tokens, 1900 + tokens);
  }
}
