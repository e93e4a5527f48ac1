// A complete custom policy built against an installed amoeba (find_package(amoeba)): frequency-weighted LRU
// victims, one of the eviction rules of the CoMoE-style article (DESIGN §5), used in a fixed-capacity expert
// cache. Exits 0 when the policy picks the expected victim. The code between the example markers is what
// docs/policies.md shows.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <vector>

// example-begin weighted-lru-policy
#include <amoeba/adjust/policy_concepts.hpp>
#include <amoeba/adjust/score_order.hpp>

// Frequency-weighted LRU: an expert's claim to stay is the tick of its last use plus `weight` ticks for every
// step it was routed in; the expert with the smallest claim leaves first (ties: the colder rank).
class WeightedLruEvict {
 public:
  std::uint64_t weight = 4;

  // routing_observer: the adjuster forwards every observe(layer, experts) call.
  void observe(const amoeba::AdjustView& v, std::uint32_t layer, std::span<const std::uint32_t> experts) {
    const std::size_t n = std::size_t(v.layers()) * v.experts_per_layer();
    if (last_.size() != n) {
      last_.assign(n, 0);
      count_.assign(n, 0);
    }
    for (std::uint32_t e : experts) {
      last_[index(v, {layer, e})] = v.tick();
      ++count_[index(v, {layer, e})];
    }
  }

  // evict_policy: victims across layers (elastic capacity) and within one layer (swaps in a full cache).
  // The score helpers walk every layer, skip busy and non-resident experts and respect the offload limit.
  void nominate_evictions(const amoeba::AdjustView& v, std::uint32_t n,
                          std::vector<amoeba::ExpertKey>& out) const {
    amoeba::nominate_by_score(v, n, out, [&](amoeba::ExpertKey k) { return score(v, k); });
  }
  std::optional<amoeba::ExpertKey> victim_in_layer(const amoeba::AdjustView& v, std::uint32_t layer) const {
    return amoeba::lowest_scored(v, layer, [&](amoeba::ExpertKey k) { return score(v, k); });
  }

 private:
  static std::size_t index(const amoeba::AdjustView& v, amoeba::ExpertKey k) {
    return std::size_t(k.layer) * v.experts_per_layer() + k.expert;
  }
  amoeba::VictimScore score(const amoeba::AdjustView& v, amoeba::ExpertKey k) const {
    const std::size_t i = index(v, k);
    const std::uint64_t claim = i < last_.size() ? last_[i] + weight * count_[i] : 0;
    return {claim, 0, amoeba::coldness_of(v, k)};
  }
  std::vector<std::uint64_t> last_, count_;
};
static_assert(amoeba::evict_policy<WeightedLruEvict> && amoeba::routing_observer<WeightedLruEvict>);
// example-end weighted-lru-policy

// example-begin weighted-lru-use
#include <amoeba/adjust/adjuster.hpp>
#include <amoeba/policies/admit_on_miss.hpp>
#include <amoeba/policies/fixed_cache.hpp>
#include <amoeba/pool.hpp>

// A CoMoE-style cache with the new victim order: two experts per layer, misses admitted.
using WeightedLruCache =
    amoeba::Adjuster<WeightedLruEvict, amoeba::policies::AdmitOnMiss, amoeba::policies::FixedCapacity>;

int main() {
  using namespace amoeba;
  HostArena arena(32 * 4096);  // 32 expert pages of 4 KiB, KV pages of 1 KiB
  MoePool pool(arena.span(), {PageSpec{4096}, PageSpec{1024}});
  WeightedLruCache cache(ExpertRanker::uniform(/*layers=*/1, /*experts=*/4), {},
                         policies::FixedCapacity{.resident_per_layer = 2});
  if (cache.populate(pool)) return 1;  // experts 0 and 1 resident

  const std::uint32_t e0[] = {0}, e1[] = {1}, e2[] = {2};
  cache.observe(0, e0);  // tick 1
  cache.observe(0, e0);  // tick 2
  cache.observe(0, e0);  // tick 3: claim of expert 0 = 3 + 3 * 4 = 15
  cache.observe(0, e1);  // tick 4: claim of expert 1 = 4 + 1 * 4 = 8 (plain LRU would keep it)
  cache.observe(0, e2);  // tick 5: a miss

  ChangeList changes = cache.adjust(/*shortfall_pages=*/0, pool.available<ExpertPage>(), pool);
  std::printf("%s\n", to_string(changes).c_str());
  // ... the forward pass copies expert 2 into its reserved pages; expert 1 is still usable ...
  if (auto error = cache.commit(changes, pool)) {
    std::printf("%s\n", error->message.c_str());
    return 1;
  }
  const bool ok = changes.evictions.size() == 1 && changes.evictions[0].expert == ExpertKey{0, 1} &&
                  cache.residency().is_resident({0, 2});
  return ok ? 0 : 1;
}
// example-end weighted-lru-use
