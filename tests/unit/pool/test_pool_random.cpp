// Randomized allocate/split/free/merge sequences against a shadow model (DESIGN §9): 10^6 operations x 20
// seeds for an attention-only pool and for a hybrid pool; zero overlaps, zero leaks, every seed fully merged
// once drained.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "amoeba/pool.hpp"
#include "support/pool_shadow.hpp"

using namespace amoeba;

namespace {
std::uint64_t ops_per_seed() {
  const char* env = std::getenv("AMOEBA_POOL_RANDOM_OPS");  // shorter runs under sanitizers
  return env ? std::strtoull(env, nullptr, 10) : 1'000'000;
}

template <class Pool>
void run_seed(Pool& pool, std::uint64_t seed) {
  testing::PoolShadow<Pool> shadow(pool);
  std::mt19937_64 rng(seed);
  const std::uint64_t n = ops_per_seed();
  for (std::uint64_t i = 0; i < n; ++i) {
    // Phases of pressure: mostly allocate, then mostly free, so the pool fills, fragments and heals
    // repeatedly.
    const bool filling = (i / 20000) % 2 == 0;
    std::uint32_t choice = static_cast<std::uint32_t>(rng());
    if (!filling && choice % 8 < 4) choice = 4 + choice % 3;
    auto err = shadow.step(choice, rng());
    if (err) FAIL("seed " << seed << " op " << i << ": " << *err);
    if (i % 4099 == 0) {
      if (auto e = pool.check_invariants()) FAIL("seed " << seed << " op " << i << ": " << *e);
      if (auto e = shadow.check_counts()) FAIL("seed " << seed << " op " << i << ": " << *e);
    }
  }
  if (auto e = shadow.drain()) FAIL("seed " << seed << " drain: " << *e);
  REQUIRE(pool.fully_merged());
  REQUIRE(pool.stats().trapped_bytes == 0);
}
}  // namespace

TEST_CASE("random sequences, attention-only pool", "[pool][random]") {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    // 40 large pages of 16 KiB, KV pages of 1 KiB: 640 KV slots, so the pool runs full often.
    MoePool pool(ArenaSpan{nullptr, 40 * 16384}, {PageSpec{16384}, PageSpec{1024}});
    run_seed(pool, seed);
  }
}

TEST_CASE("random sequences, hybrid pool", "[pool][random]") {
  for (std::uint64_t seed = 100; seed < 120; ++seed) {
    // expert 12 KiB, SSM 8 KiB -> large 24 KiB; KV 1 KiB, conv 512 B with 400 B payload.
    HybridMoePool pool(ArenaSpan{nullptr, 30 * 24576 + 512},
                       {PageSpec{12288}, PageSpec{8192}, PageSpec{1024}, PageSpec{512, 400}});
    run_seed(pool, seed);
  }
}
