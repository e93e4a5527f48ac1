// Adjuster decisions at Qwen3-30B-A3B size (48 layers x 128 experts, top-8), DESIGN §8 target: <= 5 us per
// decision. The pool is bookkeeping only (no arena bytes), sized with the model's real page sizes.
//
// Each decision that reserves pages or marks experts busy is undone with cancel() inside the timed loop, so
// the numbers for "adjust+cancel" are upper bounds of one decision.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <type_traits>
#include <vector>

#include "amoeba/policies/stacks.hpp"

using namespace amoeba;
using namespace amoeba::policies;

namespace {

constexpr std::uint32_t kLayers = 48, kExperts = 128, kTopK = 8;
constexpr std::uint64_t kExpertPageBytes = 3'145'728;  // Qwen3-30B-A3B expert matrix, bf16 (DESIGN §3.1)
constexpr std::uint64_t kKvPageBytes = 32'768;
constexpr std::uint32_t kOffloadLimit = 16;
constexpr std::uint32_t kOffloadedPerLayer = 10;  // steady state: ten experts out per layer

ExpertRanker skewed_ranking() {
  std::mt19937_64 rng(42);
  ExpertRanker::Builder b(kLayers, kExperts);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t e = 0; e < kExperts; ++e)
      b.add_count(l, e, 1 + rng() % 1000 * (rng() % 4 == 0 ? 10 : 1));
  return b.build();
}

struct Setup {
  Setup()
      : pool(ArenaSpan{nullptr, std::uint64_t(kLayers * kExperts * 3 + 512) * kExpertPageBytes},
             {PageSpec{kExpertPageBytes}, PageSpec{kKvPageBytes}}) {}
  MoePool pool;
};

template <class A>
A make_adjuster() {
  if constexpr (std::is_same_v<typename A::capacity_rule_type, FixedCapacity>)
    return A(skewed_ranking(), {}, FixedCapacity{.resident_per_layer = kExperts - kOffloadedPerLayer});
  else if constexpr (std::is_same_v<typename A::capacity_rule_type, StaticCapacity>)
    return A(skewed_ranking());
  else
    return A(skewed_ranking(), {.expert_offload_limit = kOffloadLimit},
             ElasticHysteresis{.initial_resident_per_layer = kExperts - kOffloadedPerLayer});
}

// Top-8 routing of every layer for `steps` steps, skewed towards the ranking's head (and sometimes its tail:
// misses). Precomputed so that the timed loops measure the adjuster, not the random numbers.
using Routes = std::vector<std::vector<std::uint32_t>>;  // [step * kLayers + layer] -> experts
Routes make_routes(const ExpertRanker& ranker, std::uint32_t steps, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Routes out(std::size_t(steps) * kLayers);
  for (std::uint32_t s = 0; s < steps; ++s)
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      auto& routed = out[std::size_t(s) * kLayers + l];
      while (routed.size() < kTopK) {
        const std::uint32_t r = rng() % 4 == 0 ? std::uint32_t(rng() % kExperts) : std::uint32_t(rng() % 32);
        const std::uint32_t e = ranker.expert_at(l, r);
        if (std::find(routed.begin(), routed.end(), e) == routed.end()) routed.push_back(e);
      }
    }
  return out;
}
template <class A>
void route_step(A& a, const Routes& routes, std::size_t step) {
  const std::size_t s = step % (routes.size() / kLayers);
  for (std::uint32_t l = 0; l < kLayers; ++l) a.observe(l, routes[s * kLayers + l]);
}

template <class A>
void BM_Decision(benchmark::State& state) {
  Setup s;
  A a = make_adjuster<A>();
  if (a.populate(s.pool)) state.SkipWithError("populate failed");
  const Routes routes = make_routes(a.ranker(), 64, 1);
  for (std::size_t i = 0; i < 64; ++i) route_step(a, routes, i);
  const std::uint64_t shortfall = std::uint64_t(state.range(0));
  const std::uint64_t free_pages = std::uint64_t(state.range(1));
  std::size_t moved = 0;
  for (auto _ : state) {
    ChangeList c = a.adjust(shortfall, free_pages, s.pool);
    moved = c.evictions.size() + c.restores.size();
    benchmark::DoNotOptimize(c);
    if (a.cancel(c, s.pool)) state.SkipWithError("cancel failed");
  }
  state.counters["experts_moved"] = double(moved);
}

// One step of a CoMoE-style cache: route top-8 at every layer (observe), decide (admit the misses, swap out
// victims), commit.
template <class A>
void BM_CacheStep(benchmark::State& state) {
  Setup s;
  A a = make_adjuster<A>();
  if (a.populate(s.pool)) state.SkipWithError("populate failed");
  const Routes routes = make_routes(a.ranker(), 1024, 2);
  std::size_t moved = 0, steps = 0;
  for (auto _ : state) {
    route_step(a, routes, steps);
    ChangeList c = a.adjust(0, s.pool.available<ExpertPage>(), s.pool);
    moved += c.restores.size();
    ++steps;
    if (a.commit(c, s.pool)) state.SkipWithError("commit failed");
  }
  state.counters["admitted_per_step"] = double(moved) / double(steps == 0 ? 1 : steps);
}

// A commit cycle: evict 3 (short 8 pages), commit, restore 3 (20 free), commit: two decisions, two commits.
void BM_ElasticCommitCycle(benchmark::State& state) {
  Setup s;
  auto a = make_adjuster<ElasticAdjuster>();
  if (a.populate(s.pool)) state.SkipWithError("populate failed");
  for (auto _ : state) {
    ChangeList e = a.adjust(8, 0, s.pool);
    if (a.commit(e, s.pool)) state.SkipWithError("commit failed");
    ChangeList r = a.adjust(0, 20, s.pool);
    if (a.commit(r, s.pool)) state.SkipWithError("commit failed");
    benchmark::DoNotOptimize(r);
  }
}

void BM_ObserveStep(benchmark::State& state) {
  auto a = make_adjuster<LruCacheAdjuster>();
  const Routes routes = make_routes(a.ranker(), 1024, 3);
  std::size_t step = 0;
  for (auto _ : state) route_step(a, routes, step++);
  state.counters["layers"] = kLayers;
}

void BM_HysteresisRule(benchmark::State& state) {
  std::uint64_t f = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f);
    auto d = hysteresis_decision({}, f & 7, f);
    benchmark::DoNotOptimize(d);
    ++f;
  }
}

}  // namespace

// Args: {R_b, F_b}. Elastic: short 8 -> evict 3; F_b 40 -> restore 5; F_b 5 -> nothing; short 47 -> evict 16.
BENCHMARK_TEMPLATE(BM_Decision, ElasticAdjuster)
    ->ArgNames({"R_b", "F_b"})
    ->Args({8, 0})
    ->Args({0, 40})
    ->Args({0, 5})
    ->Args({47, 0});
BENCHMARK_TEMPLATE(BM_Decision, ElasticLruAdjuster)->ArgNames({"R_b", "F_b"})->Args({8, 0})->Args({0, 40});
BENCHMARK_TEMPLATE(BM_Decision, ElasticLfuAdjuster)->ArgNames({"R_b", "F_b"})->Args({8, 0});
BENCHMARK_TEMPLATE(BM_CacheStep, LruCacheAdjuster);
BENCHMARK_TEMPLATE(BM_CacheStep, LfuCacheAdjuster);
BENCHMARK_TEMPLATE(BM_Decision, StaticAdjuster)->ArgNames({"R_b", "F_b"})->Args({8, 0});
BENCHMARK(BM_ElasticCommitCycle);
BENCHMARK(BM_ObserveStep);
BENCHMARK(BM_HysteresisRule);
BENCHMARK_MAIN();
