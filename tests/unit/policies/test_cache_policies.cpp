// Static, fixed (Fate) and LRU/LFU (CoMoE-style) stacks on known routing sequences, with their exact victims.
#include <catch2/catch.hpp>

#include <initializer_list>
#include <random>
#include <vector>

#include "amoeba/policies/stacks.hpp"
#include "support/policy_fixtures.hpp"

using namespace amoeba;
using namespace amoeba::policies;

namespace {
using testing::PoolFixture;
std::vector<std::uint32_t> resident_experts(const ResidencyTable& t, std::uint32_t layer) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t e = 0; e < t.experts_per_layer(); ++e)
    if (t.is_resident({layer, e})) out.push_back(e);
  return out;
}
template <class A>
void route(A& a, std::uint32_t layer, std::initializer_list<std::uint32_t> experts) {
  const std::vector<std::uint32_t> v(experts);
  a.observe(layer, v);
}
// One step of a cache: decide with plenty of free pages, check the swap, commit. Returns the victim.
template <class A>
std::optional<ExpertKey> step(A& a, MoePool& pool) {
  ChangeList c = a.adjust(0, pool.available<ExpertPage>(), pool);
  REQUIRE(c.evictions.size() <= 1);
  REQUIRE(c.restores.size() == c.evictions.size());
  std::optional<ExpertKey> victim;
  if (!c.evictions.empty()) {
    CHECK(c.evictions[0].cause == EvictionCause::kSwap);
    victim = c.evictions[0].expert;
  }
  REQUIRE_FALSE(a.commit(c, pool).has_value());
  REQUIRE_FALSE(pool.check_invariants().has_value());
  return victim;
}
}  // namespace

TEST_CASE("static: every expert resident, nothing moves under any pressure", "[policies][static]") {
  PoolFixture f(64);
  StaticAdjuster a(ExpertRanker::uniform(2, 4));
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  CHECK(a.residency().resident_total() == 8);
  CHECK(f.pool.stats().used_of<ExpertPage>() == 24);
  route(a, 0, {1, 2});
  for (auto [r, free] : {std::pair<int, int>{100, 0}, {0, 0}, {0, 1000}}) {
    const ChangeList c = a.adjust(std::uint64_t(r), std::uint64_t(free), f.pool);
    CHECK(c.empty());
  }
}

TEST_CASE("fixed cache (Fate): a resident prefix per layer, nothing moves", "[policies][fixed]") {
  PoolFixture f(64);
  const auto ranker = ExpertRanker::from_probabilities({{0.1, 0.4, 0.3, 0.2}, {0.4, 0.3, 0.2, 0.1}});
  FixedCacheAdjuster a(ranker, {}, FixedCapacity{.resident_per_layer = 2, .per_layer = {1, 3}});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  CHECK(resident_experts(a.residency(), 0) == std::vector<std::uint32_t>{1});
  CHECK(resident_experts(a.residency(), 1) == std::vector<std::uint32_t>{0, 1, 2});
  route(a, 0, {0, 3});  // misses
  CHECK(a.adjust(20, 0, f.pool).empty());
  CHECK(a.adjust(0, 60, f.pool).empty());
  FixedCacheAdjuster b(ranker, {}, FixedCapacity{.resident_per_layer = 2});
  PoolFixture g(64);
  REQUIRE_FALSE(b.populate(g.pool).has_value());
  CHECK(resident_experts(b.residency(), 0) == std::vector<std::uint32_t>{1, 2});
}

TEST_CASE("LRU cache: a miss is admitted and the least recently used expert of its layer leaves",
          "[policies][lru]") {
  PoolFixture f(48);
  LruCacheAdjuster a(ExpertRanker::uniform(1, 4), {}, FixedCapacity{.resident_per_layer = 2});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  REQUIRE(resident_experts(a.residency(), 0) == std::vector<std::uint32_t>{0, 1});
  route(a, 0, {0});
  route(a, 0, {0});
  route(a, 0, {1});
  CHECK_FALSE(step(a, f.pool).has_value());  // no miss, nothing moves
  route(a, 0, {2});                          // miss: 0 was used at tick 2, 1 at tick 3
  CHECK(step(a, f.pool) == ExpertKey{0, 0});
  CHECK(resident_experts(a.residency(), 0) == std::vector<std::uint32_t>{1, 2});
  route(a, 0, {3});  // miss: 1 (tick 3) is older than 2 (tick 4)
  CHECK(step(a, f.pool) == ExpertKey{0, 1});
  route(a, 0, {2});
  route(a, 0, {0});  // miss: 3 (tick 5) older than 2 (tick 6)
  CHECK(step(a, f.pool) == ExpertKey{0, 3});
  CHECK(resident_experts(a.residency(), 0) == std::vector<std::uint32_t>{0, 2});
}

TEST_CASE("LFU cache: the least frequently used expert leaves, ties by recency", "[policies][lfu]") {
  PoolFixture f(48);
  LfuCacheAdjuster a(ExpertRanker::uniform(1, 4), {}, FixedCapacity{.resident_per_layer = 2});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  route(a, 0, {0});
  route(a, 0, {0});
  route(a, 0, {1});
  route(a, 0, {2});  // miss: counts 0:2, 1:1 -> 1 leaves (LRU would pick 0)
  CHECK(step(a, f.pool) == ExpertKey{0, 1});
  route(a, 0, {3});  // miss: counts 0:2, 2:1 -> 2 leaves
  CHECK(step(a, f.pool) == ExpertKey{0, 2});
  route(a, 0, {3});
  route(a, 0, {1});  // miss: counts 0:2 (tick 2), 3:2 (tick 6) -> tie, 0 is less recent
  CHECK(step(a, f.pool) == ExpertKey{0, 0});
  CHECK(resident_experts(a.residency(), 0) == std::vector<std::uint32_t>{1, 3});
  CHECK(a.evict_policy().count(a.view(), {0, 1}) == 2);
}

TEST_CASE("caches: misses admitted in order, per layer, several in one step", "[policies][lru]") {
  PoolFixture f(64);
  LruCacheAdjuster a(ExpertRanker::uniform(2, 4), {}, FixedCapacity{.resident_per_layer = 2});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  route(a, 0, {1, 3});
  route(a, 1, {2, 0});
  ChangeList c = a.adjust(0, f.pool.available<ExpertPage>(), f.pool);
  REQUIRE(c.restores.size() == 2);
  CHECK(c.restores[0].expert == ExpertKey{0, 3});
  CHECK(c.restores[1].expert == ExpertKey{1, 2});
  REQUIRE(c.evictions.size() == 2);
  CHECK(c.evictions[0].expert == ExpertKey{0, 0});  // never routed (tick 0)
  CHECK(c.evictions[1].expert == ExpertKey{1, 1});
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  CHECK(a.restore_policy().pending_count() == 0);
}

TEST_CASE("caches: an admission waits while the pool has no 3 free expert pages", "[policies][lru]") {
  PoolFixture f(16);  // 2 layers x 2 resident x 3 = 12 pages, 4 free
  LruCacheAdjuster a(ExpertRanker::uniform(2, 4), {}, FixedCapacity{.resident_per_layer = 2});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  std::vector<PageHandle> kv_hog;
  REQUIRE_FALSE(f.pool.allocate_n<ExpertPage>(2, request_owner(7), kv_hog).has_value());  // 2 left
  route(a, 0, {2});
  ChangeList c = a.adjust(0, f.pool.available<ExpertPage>(), f.pool);
  CHECK(c.empty());  // neither the admission nor its victim
  CHECK(a.restore_policy().pending_count() == 1);
  REQUIRE(f.pool.free(kv_hog[0]) == PageStatus::kOk);
  c = a.adjust(0, f.pool.available<ExpertPage>(), f.pool);
  REQUIRE(c.restores.size() == 1);
  CHECK(c.restores[0].expert == ExpertKey{0, 2});
  CHECK(c.evictions.size() == 1);
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
}

TEST_CASE("LRU: the recency lists agree with a scan by (last use, coldness)", "[policies][lru]") {
  std::mt19937_64 rng(11);
  ExpertRanker::Builder b(3, 20);
  for (std::uint32_t l = 0; l < 3; ++l)
    for (std::uint32_t e = 0; e < 20; ++e) b.add_count(l, e, rng() % 9);
  const ExpertRanker ranker = b.build();
  PoolFixture f(200);
  ElasticLruAdjuster a(ranker, {.expert_offload_limit = 7},
                       ElasticHysteresis{.initial_resident_per_layer = 16});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  for (int round = 0; round < 300; ++round) {
    const std::uint32_t layer = std::uint32_t(rng() % 3);
    std::vector<std::uint32_t> routed;
    for (std::uint32_t e = 0; e < 20; ++e)
      if (rng() % 5 == 0) routed.push_back(e);
    a.observe(layer, routed);
    const AdjustView v = a.view();
    const LruEvict& p = a.evict_policy();
    auto score = [&](ExpertKey k) { return VictimScore{p.last_use(v, k), 0, coldness_of(v, k)}; };
    for (std::uint32_t l = 0; l < 3; ++l) CHECK(p.victim_in_layer(v, l) == lowest_scored(v, l, score));
    const std::uint32_t n = std::uint32_t(rng() % 12);
    std::vector<ExpertKey> got, want;
    p.nominate_evictions(v, n, got);
    nominate_by_score(v, n, want, score);
    CHECK(got == want);
    if (round % 10 == 0) {  // move the border now and then
      ChangeList c = a.adjust(rng() % 2 ? 0 : rng() % 9, f.pool.available<ExpertPage>() % 30, f.pool);
      REQUIRE_FALSE(a.commit(c, f.pool).has_value());
    }
  }
}
