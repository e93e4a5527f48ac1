// Compile-time checks of the adjuster's policy concepts: every shipped policy models its concept, minimal
// archetypes model each concept, and types missing a member (or with a wrong signature) do not.
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "amoeba/adjust/adjuster.hpp"
#include "amoeba/adjust/policy_concepts.hpp"
#include "amoeba/expert/nominations.hpp"
#include "amoeba/policies/stacks.hpp"

namespace {
using namespace amoeba;
using namespace amoeba::policies;

// ---- shipped models
static_assert(capacity_rule<StaticCapacity> && capacity_rule<FixedCapacity> &&
              capacity_rule<ElasticHysteresis>);
static_assert(evict_policy<NeverEvict> && evict_policy<RankedEvict> && evict_policy<LruEvict> &&
              evict_policy<LfuEvict>);
static_assert(restore_policy<NeverRestore> && restore_policy<RankedRestore> && restore_policy<AdmitOnMiss>);
static_assert(routing_observer<LruEvict> && routing_observer<LfuEvict> && routing_observer<AdmitOnMiss>);
static_assert(commit_observer<AdmitOnMiss>);
static_assert(!routing_observer<RankedEvict> && !routing_observer<NeverRestore> &&
              !commit_observer<LruEvict>);
// the axes are distinct: a victim order is not a restore order or a capacity rule
static_assert(!restore_policy<RankedEvict> && !evict_policy<RankedRestore> && !capacity_rule<LruEvict>);
static_assert(!evict_policy<ElasticHysteresis> && !restore_policy<StaticCapacity>);

// ---- archetypes: the least a model must provide
struct CapacityArchetype {
  CapacityDecision decide(const AdjustSignal&, const AdjustView&) const { return {}; }
  std::uint32_t layer_capacity(const AdjustView&, std::uint32_t) const { return 0; }
  std::uint32_t initial_resident(const AdjustView&, std::uint32_t) const { return 0; }
};
struct EvictArchetype {
  void nominate_evictions(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const {}
  std::optional<ExpertKey> victim_in_layer(const AdjustView&, std::uint32_t) const { return {}; }
};
struct RestoreArchetype {
  void nominate_restores(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const {}
};
static_assert(capacity_rule<CapacityArchetype> && evict_policy<EvictArchetype> &&
              restore_policy<RestoreArchetype>);
// ...and an Adjuster can be built from the archetypes alone
using ArchetypeAdjuster = Adjuster<EvictArchetype, RestoreArchetype, CapacityArchetype>;
static_assert(std::is_class_v<ArchetypeAdjuster>);

// ---- non-models: a member missing
struct CapacityWithoutDecide {
  std::uint32_t layer_capacity(const AdjustView&, std::uint32_t) const { return 0; }
  std::uint32_t initial_resident(const AdjustView&, std::uint32_t) const { return 0; }
};
struct CapacityWithoutInitial {
  CapacityDecision decide(const AdjustSignal&, const AdjustView&) const { return {}; }
  std::uint32_t layer_capacity(const AdjustView&, std::uint32_t) const { return 0; }
};
struct EvictWithoutSwapVictim {
  void nominate_evictions(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const {}
};
struct EvictWithoutNominate {
  std::optional<ExpertKey> victim_in_layer(const AdjustView&, std::uint32_t) const { return {}; }
};
struct Empty {};
static_assert(!capacity_rule<CapacityWithoutDecide> && !capacity_rule<CapacityWithoutInitial>);
static_assert(!evict_policy<EvictWithoutSwapVictim> && !evict_policy<EvictWithoutNominate>);
static_assert(!restore_policy<Empty> && !evict_policy<Empty> && !capacity_rule<Empty>);

// ---- non-models: wrong signatures
struct DecideReturnsPair {  // result must be CapacityDecision exactly
  std::pair<int, int> decide(const AdjustSignal&, const AdjustView&) const { return {}; }
  std::uint32_t layer_capacity(const AdjustView&, std::uint32_t) const { return 0; }
  std::uint32_t initial_resident(const AdjustView&, std::uint32_t) const { return 0; }
};
struct NonConstNominate {  // nominate must be callable on a const policy
  void nominate_restores(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) {}
};
struct VictimReturnsKey {  // "none" must be expressible
  void nominate_evictions(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const {}
  ExpertKey victim_in_layer(const AdjustView&, std::uint32_t) const { return {}; }
};
struct NotCopyable {
  NotCopyable() = default;
  NotCopyable(const NotCopyable&) = delete;
  void nominate_restores(const AdjustView&, std::uint32_t, std::vector<ExpertKey>&) const {}
};
static_assert(!capacity_rule<DecideReturnsPair>);
static_assert(!restore_policy<NonConstNominate>);
static_assert(!evict_policy<VictimReturnsKey>);
static_assert(!restore_policy<NotCopyable>);

// ---- the pool requirement
static_assert(expert_page_pool<MoePool> && expert_page_pool<HybridMoePool>);
static_assert(!expert_page_pool<Empty>);

// ---- values handed to the backend are plain data
static_assert(std::is_trivially_copyable_v<ExpertKey> && std::is_trivially_copyable_v<ExpertPages>);
static_assert(std::is_trivially_copyable_v<Eviction> && std::is_trivially_copyable_v<Restore>);
static_assert(std::is_trivially_copyable_v<Nominee>);
static_assert(std::is_copy_constructible_v<ChangeList>);

// ---- every stack is an Adjuster over the right axes
static_assert(std::is_same_v<ElasticAdjuster::capacity_rule_type, ElasticHysteresis>);
static_assert(std::is_same_v<Adjuster<RankedEvict, RankedRestore, ElasticHysteresis>, ElasticAdjuster>);
static_assert(std::is_same_v<LruCacheAdjuster::evict_policy_type, LruEvict>);
static_assert(std::is_same_v<ElasticLruAdjuster::restore_policy_type, RankedRestore>);
}  // namespace
