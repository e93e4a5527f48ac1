// hysteresis_decision: the paper's worked numbers and every rule's boundary values (DESIGN §3.3).
#include <catch2/catch.hpp>

#include <cstdint>

#include "amoeba/policies/elastic_hysteresis.hpp"

using amoeba::policies::hysteresis_decision;
using amoeba::policies::HysteresisDecision;
using amoeba::policies::HysteresisParams;

// Compile-time checks of the constexpr rule with the paper's numbers.
static_assert(hysteresis_decision({}, 8, 0).evict == 3);     // short 8 -> ceil(9/3) = 3
static_assert(hysteresis_decision({}, 0, 1).evict == 1);     // F_b = 1 < 2 -> evict 1
static_assert(hysteresis_decision({}, 0, 20).restore == 3);  // floor(11/3) = 3
static_assert(hysteresis_decision({}, 0, 40).restore == 5);  // floor(31/3) = 10, capped at 5
static_assert(hysteresis_decision({}, 0, 5) == HysteresisDecision{});
static_assert(HysteresisParams{}.evict_below == 2 && HysteresisParams{}.restore_above == 9 &&
              HysteresisParams{}.max_restores == 5 && HysteresisParams{}.pages_per_expert == 3);

namespace {
// The paper's rule written out independently, for sweeps.
HysteresisDecision paper_rule(std::uint64_t r, std::uint64_t f) {
  if (r > 0) return {static_cast<std::uint64_t>((static_cast<double>(r) + 1.0) / 3.0 + 0.999999), 0};
  if (f < 2) return {1, 0};
  if (f > 9) return {0, std::min<std::uint64_t>(5, (f - 9) / 3)};
  return {0, 0};
}
}  // namespace

TEST_CASE("hysteresis: the paper's numbers", "[hysteresis]") {
  const HysteresisParams p{};
  CHECK(hysteresis_decision(p, 8, 0) == HysteresisDecision{3, 0});
  CHECK(hysteresis_decision(p, 0, 1) == HysteresisDecision{1, 0});
  CHECK(hysteresis_decision(p, 0, 20) == HysteresisDecision{0, 3});
  CHECK(hysteresis_decision(p, 0, 40) == HysteresisDecision{0, 5});
  for (std::uint64_t f = 2; f <= 9; ++f) {
    INFO("F_b = " << f);
    CHECK(hysteresis_decision(p, 0, f) == HysteresisDecision{});
  }
}

TEST_CASE("hysteresis: boundary values of each rule", "[hysteresis]") {
  const HysteresisParams p{};
  // shortfall rule: ceil((R_b + 1) / 3)
  CHECK(hysteresis_decision(p, 1, 0).evict == 1);
  CHECK(hysteresis_decision(p, 2, 0).evict == 1);
  CHECK(hysteresis_decision(p, 3, 0).evict == 2);
  CHECK(hysteresis_decision(p, 5, 0).evict == 2);
  CHECK(hysteresis_decision(p, 6, 0).evict == 3);
  CHECK(hysteresis_decision(p, 9, 0).evict == 4);
  // a shortfall wins over plenty of free pages (free pages may be trapped or of the wrong kind)
  CHECK(hysteresis_decision(p, 1, 100) == HysteresisDecision{1, 0});
  // preventive rule: F_b < 2
  CHECK(hysteresis_decision(p, 0, 0) == HysteresisDecision{1, 0});
  CHECK(hysteresis_decision(p, 0, 2) == HysteresisDecision{0, 0});
  // restore rule: F_b > 9, floor((F_b - 9) / 3), at most 5
  CHECK(hysteresis_decision(p, 0, 9) == HysteresisDecision{0, 0});
  CHECK(hysteresis_decision(p, 0, 10) == HysteresisDecision{0, 0});
  CHECK(hysteresis_decision(p, 0, 11) == HysteresisDecision{0, 0});
  CHECK(hysteresis_decision(p, 0, 12) == HysteresisDecision{0, 1});
  CHECK(hysteresis_decision(p, 0, 23) == HysteresisDecision{0, 4});
  CHECK(hysteresis_decision(p, 0, 24) == HysteresisDecision{0, 5});
  CHECK(hysteresis_decision(p, 0, 1'000'000) == HysteresisDecision{0, 5});
}

TEST_CASE("hysteresis: matches the rule written out, over a sweep", "[hysteresis]") {
  for (std::uint64_t r = 0; r < 64; ++r)
    for (std::uint64_t f = 0; f < 64; ++f) {
      INFO("R_b = " << r << ", F_b = " << f);
      CHECK(hysteresis_decision({}, r, f) == paper_rule(r, f));
    }
}

TEST_CASE("hysteresis: thresholds are parameters", "[hysteresis]") {
  const HysteresisParams p{.evict_below = 4, .restore_above = 20, .max_restores = 2, .pages_per_expert = 2};
  CHECK(hysteresis_decision(p, 0, 3) == HysteresisDecision{1, 0});
  CHECK(hysteresis_decision(p, 0, 4) == HysteresisDecision{0, 0});
  CHECK(hysteresis_decision(p, 0, 20) == HysteresisDecision{0, 0});
  CHECK(hysteresis_decision(p, 0, 22) == HysteresisDecision{0, 1});
  CHECK(hysteresis_decision(p, 0, 99) == HysteresisDecision{0, 2});
  CHECK(hysteresis_decision(p, 5, 0) == HysteresisDecision{3, 0});  // ceil(6 / 2)
}
