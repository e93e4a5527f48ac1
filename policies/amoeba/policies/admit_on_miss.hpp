// Admit on miss (CoMoE-style cache): an expert the router picked while it was not resident is admitted, in
// the order the misses were observed. With FixedCapacity, an admission into a full layer swaps out that
// layer's victim (LRU/LFU). The miss itself is served from the load buffer; the admission needs three free
// expert pages at decision time (deferred-free rule: the victim's pages are usable only after the forward),
// so without them it waits for a later step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/policy_concepts.hpp"

namespace amoeba::policies {

// restore_policy + routing_observer + commit_observer. At most `max_pending` misses are remembered (the
// oldest are forgotten first). Cost: O(k) per observe of k experts, O(pending) per decision and commit.
class AdmitOnMiss {
 public:
  std::size_t max_pending = 4096;

  void observe(const AdjustView& v, std::uint32_t layer, std::span<const std::uint32_t> experts) {
    const std::size_t n = std::size_t(v.layers()) * v.experts_per_layer();
    if (pending_bit_.size() != n) pending_bit_.assign(n, 0);
    for (std::uint32_t e : experts) {
      if (e >= v.experts_per_layer()) continue;
      const ExpertKey k{layer, e};
      std::uint8_t& bit = pending_bit_[index(v, k)];
      if (v.residency().is_resident(k) || bit) continue;
      bit = 1;
      pending_.push_back(k);
      if (pending_.size() > max_pending) {
        pending_bit_[index(v, pending_.front())] = 0;
        pending_.pop_front();
      }
    }
  }
  void nominate_restores(const AdjustView& v, std::uint32_t n, std::vector<ExpertKey>& out) const {
    for (auto it = pending_.begin(); n > 0 && it != pending_.end(); ++it)
      if (v.is_restorable(*it)) {
        out.push_back(*it);
        --n;
      }
  }
  // Forgets misses that are resident now.
  void on_commit(const AdjustView& v, const ChangeList&) {
    std::erase_if(pending_, [&](ExpertKey k) {
      if (!v.residency().is_resident(k)) return false;
      pending_bit_[index(v, k)] = 0;
      return true;
    });
  }
  std::size_t pending_count() const noexcept { return pending_.size(); }
  ExpertKey pending_at(std::size_t i) const { return pending_[i]; }

 private:
  static std::size_t index(const AdjustView& v, ExpertKey k) noexcept {
    return std::size_t(k.layer) * v.experts_per_layer() + k.expert;
  }
  std::deque<ExpertKey> pending_;
  std::vector<std::uint8_t> pending_bit_;
};
static_assert(restore_policy<AdmitOnMiss> && routing_observer<AdmitOnMiss> && commit_observer<AdmitOnMiss>);

}  // namespace amoeba::policies
