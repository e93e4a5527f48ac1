// Nominations across layers on a small hand-made ranking: exact sequences, the offload limit, busy experts.
#include <catch2/catch.hpp>

#include <vector>

#include "amoeba/expert/nominations.hpp"

using namespace amoeba;

namespace {
// layer 0 ranks 0,1,2,3; layer 1 ranks 1,3,2,0; layer 2 ranks 2,0,1,3 (0 and 1 tie: lower id first).
ExpertRanker hand_ranking() {
  return ExpertRanker::from_probabilities(
      {{0.40, 0.30, 0.20, 0.10}, {0.05, 0.50, 0.15, 0.30}, {0.25, 0.25, 0.35, 0.15}});
}
ExpertPages some_pages() {
  return ExpertPages{};
}

template <class N>
std::vector<ExpertKey> drain(N& n, std::size_t max = 100) {
  std::vector<ExpertKey> out;
  while (out.size() < max) {
    const auto x = n.next();
    if (!x) break;
    out.push_back(x->expert);
  }
  return out;
}
}  // namespace

TEST_CASE("nominations: restore order, highest probability across layers first", "[nominations]") {
  const auto ranker = hand_ranking();
  ResidencyTable table(ranker);  // everything offloaded
  RestoreNominations n(ranker, table);
  CHECK(n.peek()->expert == ExpertKey{1, 1});
  CHECK(n.peek()->probability == 0.50);
  const std::vector<ExpertKey> expected{{1, 1}, {0, 0}, {2, 2}, {0, 1}, {1, 3}, {2, 0},
                                        {2, 1}, {0, 2}, {1, 2}, {2, 3}, {0, 3}, {1, 0}};
  CHECK(drain(n) == expected);
  CHECK(n.empty());
}

TEST_CASE("nominations: evict order, lowest probability across layers first", "[nominations]") {
  const auto ranker = hand_ranking();
  ResidencyTable table(ranker);
  for (std::uint32_t l = 0; l < 3; ++l)
    for (std::uint32_t e = 0; e < 4; ++e) REQUIRE(table.mark_resident({l, e}, some_pages()));
  EvictNominations n(ranker, table, [](std::uint32_t) { return 4u; });
  const std::vector<ExpertKey> expected{{1, 0}, {0, 3}, {1, 2}, {2, 3}, {0, 2}, {2, 1},
                                        {2, 0}, {0, 1}, {1, 3}, {2, 2}, {0, 0}, {1, 1}};
  CHECK(drain(n) == expected);
}

TEST_CASE("nominations: a layer at the offload limit does not nominate", "[nominations]") {
  const auto ranker = hand_ranking();
  ResidencyTable table(ranker);
  for (std::uint32_t l = 0; l < 3; ++l)
    for (std::uint32_t e = 0; e < 4; ++e) REQUIRE(table.mark_resident({l, e}, some_pages()));
  const std::uint32_t limit = 2;
  auto allowance = [&](std::uint32_t l) { return limit - table.offloaded_count(l); };

  SECTION("limit 2, nothing offloaded: each layer gives two, then nobody nominates") {
    EvictNominations n(ranker, table, allowance);
    const std::vector<ExpertKey> expected{{1, 0}, {0, 3}, {1, 2}, {2, 3}, {0, 2}, {2, 1}};
    CHECK(drain(n) == expected);
  }
  SECTION("layer 1 already at the limit, layer 0 one below it") {
    REQUIRE(table.mark_offloaded({1, 0}));
    REQUIRE(table.mark_offloaded({1, 2}));
    REQUIRE(table.mark_offloaded({0, 3}));
    EvictNominations n(ranker, table, allowance);
    const std::vector<ExpertKey> expected{{2, 3}, {0, 2}, {2, 1}};
    CHECK(drain(n) == expected);
  }
}

TEST_CASE("nominations: a resident prefix, taking one exposes the layer's next", "[nominations]") {
  const auto ranker = hand_ranking();
  ResidencyTable table(ranker);
  // layer 0 keeps ranks 0-1, layer 1 ranks 0-2, layer 2 rank 0
  for (ExpertKey k : {ExpertKey{0, 0}, {0, 1}, {1, 1}, {1, 3}, {1, 2}, {2, 2}})
    REQUIRE(table.mark_resident(k, some_pages()));
  RestoreNominations r(ranker, table);
  CHECK(drain(r) == std::vector<ExpertKey>{{2, 0}, {2, 1}, {0, 2}, {2, 3}, {0, 3}, {1, 0}});
  EvictNominations e(ranker, table, [](std::uint32_t) { return 10u; });
  CHECK(drain(e) == std::vector<ExpertKey>{{1, 2}, {0, 1}, {1, 3}, {2, 2}, {0, 0}, {1, 1}});
}

TEST_CASE("nominations: skipped experts do not end their layer", "[nominations]") {
  const auto ranker = hand_ranking();
  ResidencyTable table(ranker);
  RestoreNominations r(ranker, table, [](ExpertKey k) {
    return k == ExpertKey{1, 1} || k == ExpertKey{0, 0};
  });
  CHECK(drain(r, 3) == std::vector<ExpertKey>{{2, 2}, {0, 1}, {1, 3}});
}
