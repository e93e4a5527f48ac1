// Scheduler: continuous batching in the style of vLLM v1 (nano-vllm's `scheduler.py` + `block_manager.py`),
// with the unified pool as the block manager (DESIGN §3.6).
//
//   - FCFS; a per-step token budget (max_num_batched_tokens) and a cap on running sequences (max_num_seqs);
//   - running sequences first ("decode first"), in admission order, each scheduled for its remaining tokens
//     (1 for decode, the rest of its prompt for a prefill in progress) within the budget: chunked prefill;
//   - KV pages of 16 tokens, one page per attention layer per block, allocated from the pool with the
//     request's previous page as affinity hint; hybrid models also take one SSM and one conv page per
//     linear-attention layer when a request starts;
//   - a running sequence that cannot grow preempts the most recently admitted running sequence (recompute:
//     its pages go back, it rejoins the front of the waiting queue); if it is itself that sequence, it is
//     preempted; waiting sequences are not admitted in a step that preempted (as vLLM v1);
//   - the first allocation that fails in a step (a growth that forced preemption, or the waiting head)
//     sets the shortfall R_b = ceil(missing bytes / expert page bytes): expert pages the adjuster would
//     have to free for it to fit (DESIGN §3.3). A request blocked only by the budget or the sequence cap
//     sets none.
//
// schedule() returns the step's plan, whose batch is the step contract's StepBatch (amoeba/engine/step.hpp);
// complete() applies the forward's outcome (tokens emitted, sequences finished and their pages freed).
// Neither throws on a shortfall. Complexity per step: O(scheduled sequences + pages allocated/freed).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "amoeba/engine/step.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/model.hpp"
#include "engine/sequence.hpp"

namespace amoeba::engine {

template <class Pool, class Kind>
struct pool_has_kind : std::false_type {};
template <class... Ks, class Kind>
struct pool_has_kind<TieredPagePool<Ks...>, Kind> : std::bool_constant<(std::is_same_v<Kind, Ks> || ...)> {};

struct SchedulerConfig {
  std::uint32_t max_num_batched_tokens = 2048;  // vLLM v1 default for online serving with chunked prefill
  std::uint32_t max_num_seqs = 256;             // vLLM default
  std::uint32_t max_model_len = 2048;
  // At most this many KV pages held at once (0: as many as the pool has). Past it the scheduler preempts as
  // when the pool runs out, but reports no shortfall (evicting experts would not help). Runs whose pools
  // differ (experts evicted in one, not in the other) then see the same KV capacity and schedule alike.
  std::uint64_t kv_page_limit = 0;
};

// The scheduler's plan for one step: the step contract's batch (what a backend sees) and, beside it, the
// engine's own sequence records.
struct StepPlan {
  StepBatch batch;                    // batch.seqs[i]: context, new tokens, sampling, KV and state page lists
  std::vector<Sequence*> seqs;        // seqs[i] is the sequence behind batch.seqs[i]
  std::uint64_t shortfall_pages = 0;  // R_b, in expert pages
  std::uint32_t preempted = 0;
  bool empty() const noexcept { return batch.empty(); }
  std::size_t size() const noexcept { return seqs.size(); }
};

template <class Pool>
class Scheduler {
 public:
  static constexpr bool kHybrid = pool_has_kind<Pool, SsmPage>::value;

  Scheduler(const ModelSpec& model, const PageGeometry& geometry, const SchedulerConfig& config, Pool& pool)
      : cfg_(config),
        pool_(&pool),
        attn_layers_(model.attention_layers()),
        linear_layers_(model.linear_layers()),
        expert_page_bytes_(geometry.expert_page_bytes),
        kv_page_bytes_(geometry.kv_page_bytes) {
    if constexpr (kHybrid) {
      ssm_page_bytes_ = geometry.ssm_page_bytes;
      conv_page_bytes_ = geometry.conv_page_bytes;
    }
    running_.reserve(config.max_num_seqs);
  }

  // Adds an arrived sequence to the back of the waiting queue. The sequence must outlive the scheduler's use.
  void add(Sequence& s) {
    s.status = SeqStatus::kWaiting;
    waiting_.push_back(&s);
  }
  bool idle() const noexcept { return running_.empty() && waiting_.empty(); }
  std::size_t num_running() const noexcept { return running_.size(); }
  std::size_t num_waiting() const noexcept { return waiting_.size(); }

  // Bytes a sequence of `tokens` tokens holds (KV blocks plus, for hybrid models, its state pages).
  std::uint64_t bytes_for(std::uint32_t tokens) const noexcept {
    const std::uint64_t blocks = (tokens + kBlock - 1) / kBlock;
    return blocks * attn_layers_ * kv_page_bytes_ + linear_layers_ * (ssm_page_bytes_ + conv_page_bytes_);
  }

  StepPlan schedule() {
    StepPlan plan;
    schedule(plan);
    return plan;
  }
  // The same into `plan`, which is cleared first; its vectors keep their capacity (the engine reuses one plan
  // across steps, so a steady-state step allocates nothing here).
  void schedule(StepPlan& plan) {
    std::vector<SequenceStep> steps = std::move(plan.batch.seqs);
    steps.clear();
    plan.batch = StepBatch{};
    plan.batch.seqs = std::move(steps);
    plan.seqs.clear();
    plan.shortfall_pages = 0;
    plan.preempted = 0;
    plan.seqs.reserve(running_.size() + 8);
    plan.batch.seqs.reserve(running_.size() + 8);
    std::uint64_t budget = cfg_.max_num_batched_tokens;
    std::uint64_t lack_bytes = 0;
    bool preempted = false;
    for (std::size_t i = 0; i < running_.size() && budget > 0;) {
      Sequence* s = running_[i];
      const std::uint32_t n =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(s->num_tokens() - s->computed, budget));
      bool scheduled = true;
      for (;;) {
        const Growth g = grow(*s, s->computed + n);
        if (g.ok) break;
        if (lack_bytes == 0) lack_bytes = g.pool_lack_bytes;
        Sequence* victim = running_.back();
        running_.pop_back();
        preempt(*victim);
        ++plan.preempted;
        preempted = true;
        if (victim == s) {
          scheduled = false;
          break;
        }
      }
      if (!scheduled) break;
      plan.seqs.push_back(s);
      plan.batch.seqs.push_back(SequenceStep{s->id, 0, n, false, {}, {}});
      budget -= n;
      ++i;
    }
    if (!preempted) {
      while (!waiting_.empty() && budget > 0 && running_.size() < cfg_.max_num_seqs) {
        Sequence* s = waiting_.front();
        const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::uint64_t>(s->num_tokens(), budget));
        const Growth g = grow(*s, n);
        if (!g.ok) {
          if (lack_bytes == 0) lack_bytes = g.pool_lack_bytes;
          break;
        }
        waiting_.pop_front();
        s->status = SeqStatus::kRunning;
        running_.push_back(s);
        plan.seqs.push_back(s);
        plan.batch.seqs.push_back(SequenceStep{s->id, 0, n, false, {}, {}});
        budget -= n;
      }
    }
    // The page lists are final only now: a later preemption in this step may have taken a victim's pages,
    // but never those of a sequence already in the batch (victims come from the back of running_).
    StepBatch& b = plan.batch;
    b.attention_layers = attn_layers_;
    b.tokens_per_kv_page = kBlock;
    for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
      const Sequence& s = *plan.seqs[i];
      SequenceStep& x = b.seqs[i];
      x.context_before = s.computed;
      x.samples = s.computed + x.new_tokens == s.num_tokens();
      x.kv_pages = s.kv_pages;
      x.state_pages = s.state_pages;
      b.tokens += x.new_tokens;
      b.sampling_seqs += x.samples;
    }
    plan.shortfall_pages = (lack_bytes + expert_page_bytes_ - 1) / expert_page_bytes_;
  }

  // After the forward that ran `plan`, at simulated time `now`: emits tokens, finishes sequences (their pages
  // go back to the pool). Returns the number of sequences that finished.
  std::uint32_t complete(const StepPlan& plan, double now) {
    std::uint32_t finished = 0;
    for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
      Sequence& s = *plan.seqs[i];
      s.computed += plan.batch.seqs[i].new_tokens;
      if (s.computed < s.num_tokens()) continue;  // a prefill chunk that did not reach the end
      ++s.generated;
      if (s.first_token_s < 0) s.first_token_s = now;
      if (s.generated >= s.output_tokens) {
        s.status = SeqStatus::kFinished;
        s.finish_s = now;
        release(s);
        // Give the lists' memory back too: clear() keeps the capacity, kilobytes per finished request.
        std::vector<PageHandle>().swap(s.kv_pages);
        std::vector<PageHandle>().swap(s.state_pages);
        ++finished;
      }
    }
    if (finished > 0)
      running_.erase(std::remove_if(running_.begin(), running_.end(),
                                    [](const Sequence* s) { return s->status == SeqStatus::kFinished; }),
                     running_.end());
    return finished;
  }

 private:
  static constexpr std::uint32_t kBlock = PageGeometry::kTokensPerKvPage;

  // What grow() did: ok, or refused (nothing changed) with the bytes the pool lacked — 0 when the KV page
  // limit, not the pool, refused it (no shortfall: more pool pages would not help).
  struct Growth {
    bool ok = true;
    std::uint64_t pool_lack_bytes = 0;
  };
  static Growth lacking(std::uint64_t bytes) { return {false, bytes}; }

  // Makes `s` hold KV for `tokens` tokens (and its state pages).
  Growth grow(Sequence& s, std::uint32_t tokens) {
    const std::uint32_t want = (tokens + kBlock - 1) / kBlock;
    const std::uint64_t new_blocks = want > s.blocks ? want - s.blocks : 0;
    const std::uint64_t kv_pages = new_blocks * attn_layers_;
    const bool need_state = kHybrid && s.state_pages.empty() && linear_layers_ > 0;
    if (kv_pages == 0 && !need_state) return {};
    const std::uint64_t kv_avail = pool_->template available<KvPage>();
    if (kv_avail < kv_pages) return lacking((kv_pages - kv_avail) * kv_page_bytes_);
    if (cfg_.kv_page_limit > 0 && kv_held_ + kv_pages > cfg_.kv_page_limit) return lacking(0);
    const OwnerId owner = s.id;
    if constexpr (kHybrid) {
      if (need_state) {
        const std::size_t before = s.state_pages.size();
        if (auto f = pool_->template allocate_n<SsmPage>(linear_layers_, owner, s.state_pages); f)
          return lacking((f->requested_pages - f->available_pages) * ssm_page_bytes_);
        if (auto f = pool_->template allocate_n<ConvPage>(linear_layers_, owner, s.state_pages); f) {
          for (std::size_t i = before; i < s.state_pages.size(); ++i) (void)pool_->free(s.state_pages[i]);
          s.state_pages.resize(before);
          return lacking((f->requested_pages - f->available_pages) * conv_page_bytes_);
        }
      }
    }
    if (kv_pages > 0) {
      std::optional<PageHandle> near;
      if (!s.kv_pages.empty()) near = s.kv_pages.back();
      // Grow geometrically: allocate_n reserves exactly what it appends, which would reallocate the page list
      // at every block.
      if (s.kv_pages.capacity() < s.kv_pages.size() + kv_pages)
        s.kv_pages.reserve(std::max<std::size_t>(2 * s.kv_pages.capacity(), s.kv_pages.size() + kv_pages));
      if (auto f = pool_->template allocate_n<KvPage>(kv_pages, owner, s.kv_pages, near); f) {
        const std::uint64_t lack = (f->requested_pages - f->available_pages) * kv_page_bytes_;
        if (need_state) release_state(s);  // all or nothing
        return lacking(lack == 0 ? kv_page_bytes_ : lack);
      }
      s.blocks = want;
      kv_held_ += kv_pages;
    }
    return {};
  }

  void release_state(Sequence& s) {
    for (PageHandle p : s.state_pages) {
      [[maybe_unused]] const PageStatus st = pool_->free(p);
      assert(st == PageStatus::kOk);
    }
    s.state_pages.clear();
  }
  void release(Sequence& s) {
    for (PageHandle p : s.kv_pages) {
      [[maybe_unused]] const PageStatus st = pool_->free(p);
      assert(st == PageStatus::kOk);
    }
    kv_held_ -= s.kv_pages.size();
    s.kv_pages.clear();
    s.blocks = 0;
    release_state(s);
  }
  void preempt(Sequence& s) {
    release(s);
    s.computed = 0;
    s.status = SeqStatus::kWaiting;
    ++s.preemptions;
    waiting_.push_front(&s);
  }

  SchedulerConfig cfg_;
  Pool* pool_;
  std::uint32_t attn_layers_, linear_layers_;
  std::uint64_t expert_page_bytes_, kv_page_bytes_, ssm_page_bytes_ = 0, conv_page_bytes_ = 0;
  std::vector<Sequence*> running_;
  std::deque<Sequence*> waiting_;
  std::uint64_t kv_held_ = 0;  // KV pages held by running sequences
};

}  // namespace amoeba::engine
