// The routable rule (routing.hpp make_routable, applied by SyntheticRouting and RecordedRouting): every set a
// routing source hands out is one a top-k router can produce for the step's T tokens,
// min(k, E) <= |set| <= min(T k, E); a set already within those bounds is unchanged; the same seed gives the
// same sets; the rule draws nothing from the random streams.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/routing.hpp"
#include "engine/routing_source.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

StepBatch batch_of(std::uint64_t tokens) {
  StepBatch b;
  b.tokens = tokens;
  return b;
}

std::vector<std::uint32_t> as_vector(std::span<const std::uint32_t> s) {
  return {s.begin(), s.end()};
}

bool ascending_distinct_below(const std::vector<std::uint32_t>& s, std::uint32_t experts) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] >= experts) return false;
    if (i > 0 && s[i - 1] >= s[i]) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("routable range: [min(k, E), min(T k, E)], nothing for no tokens", "[engine][routing]") {
  CHECK(routable_range(1, 4, 60).min == 4);
  CHECK(routable_range(1, 4, 60).max == 4);
  CHECK(routable_range(3, 4, 60).max == 12);
  CHECK(routable_range(15, 4, 60).max == 60);
  CHECK(routable_range(1000, 4, 60).max == 60);
  CHECK(routable_range(2, 8, 4).min == 4);  // more experts per token than experts: all of them
  CHECK(routable_range(2, 8, 4).max == 4);
  CHECK(routable_range(~std::uint64_t{0}, 8, 128).max == 128);  // T k does not overflow
  CHECK(routable_range(0, 4, 60).min == 0);
  CHECK(routable_range(0, 4, 60).max == 0);
}

TEST_CASE("make_routable: adds the most popular missing experts, keeps the most popular, else nothing",
          "[engine][routing]") {
  // Popularity of 6 experts: 5 most popular, then 2, then 0 and 3 (tied: the lower id first), 4, 1.
  const std::vector<double> pop{0.2, 0.05, 0.3, 0.2, 0.1, 0.4};
  std::vector<std::uint32_t> s{1};
  make_routable(s, 1, 3, pop);  // one token, top-3: exactly 3
  CHECK(s == std::vector<std::uint32_t>{1, 2, 5});
  s = {};
  make_routable(s, 2, 3, pop);
  CHECK(s == std::vector<std::uint32_t>{0, 2, 5});
  s = {0, 1, 3, 4};
  make_routable(s, 1, 2, pop);  // at most 2: the two most popular of the set (0 and 3 tie: 0)
  CHECK(s == std::vector<std::uint32_t>{0, 3});
  s = {1, 4};
  make_routable(s, 1, 2, pop);  // within bounds: unchanged, however unpopular
  CHECK(s == std::vector<std::uint32_t>{1, 4});
  s = {0, 1, 2};
  make_routable(s, 0, 2, pop);  // no tokens: nothing is routed
  CHECK(s.empty());
}

TEST_CASE("make_routable on random sets: within bounds after, the identity within bounds before",
          "[engine][routing]") {
  std::mt19937_64 gen(20261201);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto experts = static_cast<std::uint32_t>(1 + gen() % 80);
    const auto top_k = static_cast<std::uint32_t>(1 + gen() % 10);
    const std::uint64_t tokens = gen() % 4 == 0 ? 1 + gen() % 3 : gen() % 64;
    std::vector<double> pop(experts);
    for (double& p : pop) p = double(gen() % 7);  // many ties
    std::vector<std::uint32_t> set;
    const double density = double(gen() % 101) / 100.0;
    for (std::uint32_t e = 0; e < experts; ++e)
      if (double(gen() % 1000) / 1000.0 < density) set.push_back(e);
    const std::vector<std::uint32_t> before = set;
    const RoutableRange r = routable_range(tokens, top_k, experts);
    make_routable(set, tokens, top_k, pop);
    INFO("E " << experts << " k " << top_k << " T " << tokens << " |set| " << before.size());
    REQUIRE(set.size() >= r.min);
    REQUIRE(set.size() <= r.max);
    REQUIRE(ascending_distinct_below(set, experts));
    if (before.size() >= r.min && before.size() <= r.max) {
      REQUIRE(set == before);
    } else if (before.size() < r.min) {  // grown: everything drawn is kept
      REQUIRE(std::includes(set.begin(), set.end(), before.begin(), before.end()));
    } else {  // cut: a subset, and nothing dropped is more popular than what is kept
      REQUIRE(std::includes(before.begin(), before.end(), set.begin(), set.end()));
      double least_kept = 1e300;
      for (std::uint32_t e : set) least_kept = std::min(least_kept, pop[e]);
      for (std::uint32_t e : before)
        if (!std::binary_search(set.begin(), set.end(), e)) REQUIRE(pop[e] <= least_kept);
    }
  }
}

TEST_CASE("synthetic routing hands out routable sets only, for any T, k, E, skew and seed",
          "[engine][routing]") {
  std::mt19937_64 gen(7);
  std::size_t changed = 0;  // draws the rule had to change, over every trial
  for (int trial = 0; trial < 60; ++trial) {
    const auto experts = static_cast<std::uint32_t>(2 + gen() % 127);
    const auto top_k = static_cast<std::uint32_t>(1 + gen() % std::min<std::uint32_t>(experts, 8));
    const auto layers = static_cast<std::uint32_t>(1 + gen() % 6);
    RoutingParams p;
    p.skew = double(gen() % 801) / 100.0;  // [0, 8], the flag's range
    p.temporal_period = 1 + static_cast<std::uint32_t>(gen() % 8);
    const std::uint64_t seed = gen();
    SyntheticRouting routing(RoutingModel(layers, experts, top_k, p, seed));
    SyntheticRouting twin(RoutingModel(layers, experts, top_k, p, seed));
    RoutingModel raw(layers, experts, top_k, p, seed);  // the same draws without the rule
    std::vector<std::uint8_t> touched;
    for (int step = 0; step < 40; ++step) {
      const std::uint64_t tokens = step % 3 == 0 ? 1 : 1 + gen() % 40;
      routing.begin_step(batch_of(tokens));
      twin.begin_step(batch_of(tokens));
      raw.step(tokens, touched);
      const RoutableRange r = routable_range(tokens, top_k, experts);
      for (std::uint32_t l = 0; l < layers; ++l) {
        const std::vector<std::uint32_t> set = as_vector(routing.layer_experts(l));
        INFO("E " << experts << " k " << top_k << " skew " << p.skew << " T " << tokens << " layer " << l);
        REQUIRE(set.size() >= r.min);
        REQUIRE(set.size() <= r.max);
        REQUIRE(ascending_distinct_below(set, experts));
        REQUIRE(set == as_vector(twin.layer_experts(l)));  // the same seed: the same sets
        std::vector<std::uint32_t> drawn;
        for (std::uint32_t e = 0; e < experts; ++e)
          if (touched[std::size_t(l) * experts + e]) drawn.push_back(e);
        // Within bounds the draw is handed out as it is; and the rule consumed no random draw, or the raw
        // model's later steps would differ from the source's.
        if (drawn.size() >= r.min && drawn.size() <= r.max)
          REQUIRE(set == drawn);
        else
          ++changed;
      }
    }
  }
  CHECK(changed > 0);  // the trials do reach sets outside the bounds
}

TEST_CASE("synthetic routing at one token of a top-4 model: exactly 4 experts, the draw when it has 4",
          "[engine][routing]") {
  // Independent draws at T = 1 often touch 3 or 5 experts of Qwen1.5-MoE's 60: the case the rule exists for.
  SyntheticRouting routing(RoutingModel(24, 60, 4, RoutingParams{}, 0));
  RoutingModel raw(24, 60, 4, RoutingParams{}, 0);
  std::vector<std::uint8_t> touched;
  std::size_t unroutable = 0, kept = 0;
  for (int step = 0; step < 50; ++step) {
    routing.begin_step(batch_of(1));
    raw.step(1, touched);
    for (std::uint32_t l = 0; l < 24; ++l) {
      REQUIRE(routing.layer_experts(l).size() == 4);
      const auto n = std::count(touched.begin() + l * 60, touched.begin() + (l + 1) * 60, std::uint8_t{1});
      if (n == 4)
        ++kept;
      else
        ++unroutable;
    }
  }
  CHECK(unroutable > 0);  // the draws do leave the bounds here
  CHECK(kept > 0);
}

TEST_CASE("recorded routing replays routable sets for each step's tokens, routable ones as recorded",
          "[engine][routing]") {
  // 8 experts, top-2. Layer 0 routes to all 8 at step 0 (a large batch's set), to {6} at step 1.
  std::vector<RecordedStep> steps{{{0, 1, 2, 3, 4, 5, 6, 7}}, {{6}}, {{1, 6}}};
  RecordedRouting r(1, 8, 2, steps, /*wrap=*/true);
  r.begin_step(batch_of(4));  // 4 tokens x 2 = 8: all 8 are routable
  CHECK(r.layer_experts(0).size() == 8);
  r.begin_step(batch_of(4));  // {6} alone is short of k = 2: 6 is the record's most routed, then 1
  CHECK(as_vector(r.layer_experts(0)) == std::vector<std::uint32_t>{1, 6});
  r.begin_step(batch_of(1));
  CHECK(as_vector(r.layer_experts(0)) == std::vector<std::uint32_t>{1, 6});
  r.begin_step(batch_of(1));  // wrapped to step 0, now at one token: the 2 most routed experts
  CHECK(as_vector(r.layer_experts(0)) == std::vector<std::uint32_t>{1, 6});
  r.begin_step(batch_of(3));  // step 1 at 3 tokens
  CHECK(as_vector(r.layer_experts(0)) == std::vector<std::uint32_t>{1, 6});
}
