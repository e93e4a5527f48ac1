// Nominations over the expert ranking (DESIGN §3.2, paper):
//   restore: each layer nominates its next non-resident expert (its hottest offloaded one); the adjuster
//   takes
//            the nominees with the highest routing probability across layers;
//   evict:   each layer nominates its last resident expert (its coldest resident one); the adjuster takes the
//            lowest. Layers that already have `expert_offload_limit` experts offloaded do not nominate.
// Both are priority queues over layers: taking one nominee exposes that layer's next one. Ties in probability
// go to the lower layer. The rank order is the ResidencyTable's (the ranking it was built from);
// probabilities come from the ExpertRanker.
//
// Cost: building is O(L * E / 64 + L) with the table's rank bitmaps (plus skipped experts); each next() is
// O(log L + E / 64).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <optional>
#include <vector>

#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba {

struct Nominee {
  ExpertKey expert;
  double probability = 0;
  std::uint32_t rank = 0;
  friend constexpr bool operator==(const Nominee&, const Nominee&) = default;
};

namespace detail {
struct NomineeSlot {
  double p;
  std::uint32_t layer, rank;
};
}  // namespace detail

// Restore nominations. `skip(ExpertKey)` -> bool hides experts (e.g. busy ones) without ending the layer.
template <class Skip = bool (*)(ExpertKey)>
class RestoreNominations {
 public:
  RestoreNominations(
      const ExpertRanker& ranker, const ResidencyTable& table, Skip skip = [](ExpertKey) { return false; })
      : ranker_(&ranker), table_(&table), skip_(std::move(skip)) {
    assert(ranker.layers() == table.layers() && ranker.experts_per_layer() == table.experts_per_layer());
    heap_.reserve(table.layers());
    for (std::uint32_t l = 0; l < table.layers(); ++l) push_from(l, 0);
    std::make_heap(heap_.begin(), heap_.end(), less);
  }
  bool empty() const noexcept { return heap_.empty(); }
  std::optional<Nominee> peek() const {
    if (heap_.empty()) return std::nullopt;
    const auto& s = heap_.front();
    return Nominee{{s.layer, table_->expert_at_rank(s.layer, s.rank)}, s.p, s.rank};
  }
  // Takes the best nominee; that layer's next offloaded expert becomes its nominee.
  std::optional<Nominee> next() {
    auto n = peek();
    if (!n) return n;
    std::pop_heap(heap_.begin(), heap_.end(), less);
    heap_.pop_back();
    if (push_from(n->expert.layer, n->rank + 1)) std::push_heap(heap_.begin(), heap_.end(), less);
    return n;
  }

 private:
  // "a is worse than b": lower probability, or equal and higher layer.
  static bool less(const detail::NomineeSlot& a, const detail::NomineeSlot& b) noexcept {
    return a.p < b.p || (a.p == b.p && a.layer > b.layer);
  }
  bool push_from(std::uint32_t layer, std::uint32_t from_rank) {
    for (auto r = table_->first_offloaded_rank(layer, from_rank); r;
         r = table_->first_offloaded_rank(layer, *r + 1)) {
      const ExpertKey k{layer, table_->expert_at_rank(layer, *r)};
      if (skip_(k)) continue;
      heap_.push_back({ranker_->probability(k), layer, *r});
      return true;
    }
    return false;
  }
  const ExpertRanker* ranker_;
  const ResidencyTable* table_;
  Skip skip_;
  std::vector<detail::NomineeSlot> heap_;
};

// Eviction nominations. `allowance(layer)` -> how many experts the layer may still lose (0: it does not
// nominate; paper: a layer with expert_offload_limit experts offloaded); each nominee taken from a layer uses
// one. `skip(ExpertKey)` hides experts.
template <class Allowance, class Skip = bool (*)(ExpertKey)>
class EvictNominations {
 public:
  EvictNominations(
      const ExpertRanker& ranker, const ResidencyTable& table, Allowance allowance,
      Skip skip = [](ExpertKey) { return false; })
      : ranker_(&ranker), table_(&table), skip_(std::move(skip)) {
    assert(ranker.layers() == table.layers() && ranker.experts_per_layer() == table.experts_per_layer());
    left_.resize(table.layers());
    heap_.reserve(table.layers());
    for (std::uint32_t l = 0; l < table.layers(); ++l) {
      left_[l] = static_cast<std::uint32_t>(allowance(l));
      if (left_[l] > 0) push_below(l, table.experts_per_layer());
    }
    std::make_heap(heap_.begin(), heap_.end(), greater);
  }
  bool empty() const noexcept { return heap_.empty(); }
  std::optional<Nominee> peek() const {
    if (heap_.empty()) return std::nullopt;
    const auto& s = heap_.front();
    return Nominee{{s.layer, table_->expert_at_rank(s.layer, s.rank)}, s.p, s.rank};
  }
  // Takes the coldest nominee; that layer nominates its next coldest resident expert if it may lose another.
  std::optional<Nominee> next() {
    auto n = peek();
    if (!n) return n;
    std::pop_heap(heap_.begin(), heap_.end(), greater);
    heap_.pop_back();
    const std::uint32_t l = n->expert.layer;
    if (--left_[l] > 0 && push_below(l, n->rank)) std::push_heap(heap_.begin(), heap_.end(), greater);
    return n;
  }

 private:
  // "a comes after b": higher probability, or equal and higher layer.
  static bool greater(const detail::NomineeSlot& a, const detail::NomineeSlot& b) noexcept {
    return a.p > b.p || (a.p == b.p && a.layer > b.layer);
  }
  bool push_below(std::uint32_t layer, std::uint32_t below_rank) {
    for (auto r = table_->last_resident_rank(layer, below_rank); r;
         r = table_->last_resident_rank(layer, *r)) {
      const ExpertKey k{layer, table_->expert_at_rank(layer, *r)};
      if (skip_(k)) continue;
      heap_.push_back({ranker_->probability(k), layer, *r});
      return true;
    }
    return false;
  }
  const ExpertRanker* ranker_;
  const ResidencyTable* table_;
  Skip skip_;
  std::vector<std::uint32_t> left_;
  std::vector<detail::NomineeSlot> heap_;
};

}  // namespace amoeba
