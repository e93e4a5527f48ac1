// LFU victims (CoMoE-style expert cache): the resident expert routed in the fewest steps leaves first; ties
// go to the least recently used, then the colder rank, then the lower layer. Counts are kept for every
// expert, resident or not, since the first observation ("perfect" LFU: an expert re-admitted keeps its
// history).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/policy_concepts.hpp"
#include "amoeba/adjust/score_order.hpp"

namespace amoeba::policies {

// evict_policy + routing_observer. Each observe() that routes an expert adds 1 to its count (steps in which
// it was used, not tokens). Cost as LruEvict.
class LfuEvict {
 public:
  void observe(const AdjustView& v, std::uint32_t layer, std::span<const std::uint32_t> experts) {
    const std::size_t e_per = v.experts_per_layer(), n = std::size_t(v.layers()) * e_per;
    if (count_.size() != n) {
      count_.assign(n, 0);
      last_use_.assign(n, 0);
    }
    for (std::uint32_t e : experts)
      if (e < e_per) {
        ++count_[layer * e_per + e];
        last_use_[layer * e_per + e] = v.tick();
      }
  }
  std::uint64_t count(const AdjustView& v, ExpertKey k) const noexcept {
    const std::size_t i = std::size_t(k.layer) * v.experts_per_layer() + k.expert;
    return i < count_.size() ? count_[i] : 0;
  }
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
    const LfuEvict* p;
    const AdjustView* v;
    VictimScore operator()(ExpertKey k) const noexcept {
      return VictimScore{p->count(*v, k), p->last_use(*v, k), coldness_of(*v, k)};
    }
  };
  std::vector<std::uint64_t> count_, last_use_;
};
static_assert(evict_policy<LfuEvict> && routing_observer<LfuEvict>);

}  // namespace amoeba::policies
