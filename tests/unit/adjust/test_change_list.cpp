// Adjuster commit/cancel: the deferred-free rule, reservations, and rejected change lists that change
// nothing.
#include <catch2/catch.hpp>

#include <vector>

#include "amoeba/policies/stacks.hpp"

using namespace amoeba;
using namespace amoeba::policies;

namespace {
struct Fixture {
  Fixture()
      : arena(64 * 4096),
        pool(arena.span(), {PageSpec{4096}, PageSpec{1024}}),
        a(ExpertRanker::uniform(2, 4)) {
    REQUIRE_FALSE(a.populate(pool).has_value());  // all 8 experts, 24 pages
  }
  // Snapshot of everything a failed call must leave alone.
  struct Snapshot {
    std::uint64_t version, used, free, busy;
    friend bool operator==(const Snapshot&, const Snapshot&) = default;
  };
  Snapshot snap() const {
    return {a.residency().version(), pool.stats().used_of<ExpertPage>(), pool.available<ExpertPage>(),
            a.busy_count()};
  }
  HostArena arena;
  MoePool pool;
  ElasticAdjuster a;
};
}  // namespace

TEST_CASE("adjuster: evicted pages return only at commit, restores are reserved at decision time",
          "[adjust]") {
  Fixture f;
  ChangeList c = f.a.adjust(2, 0, f.pool);  // ceil(3/3) = 1
  REQUIRE(c.evictions.size() == 1);
  const ExpertKey k = c.evictions[0].expert;
  CHECK(k == ExpertKey{0, 3});  // uniform ranking: coldest = highest id; ties -> lower layer
  CHECK(f.a.residency().is_resident(k));
  for (ExpertMatrix m : kExpertMatrices)
    CHECK(f.pool.owner_of(c.evictions[0].pages[m]) == expert_owner(k, m));
  const auto free_before = f.pool.available<ExpertPage>();
  REQUIRE_FALSE(f.a.commit(c, f.pool).has_value());
  CHECK_FALSE(f.a.residency().is_resident(k));
  CHECK(f.pool.available<ExpertPage>() == free_before + 3);
  for (ExpertMatrix m : kExpertMatrices) CHECK_FALSE(f.pool.owner_of(c.evictions[0].pages[m]).has_value());

  ChangeList r = f.a.adjust(0, 12, f.pool);  // floor(3/3) = 1
  REQUIRE(r.restores.size() == 1);
  CHECK(r.restores[0].expert == k);
  CHECK(f.pool.available<ExpertPage>() == free_before);
  for (ExpertMatrix m : kExpertMatrices)
    CHECK(f.pool.owner_of(r.restores[0].pages[m]) == expert_owner(k, m, /*reserved=*/true));
  CHECK_FALSE(f.a.residency().is_resident(k));
  REQUIRE_FALSE(f.a.commit(r, f.pool).has_value());
  CHECK(f.a.residency().pages_of(k) == r.restores[0].pages);
  for (ExpertMatrix m : kExpertMatrices) CHECK(f.pool.owner_of(r.restores[0].pages[m]) == expert_owner(k, m));
  CHECK(f.a.busy_count() == 0);
}

TEST_CASE("adjuster: cancel releases reservations and keeps evicted experts", "[adjust]") {
  Fixture f;
  ChangeList e = f.a.adjust(5, 0, f.pool);
  REQUIRE(e.evictions.size() == 2);
  REQUIRE_FALSE(f.a.commit(e, f.pool).has_value());
  const auto free0 = f.pool.available<ExpertPage>();
  ChangeList r = f.a.adjust(0, 15, f.pool);
  REQUIRE(r.restores.size() == 2);
  CHECK(f.pool.available<ExpertPage>() == free0 - 6);
  SECTION("whole list") {
    REQUIRE_FALSE(f.a.cancel(r, f.pool).has_value());
    CHECK(r.empty());
    CHECK(f.pool.available<ExpertPage>() == free0);
    CHECK(f.a.busy_count() == 0);
  }
  SECTION("one restore") {
    const ExpertKey first = r.restores[0].expert;
    REQUIRE_FALSE(f.a.cancel_restore(r, first, f.pool).has_value());
    CHECK(r.restores.size() == 1);
    CHECK(f.pool.available<ExpertPage>() == free0 - 3);
    const auto err = f.a.cancel_restore(r, first, f.pool);
    REQUIRE(err.has_value());
    CHECK(err->code == ChangeErrorCode::kNotFound);
    REQUIRE_FALSE(f.a.commit(r, f.pool).has_value());
    CHECK_FALSE(f.a.residency().is_resident(first));
    // the cancelled expert can be named again
    ChangeList again = f.a.adjust(0, 12, f.pool);
    REQUIRE(again.restores.size() == 1);
    CHECK(again.restores[0].expert == first);
  }
  SECTION("pressure evictions in a cancelled list stay resident") {
    ChangeList p = f.a.adjust(2, 0, f.pool);
    REQUIRE(p.evictions.size() == 1);
    REQUIRE_FALSE(f.a.cancel(p, f.pool).has_value());
    CHECK(f.a.residency().resident_total() == 6);
  }
}

TEST_CASE("adjuster: bad change lists are rejected with a clear error and change nothing", "[adjust]") {
  Fixture f;
  ChangeList e = f.a.adjust(2, 0, f.pool);
  REQUIRE_FALSE(f.a.commit(e, f.pool).has_value());
  const ExpertKey gone = e.evictions[0].expert;
  ChangeList r = f.a.adjust(0, 12, f.pool);  // reserves `gone` back
  REQUIRE(r.restores.size() == 1);
  const auto before = f.snap();
  auto expect = [&](const ChangeList& c, ChangeErrorCode code, ExpertKey who) {
    const auto err = f.a.commit(c, f.pool);
    REQUIRE(err.has_value());
    CHECK(err->code == code);
    CHECK(err->expert == who);
    CHECK(err->message.find("commit: ") == 0);
    CHECK(f.snap() == before);
    CHECK_FALSE(f.pool.check_invariants().has_value());
  };
  SECTION("committing an eviction twice: not resident") {
    CHECK(f.a.commit(e, f.pool)->message ==
          "commit: eviction of an expert that is not resident: (layer 0, expert 3)");
    expect(e, ChangeErrorCode::kNotResident, gone);
  }
  SECTION("a valid restore next to an invalid eviction is not applied either") {
    ChangeList mixed = r;
    mixed.evictions.push_back({{1, 2}, *f.a.residency().pages_of({1, 2}), EvictionCause::kPressure});
    mixed.evictions.push_back({{1, 3}, *f.a.residency().pages_of({1, 2}), EvictionCause::kPressure});
    expect(mixed, ChangeErrorCode::kPagesMismatch, ExpertKey{1, 3});
    CHECK(f.a.residency().is_resident({1, 2}));
    CHECK_FALSE(f.a.residency().is_resident(gone));
  }
  SECTION("restore of a resident expert") {
    ChangeList bad;
    bad.restores.push_back({{1, 1}, r.restores[0].pages});
    expect(bad, ChangeErrorCode::kAlreadyResident, ExpertKey{1, 1});
  }
  SECTION("restore whose pages are not reserved for it") {
    ChangeList bad;
    bad.restores.push_back({gone, *f.a.residency().pages_of({1, 1})});
    expect(bad, ChangeErrorCode::kNotReserved, gone);
    ChangeList other = r;
    other.restores[0].pages[ExpertMatrix::kW2] = other.restores[0].pages[ExpertMatrix::kW1];
    expect(other, ChangeErrorCode::kNotReserved, gone);
  }
  SECTION("eviction with pages the expert does not hold") {
    ChangeList bad;
    bad.evictions.push_back({{1, 2}, *f.a.residency().pages_of({1, 1}), EvictionCause::kPressure});
    expect(bad, ChangeErrorCode::kPagesMismatch, ExpertKey{1, 2});
  }
  SECTION("an expert named twice") {
    ChangeList bad;
    const ExpertKey k{1, 0};
    bad.evictions.push_back({k, *f.a.residency().pages_of(k), EvictionCause::kPressure});
    bad.evictions.push_back(bad.evictions[0]);
    expect(bad, ChangeErrorCode::kDuplicate, k);
  }
  SECTION("an expert outside the model") {
    ChangeList bad;
    bad.evictions.push_back({{2, 0}, {}, EvictionCause::kPressure});
    expect(bad, ChangeErrorCode::kOutOfRange, ExpertKey{2, 0});
    bad.evictions[0].expert = {0, 4};
    expect(bad, ChangeErrorCode::kOutOfRange, ExpertKey{0, 4});
  }
  SECTION("cancel of a list whose restore is not reserved") {
    ChangeList bad = r;
    bad.restores[0].pages[ExpertMatrix::kW3] = PageHandle{60, 0};
    const auto err = f.a.cancel(bad, f.pool);
    REQUIRE(err.has_value());
    CHECK(err->code == ChangeErrorCode::kNotReserved);
    CHECK(f.snap() == before);
    CHECK(bad.restores.size() == 1);
  }
  REQUIRE_FALSE(f.a.commit(r, f.pool).has_value());  // the genuine list still commits
  CHECK(f.a.residency().is_resident(gone));
}

TEST_CASE("adjuster: populate is all or nothing", "[adjust]") {
  HostArena arena(20 * 4096);
  MoePool pool(arena.span(), {PageSpec{4096}, PageSpec{1024}});
  ElasticAdjuster a(ExpertRanker::uniform(2, 4));
  const auto s = a.populate(pool);  // needs 24 pages, 20 exist
  REQUIRE(s.has_value());
  CHECK(s->requested_pages == 24);
  CHECK(s->available_pages == 20);
  CHECK(a.residency().resident_total() == 0);
  CHECK(pool.fully_merged());
  const ExpertKey outside[] = {{0, 9}};
  CHECK_THROWS_AS(a.place(outside, pool), ConfigError);
  const ExpertKey two[] = {{0, 1}, {1, 2}};
  REQUIRE_FALSE(a.place(two, pool).has_value());
  CHECK(a.residency().resident_total() == 2);
}

TEST_CASE("adjuster: owner ids encode layer, expert, matrix and reservation", "[adjust]") {
  for (ExpertMatrix m : kExpertMatrices)
    for (bool reserved : {false, true}) {
      const ExpertKey k{123, 4567};
      const auto d = decode_expert_owner(expert_owner(k, m, reserved));
      REQUIRE(d.has_value());
      CHECK(d->expert == k);
      CHECK(d->matrix == m);
      CHECK(d->reserved == reserved);
      CHECK(is_expert_owner(expert_owner(k, m, reserved)));
      CHECK_FALSE(is_request_owner(expert_owner(k, m, reserved)));
    }
  CHECK(is_request_owner(request_owner(kMaxRequestOwner)));
  CHECK_FALSE(decode_expert_owner(kFreeOwner).has_value());
  CHECK_FALSE(is_expert_owner(kFreeOwner));
}
