// The loader's protocol on the CPU: queue order (restores, then predictions), deduplication, buffer capacity,
// on-demand slot reuse, where the kernel reads each expert, and rejected inputs that change nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "amoeba/adjust/validate_changes.hpp"
#include "amoeba/loader/load_planner.hpp"
#include "amoeba/pool.hpp"

using namespace amoeba;

namespace {
constexpr std::uint32_t kLayers = 3, kExperts = 8, kSlots = 3;

struct Fixture {
  MoePool pool{ArenaSpan{nullptr, 64 * 4096}, {PageSpec{4096}, PageSpec{1024}}};
  ResidencyTable table{kLayers, kExperts};
  LoadPlanner planner{LoaderShape{kLayers, kExperts, kSlots}};

  ExpertPages take_pages(ExpertKey k, bool reserved) {
    ExpertPages p;
    for (ExpertMatrix m : kExpertMatrices) p[m] = *pool.allocate<ExpertPage>(expert_owner(k, m, reserved));
    return p;
  }
  void make_resident(ExpertKey k) { REQUIRE(table.mark_resident(k, take_pages(k, false))); }
  Restore reserve(ExpertKey k) { return Restore{k, take_pages(k, true)}; }

  Fixture() {
    // Experts 0..4 resident in every layer; 5, 6, 7 offloaded.
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t e = 0; e < 5; ++e) make_resident({l, e});
  }
};

std::vector<std::uint32_t> experts_of(const std::vector<ExpertCopy>& v) {
  std::vector<std::uint32_t> out;
  for (auto& c : v) out.push_back(c.expert.expert);
  return out;
}
}  // namespace

TEST_CASE("prefetch queue: restores first, then predictions, deduplicated", "[loader]") {
  Fixture f;
  ChangeList cl;
  cl.restores.push_back(f.reserve({1, 6}));
  REQUIRE_FALSE(f.planner.begin_forward(cl, f.table, f.pool).has_value());

  // layer 1: predicted 2 (resident), 6 (being restored), 7, 7 again, 5 -> restore 6, then 7, 5
  const std::vector<std::uint32_t> pred{2, 6, 7, 7, 5};
  auto q = f.planner.plan_prefetch(1, pred);
  REQUIRE(q.has_value());
  REQUIRE(experts_of(*q) == std::vector<std::uint32_t>{6, 7, 5});
  CHECK((*q)[0].target == CopyTarget::kReservedPages);
  CHECK((*q)[0].pages == cl.restores[0].pages);
  CHECK((*q)[1].target == CopyTarget::kBufferSlot);
  CHECK((*q)[1].buffer == 1);
  CHECK((*q)[1].slot == 0);
  CHECK((*q)[2].slot == 1);
  CHECK(f.planner.stats().restores == 1);
  CHECK(f.planner.stats().prefetches == 2);

  // where layer 1 is read from: 0..4 resident pages, 6 restored pages, 7 and 5 buffer slots
  std::vector<ExpertLocation> loc(kExperts);
  f.planner.locations(1, loc);
  CHECK(loc[2].page[1] == static_cast<std::int32_t>(f.table.pages_of({1, 2})->pages[1].index));
  CHECK(loc[6].buffer_slot == -1);
  CHECK(loc[6].page[2] == static_cast<std::int32_t>(cl.restores[0].pages.pages[2].index));
  CHECK(loc[7].buffer_slot == 0);
  CHECK(loc[5].buffer_slot == 1);

  // demand: routed 7 (prefetched: a hit), 6 (restored), 1 (resident) -> nothing to load
  const std::vector<std::uint32_t> routed{7, 6, 1};
  auto d = f.planner.plan_demand(1, routed);
  REQUIRE(d.has_value());
  CHECK(d->empty());  // the restore was issued by the prefetch already
  CHECK(f.planner.stats().prefetch_hits == 1);
  CHECK(f.planner.stats().prefetch_wasted == 1);  // 5 was predicted, not routed
}

TEST_CASE("predictions beyond the buffer are dropped and counted", "[loader]") {
  Fixture f;
  f.table.mark_offloaded({0, 4});  // pages leak into nowhere here: the test owns the pool
  f.table.mark_offloaded({0, 3});
  REQUIRE_FALSE(f.planner.begin_forward(ChangeList{}, f.table, f.pool).has_value());
  const std::vector<std::uint32_t> pred{3, 4, 5, 6, 7};
  auto q = f.planner.plan_prefetch(0, pred);
  REQUIRE(q.has_value());
  CHECK(experts_of(*q) == std::vector<std::uint32_t>{3, 4, 5});
  CHECK(f.planner.stats().predictions_dropped == 2);
}

TEST_CASE("on-demand loads: free slots first, then unrouted predictions, too many misses changes nothing",
          "[loader]") {
  Fixture f;
  REQUIRE_FALSE(f.planner.begin_forward(ChangeList{}, f.table, f.pool).has_value());
  const std::vector<std::uint32_t> pred{5, 6};
  REQUIRE(f.planner.plan_prefetch(2, pred).has_value());  // slots 0:5, 1:6

  f.table.mark_offloaded({2, 0});  // now 0, 5, 6, 7 are offloaded: 4 > 3 slots
  const std::vector<std::uint32_t> all{0, 5, 6, 7};
  auto bad = f.planner.plan_demand(2, all);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == LoaderErrorCode::kTooManyMisses);
  CHECK(bad.error().message.find("expert_offload_limit") != std::string::npos);
  CHECK(f.planner.stats().on_demand_misses == 0);
  std::vector<ExpertLocation> loc(kExperts);
  f.planner.locations(2, loc);
  CHECK(loc[5].buffer_slot == 0);  // unchanged
  CHECK(loc[6].buffer_slot == 1);
  CHECK(loc[7].absent());

  const std::vector<std::uint32_t> routed{7, 0, 5};  // 5 hit; 7 -> free slot 2; 0 -> slot 1 (6 unrouted)
  auto d = f.planner.plan_demand(2, routed);
  REQUIRE(d.has_value());
  REQUIRE(d->size() == 2);
  CHECK((*d)[0].expert.expert == 7);
  CHECK((*d)[0].slot == 2);
  CHECK((*d)[0].on_demand);
  CHECK((*d)[1].expert.expert == 0);
  CHECK((*d)[1].slot == 1);
  f.planner.locations(2, loc);
  CHECK(loc[6].absent());
  CHECK(loc[0].buffer_slot == 1);
  CHECK(f.planner.stats().on_demand_misses == 2);
  CHECK(f.planner.stats().prefetch_hits == 1);
}

TEST_CASE("buffers alternate by layer and are emptied for layer + 2", "[loader]") {
  Fixture f;
  REQUIRE_FALSE(f.planner.begin_forward(ChangeList{}, f.table, f.pool).has_value());
  const std::vector<std::uint32_t> p{5};
  auto a = f.planner.plan_prefetch(0, p);
  auto b = f.planner.plan_prefetch(1, p);
  REQUIRE((a && b));
  CHECK((*a)[0].buffer == 0);
  CHECK((*b)[0].buffer == 1);
  auto c = f.planner.plan_prefetch(2, p);
  REQUIRE(c.has_value());
  CHECK((*c)[0].buffer == 0);
  CHECK((*c)[0].slot == 0);  // layer 0's occupant is gone
  std::vector<ExpertLocation> loc(kExperts);
  f.planner.locations(0, loc);
  CHECK(loc[5].absent());  // buffer 0 now belongs to layer 2
}

TEST_CASE("evicted experts stay readable until the forward ends", "[loader]") {
  Fixture f;
  ChangeList cl;
  cl.evictions.push_back(Eviction{{0, 4}, *f.table.pages_of({0, 4}), EvictionCause::kPressure});
  REQUIRE_FALSE(f.planner.begin_forward(cl, f.table, f.pool).has_value());
  std::vector<ExpertLocation> loc(kExperts);
  f.planner.locations(0, loc);
  CHECK(loc[4].page[0] == static_cast<std::int32_t>(cl.evictions[0].pages.pages[0].index));
  // its pages still belong to the expert: nobody can be handed them during the forward
  CHECK(f.pool.owner_of(cl.evictions[0].pages.pages[0]) == expert_owner({0, 4}, ExpertMatrix::kW1));
  auto gone = f.planner.end_forward();
  REQUIRE(gone == std::vector<ExpertKey>{{0, 4}});
  CHECK_FALSE(f.planner.in_forward());
}

TEST_CASE("bad change lists are rejected and change nothing", "[loader]") {
  Fixture f;
  SECTION("eviction of a non-resident expert") {
    ChangeList cl;
    cl.evictions.push_back(Eviction{{1, 6}, {}, EvictionCause::kPressure});
    auto e = f.planner.begin_forward(cl, f.table, f.pool);
    REQUIRE(e.has_value());
    CHECK(e->code == ChangeErrorCode::kNotResident);
    CHECK(e->message.find("(layer 1, expert 6)") != std::string::npos);
  }
  SECTION("restore of a resident expert") {
    ChangeList cl;
    cl.restores.push_back(Restore{{1, 2}, *f.table.pages_of({1, 2})});
    auto e = f.planner.begin_forward(cl, f.table, f.pool);
    REQUIRE(e.has_value());
    CHECK(e->code == ChangeErrorCode::kAlreadyResident);
  }
  SECTION("restore page not reserved for that expert") {
    ChangeList cl;
    Restore r = f.reserve({1, 6});
    r.pages[ExpertMatrix::kW3] = f.take_pages({1, 7}, true)[ExpertMatrix::kW3];  // someone else's reservation
    cl.restores.push_back(r);
    auto e = f.planner.begin_forward(cl, f.table, f.pool);
    REQUIRE(e.has_value());
    CHECK(e->code == ChangeErrorCode::kNotReserved);
  }
  SECTION("restore page that is free") {
    ChangeList cl;
    Restore r = f.reserve({1, 6});
    REQUIRE(f.pool.free(r.pages[ExpertMatrix::kW2]) == PageStatus::kOk);
    cl.restores.push_back(r);
    auto e = f.planner.begin_forward(cl, f.table, f.pool);
    REQUIRE(e.has_value());
    CHECK(e->code == ChangeErrorCode::kNotReserved);
  }
  CHECK_FALSE(f.planner.in_forward());
  const std::vector<std::uint32_t> p{5};
  auto q = f.planner.plan_prefetch(0, p);
  REQUIRE_FALSE(q.has_value());
  CHECK(q.error().code == LoaderErrorCode::kNoForward);
  CHECK(f.planner.stats().copies == 0);
}

TEST_CASE("bad shapes and indices", "[loader]") {
  CHECK_THROWS_AS(LoadPlanner(LoaderShape{0, 8, 2}), ConfigError);
  CHECK_THROWS_WITH(LoadPlanner(LoaderShape{2, 8, 9}), Catch::Contains("loader.buffer_slots = 9"));
  Fixture f;
  REQUIRE_FALSE(f.planner.begin_forward(ChangeList{}, f.table, f.pool).has_value());
  const std::vector<std::uint32_t> bad{8};
  CHECK(f.planner.plan_prefetch(0, bad).error().code == LoaderErrorCode::kOutOfRange);
  CHECK(f.planner.plan_demand(0, bad).error().code == LoaderErrorCode::kOutOfRange);
  CHECK(f.planner.plan_demand(3, {}).error().code == LoaderErrorCode::kOutOfRange);
}

TEST_CASE("zero buffer slots: nothing may be offloaded, so any miss is refused", "[loader]") {
  Fixture f;
  LoadPlanner none(LoaderShape{kLayers, kExperts, 0});
  REQUIRE_FALSE(none.begin_forward(ChangeList{}, f.table, f.pool).has_value());
  const std::vector<std::uint32_t> resident{0, 3}, offloaded{6};
  auto p = none.plan_prefetch(0, offloaded);  // a prediction with no slot is dropped, not an error
  REQUIRE(p.has_value());
  CHECK(p->empty());
  CHECK(none.stats().predictions_dropped == 1);
  auto ok = none.plan_demand(0, resident);
  REQUIRE(ok.has_value());
  CHECK(ok->empty());
  auto miss = none.plan_demand(1, offloaded);
  REQUIRE_FALSE(miss.has_value());
  CHECK(miss.error().code == LoaderErrorCode::kTooManyMisses);
}

TEST_CASE("one validation: the planner rejects exactly what Adjuster::commit rejects", "[loader][adjust]") {
  // Every bad list gives the same ChangeError code from validate_changes under both callers' names.
  Fixture f;
  struct Case {
    const char* what;
    ChangeList list;
    ChangeErrorCode code;
  };
  std::vector<Case> cases;
  {
    ChangeList c;
    c.evictions.push_back(Eviction{{1, 6}, {}, EvictionCause::kPressure});
    cases.push_back({"eviction of an offloaded expert", c, ChangeErrorCode::kNotResident});
  }
  {
    ChangeList c;
    c.evictions.push_back(Eviction{{1, 2}, *f.table.pages_of({1, 3}), EvictionCause::kPressure});
    cases.push_back({"eviction naming another expert's pages", c, ChangeErrorCode::kPagesMismatch});
  }
  {
    ChangeList c;
    const Eviction ev{{2, 1}, *f.table.pages_of({2, 1}), EvictionCause::kPressure};
    c.evictions = {ev, ev};
    cases.push_back({"an expert named twice", c, ChangeErrorCode::kDuplicate});
  }
  {
    ChangeList c;
    c.restores.push_back(Restore{{0, 9}, {}});
    cases.push_back({"an expert outside the model", c, ChangeErrorCode::kOutOfRange});
  }
  {
    ChangeList c;
    c.restores.push_back(Restore{{0, 7}, f.take_pages({0, 7}, /*reserved=*/false)});
    cases.push_back({"restore into pages that are not reserved", c, ChangeErrorCode::kNotReserved});
  }
  const auto used_before = f.pool.stats().used_of<ExpertPage>();
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<std::uint8_t> seen;
    const auto direct = validate_changes(c.list, f.table, f.pool, "commit", ChangeCheck::kApply, seen);
    REQUIRE(direct.has_value());
    CHECK(direct->code == c.code);
    const auto planner = f.planner.begin_forward(c.list, f.table, f.pool);
    REQUIRE(planner.has_value());
    CHECK(planner->code == c.code);
    CHECK(planner->expert == direct->expert);
    CHECK_FALSE(f.planner.in_forward());
    CHECK(std::count(seen.begin(), seen.end(), 1) == 0);  // scratch left clean
  }
  CHECK(f.pool.stats().used_of<ExpertPage>() == used_before);
}
