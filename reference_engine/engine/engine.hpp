// Engine<Pool, Adjuster, Backend>: the serving loop (nano-vllm's `llm_engine.py`), one step as DESIGN §2
// draws it:
//
//   arrivals -> Scheduler.schedule()            -> StepPlan {batch, KV pages granted, shortfall R_b}
//            -> Adjuster.adjust({R_b, F_b}, pool) -> ChangeList {evictions, restores with reserved pages}
//            -> routing for the batch             -> which experts each MoE layer's tokens pick
//            -> Backend.forward(plan, experts)     -> step time, bytes moved, hits and misses
//            -> Adjuster.observe(routing), Adjuster.commit(changes)   (evicted pages back only now)
//            -> Scheduler.complete(plan, now)      -> tokens emitted, finished requests' pages back
//
// All three are template parameters; the one place that turns policy names into instantiations is
// policy_dispatch.hpp. A step whose plan is empty (nothing fits, nothing runs) still lets the adjuster act
// and commits at once (no forward is in flight), costing the backend's idle step time. After run(), drain()
// checks conservation: every request finished, every KV/state page and every reservation back, and -- after
// the resident experts are released too -- the pool fully merged with its invariants intact.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "amoeba/adjust/adjuster.hpp"
#include "engine/metrics.hpp"
#include "engine/model.hpp"
#include "engine/routing.hpp"
#include "engine/scheduler.hpp"
#include "engine/sim_backend.hpp"

namespace amoeba::engine {

// What the engine needs from a backend.
template <class B>
concept backend = requires(B& b, const B& cb, const StepPlan& plan, const std::vector<LayerExperts>& layers,
                           ForwardStats& stats) {
  b.forward(plan, layers, stats);
  { cb.idle_step_s() } -> std::convertible_to<double>;
};

struct EngineOptions {
  bool record_timeline = false;
  std::uint64_t max_steps = 50'000'000;  // a guard against a policy that never makes progress
};

template <class Pool, class Adj, backend Backend>
class Engine {
 public:
  Engine(const ModelSpec& model, const PageGeometry& geometry, const SchedulerConfig& sched, Pool pool,
         Adj adj, Backend backend, RoutingModel routing, const std::vector<Request>& trace,
         EngineOptions options = {})
      : pool_(std::move(pool)),
        adj_(std::move(adj)),
        backend_(std::move(backend)),
        routing_(std::move(routing)),
        scheduler_(model, geometry, sched, pool_),
        options_(options),
        layers_(routing_.layers()),
        experts_(routing_.experts()) {
    seqs_.reserve(trace.size());
    for (const Request& r : trace) seqs_.emplace_back(r);
    std::stable_sort(seqs_.begin(), seqs_.end(),
                     [](const Sequence& a, const Sequence& b) { return a.arrival_s < b.arrival_s; });
    if (auto s = adj_.populate(pool_))
      throw std::logic_error("engine: initial expert placement short of " +
                             std::to_string(s->requested_pages) + " expert pages (have " +
                             std::to_string(s->available_pages) +
                             "); the memory plan should have refused this configuration");
    resident_.assign(std::size_t(layers_) * experts_, 0);
    restoring_.assign(resident_.size(), 0);
    adj_.residency().for_each_resident(
        [&](ExpertKey k, const ExpertPages&) { resident_[std::size_t(k.layer) * experts_ + k.expert] = 1; });
    result_.min_resident_experts = result_.max_resident_experts = adj_.residency().resident_total();
    layer_views_.resize(layers_);
    routed_.reserve(experts_);
  }

  // One iteration of the loop. False once every request has finished.
  bool step() {
    while (next_arrival_ < seqs_.size() && seqs_[next_arrival_].arrival_s <= now_)
      scheduler_.add(seqs_[next_arrival_++]);
    if (scheduler_.idle()) {
      if (next_arrival_ >= seqs_.size()) return false;
      now_ = std::max(now_, seqs_[next_arrival_].arrival_s);
      return true;
    }
    if (++iterations_ > options_.max_steps) throw std::logic_error("engine: step limit reached");
    StepPlan plan = scheduler_.schedule();
    const AdjustSignal signal{plan.shortfall_pages, pool_.template available<ExpertPage>()};
    ChangeList changes = adj_.adjust(signal, pool_);
    result_.evictions += changes.evictions.size();
    result_.restores += changes.restores.size();
    if (plan.empty()) {
      if (changes.empty() && scheduler_.num_running() == 0 && ++stuck_ > 1000)
        throw std::logic_error("engine: no request can be scheduled and the adjuster frees nothing");
      commit(changes);
      now_ += backend_.idle_step_s();
      record(plan, changes, ForwardStats{});
      return true;
    }
    stuck_ = 0;
    for (const Restore& r : changes.restores) restoring_[index(r.expert)] = 1;
    routing_.step(plan.tokens, touched_);
    for (std::uint32_t l = 0; l < layers_; ++l) {
      const std::size_t o = std::size_t(l) * experts_;
      layer_views_[l] = LayerExperts{&touched_[o], &resident_[o], &restoring_[o]};
    }
    ForwardStats fs;
    backend_.forward(plan, layer_views_, fs);
    now_ += fs.step_s;
    ++result_.forward_steps;
    result_.peak_concurrency =
        std::max<std::uint32_t>(result_.peak_concurrency, static_cast<std::uint32_t>(plan.batch.size()));
    result_.expert_bytes_h2d += fs.h2d_bytes;
    touches_ += fs.expert_touches;
    hits_ += fs.expert_hits;
    prefetched_ += fs.expert_prefetched;
    result_.wasted_prefetches += fs.wasted_prefetches;
    result_.copy_stall_s += fs.stall_s;
    result_.compute_s += fs.compute_s;
    if constexpr (kObservesRouting) {
      for (std::uint32_t l = 0; l < layers_; ++l) {
        routed_.clear();
        const std::size_t o = std::size_t(l) * experts_;
        for (std::uint32_t e = 0; e < experts_; ++e)
          if (touched_[o + e]) routed_.push_back(e);
        adj_.observe(l, std::span<const std::uint32_t>(routed_));
      }
    }
    for (const Restore& r : changes.restores) restoring_[index(r.expert)] = 0;
    commit(changes);
    record(plan, changes, fs);
    scheduler_.complete(plan, now_);
    return true;
  }

  RunResult run() {
    while (step()) {
    }
    return result();
  }

  RunResult result() const {
    RunResult r = result_;
    summarize_requests(seqs_, r);
    r.expert_hit_rate = touches_ > 0 ? double(hits_) / double(touches_) : 1.0;
    r.expert_prefetch_rate = touches_ > 0 ? double(prefetched_) / double(touches_) : 0.0;
    return r;
  }

  // Conservation check after run(): returns the first violation, or nothing. Releases every resident expert
  // (through the adjuster, as an eviction list), so the engine cannot step afterwards.
  std::optional<std::string> drain() {
    for (const Sequence& s : seqs_)
      if (s.status != SeqStatus::kFinished) return "request " + std::to_string(s.id) + " did not finish";
    if (!scheduler_.idle()) return std::string("scheduler still holds requests");
    if (adj_.busy_count() != 0)
      return "adjuster still has " + std::to_string(adj_.busy_count()) + " busy experts";
    const auto st = pool_.stats();
    for (std::size_t k = 0; k < Pool::kKinds; ++k)
      if (Pool::tier_of(k) == Tier::kSmall && st.used_pages[k] != 0)
        return std::string(Pool::name_of(k)) + " pages still in use: " + std::to_string(st.used_pages[k]);
    if (st.template used_of<ExpertPage>() != 3 * adj_.residency().resident_total())
      return "expert pages in use (" + std::to_string(st.template used_of<ExpertPage>()) +
             ") differ from 3 x resident experts (" + std::to_string(adj_.residency().resident_total()) + ")";
    ChangeList all;
    adj_.residency().for_each_resident([&](ExpertKey k, const ExpertPages& p) {
      all.evictions.push_back({k, p, EvictionCause::kPressure});
    });
    if (auto e = adj_.commit(all, pool_)) return "releasing resident experts: " + e->message;
    if (!pool_.fully_merged()) return std::string("pool not fully merged after releasing everything");
    if (auto e = pool_.check_invariants()) return "pool invariant: " + *e;
    return std::nullopt;
  }

  const Pool& pool() const noexcept { return pool_; }
  const Adj& adjuster() const noexcept { return adj_; }
  const Scheduler<Pool>& scheduler() const noexcept { return scheduler_; }
  const std::vector<Sequence>& sequences() const noexcept { return seqs_; }
  double now() const noexcept { return now_; }

 private:
  static constexpr bool kObservesRouting = routing_observer<typename Adj::evict_policy_type> ||
                                           routing_observer<typename Adj::restore_policy_type> ||
                                           routing_observer<typename Adj::capacity_rule_type>;

  std::size_t index(ExpertKey k) const noexcept { return std::size_t(k.layer) * experts_ + k.expert; }

  void commit(const ChangeList& changes) {
    if (changes.empty()) return;
    if (auto e = adj_.commit(changes, pool_)) throw std::logic_error("engine: " + e->message);
    for (const Restore& r : changes.restores) resident_[index(r.expert)] = 1;
    for (const Eviction& ev : changes.evictions) resident_[index(ev.expert)] = 0;
    const std::uint64_t n = adj_.residency().resident_total();
    result_.min_resident_experts = std::min(result_.min_resident_experts, n);
    result_.max_resident_experts = std::max(result_.max_resident_experts, n);
  }

  void record(const StepPlan& plan, const ChangeList& changes, const ForwardStats& fs) {
    if (!options_.record_timeline) return;
    TimelineRow row;
    row.step = result_.timeline.size();
    row.time_s = now_;
    row.step_ms = fs.step_s * 1e3;
    row.running = static_cast<std::uint32_t>(plan.batch.size());
    row.waiting = static_cast<std::uint32_t>(scheduler_.num_waiting());
    row.batch_tokens = plan.tokens;
    row.free_kv_pages = pool_.template available<KvPage>();
    row.free_expert_pages = pool_.template available<ExpertPage>();
    row.resident_experts = adj_.residency().resident_total();
    row.shortfall_pages = plan.shortfall_pages;
    row.evictions = static_cast<std::uint32_t>(changes.evictions.size());
    row.restores = static_cast<std::uint32_t>(changes.restores.size());
    row.h2d_bytes = fs.h2d_bytes;
    result_.timeline.push_back(row);
  }

  Pool pool_;
  Adj adj_;
  Backend backend_;
  RoutingModel routing_;
  Scheduler<Pool> scheduler_;
  EngineOptions options_;
  std::uint32_t layers_, experts_;
  std::vector<Sequence> seqs_;
  std::size_t next_arrival_ = 0;
  double now_ = 0;
  std::uint64_t iterations_ = 0, stuck_ = 0;
  std::vector<std::uint8_t> resident_, restoring_, touched_;
  std::vector<LayerExperts> layer_views_;
  std::vector<std::uint32_t> routed_;
  std::uint64_t touches_ = 0, hits_ = 0, prefetched_ = 0;
  RunResult result_;
};

}  // namespace amoeba::engine
