// ChangeList invariants over randomized steps (many seeds) against a shadow model, for every stack that moves
// experts: never evicts a non-resident expert, never restores a resident one, reserved pages really reserved
// in the pool and never double-booked, the offload limit holds, commits agree with the shadow, and committing
// then draining leaves the pool fully merged.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "amoeba/policies/stacks.hpp"

using namespace amoeba;
using namespace amoeba::policies;

namespace {

constexpr std::uint32_t kLayers = 4, kExperts = 10, kLimit = 6;

ExpertRanker random_ranking(std::mt19937_64& rng) {
  ExpertRanker::Builder b(kLayers, kExperts);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t e = 0; e < kExperts; ++e) b.add_count(l, e, rng() % 50);
  return b.build();
}

template <class A>
A make(const ExpertRanker& r);
template <>
ElasticAdjuster make(const ExpertRanker& r) {
  return ElasticAdjuster(r, {.expert_offload_limit = kLimit},
                         ElasticHysteresis{.initial_resident_per_layer = 8});
}
template <>
ElasticLruAdjuster make(const ExpertRanker& r) {
  return ElasticLruAdjuster(r, {.expert_offload_limit = kLimit},
                            ElasticHysteresis{.initial_resident_per_layer = 8});
}
template <>
ElasticLfuAdjuster make(const ExpertRanker& r) {
  return ElasticLfuAdjuster(r, {.expert_offload_limit = kLimit},
                            ElasticHysteresis{.initial_resident_per_layer = 8});
}
template <>
ElasticMissAdjuster make(const ExpertRanker& r) {
  return ElasticMissAdjuster(r, {.expert_offload_limit = kLimit},
                             ElasticHysteresis{.initial_resident_per_layer = 7});
}
template <>
LruCacheAdjuster make(const ExpertRanker& r) {
  return LruCacheAdjuster(r, {}, FixedCapacity{.resident_per_layer = 5, .max_admissions_per_step = 4});
}
template <>
LfuCacheAdjuster make(const ExpertRanker& r) {
  return LfuCacheAdjuster(r, {}, FixedCapacity{.resident_per_layer = 5});
}

using Shadow = std::map<ExpertKey, ExpertPages>;

// Checks one change list against the shadow and the pool. `outstanding`: experts named by lists not yet
// committed; `booked`: pages reserved by those lists.
template <class A>
void check_list(const A& a, const MoePool& pool, const ChangeList& c, const Shadow& shadow,
                std::set<ExpertKey>& outstanding, std::set<std::pair<std::uint32_t, std::uint8_t>>& booked,
                bool capacity_elastic) {
  std::map<std::uint32_t, std::uint32_t> pressure_per_layer;
  std::set<std::pair<std::uint32_t, std::uint8_t>> resident_pages;
  for (const auto& [k, p] : shadow)
    for (ExpertMatrix n : kExpertMatrices) resident_pages.insert({p[n].index, p[n].kind});
  for (const Eviction& ev : c.evictions) {
    INFO("eviction " << ev.expert);
    const auto it = shadow.find(ev.expert);
    REQUIRE(it != shadow.end());  // never evicts a non-resident expert
    CHECK(it->second == ev.pages);
    REQUIRE(outstanding.insert(ev.expert).second);  // never named twice, here or by an outstanding list
    if (ev.cause == EvictionCause::kPressure) ++pressure_per_layer[ev.expert.layer];
    if (capacity_elastic) CHECK(ev.cause == EvictionCause::kPressure);
  }
  for (const Restore& r : c.restores) {
    INFO("restore " << r.expert);
    REQUIRE(shadow.count(r.expert) == 0);  // never restores a resident expert
    REQUIRE(outstanding.insert(r.expert).second);
    for (ExpertMatrix m : kExpertMatrices) {
      CHECK(pool.owner_of(r.pages[m]) == expert_owner(r.expert, m, true));    // really reserved
      REQUIRE(booked.insert({r.pages[m].index, r.pages[m].kind}).second);     // never double-booked
      CHECK(resident_pages.count({r.pages[m].index, r.pages[m].kind}) == 0);  // nor a resident expert's page
    }
  }
  for (auto [layer, n] : pressure_per_layer) {
    std::uint32_t offloaded = 0;
    for (std::uint32_t e = 0; e < kExperts; ++e) offloaded += shadow.count({layer, e}) == 0;
    CHECK(offloaded + n <= kLimit);  // counted with this list's pressure evictions; outstanding ones add
  }
  (void)a;
}

template <class A>
void apply_to_shadow(const ChangeList& c, Shadow& shadow, std::set<ExpertKey>& outstanding,
                     std::set<std::pair<std::uint32_t, std::uint8_t>>& booked) {
  for (const Restore& r : c.restores) {
    shadow[r.expert] = r.pages;
    outstanding.erase(r.expert);
    for (ExpertMatrix m : kExpertMatrices) booked.erase({r.pages[m].index, r.pages[m].kind});
  }
  for (const Eviction& ev : c.evictions) {
    shadow.erase(ev.expert);
    outstanding.erase(ev.expert);
  }
}

void forget(const ChangeList& c, std::set<ExpertKey>& outstanding,
            std::set<std::pair<std::uint32_t, std::uint8_t>>& booked) {
  for (const Restore& r : c.restores) {
    outstanding.erase(r.expert);
    for (ExpertMatrix m : kExpertMatrices) booked.erase({r.pages[m].index, r.pages[m].kind});
  }
  for (const Eviction& ev : c.evictions) outstanding.erase(ev.expert);
}

template <class A>
void check_table(const A& a, const MoePool& pool, const Shadow& shadow) {
  CHECK(a.residency().resident_total() == shadow.size());
  for (const auto& [k, p] : shadow) {
    REQUIRE(a.residency().pages_of(k) == p);
    for (ExpertMatrix m : kExpertMatrices) CHECK(pool.owner_of(p[m]) == expert_owner(k, m));
  }
}

template <class A>
void run_seed(std::uint64_t seed, bool elastic) {
  std::mt19937_64 rng(seed);
  const ExpertRanker ranker = random_ranking(rng);
  const std::uint32_t expert_pages = 100 + std::uint32_t(rng() % 60);
  HostArena arena(std::uint64_t(expert_pages) * 4096);
  MoePool pool(arena.span(), {PageSpec{4096}, PageSpec{512}});
  A a = make<A>(ranker);
  REQUIRE_FALSE(a.populate(pool).has_value());
  Shadow shadow;
  a.residency().for_each_resident([&](ExpertKey k, const ExpertPages& p) { shadow[k] = p; });
  std::set<ExpertKey> outstanding;
  std::set<std::pair<std::uint32_t, std::uint8_t>> booked;
  std::vector<std::vector<PageHandle>> requests(12);  // KV pages per request: the pressure
  std::vector<ChangeList> pending;
  std::uint64_t evictions_seen = 0, restores_seen = 0;

  for (int step = 0; step < 150; ++step) {
    INFO("seed " << seed << " step " << step);
    // requests grow and finish
    for (std::uint32_t q = 0; q < requests.size(); ++q) {
      const auto roll = rng() % 10;
      if (roll < 3) {
        for (const PageHandle p : requests[q]) REQUIRE(pool.free(p) == PageStatus::kOk);
        requests[q].clear();
      } else if (roll < 7) {
        const std::uint64_t n = rng() % 24;
        (void)pool.allocate_n<KvPage>(n, request_owner(q), requests[q],
                                      requests[q].empty() ? std::nullopt : std::optional(requests[q].back()));
      }
    }
    // routing
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      std::vector<std::uint32_t> routed;
      for (std::uint32_t e = 0; e < kExperts; ++e)
        if (rng() % 4 == 0) routed.push_back(e);
      a.observe(l, routed);
    }
    const std::uint64_t shortfall = rng() % 3 == 0 ? rng() % 14 : 0;
    ChangeList c = a.adjust(shortfall, pool.available<ExpertPage>(), pool);
    check_list(a, pool, c, shadow, outstanding, booked, elastic);
    evictions_seen += c.evictions.size();
    restores_seen += c.restores.size();
    if (elastic && shortfall > 0) CHECK(c.restores.empty());
    pending.push_back(std::move(c));
    if (rng() % 8 == 0) continue;  // sometimes decide again before the forward has ended
    for (ChangeList& p : pending) {
      const auto roll = rng() % 10;
      if (roll == 0) {
        forget(p, outstanding, booked);
        REQUIRE_FALSE(a.cancel(p, pool).has_value());
        continue;
      }
      if (roll == 1 && !p.restores.empty()) {
        const Restore dropped = p.restores[rng() % p.restores.size()];
        REQUIRE_FALSE(a.cancel_restore(p, dropped.expert, pool).has_value());
        outstanding.erase(dropped.expert);
        for (ExpertMatrix m : kExpertMatrices) booked.erase({dropped.pages[m].index, dropped.pages[m].kind});
      }
      const auto version = a.residency().version();
      REQUIRE_FALSE(a.commit(p, pool).has_value());
      apply_to_shadow<A>(p, shadow, outstanding, booked);
      if (!p.empty()) {  // a second commit of the same list is rejected and changes nothing
        const auto v2 = a.residency().version();
        CHECK(a.commit(p, pool).has_value());
        CHECK(a.residency().version() == v2);
        CHECK(v2 > version);
      }
    }
    pending.clear();
    CHECK(outstanding.empty());
    CHECK(booked.empty());
    CHECK(a.busy_count() == 0);
    check_table(a, pool, shadow);
    const auto inv = pool.check_invariants();
    INFO(inv.value_or(""));
    REQUIRE_FALSE(inv.has_value());
  }
  for (ChangeList& p : pending) REQUIRE_FALSE(a.commit(p, pool).has_value());
  // drain: requests finish, every expert leaves
  for (auto& q : requests)
    for (const PageHandle p : q) REQUIRE(pool.free(p) == PageStatus::kOk);
  ChangeList drain;
  a.residency().for_each_resident([&](ExpertKey k, const ExpertPages& p) {
    drain.evictions.push_back({k, p, EvictionCause::kPressure});
  });
  REQUIRE_FALSE(a.commit(drain, pool).has_value());
  CHECK(a.residency().resident_total() == 0);
  CHECK(pool.fully_merged());
  CHECK_FALSE(pool.check_invariants().has_value());
  CHECK(evictions_seen > 0);  // the run exercised both directions
  CHECK(restores_seen > 0);
}

}  // namespace

TEMPLATE_TEST_CASE("adjuster: randomized change lists against a shadow model (elastic capacity)",
                   "[adjust][random]", ElasticAdjuster, ElasticLruAdjuster, ElasticLfuAdjuster,
                   ElasticMissAdjuster) {
  for (std::uint64_t seed = 1; seed <= 100; ++seed) run_seed<TestType>(seed, true);
}

TEMPLATE_TEST_CASE("adjuster: randomized change lists against a shadow model (fixed-capacity caches)",
                   "[adjust][random]", LruCacheAdjuster, LfuCacheAdjuster) {
  for (std::uint64_t seed = 1; seed <= 100; ++seed) run_seed<TestType>(seed, false);
}
