// The grouped GEMMs' run order of the shared chunks' units (kernels/moe/unit_order.hpp): a bijection on the
// call's units that keeps each kind's list order, puts every chunk unit inside its span and spaces them
// evenly there; spread 1 (and no chunks) is the list's own order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "moe/unit_order.hpp"

using amoeba::kernels::unit_order::list_unit;

namespace {

// Checks list_unit(·, units, chunks, spread) over every position against its rules.
void check_order(long long units, long long chunks, long long spread) {
  INFO("units " << units << ", chunk units " << chunks << ", spread " << spread);
  const long long span = std::min(units, chunks * std::max(spread, 1LL));
  std::vector<int> seen(static_cast<std::size_t>(units), 0);
  long long next_chunk = 0, next_routed = chunks, last_chunk_at = -1, max_gap = 0;
  for (long long u = 0; u < units; ++u) {
    const long long l = list_unit(u, units, chunks, spread);
    REQUIRE(l >= 0);
    REQUIRE(l < units);
    ++seen[static_cast<std::size_t>(l)];
    if (l < chunks) {  // a chunk's unit: the next in list order, inside the span
      REQUIRE(l == next_chunk);
      ++next_chunk;
      REQUIRE(u < std::max(span, chunks));
      max_gap = std::max(max_gap, u - last_chunk_at);
      last_chunk_at = u;
    } else {  // a routed unit: the next in list order
      REQUIRE(l == next_routed);
      ++next_routed;
    }
  }
  for (int s : seen) REQUIRE(s == 1);
  REQUIRE(next_chunk == chunks);
  if (chunks > 0 && spread > 1) {  // evenly: no two chunk units further apart than ⌈span / C⌉
    REQUIRE(max_gap <= (span + chunks - 1) / chunks);
  }
}

}  // namespace

TEST_CASE("unit order: spread 1 and calls without chunks keep the tile list's order", "[unit_order]") {
  for (long long u = 0; u < 1000; ++u) {
    REQUIRE(list_unit(u, 1000, 352, 1) == u);
    REQUIRE(list_unit(u, 1000, 0, 8) == u);
  }
}

TEST_CASE("unit order: a worked example, 4 chunk units among 12 spread over 8 positions", "[unit_order]") {
  // Span 8: chunk units at ⌊(u+1)·4/8⌋ > ⌊u·4/8⌋, positions 1, 3, 5, 7; routed units 4.. in the gaps and past
  // the span.
  const long long expected[12] = {4, 0, 5, 1, 6, 2, 7, 3, 8, 9, 10, 11};
  for (long long u = 0; u < 12; ++u) REQUIRE(list_unit(u, 12, 4, 2) == expected[u]);
  // Spread over all 12: 4 chunk units every 3 positions.
  const long long even[12] = {4, 5, 0, 6, 7, 1, 8, 9, 2, 10, 11, 3};
  for (long long u = 0; u < 12; ++u) REQUIRE(list_unit(u, 12, 4, 1000) == even[u]);
}

TEST_CASE("unit order: a bijection keeping each kind's order, chunks inside their span", "[unit_order]") {
  // The sizes of the measured layers (Qwen1.5-MoE's 4 chunks: 352 of 1672 gate/up units at 256 tokens), the
  // edges (every unit a chunk's, one routed unit, one chunk unit), then random sizes.
  for (long long spread : {1LL, 2LL, 3LL, 4LL, 1LL << 20}) {
    check_order(1672, 352, spread);
    check_order(5, 5, spread);
    check_order(6, 5, spread);
    check_order(7, 1, spread);
    check_order(1, 0, spread);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    const long long units = 1 + static_cast<long long>(rng() % 5000);
    const long long chunks = static_cast<long long>(rng() % (units + 1));
    const long long spread = 1 + static_cast<long long>(rng() % 9);
    check_order(units, chunks, spread);
  }
}
