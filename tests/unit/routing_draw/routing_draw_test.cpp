// tests/device/routing_draw.hpp: every router draws k distinct in-range experts per token with weights that
// sum to 1; the uniform router is the benchmark's historical one (same ids for the same seed, counts flat),
// hot puts its expert in every other token, zipf skews the counts by rank as 1 / rank^s says, balanced gives
// every expert T·k / E tokens rounded down or up.
#include "routing_draw.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

namespace {

using amoeba::testing::draw_routing;
using amoeba::testing::DrawnRouting;
using amoeba::testing::Router;
using amoeba::testing::zipf_ranking;

void check_well_formed(const DrawnRouting& r, int experts, int k, int tokens) {
  REQUIRE(r.ids.size() == static_cast<std::size_t>(tokens) * k);
  REQUIRE(r.weights.size() == r.ids.size());
  REQUIRE(r.shared.size() == static_cast<std::size_t>(tokens));
  std::set<int> used;
  for (int t = 0; t < tokens; ++t) {
    std::set<int> mine;
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      const int e = r.ids[static_cast<std::size_t>(t) * k + j];
      CHECK(e >= 0);
      CHECK(e < experts);
      mine.insert(e);
      used.insert(e);
      const float w = r.weights[static_cast<std::size_t>(t) * k + j];
      CHECK(w > 0.0f);
      sum += w;
    }
    CHECK(mine.size() == static_cast<std::size_t>(k));
    CHECK(sum == Approx(1.0).epsilon(1e-5));
    CHECK(r.shared[t] > 0.0f);
    CHECK(r.shared[t] < 1.0f);
  }
  CHECK(r.distinct_experts == static_cast<int>(used.size()));
}

std::vector<int> counts(const DrawnRouting& r, int experts) {
  std::vector<int> c(experts, 0);
  for (int e : r.ids) ++c[e];
  return c;
}

}  // namespace

TEST_CASE("every router draws k distinct experts per token, weights summing to 1", "[routing_draw]") {
  for (const Router& router : {Router{}, Router::parse("hot:5"), Router::parse("zipf:1.2"),
                               Router::parse("zipf:0"), Router::parse("balanced")})
    for (int tokens : {0, 1, 3, 64, 1000}) {
      INFO(router.name() << " T=" << tokens);
      check_well_formed(draw_routing(60, 4, tokens, 11, router), 60, 4, tokens);
      check_well_formed(draw_routing(8, 2, tokens, 12, router), 8, 2, tokens);
      check_well_formed(draw_routing(128, 8, tokens, 13, router), 128, 8, tokens);
    }
}

TEST_CASE("a seed gives the same routing, another seed another", "[routing_draw]") {
  for (const Router& router :
       {Router{}, Router::parse("hot:3"), Router::parse("zipf:1"), Router::parse("balanced")}) {
    INFO(router.name());
    const DrawnRouting a = draw_routing(60, 4, 200, 7, router), b = draw_routing(60, 4, 200, 7, router);
    const DrawnRouting c = draw_routing(60, 4, 200, 8, router);
    CHECK(a.ids == b.ids);
    CHECK(a.weights == b.weights);
    CHECK(a.ids != c.ids);
  }
}

// The ids the benchmark's routing drew before this header existed (E60 k4, 5 tokens, seed 7, libstdc++): the
// uniform and hot routers keep them, so earlier results stay comparable.
TEST_CASE("uniform and hot keep the benchmark's historical draws", "[routing_draw]") {
  const std::vector<std::int32_t> uniform = {45, 7,  10, 50, 43, 36, 19, 20, 51, 37,
                                             4,  10, 19, 38, 3,  43, 40, 10, 1,  36};
  const std::vector<std::int32_t> hot = {9,  57, 53, 6,  15, 45, 25, 50, 9,  52,
                                         37, 5,  10, 20, 39, 4,  9,  54, 18, 47};
  CHECK(draw_routing(60, 4, 5, 7).ids == uniform);
  CHECK(draw_routing(60, 4, 5, 7, Router::parse("hot:9")).ids == hot);
}

TEST_CASE("uniform: flat counts, hot: its expert in every other token", "[routing_draw]") {
  const int experts = 60, k = 4, tokens = 30000;
  const std::vector<int> c = counts(draw_routing(experts, k, tokens, 21), experts);
  const double mean = static_cast<double>(tokens) * k / experts;                         // 2000
  for (int e = 0; e < experts; ++e) CHECK(std::abs(c[e] - mean) < 6 * std::sqrt(mean));  // ~6 sigma

  const DrawnRouting hot = draw_routing(experts, k, 1000, 22, Router::parse("hot:17"));
  for (int t = 0; t < 1000; t += 2) CHECK(hot.ids[static_cast<std::size_t>(t) * k] == 17);
  CHECK(counts(hot, experts)[17] >= 500);
}

TEST_CASE("zipf: counts fall with the fixed rank, as steeply as s says", "[routing_draw]") {
  const int experts = 60, k = 4, tokens = 30000;
  const std::vector<int> rank_of = zipf_ranking(experts);
  std::vector<int> expert_at(experts);
  for (int e = 0; e < experts; ++e) expert_at[rank_of[e]] = e;
  // The ranking is a permutation, the same for every seed (it does not depend on one).
  CHECK(std::set<int>(rank_of.begin(), rank_of.end()).size() == static_cast<std::size_t>(experts));
  CHECK(zipf_ranking(experts) == rank_of);

  const std::vector<int> flat =
      counts(draw_routing(experts, k, tokens, 31, Router::parse("zipf:0")), experts);
  const std::vector<int> skew =
      counts(draw_routing(experts, k, tokens, 31, Router::parse("zipf:1.2")), experts);
  const double mean = static_cast<double>(tokens) * k / experts;
  for (int e = 0; e < experts; ++e) CHECK(std::abs(flat[e] - mean) < 6 * std::sqrt(mean));
  // Skewed: the most popular expert is taken by a large share of the tokens (at most every token: k
  // distinct), the least popular far below the mean, and counts fall with rank (compared over groups of 10
  // ranks to average out the sampling noise).
  const int top = skew[expert_at[0]], last = skew[expert_at[experts - 1]];
  CHECK(top > 5 * mean);
  CHECK(top <= tokens);
  CHECK(last < mean / 2);
  int previous = tokens * k;
  for (int g = 0; g < experts; g += 10) {
    int group = 0;
    for (int r = g; r < g + 10; ++r) group += skew[expert_at[r]];
    CHECK(group < previous);
    previous = group;
  }
}

TEST_CASE("balanced: every expert gets T*k/E tokens, rounded down or up", "[routing_draw]") {
  const Router balanced = Router::parse("balanced");
  // Qwen3 at 4096 tokens: exactly 256 each; Qwen1.5 at 4096: 16384 / 60 = 273.07; Mixtral at 3 tokens: 6 of
  // 8 experts once; all 60 experts with one token only 4.
  struct Case {
    int experts, k, tokens;
  };
  for (const Case& c :
       {Case{128, 8, 4096}, Case{60, 4, 4096}, Case{8, 2, 3}, Case{60, 4, 1}, Case{60, 4, 0}}) {
    INFO("E" << c.experts << " k" << c.k << " T=" << c.tokens);
    const DrawnRouting r = draw_routing(c.experts, c.k, c.tokens, 41, balanced);
    const long long slots = static_cast<long long>(c.tokens) * c.k;
    const long long low = slots / c.experts, high = (slots + c.experts - 1) / c.experts;
    const std::vector<int> n = counts(r, c.experts);
    long long total = 0;
    for (int e = 0; e < c.experts; ++e) {
      CHECK(n[e] >= low);
      CHECK(n[e] <= high);
      total += n[e];
    }
    CHECK(total == slots);
    CHECK(r.distinct_experts == static_cast<int>(std::min<long long>(slots, c.experts)));
  }
  CHECK(counts(draw_routing(128, 8, 4096, 42, balanced), 128) == std::vector<int>(128, 256));
  // Which experts get the extra token depends on the seed.
  CHECK(counts(draw_routing(60, 4, 1, 43, balanced), 60) != counts(draw_routing(60, 4, 1, 44, balanced), 60));
}

TEST_CASE("Router::parse names the accepted forms and refuses the rest", "[routing_draw]") {
  CHECK(Router::parse("uniform").kind == Router::Kind::kUniform);
  CHECK(Router::parse("hot:3").hot_expert == 3);
  CHECK(Router::parse("zipf:1.5").zipf_s == 1.5);
  CHECK(Router::parse("zipf:1.5").name() == "zipf:1.5");
  CHECK(Router::parse("hot:3").name() == "hot:3");
  CHECK(Router::parse("balanced").kind == Router::Kind::kBalanced);
  CHECK(Router::parse("balanced").name() == "balanced");
  for (const char* bad : {"", "zipf", "zipf:", "zipf:-1", "zipf:x", "hot", "hot:-2", "uniform:1",
                          "lognormal:1", "balanced:1", "balanced:"}) {
    INFO(bad);
    try {
      Router::parse(bad);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("--router") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(draw_routing(8, 2, 4, 1, Router::parse("hot:8")), std::invalid_argument);
}
