// Adjuster<EvictPolicy, RestorePolicy, CapacityRule>: moves the border between expert pages and KV pages
// (DESIGN §3.3). Runs once per step, after the scheduler (the free pages left then best reflect memory
// pressure):
//
//   changes = adjuster.adjust({R_b, F_b}, pool);   // decide; reserves 3 expert pages per restore only
//   backend.forward(step with changes);            // evicted experts stay usable; restores copied into
//                                                  // their reserved pages ahead of predicted experts
//   adjuster.commit(changes, pool);                // after the forward: evicted pages back to the pool,
//                                                  // restored experts resident, residency table updated
//   adjuster.cancel(changes, pool);                // instead of commit: releases the reservations
//
// Axes (each a concept in amoeba/adjust/policy_concepts.hpp; none has a default: the core names no policy):
//   CapacityRule  how many experts move (StaticCapacity, FixedCapacity, ElasticHysteresis = the paper);
//   EvictPolicy   which resident experts leave (RankedEvict = paper, LruEvict, LfuEvict, NeverEvict);
//   RestorePolicy which offloaded experts come back (RankedRestore = paper, AdmitOnMiss, NeverRestore).
// A restore into a layer at its capacity (FixedCapacity) swaps out that layer's victim
// (EvictionCause::kSwap). Ready-made stacks (static, fixed cache, LRU/LFU caches, elastic, cross variants):
// amoeba/policies/stacks.hpp.
//
// The adjuster owns the ResidencyTable (read it through residency()); only populate()/place() and commit()
// change it. Experts named by an uncommitted change list are "busy" and never named again until that list is
// committed or cancelled. Failed operations change nothing. Not thread-safe.
#pragma once

#include <algorithm>
#include <cassert>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "amoeba/adjust/adjust_view.hpp"
#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/policy_concepts.hpp"
#include "amoeba/adjust/validate_changes.hpp"
#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/expert/residency_table.hpp"
#include "amoeba/pool/page_kinds.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"

namespace amoeba {

// What the adjuster needs from a pool: expert pages by owner (TieredPagePool with ExpertPage models it).
template <class P>
concept expert_page_pool = requires(P& p, const P& cp, OwnerId o, PageHandle h) {
  { p.template allocate<ExpertPage>(o) } -> std::same_as<Expected<PageHandle, Shortfall>>;
  { p.free(h) } -> std::same_as<PageStatus>;
  { p.set_owner(h, o) } -> std::same_as<PageStatus>;
  { cp.owner_of(h) } -> std::same_as<std::optional<OwnerId>>;
  { cp.template available<ExpertPage>() } -> std::convertible_to<std::uint64_t>;
};
static_assert(expert_page_pool<MoePool> && expert_page_pool<HybridMoePool>);

struct AdjusterConfig {
  // Most experts a layer may have offloaded (paper: expert_offload_limit; it also sizes the load buffers).
  // Layers at the limit do not nominate for pressure eviction. kNoOffloadLimit: no limit.
  std::uint32_t expert_offload_limit = kNoOffloadLimit;
};

template <evict_policy EvictPolicy, restore_policy RestorePolicy, capacity_rule CapacityRule>
class Adjuster {
 public:
  using evict_policy_type = EvictPolicy;
  using restore_policy_type = RestorePolicy;
  using capacity_rule_type = CapacityRule;

  explicit Adjuster(ExpertRanker ranker, AdjusterConfig config = {}, CapacityRule capacity = {},
                    EvictPolicy evict = {}, RestorePolicy restore = {})
      : ranker_(std::move(ranker)),
        table_(ranker_),
        config_(config),
        capacity_(std::move(capacity)),
        evict_(std::move(evict)),
        restore_(std::move(restore)) {
    const std::size_t n = std::size_t(ranker_.layers()) * ranker_.experts_per_layer();
    busy_.assign(n, kIdle);
    seen_.assign(n, 0);
    leaving_.assign(ranker_.layers(), 0);
    arriving_.assign(ranker_.layers(), 0);
  }

  // ---- state
  const ExpertRanker& ranker() const noexcept { return ranker_; }
  const ResidencyTable& residency() const noexcept { return table_; }
  const AdjusterConfig& config() const noexcept { return config_; }
  EvictPolicy& evict_policy() noexcept { return evict_; }
  const EvictPolicy& evict_policy() const noexcept { return evict_; }
  RestorePolicy& restore_policy() noexcept { return restore_; }
  const RestorePolicy& restore_policy() const noexcept { return restore_; }
  CapacityRule& capacity_rule() noexcept { return capacity_; }
  const CapacityRule& capacity_rule() const noexcept { return capacity_; }
  std::uint64_t tick() const noexcept { return tick_; }
  // Experts named by change lists that are neither committed nor cancelled.
  std::uint64_t busy_count() const noexcept { return busy_total_; }
  AdjustView view() const noexcept {
    return AdjustView(ranker_, table_, config_.expert_offload_limit, tick_, busy_, leaving_);
  }

  // ---- initial placement
  // Makes the hottest capacity_rule().initial_resident(layer) experts of every layer resident (allocating 3
  // expert pages each; experts already resident are kept). All or nothing: on a shortfall nothing changes and
  // the shortfall (in expert pages for the whole placement) is returned.
  template <expert_page_pool Pool>
  std::optional<Shortfall> populate(Pool& pool) {
    std::vector<ExpertKey> keys;
    const AdjustView v = view();
    for (std::uint32_t l = 0; l < ranker_.layers(); ++l) {
      const std::uint32_t n =
          std::min<std::uint32_t>(capacity_.initial_resident(v, l), ranker_.experts_per_layer());
      for (std::uint32_t r = 0; r < n; ++r) keys.push_back({l, ranker_.expert_at(l, r)});
    }
    return place(keys, pool);
  }
  // Makes `experts` resident (3 pages each; resident ones are skipped). All or nothing, as populate().
  // Throws ConfigError for an expert out of range (a bad placement is a configuration error).
  template <expert_page_pool Pool>
  std::optional<Shortfall> place(std::span<const ExpertKey> experts, Pool& pool) {
    std::vector<ExpertKey> todo;
    for (ExpertKey k : experts) {
      if (!table_.contains(k))
        throw_config_error("placement.expert", k,
                           "is outside the model (" + std::to_string(table_.layers()) + " layers x " +
                               std::to_string(table_.experts_per_layer()) + " experts)");
      if (!table_.is_resident(k) && busy_[index(k)] == kIdle && !seen_[index(k)]) {
        seen_[index(k)] = 1;
        todo.push_back(k);
      }
    }
    for (ExpertKey k : todo) seen_[index(k)] = 0;
    const std::uint64_t need = todo.size() * kMatricesPerExpert;
    const std::uint64_t have = pool.template available<ExpertPage>();
    if (have < need) return Shortfall{ShortfallReason::kExhausted, need, have};
    for (ExpertKey k : todo) {
      const ExpertPages pages = take_expert_pages(pool, k, /*reserved=*/false);
      const bool ok = table_.mark_resident(k, pages);
      assert(ok);
      (void)ok;
    }
    return std::nullopt;
  }

  // ---- routing observations (LRU/LFU bookkeeping, miss admission)
  // The experts routed at `layer` in this step (distinct ids; ids >= experts_per_layer() are ignored). Each
  // call advances tick() by one.
  void observe(std::uint32_t layer, std::span<const std::uint32_t> experts) {
    assert(layer < ranker_.layers());
    if (layer >= ranker_.layers()) return;
    ++tick_;
    const AdjustView v = view();
    if constexpr (routing_observer<CapacityRule>) capacity_.observe(v, layer, experts);
    if constexpr (routing_observer<EvictPolicy>) evict_.observe(v, layer, experts);
    if constexpr (routing_observer<RestorePolicy>) restore_.observe(v, layer, experts);
  }

  // ---- the decision
  // Decides this step's changes from the scheduler's shortfall R_b and the free expert pages F_b. Side
  // effects: only the reservation of 3 expert pages per restore (owner expert_owner(k, m, reserved=true))
  // and marking the named experts busy. Restores stop at the first one the pool cannot reserve.
  template <expert_page_pool Pool>
  ChangeList adjust(const AdjustSignal& signal, Pool& pool) {
    ChangeList out;
    out.signal = signal;
    const AdjustView v = view();
    const CapacityDecision d = capacity_.decide(signal, v);
    out.decision = d;
    if (d.evict > 0) {
      scratch_.clear();
      evict_.nominate_evictions(v, d.evict, scratch_);
      for (std::size_t i = 0; i < scratch_.size() && out.evictions.size() < d.evict; ++i) {
        const ExpertKey k = scratch_[i];
        // A policy that breaks its contract is a bug: caught in debug builds, skipped in release.
        const bool ok = table_.contains(k) && v.is_evictable(k) && v.eviction_allowance(k.layer) > 0;
        assert(ok && "evict policy named an expert it may not evict");
        if (!ok) continue;
        take_eviction(out, k, EvictionCause::kPressure);
      }
    }
    if (d.restore > 0) {
      scratch_.clear();
      restore_.nominate_restores(v, d.restore, scratch_);
      for (std::size_t i = 0; i < scratch_.size() && out.restores.size() < d.restore; ++i) {
        const ExpertKey k = scratch_[i];
        const bool ok = table_.contains(k) && v.is_restorable(k);
        assert(ok && "restore policy named an expert it may not restore");
        if (!ok) continue;
        std::optional<ExpertKey> victim;
        const std::int64_t occupancy =
            std::int64_t(table_.resident_count(k.layer)) + arriving_[k.layer] - leaving_[k.layer];
        if (occupancy + 1 > std::int64_t(capacity_.layer_capacity(v, k.layer))) {
          victim = evict_.victim_in_layer(v, k.layer);
          if (!victim || !table_.contains(*victim) || victim->layer != k.layer || !v.is_evictable(*victim))
            continue;  // no room in this layer
        }
        if (pool.template available<ExpertPage>() < kMatricesPerExpert) break;  // pool short: stop restoring
        Restore r{k, take_expert_pages(pool, k, /*reserved=*/true)};
        out.restores.push_back(r);
        set_busy(k, kRestoring);
        ++arriving_[k.layer];
        if (victim) take_eviction(out, *victim, EvictionCause::kSwap);
      }
    }
    return out;
  }
  template <expert_page_pool Pool>
  ChangeList adjust(std::uint64_t shortfall_pages, std::uint64_t free_expert_pages, Pool& pool) {
    return adjust(AdjustSignal{shortfall_pages, free_expert_pages}, pool);
  }

  // ---- applying it
  // After the forward pass: restored experts become resident on their reserved pages, evicted experts are
  // marked offloaded and their pages freed. Validates the whole list first; on an error nothing changes.
  template <expert_page_pool Pool>
  [[nodiscard]] std::optional<ChangeError> commit(const ChangeList& changes, Pool& pool) {
    if (auto e = validate(changes, pool, "commit", ChangeCheck::kApply)) return e;
    for (const Restore& r : changes.restores) {
      for (ExpertMatrix m : kExpertMatrices) {
        [[maybe_unused]] const PageStatus s = pool.set_owner(r.pages[m], expert_owner(r.expert, m));
        assert(s == PageStatus::kOk);
      }
      [[maybe_unused]] const bool ok = table_.mark_resident(r.expert, r.pages);
      assert(ok);
      release_busy(r.expert);
    }
    for (const Eviction& ev : changes.evictions) {
      [[maybe_unused]] const auto pages = table_.mark_offloaded(ev.expert);
      assert(pages.has_value());
      for (ExpertMatrix m : kExpertMatrices) {
        [[maybe_unused]] const PageStatus s = pool.free(ev.pages[m]);
        assert(s == PageStatus::kOk);
      }
      release_busy(ev.expert);
    }
    const AdjustView v = view();
    if constexpr (commit_observer<CapacityRule>) capacity_.on_commit(v, changes);
    if constexpr (commit_observer<EvictPolicy>) evict_.on_commit(v, changes);
    if constexpr (commit_observer<RestorePolicy>) restore_.on_commit(v, changes);
    return std::nullopt;
  }

  // Abandons a whole change list instead of committing it: every restore's reserved pages go back to the
  // pool, evictions are dropped (their experts stay resident), the list is emptied. On an error nothing
  // changes.
  template <expert_page_pool Pool>
  [[nodiscard]] std::optional<ChangeError> cancel(ChangeList& changes, Pool& pool) {
    if (auto e = validate(changes, pool, "cancel", ChangeCheck::kCancel)) return e;
    for (const Restore& r : changes.restores) release_reservation(r, pool);
    for (const Eviction& ev : changes.evictions)
      if (table_.contains(ev.expert)) release_busy(ev.expert);
    changes.evictions.clear();
    changes.restores.clear();
    return std::nullopt;
  }
  // Cancels one restore (its copy will not happen): releases its reserved pages and removes it from the list.
  // Evictions in the list are kept (a swap victim still leaves at commit; its layer refills on a later miss).
  template <expert_page_pool Pool>
  [[nodiscard]] std::optional<ChangeError> cancel_restore(ChangeList& changes, ExpertKey expert, Pool& pool) {
    auto it = std::find_if(changes.restores.begin(), changes.restores.end(),
                           [&](const Restore& r) { return r.expert == expert; });
    if (it == changes.restores.end())
      return change_error(ChangeErrorCode::kNotFound, expert, "cancel_restore");
    if (auto e = check_restore(*it, table_, pool, "cancel_restore")) return e;
    release_reservation(*it, pool);
    changes.restores.erase(it);
    return std::nullopt;
  }

 private:
  // The three matrix pages of `k` (precondition: available<ExpertPage>() >= 3), side by side when the pool
  // offers allocate_adjacent and a run is free: the paged kernel reads W1 and W3 in lockstep and measured
  // 1-3% slower on the H200 with them far apart (docs/kernel.md).
  template <class Pool>
  static ExpertPages take_expert_pages(Pool& pool, ExpertKey k, bool reserved) {
    ExpertPages pages;
    if constexpr (requires(std::vector<PageHandle> & v) {
                    pool.template allocate_adjacent<ExpertPage>(3, OwnerId{}, v);
                  }) {
      std::vector<PageHandle> run;
      run.reserve(kMatricesPerExpert);
      const auto err = pool.template allocate_adjacent<ExpertPage>(
          kMatricesPerExpert, expert_owner(k, ExpertMatrix::kW1, reserved), run);
      assert(!err && run.size() == kMatricesPerExpert && "available() promised these pages");
      (void)err;
      for (std::size_t j = 0; j < kMatricesPerExpert; ++j) {
        pages.pages[j] = run[j];
        const PageStatus st = pool.set_owner(run[j], expert_owner(k, kExpertMatrices[j], reserved));
        assert(st == PageStatus::kOk);
        (void)st;
      }
    } else {
      for (ExpertMatrix m : kExpertMatrices) {
        auto p = pool.template allocate<ExpertPage>(expert_owner(k, m, reserved));
        assert(p.has_value() && "available() promised these pages");
        pages[m] = *p;
      }
    }
    return pages;
  }
  enum : std::uint8_t { kIdle = 0, kEvicting = 1, kRestoring = 2 };

  std::size_t index(ExpertKey k) const noexcept {
    return std::size_t(k.layer) * ranker_.experts_per_layer() + k.expert;
  }
  void set_busy(ExpertKey k, std::uint8_t what) noexcept {
    busy_[index(k)] = what;
    ++busy_total_;
  }
  void take_eviction(ChangeList& out, ExpertKey k, EvictionCause cause) {
    out.evictions.push_back({k, *table_.pages_of(k), cause});
    set_busy(k, kEvicting);
    ++leaving_[k.layer];
  }
  void release_busy(ExpertKey k) noexcept {
    std::uint8_t& b = busy_[index(k)];
    if (b == kEvicting) --leaving_[k.layer];
    if (b == kRestoring) --arriving_[k.layer];
    if (b != kIdle) --busy_total_;
    b = kIdle;
  }
  template <class Pool>
  void release_reservation(const Restore& r, Pool& pool) {
    for (ExpertMatrix m : kExpertMatrices) {
      [[maybe_unused]] const PageStatus s = pool.free(r.pages[m]);
      assert(s == PageStatus::kOk);
    }
    release_busy(r.expert);
  }

  template <class Pool>
  std::optional<ChangeError> validate(const ChangeList& c, const Pool& pool, const char* op,
                                      ChangeCheck check) {
    return validate_changes(c, table_, pool, op, check, seen_);
  }

  ExpertRanker ranker_;
  ResidencyTable table_;
  AdjusterConfig config_;
  CapacityRule capacity_;
  EvictPolicy evict_;
  RestorePolicy restore_;
  std::uint64_t tick_ = 0;
  std::vector<std::uint8_t> busy_;                 // per (layer, expert): kIdle / kEvicting / kRestoring
  std::vector<std::uint8_t> seen_;                 // scratch for duplicate detection, all zero between calls
  std::vector<std::uint32_t> leaving_, arriving_;  // per layer, busy evictions / restores
  std::uint64_t busy_total_ = 0;
  std::vector<ExpertKey> scratch_;
};

}  // namespace amoeba
