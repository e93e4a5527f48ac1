// Fixed expert cache (Fate-style): each layer keeps a fixed number of experts resident -- the hottest prefix
// of its ranking, placed by Adjuster::populate() -- and nothing moves on memory pressure. Paired with
// NeverEvict/NeverRestore it is Fate's cache; paired with an admit-on-miss restore and LRU/LFU victims it is
// the CoMoE-style cache of fixed capacity (a missed expert is admitted and swaps out a victim of its layer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/policy_concepts.hpp"

namespace amoeba::policies {

// capacity_rule: `resident_per_layer` experts per layer (or per_layer[l] when given, one entry per layer).
// decide() never asks for pressure evictions; it allows up to `max_admissions_per_step` restores, each of
// which must swap out a victim of its layer once that layer is at capacity.
struct FixedCapacity {
  std::uint32_t resident_per_layer = 0;
  std::vector<std::uint32_t> per_layer{};
  std::uint32_t max_admissions_per_step = ~std::uint32_t{0};

  CapacityDecision decide(const AdjustSignal&, const AdjustView&) const noexcept {
    return {0, max_admissions_per_step};
  }
  std::uint32_t layer_capacity(const AdjustView& v, std::uint32_t layer) const noexcept {
    const std::uint32_t c = layer < per_layer.size() ? per_layer[layer] : resident_per_layer;
    return std::min(c, v.experts_per_layer());
  }
  std::uint32_t initial_resident(const AdjustView& v, std::uint32_t layer) const noexcept {
    return layer_capacity(v, layer);
  }
};
static_assert(capacity_rule<FixedCapacity>);

}  // namespace amoeba::policies
