// Static residency (what vLLM and SGLang do): every expert is resident, nothing ever moves; the KV cache gets
// what is left of the pool. Also the "never" models of the evict and restore axes, used by the fixed cache.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/policy_concepts.hpp"

namespace amoeba::policies {

// capacity_rule: all experts resident; never asks for a move.
struct StaticCapacity {
  CapacityDecision decide(const AdjustSignal&, const AdjustView&) const noexcept { return {}; }
  std::uint32_t layer_capacity(const AdjustView& v, std::uint32_t) const noexcept {
    return v.experts_per_layer();
  }
  std::uint32_t initial_resident(const AdjustView& v, std::uint32_t) const noexcept {
    return v.experts_per_layer();
  }
};
static_assert(capacity_rule<StaticCapacity>);

// evict_policy: names nothing.
struct NeverEvict {
  void nominate_evictions(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const noexcept {}
  std::optional<ExpertKey> victim_in_layer(const AdjustView&, std::uint32_t) const noexcept {
    return std::nullopt;
  }
};
static_assert(evict_policy<NeverEvict>);

// restore_policy: names nothing.
struct NeverRestore {
  void nominate_restores(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const noexcept {}
};
static_assert(restore_policy<NeverRestore>);

}  // namespace amoeba::policies
