// LRU victims (CoMoE-style expert cache): the resident expert whose last routing is oldest leaves first.
// Needs routing observations (Adjuster::observe). Within a layer it picks the swap victim of a fixed-capacity
// cache; across layers (with an elastic capacity rule) the globally least recently used expert leaves first.
// Ties (e.g. never routed, or routed in the same observe call) go to the colder rank, then the lower layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/policy_concepts.hpp"
#include "amoeba/adjust/score_order.hpp"

namespace amoeba::policies {

// evict_policy + routing_observer. Keeps, per layer, every expert (resident or not) in one recency list
// (most recent at the head; never-routed experts in rank order, coldest at the tail), so that a victim is
// found by walking from the tail past the few offloaded or busy experts.
// Memory: 16 bytes per (layer, expert). Cost: O(k log k) per observe of k experts; a decision that evicts n
// experts: O(L log L + n log L + skipped experts).
class LruEvict {
 public:
  void observe(const AdjustView& v, std::uint32_t layer, std::span<const std::uint32_t> experts) {
    init(v);
    const std::uint32_t E = v.experts_per_layer();
    order_.assign(experts.begin(), experts.end());
    std::erase_if(order_, [E](std::uint32_t e) { return e >= E; });
    // coldest first, so that after the moves the hottest of the group is nearest the head
    std::sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
      return v.residency().rank_of({layer, a}) > v.residency().rank_of({layer, b});
    });
    for (std::uint32_t e : order_) {
      last_use_[std::size_t(layer) * E + e] = v.tick();
      move_to_head(layer, e, E);
    }
  }
  // Tick of the last observe() that routed k (0: never).
  std::uint64_t last_use(const AdjustView& v, ExpertKey k) const noexcept {
    const std::size_t i = std::size_t(k.layer) * v.experts_per_layer() + k.expert;
    return i < last_use_.size() ? last_use_[i] : 0;
  }

  void nominate_evictions(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) const {
    if (n == 0) return;
    if (!ready(v)) return nominate_by_score(v, n, out, Score{this, &v});  // nothing observed yet
    struct Slot {
      std::uint64_t last;
      std::uint32_t coldness, layer, expert;
    };
    const auto after = [](const Slot& a, const Slot& b) {
      return std::tie(a.last, a.coldness, a.layer) > std::tie(b.last, b.coldness, b.layer);
    };
    const std::uint32_t E = v.experts_per_layer();
    std::vector<Slot> heap;
    std::vector<std::uint32_t> left(v.layers());
    heap.reserve(v.layers());
    for (std::uint32_t l = 0; l < v.layers(); ++l) {
      left[l] = v.eviction_allowance(l);
      if (left[l] == 0) continue;
      const std::uint32_t e = walk(v, l, tail_[l]);
      if (e != kNil) heap.push_back({last_use_[std::size_t(l) * E + e], coldness_of(v, {l, e}), l, e});
    }
    std::make_heap(heap.begin(), heap.end(), after);
    while (n > 0 && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), after);
      const Slot s = heap.back();
      heap.pop_back();
      out.push_back({s.layer, s.expert});
      --n;
      if (--left[s.layer] == 0) continue;
      const std::uint32_t e = walk(v, s.layer, prev_[std::size_t(s.layer) * E + s.expert]);
      if (e == kNil) continue;
      heap.push_back({last_use_[std::size_t(s.layer) * E + e], coldness_of(v, {s.layer, e}), s.layer, e});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  }
  std::optional<ExpertKey> victim_in_layer(const AdjustView& v, std::uint32_t layer) const {
    if (!ready(v)) return lowest_scored(v, layer, Score{this, &v});
    const std::uint32_t e = walk(v, layer, tail_[layer]);
    return e == kNil ? std::nullopt : std::optional<ExpertKey>(ExpertKey{layer, e});
  }

 private:
  static constexpr std::uint32_t kNil = std::numeric_limits<std::uint32_t>::max();
  struct Score {
    const LruEvict* p;
    const AdjustView* v;
    VictimScore operator()(ExpertKey k) const noexcept {
      return VictimScore{p->last_use(*v, k), 0, coldness_of(*v, k)};
    }
  };
  bool ready(const AdjustView& v) const noexcept {
    return last_use_.size() == std::size_t(v.layers()) * v.experts_per_layer();
  }
  void init(const AdjustView& v) {
    if (ready(v)) return;
    const std::uint32_t L = v.layers(), E = v.experts_per_layer();
    last_use_.assign(std::size_t(L) * E, 0);
    prev_.assign(std::size_t(L) * E, kNil);
    next_.assign(std::size_t(L) * E, kNil);
    head_.assign(L, kNil);
    tail_.assign(L, kNil);
    for (std::uint32_t l = 0; l < L; ++l) {  // rank order: hottest at the head
      std::uint32_t prev = kNil;
      for (std::uint32_t r = 0; r < E; ++r) {
        const std::uint32_t e = v.residency().expert_at_rank(l, r);
        prev_[std::size_t(l) * E + e] = prev;
        if (prev == kNil)
          head_[l] = e;
        else
          next_[std::size_t(l) * E + prev] = e;
        prev = e;
      }
      tail_[l] = prev;
    }
  }
  void move_to_head(std::uint32_t l, std::uint32_t e, std::uint32_t E) {
    std::uint32_t* prev = &prev_[std::size_t(l) * E];
    std::uint32_t* next = &next_[std::size_t(l) * E];
    if (head_[l] == e) return;
    // unlink (e is not the head, so prev[e] != kNil)
    next[prev[e]] = next[e];
    if (next[e] != kNil)
      prev[next[e]] = prev[e];
    else
      tail_[l] = prev[e];
    // push front
    prev[e] = kNil;
    next[e] = head_[l];
    prev[head_[l]] = e;
    head_[l] = e;
  }
  // From expert `e` towards the head: the first evictable one, or kNil.
  std::uint32_t walk(const AdjustView& v, std::uint32_t l, std::uint32_t e) const {
    const std::uint32_t E = v.experts_per_layer();
    while (e != kNil && !v.is_evictable({l, e})) e = prev_[std::size_t(l) * E + e];
    return e;
  }

  std::vector<std::uint64_t> last_use_;
  std::vector<std::uint32_t> prev_, next_, head_, tail_;
  std::vector<std::uint32_t> order_;  // scratch for observe()
};
static_assert(evict_policy<LruEvict> && routing_observer<LruEvict>);

}  // namespace amoeba::policies
