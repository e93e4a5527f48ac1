// Victim selection by score, shared by score-based evict policies (LRU, LFU, ...): each expert gets a score
// (smaller leaves first); each layer nominates its lowest-scored evictable expert and a priority queue over
// layers takes the lowest, exposing that layer's next -- the same protocol as the paper's rank nominations,
// with a different order. Scores must be distinct within a layer: end them with VictimScore::coldness, which
// the ranking makes unique (colder ranks leave first on ties).
//
// Cost: O(L * E) score evaluations to build, O(E + log L) per victim taken.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/expert/expert_key.hpp"

namespace amoeba {

// A lexicographic score: primary, then secondary, then coldness = E - 1 - rank (colder = smaller).
struct VictimScore {
  std::uint64_t primary = 0;
  std::uint64_t secondary = 0;
  std::uint32_t coldness = 0;
  friend constexpr auto operator<=>(const VictimScore&, const VictimScore&) = default;
};

inline std::uint32_t coldness_of(const AdjustView& v, ExpertKey k) noexcept {
  return v.experts_per_layer() - 1 - v.residency().rank_of(k);
}

// The lowest-scored evictable expert of `layer` whose score is above `above` (when given).
template <class Score>
std::optional<ExpertKey> lowest_scored(const AdjustView& v, std::uint32_t layer, const Score& score,
                                       const std::optional<VictimScore>& above = std::nullopt) {
  std::optional<ExpertKey> best;
  VictimScore best_s{};
  const ResidencyTable& t = v.residency();
  for (std::uint32_t e = 0; e < v.experts_per_layer(); ++e) {
    const ExpertKey k{layer, e};
    if (!t.is_resident(k) || v.is_busy(k)) continue;
    const VictimScore s = score(k);
    if (above && !(*above < s)) continue;
    if (!best || s < best_s) {
      best = k;
      best_s = s;
    }
  }
  return best;
}

// Appends up to n victims, lowest score first across layers (ties: lower layer first), respecting each
// layer's eviction_allowance().
template <class Score>
void nominate_by_score(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out,
                       const Score& score) {
  if (n == 0) return;
  struct Slot {
    VictimScore s;
    std::uint32_t layer;
    ExpertKey k;
  };
  const auto after = [](const Slot& a, const Slot& b) {
    return std::tie(a.s, a.layer) > std::tie(b.s, b.layer);
  };
  std::vector<Slot> heap;
  std::vector<std::uint32_t> left(v.layers());
  heap.reserve(v.layers());
  for (std::uint32_t l = 0; l < v.layers(); ++l) {
    left[l] = v.eviction_allowance(l);
    if (left[l] == 0) continue;
    if (auto k = lowest_scored(v, l, score)) heap.push_back({score(*k), l, *k});
  }
  std::make_heap(heap.begin(), heap.end(), after);
  while (n > 0 && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Slot top = heap.back();
    heap.pop_back();
    out.push_back(top.k);
    --n;
    if (--left[top.layer] == 0) continue;
    if (auto k = lowest_scored(v, top.layer, score, top.s)) {
      heap.push_back({score(*k), top.layer, *k});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  }
}

}  // namespace amoeba
