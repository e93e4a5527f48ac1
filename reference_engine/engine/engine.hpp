// Engine<Pool, Adjuster, Backend>: the serving loop (nano-vllm's `llm_engine.py`), one step as the step
// contract draws it (DESIGN §3.7, amoeba/engine/step.hpp):
//
//   arrivals -> Scheduler.schedule()               -> StepPlan {StepBatch, shortfall R_b}
//            -> Adjuster.adjust({R_b, F_b}, pool)    -> ChangeList {evictions, restores with reserved pages}
//            -> RoutingSource.begin_step(batch)      -> this step's synthetic or recorded choices
//            -> Backend.forward({batch, changes, residency, pool, routing})
//                                                    -> StepResult {routing used, copies, hits, times}
//            -> Adjuster.observe(result routing), Adjuster.commit(changes)   (evicted pages back only now)
//            -> Scheduler.complete(plan, now)         -> tokens emitted, finished requests' pages back
//
// Pool, Adjuster and Backend are template parameters (Backend models `backend<B, Pool>`); the routing source
// is chosen at run time. The one place that turns names into instantiations is policy_dispatch.cpp. A step
// whose plan is empty (nothing fits, nothing runs) still lets the adjuster act and commits at once (no
// forward is in flight), costing the backend's idle step time. After run(), drain() checks conservation:
// every request finished, every KV/state page and every reservation back, and -- after the resident experts
// are released too -- the pool fully merged with its invariants intact.
//
// The clock. A simulated backend's clock holds only modelled time: forward step times, idle step times, and
// jumps over idle gaps to the next arrival (its output stays deterministic). A measured backend
// (measured_backend: CudaBackend) reports wall time for each forward, and the clock also advances by the
// host time the engine itself spends in each step (schedule, adjust, commit, complete; steady_clock), so it
// is wall time without the idle sleeps: a gap with nothing scheduled still jumps to the next arrival, as a
// server that is idle would have waited. A backend with populate(residency) (populating_backend) gets the
// initial expert placement written once, right after the adjuster's.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "amoeba/adjust/adjuster.hpp"
#include "amoeba/engine/backend.hpp"
#include "amoeba/engine/step.hpp"
#include "engine/metrics.hpp"
#include "engine/model.hpp"
#include "engine/scheduler.hpp"
#include "engine/sim_backend.hpp"

namespace amoeba::engine {

struct EngineOptions {
  bool record_timeline = false;
  std::uint64_t max_steps = 50'000'000;  // a guard against a policy that never makes progress
  // When set (with record_timeline), every forward is also priced by this simulator on the very same input
  // (batch, change list, residency, pool, routing) and the price lands in the timeline (priced_ms): the
  // cost model's error on each step of a measured run, apart from how two runs' schedules diverge. The
  // routing source must know its choices (not kModel).
  std::shared_ptr<SimBackend> price_with;
};

template <class Pool, class Adj, class Backend>
requires backend<Backend, Pool>
class Engine {
 public:
  Engine(const ModelSpec& model, const PageGeometry& geometry, const SchedulerConfig& sched, Pool pool,
         Adj adj, Backend backend, std::unique_ptr<RoutingSource> routing, const std::vector<Request>& trace,
         EngineOptions options = {})
      : pool_(std::move(pool)),
        adj_(std::move(adj)),
        backend_(std::move(backend)),
        routing_(std::move(routing)),
        scheduler_(model, geometry, sched, pool_),
        options_(options) {
    if (!routing_) throw std::logic_error("engine: no routing source");
    if (routing_->layers() != adj_.residency().layers() ||
        routing_->experts() != adj_.residency().experts_per_layer())
      throw std::logic_error("engine: the routing source's shape differs from the adjuster's");
    seqs_.reserve(trace.size());
    for (const Request& r : trace) seqs_.emplace_back(r);
    std::stable_sort(seqs_.begin(), seqs_.end(),
                     [](const Sequence& a, const Sequence& b) { return a.arrival_s < b.arrival_s; });
    if (auto s = adj_.populate(pool_))
      throw std::logic_error("engine: initial expert placement short of " +
                             std::to_string(s->requested_pages) + " expert pages (have " +
                             std::to_string(s->available_pages) +
                             "); the memory plan should have refused this configuration");
    if constexpr (populating_backend<Backend>) backend_.populate(adj_.residency());
    result_.min_resident_experts = result_.max_resident_experts = adj_.residency().resident_total();
  }

  // One iteration of the loop. False once every request has finished.
  bool step() {
    const Clock::time_point started = kMeasured ? Clock::now() : Clock::time_point{};
    while (next_arrival_ < seqs_.size() && seqs_[next_arrival_].arrival_s <= now_)
      scheduler_.add(seqs_[next_arrival_++]);
    if (scheduler_.idle()) {
      step_.clear();  // a step that runs no forward leaves an empty result (a forward clears it itself)
      if (next_arrival_ >= seqs_.size()) return false;
      now_ = std::max(now_, seqs_[next_arrival_].arrival_s);
      return true;
    }
    if (++iterations_ > options_.max_steps) throw std::logic_error("engine: step limit reached");
    StepPlan& plan = plan_;  // reused across steps: a steady-state step allocates nothing for it
    scheduler_.schedule(plan);
    const AdjustSignal signal{plan.shortfall_pages, pool_.template available<ExpertPage>()};
    ChangeList changes = adj_.adjust(signal, pool_);
    result_.evictions += changes.evictions.size();
    result_.restores += changes.restores.size();
    if (plan.empty()) {
      if (changes.empty() && scheduler_.num_running() == 0 && ++stuck_ > 1000)
        throw std::logic_error("engine: no request can be scheduled and the adjuster frees nothing");
      commit(changes);
      now_ += backend_.idle_step_s();
      step_.clear();
      priced_s_ = -1;
      record(plan, changes, step_);
      if constexpr (kMeasured) {
        const double host = host_seconds(started, Clock::now());
        now_ += host;
        count_host_time(host);
      }
      return true;
    }
    stuck_ = 0;
    routing_->begin_step(plan.batch);
    const Clock::time_point forward_start = kMeasured ? Clock::now() : Clock::time_point{};
    if (auto e =
            backend_.forward(StepInput<Pool>{plan.batch, changes, adj_.residency(), pool_, *routing_}, step_))
      throw std::logic_error("engine: the backend refused the change list: " + e->message);
    // The engine's own host time after the forward counts from here.
    Clock::time_point after_forward = kMeasured ? Clock::now() : Clock::time_point{};
    priced_s_ = -1;
    if (options_.price_with && options_.record_timeline) {
      if (auto e = options_.price_with->forward(
              StepInput<Pool>{plan.batch, changes, adj_.residency(), pool_, *routing_}, priced_))
        throw std::logic_error("engine: the pricing simulator refused the change list: " + e->message);
      priced_s_ = priced_.step_s;
      // The pricing is the validation's work, not the engine's: kept off the measured clock.
      if constexpr (kMeasured) after_forward = Clock::now();
    }
    now_ += step_.step_s;
    // The host time before the forward delays this step's tokens; the time after it, the next step.
    double host_before = 0;
    if constexpr (kMeasured) {
      host_before = host_seconds(started, forward_start);
      now_ += host_before;
    }
    ++result_.forward_steps;
    result_.peak_concurrency =
        std::max<std::uint32_t>(result_.peak_concurrency, static_cast<std::uint32_t>(plan.size()));
    result_.expert_bytes_h2d += step_.h2d_bytes;
    touches_ += step_.expert_touches;
    hits_ += step_.expert_hits;
    prefetched_ += step_.expert_prefetched;
    result_.wasted_prefetches += step_.wasted_prefetches;
    result_.copy_stall_s += step_.stall_s;
    result_.compute_s += step_.compute_s;
    if constexpr (kObservesRouting)  // routing is an output of the forward: observed after it
      for (std::uint32_t l = 0; l < step_.routed_layers(); ++l) adj_.observe(l, step_.routed_at(l));
    commit(changes);
    record(plan, changes, step_);
    finished_ += scheduler_.complete(plan, now_);
    if constexpr (releasing_backend<Backend>)
      for (const Sequence* s : plan.seqs)
        if (s->status == SeqStatus::kFinished) backend_.release(s->id);
    if constexpr (kMeasured) {
      const double host_after = host_seconds(after_forward, Clock::now());
      now_ += host_after;
      count_host_time(host_before + host_after);
    }
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
    if (options_.record_timeline) {
      r.request_ttft_ms.reserve(seqs_.size());
      for (const Sequence& s : seqs_)
        r.request_ttft_ms.push_back(s.status == SeqStatus::kFinished
                                        ? (s.first_token_s - s.arrival_s) * 1e3
                                        : std::numeric_limits<double>::quiet_NaN());
    }
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
  const Backend& backend() const noexcept { return backend_; }
  const RoutingSource& routing() const noexcept { return *routing_; }
  // The last step's plan and forward result (the result is empty when that step ran no forward).
  const StepPlan& last_plan() const noexcept { return plan_; }
  const StepResult& last_step() const noexcept { return step_; }
  double now() const noexcept { return now_; }
  // Requests finished so far, of sequences().size() (progress reports).
  std::size_t finished_requests() const noexcept { return finished_; }
  std::uint64_t forward_steps() const noexcept { return result_.forward_steps; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr bool kMeasured = measured_backend<Backend>;

  static double host_seconds(Clock::time_point from, Clock::time_point to) noexcept {
    return std::chrono::duration<double>(to - from).count();
  }
  // Measured backends: `s` seconds of the engine's own work in this step (already on the clock) go into the
  // run's total and the step's timeline row.
  void count_host_time(double s) {
    result_.host_s += s;
    if (options_.record_timeline && !result_.timeline.empty()) result_.timeline.back().host_ms = s * 1e3;
  }

  static constexpr bool kObservesRouting = routing_observer<typename Adj::evict_policy_type> ||
                                           routing_observer<typename Adj::restore_policy_type> ||
                                           routing_observer<typename Adj::capacity_rule_type>;

  void commit(const ChangeList& changes) {
    if (changes.empty()) return;
    if (auto e = adj_.commit(changes, pool_)) throw std::logic_error("engine: " + e->message);
    const std::uint64_t n = adj_.residency().resident_total();
    result_.min_resident_experts = std::min(result_.min_resident_experts, n);
    result_.max_resident_experts = std::max(result_.max_resident_experts, n);
  }

  void record(const StepPlan& plan, const ChangeList& changes, const StepResult& fs) {
    if (!options_.record_timeline) return;
    TimelineRow row;
    row.step = result_.timeline.size();
    row.time_s = now_;
    row.step_ms = fs.step_s * 1e3;
    row.running = static_cast<std::uint32_t>(plan.size());
    row.waiting = static_cast<std::uint32_t>(scheduler_.num_waiting());
    row.batch_tokens = plan.batch.tokens;
    row.free_kv_pages = pool_.template available<KvPage>();
    row.free_expert_pages = pool_.template available<ExpertPage>();
    row.resident_experts = adj_.residency().resident_total();
    row.shortfall_pages = plan.shortfall_pages;
    row.evictions = static_cast<std::uint32_t>(changes.evictions.size());
    row.restores = static_cast<std::uint32_t>(changes.restores.size());
    row.h2d_bytes = fs.h2d_bytes;
    row.copy_calls = fs.copy_calls;
    row.attention_ms = fs.attention_s * 1e3;
    row.moe_ms = fs.moe_s * 1e3;
    row.dense_ms = fs.dense_s * 1e3;
    row.copy_ms = fs.copy_s * 1e3;
    row.stall_ms = fs.stall_s * 1e3;
    row.compute_ms = fs.compute_s * 1e3;
    row.forward_host_ms = fs.host_s * 1e3;
    row.priced_ms = priced_s_ < 0 ? -1 : priced_s_ * 1e3;
    for (const SequenceStep& s : plan.batch.seqs) row.decode_seqs += s.new_tokens == 1;
    row.allreduce_ms = fs.allreduce_s * 1e3;
    result_.timeline.push_back(row);
  }

  StepResult priced_;     // the pricing simulator's result of the last forward (EngineOptions::price_with)
  double priced_s_ = -1;  // its step time; < 0: not priced
  Pool pool_;
  Adj adj_;
  Backend backend_;
  std::unique_ptr<RoutingSource> routing_;
  Scheduler<Pool> scheduler_;
  EngineOptions options_;
  StepPlan plan_;    // the current step's plan, reused across steps
  StepResult step_;  // the last forward's result, reused across steps
  std::vector<Sequence> seqs_;
  std::size_t next_arrival_ = 0, finished_ = 0;
  double now_ = 0;
  std::uint64_t iterations_ = 0, stuck_ = 0;
  std::uint64_t touches_ = 0, hits_ = 0, prefetched_ = 0;
  RunResult result_;
};

}  // namespace amoeba::engine
