// The paper's elastic stack and the cross variants, on a hand-made ranking: which experts, how many.
#include <catch2/catch.hpp>

#include <vector>

#include "amoeba/policies/stacks.hpp"
#include "support/policy_fixtures.hpp"

using namespace amoeba;
using namespace amoeba::policies;

namespace {
using testing::PoolFixture;
// layer 0 ranks 0,1,2,3; layer 1 ranks 1,3,2,0; layer 2 ranks 2,0,1,3
ExpertRanker hand_ranking() {
  return ExpertRanker::from_probabilities(
      {{0.40, 0.30, 0.20, 0.10}, {0.05, 0.50, 0.15, 0.30}, {0.25, 0.25, 0.35, 0.15}});
}
std::vector<ExpertKey> keys(const std::vector<Eviction>& v) {
  std::vector<ExpertKey> k;
  for (const auto& e : v) k.push_back(e.expert);
  return k;
}
std::vector<ExpertKey> keys(const std::vector<Restore>& v) {
  std::vector<ExpertKey> k;
  for (const auto& e : v) k.push_back(e.expert);
  return k;
}
}  // namespace

TEST_CASE("elastic: short 8 pages evicts the 3 rank-coldest experts across layers", "[policies][elastic]") {
  PoolFixture f(64);
  ElasticAdjuster a(hand_ranking());
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  const ChangeList c = a.adjust(8, 0, f.pool);
  CHECK(c.decision == CapacityDecision{3, 0});
  CHECK(keys(c.evictions) == std::vector<ExpertKey>{{1, 0}, {0, 3}, {1, 2}});
  CHECK(c.restores.empty());
  // deferred free: nothing returned to the pool before commit
  CHECK(f.pool.stats().used_of<ExpertPage>() == 36);
  CHECK(a.residency().resident_total() == 12);
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  CHECK(f.pool.stats().used_of<ExpertPage>() == 27);
  CHECK(a.residency().resident_total() == 9);
}

TEST_CASE("elastic: F_b = 1 evicts one, F_b = 20 restores 3, F_b = 40 restores 5", "[policies][elastic]") {
  PoolFixture f(64);
  ElasticAdjuster a(hand_ranking(), {}, ElasticHysteresis{.initial_resident_per_layer = 0});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  CHECK(a.residency().resident_total() == 0);
  ChangeList c = a.adjust(0, 20, f.pool);
  CHECK(keys(c.restores) == std::vector<ExpertKey>{{1, 1}, {0, 0}, {2, 2}});
  CHECK(c.pages_reserved() == 9);
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  c = a.adjust(0, 40, f.pool);
  CHECK(keys(c.restores) == std::vector<ExpertKey>{{0, 1}, {1, 3}, {2, 0}, {2, 1}, {0, 2}});
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  c = a.adjust(0, 5, f.pool);
  CHECK(c.empty());
  c = a.adjust(0, 1, f.pool);
  CHECK(keys(c.evictions) == std::vector<ExpertKey>{{0, 2}});  // coldest resident: 0.20
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
}

TEST_CASE("elastic: expert_offload_limit caps evictions per layer", "[policies][elastic]") {
  PoolFixture f(64);
  ElasticAdjuster a(hand_ranking(), {.expert_offload_limit = 1});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  ChangeList c = a.adjust(30, 0, f.pool);  // asks for 11
  CHECK(c.decision.evict == 11);
  CHECK(keys(c.evictions) == std::vector<ExpertKey>{{1, 0}, {0, 3}, {2, 3}});
  // a second decision before the commit: the busy experts and the layer budgets are respected
  CHECK(a.adjust(30, 0, f.pool).empty());
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  CHECK(a.adjust(30, 0, f.pool).empty());  // every layer is at its limit now
}

TEST_CASE("elastic: restores stop when the pool cannot reserve 3 pages", "[policies][elastic]") {
  PoolFixture f(7);  // 7 expert pages: room for 2 experts
  ElasticAdjuster a(hand_ranking(), {}, ElasticHysteresis{.initial_resident_per_layer = 0});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  const ChangeList c = a.adjust(0, 40, f.pool);  // F_b is the caller's figure; the pool decides
  CHECK(c.decision.restore == 5);
  CHECK(keys(c.restores) == std::vector<ExpertKey>{{1, 1}, {0, 0}});
  CHECK(f.pool.available<ExpertPage>() == 1);
}

TEST_CASE("cross variant: elastic capacity with LRU victims across layers", "[policies][cross]") {
  PoolFixture f(64);
  ElasticLruAdjuster a(hand_ranking());
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  const std::vector<std::uint32_t> all{0, 1, 2, 3};
  const std::vector<std::uint32_t> some{0, 2};
  a.observe(0, all);                      // tick 1
  a.observe(1, all);                      // tick 2
  a.observe(2, all);                      // tick 3
  a.observe(0, some);                     // tick 4: layer 0's 1 and 3 stay at tick 1
  ChangeList c = a.adjust(5, 0, f.pool);  // evict ceil(6/3) = 2
  // oldest is tick 1 (layer 0 experts 1 and 3); the tie goes to the colder rank: 3, then 1
  CHECK(keys(c.evictions) == std::vector<ExpertKey>{{0, 3}, {0, 1}});
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  c = a.adjust(0, 1, f.pool);
  CHECK(keys(c.evictions) == std::vector<ExpertKey>{{1, 0}});  // tick 2, coldest of layer 1
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
  c = a.adjust(0, 20, f.pool);  // restores by rank
  CHECK(keys(c.restores) == std::vector<ExpertKey>{{0, 1}, {0, 3}, {1, 0}});
  REQUIRE_FALSE(a.commit(c, f.pool).has_value());
}

TEST_CASE("cross variant: elastic capacity that restores what was missed", "[policies][cross]") {
  PoolFixture f(64);
  ElasticMissAdjuster a(hand_ranking(), {}, ElasticHysteresis{.initial_resident_per_layer = 1});
  REQUIRE_FALSE(a.populate(f.pool).has_value());
  const std::vector<std::uint32_t> routed{3, 0};
  a.observe(2, routed);                          // layer 2 holds expert 2 only: both are misses
  const ChangeList c = a.adjust(0, 15, f.pool);  // restore floor(6/3) = 2
  CHECK(keys(c.restores) == std::vector<ExpertKey>{{2, 3}, {2, 0}});
}
