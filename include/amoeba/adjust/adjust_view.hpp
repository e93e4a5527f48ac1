// AdjustView: the read-only state an adjuster shows its policies while it decides (and when it reports
// routing or a commit to them): the ranking, the residency table, the offload limit, the experts already
// named by the decision in progress or by a change list not yet committed ("busy": a policy must not name
// them), and how many more experts each layer may lose under `expert_offload_limit` (paper: layers that
// already have that many experts offloaded do not nominate for eviction).
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba {

// No per-layer limit on offloaded experts.
inline constexpr std::uint32_t kNoOffloadLimit = std::numeric_limits<std::uint32_t>::max();

class AdjustView {
 public:
  // busy: one byte per (layer, expert), non-zero = busy; leaving: per layer, experts named for eviction and
  // not yet committed. Both are owned by the caller and outlive the view.
  AdjustView(const ExpertRanker& ranker, const ResidencyTable& residency, std::uint32_t offload_limit,
             std::uint64_t tick, std::span<const std::uint8_t> busy, std::span<const std::uint32_t> leaving)
      : ranker_(&ranker),
        residency_(&residency),
        offload_limit_(offload_limit),
        tick_(tick),
        busy_(busy),
        leaving_(leaving) {}

  const ExpertRanker& ranker() const noexcept { return *ranker_; }
  const ResidencyTable& residency() const noexcept { return *residency_; }
  std::uint32_t layers() const noexcept { return residency_->layers(); }
  std::uint32_t experts_per_layer() const noexcept { return residency_->experts_per_layer(); }
  std::uint32_t offload_limit() const noexcept { return offload_limit_; }
  // Routing observations so far (each observe() call is one tick); a clock for recency-based policies.
  std::uint64_t tick() const noexcept { return tick_; }

  bool is_busy(ExpertKey k) const noexcept {
    return busy_[std::size_t(k.layer) * experts_per_layer() + k.expert] != 0;
  }
  // A resident expert a policy may name for eviction / a non-resident one it may name for restore.
  bool is_evictable(ExpertKey k) const noexcept { return residency_->is_resident(k) && !is_busy(k); }
  bool is_restorable(ExpertKey k) const noexcept { return !residency_->is_resident(k) && !is_busy(k); }
  // Experts of `layer` named for eviction by this decision or an uncommitted one.
  std::uint32_t leaving(std::uint32_t layer) const noexcept { return leaving_[layer]; }
  // How many more experts `layer` may lose to pressure evictions before it reaches the offload limit.
  std::uint32_t eviction_allowance(std::uint32_t layer) const noexcept {
    const std::uint64_t gone = std::uint64_t(residency_->offloaded_count(layer)) + leaving_[layer];
    const std::uint64_t limit = offload_limit_ < experts_per_layer() ? offload_limit_ : experts_per_layer();
    return gone >= limit ? 0u : static_cast<std::uint32_t>(limit - gone);
  }

 private:
  const ExpertRanker* ranker_;
  const ResidencyTable* residency_;
  std::uint32_t offload_limit_;
  std::uint64_t tick_;
  std::span<const std::uint8_t> busy_;
  std::span<const std::uint32_t> leaving_;
};

}  // namespace amoeba
