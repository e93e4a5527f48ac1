// LRU victims (CoMoE-style expert cache): the resident expert whose last routing is oldest leaves first.
// Needs routing observations (Adjuster::observe). Within a layer it picks the swap victim of a fixed-capacity
// cache; across layers (with an elastic capacity rule) the globally least recently used expert leaves first.
// Ties (e.g. never routed) go to the colder rank, then the lower layer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/score_order.hpp"
#include "amoeba/concepts/adjust_policies.hpp"

namespace amoeba::policies {

// evict_policy + routing_observer. Memory: one 64-bit tick per (layer, expert). Cost: O(L * E) per decision
// that evicts (a scan per layer), O(k) per observe of k experts.
class LruEvict {
 public:
  void observe(const AdjustView& v, std::uint32_t layer, std::span<const std::uint32_t> experts) {
    const std::size_t e_per = v.experts_per_layer();
    if (last_use_.size() != std::size_t(v.layers()) * e_per)
      last_use_.assign(std::size_t(v.layers()) * e_per, 0);
    for (std::uint32_t e : experts)
      if (e < e_per) last_use_[layer * e_per + e] = v.tick();
  }
  // Tick of the last observe() that routed k (0: never).
  std::uint64_t last_use(const AdjustView& v, ExpertKey k) const noexcept {
    const std::size_t i = std::size_t(k.layer) * v.experts_per_layer() + k.expert;
    return i < last_use_.size() ? last_use_[i] : 0;
  }
  void nominate_evictions(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) const {
    nominate_by_score(v, n, out, Score{this, &v});
  }
  std::optional<ExpertKey> victim_in_layer(const AdjustView& v, std::uint32_t layer) const {
    return lowest_scored(v, layer, Score{this, &v});
  }

 private:
  struct Score {
    const LruEvict* p;
    const AdjustView* v;
    VictimScore operator()(ExpertKey k) const noexcept {
      return VictimScore{p->last_use(*v, k), 0, coldness_of(*v, k)};
    }
  };
  std::vector<std::uint64_t> last_use_;
};
static_assert(evict_policy<LruEvict> && routing_observer<LruEvict>);

}  // namespace amoeba::policies
