// ResidencyTable: entries, counts, checked mutations and the rank-order searches (against brute force).
#include <catch2/catch.hpp>

#include <random>

#include "amoeba/expert/residency_table.hpp"

using namespace amoeba;

namespace {
ExpertPages pages_for(std::uint32_t base) {
  ExpertPages p;
  for (std::size_t m = 0; m < kMatricesPerExpert; ++m) p.pages[m] = PageHandle{base + std::uint32_t(m), 0};
  return p;
}
}  // namespace

TEST_CASE("residency: mark resident / offloaded, counts and failed mutations", "[residency]") {
  ResidencyTable t(2, 5);
  CHECK(t.resident_total() == 0);
  CHECK(t.offloaded_count(1) == 5);
  REQUIRE(t.mark_resident({1, 3}, pages_for(30)));
  CHECK(t.is_resident({1, 3}));
  CHECK(t.pages_of({1, 3}) == pages_for(30));
  CHECK(t.resident_count(1) == 1);
  const auto v = t.version();
  CHECK_FALSE(t.mark_resident({1, 3}, pages_for(60)));  // already resident: unchanged
  CHECK_FALSE(t.mark_resident({2, 0}, pages_for(60)));  // out of range
  CHECK(t.version() == v);
  CHECK(t.pages_of({1, 3}) == pages_for(30));
  CHECK_FALSE(t.mark_offloaded({0, 3}).has_value());
  CHECK(t.mark_offloaded({1, 3}) == pages_for(30));
  CHECK_FALSE(t.pages_of({1, 3}).has_value());
  CHECK(t.resident_total() == 0);
}

TEST_CASE("residency: rank searches agree with a scan, across word boundaries", "[residency]") {
  std::mt19937_64 rng(7);
  for (std::uint32_t experts : {1u, 5u, 63u, 64u, 65u, 128u, 130u}) {
    ExpertRanker::Builder b(3, experts);
    for (std::uint32_t l = 0; l < 3; ++l)
      for (std::uint32_t e = 0; e < experts; ++e) b.set_probability(l, e, double(rng() % 1000) / 1000.0);
    const ExpertRanker ranker = b.build();
    ResidencyTable t(ranker);
    for (int round = 0; round < 200; ++round) {
      const ExpertKey k{std::uint32_t(rng() % 3), std::uint32_t(rng() % experts)};
      if (t.is_resident(k))
        (void)t.mark_offloaded(k);
      else
        REQUIRE(t.mark_resident(k, pages_for(0)));
      const std::uint32_t l = k.layer;
      const std::uint32_t from = std::uint32_t(rng() % (experts + 1));
      std::optional<std::uint32_t> first, last;
      for (std::uint32_t r = from; r < experts && !first; ++r)
        if (!t.is_resident({l, ranker.expert_at(l, r)})) first = r;
      for (std::uint32_t r = from; r-- > 0 && !last;)
        if (t.is_resident({l, ranker.expert_at(l, r)})) last = r;
      CHECK(t.first_offloaded_rank(l, from) == first);
      CHECK(t.last_resident_rank(l, from) == last);
      CHECK(t.expert_at_rank(l, t.rank_of(k)) == k.expert);
    }
  }
}
