// Ready-made adjuster stacks: the variants of DESIGN §3.3 as type aliases over Adjuster<Evict, Restore,
// Capacity>. Construct each with the ranking and its capacity rule, e.g.
//   StaticAdjuster      a(ranker, {}, StaticCapacity{});
//   FixedCacheAdjuster  a(ranker, {}, FixedCapacity{.resident_per_layer = 40});
//   LruCacheAdjuster    a(ranker, {}, FixedCapacity{.resident_per_layer = 40});
//   ElasticAdjuster     a(ranker, {.expert_offload_limit = 10}, ElasticHysteresis{});
#pragma once

#include "amoeba/adjust/adjuster.hpp"
#include "amoeba/policies/admit_on_miss.hpp"
#include "amoeba/policies/elastic_hysteresis.hpp"
#include "amoeba/policies/fixed_cache.hpp"
#include "amoeba/policies/lfu_cache.hpp"
#include "amoeba/policies/lru_cache.hpp"
#include "amoeba/policies/ranked_order.hpp"
#include "amoeba/policies/static_residency.hpp"

namespace amoeba::policies {

// vLLM/SGLang: every expert resident, nothing moves.
using StaticAdjuster = Adjuster<NeverEvict, NeverRestore, StaticCapacity>;
// Fate: a fixed resident prefix per layer; misses are served from the load buffer, nothing moves.
using FixedCacheAdjuster = Adjuster<NeverEvict, NeverRestore, FixedCapacity>;
// CoMoE-style caches: fixed capacity per layer, a missed expert is admitted and swaps out the LRU/LFU one.
using LruCacheAdjuster = Adjuster<LruEvict, AdmitOnMiss, FixedCapacity>;
using LfuCacheAdjuster = Adjuster<LfuEvict, AdmitOnMiss, FixedCapacity>;
// Rimuru: elastic hysteresis, rank-coldest victims, rank-hottest restores.
using ElasticAdjuster = Adjuster<RankedEvict, RankedRestore, ElasticHysteresis>;
// Cross variants no paper has: the paper's elastic capacity with LRU or LFU victims (restores still by rank),
// and elastic capacity that restores the experts that were actually missed.
using ElasticLruAdjuster = Adjuster<LruEvict, RankedRestore, ElasticHysteresis>;
using ElasticLfuAdjuster = Adjuster<LfuEvict, RankedRestore, ElasticHysteresis>;
using ElasticMissAdjuster = Adjuster<LruEvict, AdmitOnMiss, ElasticHysteresis>;

}  // namespace amoeba::policies
