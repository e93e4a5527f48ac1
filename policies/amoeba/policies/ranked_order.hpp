// Rank order (the paper's victims and restores, DESIGN §3.2): evict each layer's coldest resident expert,
// lowest routing probability first across layers, skipping layers at expert_offload_limit; restore each
// layer's hottest offloaded expert, highest probability first. Both walk ExpertRanker's ranking through the
// priority queues of amoeba/expert/nominations.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/policy_concepts.hpp"
#include "amoeba/expert/nominations.hpp"

namespace amoeba::policies {

// evict_policy: rank-coldest first.
struct RankedEvict {
  void nominate_evictions(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) const {
    if (n == 0) return;
    EvictNominations nominations(
        v.ranker(), v.residency(), [&v](std::uint32_t l) { return v.eviction_allowance(l); },
        [&v](ExpertKey k) { return v.is_busy(k); });
    for (; n > 0; --n) {
      const auto x = nominations.next();
      if (!x) break;
      out.push_back(x->expert);
    }
  }
  std::optional<ExpertKey> victim_in_layer(const AdjustView& v, std::uint32_t layer) const {
    const ResidencyTable& t = v.residency();
    for (auto r = t.last_resident_rank(layer); r; r = t.last_resident_rank(layer, *r)) {
      const ExpertKey k{layer, t.expert_at_rank(layer, *r)};
      if (!v.is_busy(k)) return k;
    }
    return std::nullopt;
  }
};
static_assert(evict_policy<RankedEvict>);

// restore_policy: rank-hottest first.
struct RankedRestore {
  void nominate_restores(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) const {
    if (n == 0) return;
    RestoreNominations nominations(v.ranker(), v.residency(), [&v](ExpertKey k) { return v.is_busy(k); });
    for (; n > 0; --n) {
      const auto x = nominations.next();
      if (!x) break;
      out.push_back(x->expert);
    }
  }
};
static_assert(restore_policy<RankedRestore>);

}  // namespace amoeba::policies
