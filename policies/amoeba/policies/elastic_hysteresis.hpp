// Elastic hysteresis (the Rimuru paper, DESIGN §3.3): the number of experts to evict or restore each step,
// from the scheduler's shortfall R_b (expert pages it is short) and the free expert pages F_b left after it.
//
//   R_b > 0                  -> evict ceil((R_b + 1) / 3)   (the gap plus one spare page for the next step;
//                                                            short 8 -> ceil(9/3) = 3 experts = 9 pages)
//   otherwise F_b < 2        -> evict 1                     (preventive)
//   otherwise F_b > 9        -> restore min(5, floor((F_b - 9) / 3))   (20 free -> restore 3)
//   otherwise (2 <= F_b <= 9) nothing: the gap keeps a jittering free count from thrashing; at most 5
//   restores
//                               per step keep the prefetch channel from clogging.
// 2 / 9 / 5 are the paper's defaults and 3 is the pages per expert (W1, W3, W2); all are parameters.
//
// hysteresis_decision() is the pure rule (constexpr); ElasticHysteresis is the capacity_rule that applies it
// inside an Adjuster (which pairs it with rank-coldest victims and rank-hottest restores in the paper).
#pragma once

#include <algorithm>
#include <cstdint>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/policy_concepts.hpp"

namespace amoeba::policies {

struct HysteresisParams {
  std::uint64_t evict_below = 2;       // F_b below this -> evict one expert (paper: 2)
  std::uint64_t restore_above = 9;     // F_b above this -> restore (paper: 9)
  std::uint32_t max_restores = 5;      // restores per step at most (paper: 5)
  std::uint64_t pages_per_expert = 3;  // W1, W3, W2 (paper: 3); must be > 0
  friend constexpr bool operator==(const HysteresisParams&, const HysteresisParams&) = default;
};

struct HysteresisDecision {
  std::uint64_t evict = 0;
  std::uint64_t restore = 0;
  friend constexpr bool operator==(const HysteresisDecision&, const HysteresisDecision&) = default;
};

// The paper's rules, as a pure function. Precondition: params.pages_per_expert > 0.
constexpr HysteresisDecision hysteresis_decision(const HysteresisParams& params,
                                                 std::uint64_t shortfall_pages,
                                                 std::uint64_t free_expert_pages) noexcept {
  const std::uint64_t ppe = params.pages_per_expert == 0 ? 1 : params.pages_per_expert;
  if (shortfall_pages > 0)  // paper: evict ceil((R_b + 1) / 3)
    return {(shortfall_pages + 1 + ppe - 1) / ppe, 0};
  if (free_expert_pages < params.evict_below) return {1, 0};  // paper: F_b < 2 -> evict 1
  if (free_expert_pages > params.restore_above)               // paper: restore min(5, floor((F_b - 9) / 3))
    return {0,
            std::min<std::uint64_t>(params.max_restores, (free_expert_pages - params.restore_above) / ppe)};
  return {};  // paper: 2 <= F_b <= 9, nothing moves
}

static_assert(hysteresis_decision({}, 8, 0) == HysteresisDecision{3, 0});
static_assert(hysteresis_decision({}, 0, 1) == HysteresisDecision{1, 0});
static_assert(hysteresis_decision({}, 0, 20) == HysteresisDecision{0, 3});
static_assert(hysteresis_decision({}, 0, 40) == HysteresisDecision{0, 5});

// capacity_rule: the paper's elastic capacity. Every layer may hold all its experts (no swaps); populate()
// places `initial_resident_per_layer` experts per layer (all of them by default).
struct ElasticHysteresis {
  HysteresisParams params{};
  std::uint32_t initial_resident_per_layer = ~std::uint32_t{0};

  CapacityDecision decide(const AdjustSignal& s, const AdjustView&) const noexcept {
    const HysteresisDecision d = hysteresis_decision(params, s.shortfall_pages, s.free_expert_pages);
    constexpr std::uint64_t kMax = ~std::uint32_t{0};
    return {static_cast<std::uint32_t>(std::min(d.evict, kMax)),
            static_cast<std::uint32_t>(std::min(d.restore, kMax))};
  }
  std::uint32_t layer_capacity(const AdjustView& v, std::uint32_t) const noexcept {
    return v.experts_per_layer();
  }
  std::uint32_t initial_resident(const AdjustView& v, std::uint32_t) const noexcept {
    return std::min(initial_resident_per_layer, v.experts_per_layer());
  }
};
static_assert(capacity_rule<ElasticHysteresis>);

}  // namespace amoeba::policies
