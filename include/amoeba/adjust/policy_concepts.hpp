// Concepts for the three policy axes of Adjuster<EvictPolicy, RestorePolicy, CapacityRule> (DESIGN §3.3).
// They sit beside the adjuster they constrain and mention only its vocabulary (AdjustView, AdjustSignal,
// CapacityDecision, ChangeList), never the adjuster itself:
//
//   capacity_rule   HOW MANY experts move this step (static: none; fixed cache: none on pressure, a fixed
//                   per-layer capacity; elastic hysteresis: the paper's R_b / F_b rules);
//   evict_policy    WHICH resident experts leave (rank-coldest, least recently or frequently used...);
//   restore_policy  WHICH offloaded experts come back (rank-hottest, the ones just missed...).
//
// Optional hooks, detected by the adjuster: routing_observer (observe the experts routed at a layer, for
// LRU/LFU bookkeeping and miss admission) and commit_observer (told about every committed change list).
// Each concept has a page in docs/concepts/ with its expressions, results, preconditions and complexity.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/expert/expert_key.hpp"

namespace amoeba {

// c.decide(signal, view)        -> CapacityDecision: experts to evict / restore for memory pressure this step
// c.layer_capacity(view, layer) -> most experts `layer` may hold resident (experts_per_layer() if unbounded);
//                                  a restore into a layer at capacity needs a victim from that layer (a swap)
// c.initial_resident(view, layer) -> how many experts of `layer` (its hottest) Adjuster::populate() places
template <class C>
concept capacity_rule = std::copy_constructible<C> &&
    requires(const C& c, const AdjustSignal& s, const AdjustView& v, std::uint32_t layer) {
  { c.decide(s, v) } -> std::same_as<CapacityDecision>;
  { c.layer_capacity(v, layer) } -> std::convertible_to<std::uint32_t>;
  { c.initial_resident(v, layer) } -> std::convertible_to<std::uint32_t>;
};

// p.nominate_evictions(view, n, out): appends at most n distinct keys, each view.is_evictable(), in the
//   order they should leave; no layer gets more than view.eviction_allowance(layer) of them.
// p.victim_in_layer(view, layer): the evictable expert of `layer` that should leave to make room (swap);
//   nothing if none. Does not consult the offload limit (a swap leaves the offloaded count unchanged).
template <class P>
concept evict_policy = std::copy_constructible<P> &&
    requires(const P& p, const AdjustView& v, std::uint32_t n, std::uint32_t layer,
             std::vector<ExpertKey>& out) {
  { p.nominate_evictions(v, n, out) } -> std::same_as<void>;
  { p.victim_in_layer(v, layer) } -> std::same_as<std::optional<ExpertKey>>;
};

// p.nominate_restores(view, n, out): appends at most n distinct keys, each view.is_restorable(), best first.
template <class P>
concept restore_policy = std::copy_constructible<P> &&
    requires(const P& p, const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) {
  { p.nominate_restores(v, n, out) } -> std::same_as<void>;
};

// p.observe(view, layer, experts): the experts routed at `layer` in this step (distinct ids < E).
template <class P>
concept routing_observer = requires(P& p, const AdjustView& v, std::uint32_t layer,
                                    std::span<const std::uint32_t> experts) {
  p.observe(v, layer, experts);
};

// p.on_commit(view, changes): `changes` was just committed; view shows the table after the commit.
template <class P>
concept commit_observer = requires(P& p, const AdjustView& v, const ChangeList& c) {
  p.on_commit(v, c);
};

}  // namespace amoeba
