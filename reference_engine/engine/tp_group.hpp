// TpGroup<RankBackend>: tensor parallelism's step seam, a model of the backend concept
// (amoeba/engine/backend.hpp) over `tp` rank backends, one host thread per rank. CUDA-free: the ranks are
// whatever backend runs one GPU's shard (CudaBackend over sharded_weights and shard_config's shapes, each
// with its own device, stream and NCCL communicator: docs/engine.md, "Tensor parallelism on GPUs"), or
// SimBackend / a fake in tests.
//
// One decision per step, the same on every rank: the engine on the caller's thread schedules, adjusts and
// begins the routing once; forward() hands that very StepInput (batch, change list, residency, pool,
// routing: shared, read only) to every rank at once. Rank 0 runs on the caller's thread, ranks 1..tp-1 on
// their own (started by the constructor, joined by the destructor); forward() returns when every rank has
// returned. A rank backend may only call const members of the routing source (layer_experts, kind, ...),
// as SimBackend and CudaBackend do: the engine has already called begin_step.
//
// The ranks must agree, and forward() checks that they did:
//   - every rank returns the same ChangeError or none (the list is validated against the same residency);
//   - every rank routed every MoE layer to the same experts (a GPU rank runs the replicated router on the
//     all-reduced hidden state: a rank whose all-reduce handed it other bits would pick other experts and
//     its pool would go its own way); a difference throws std::runtime_error naming the rank and the layer.
// A rank's exception is rethrown once every rank has returned (so no rank is left inside a forward): rank
// 0's as it is, another rank's as std::runtime_error("tensor-parallel rank r: ..."); the group stays usable.
//
// The result is rank 0's (routing, copy counts: every rank runs the same plan over its own 1/tp of each
// expert), with each time (step, compute, attention, MoE, dense, copy, stall, host) the slowest rank's: the
// step ends when the last rank ends.
//
// tp = 1: forward() calls the one rank on the caller's thread; no thread is started (today's backend).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/core/errors.hpp"
#include "amoeba/engine/backend.hpp"
#include "amoeba/engine/step.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba::engine {

template <class RankBackend>
class TpGroup {
 public:
  static constexpr bool kMeasured = measured_backend<RankBackend>;

  // ranks[r] is rank r. Throws ConfigError naming "--tp" when `ranks` is empty or holds a null backend.
  explicit TpGroup(std::vector<std::unique_ptr<RankBackend>> ranks) : s_(std::make_unique<State>()) {
    if (ranks.empty()) throw ConfigError("--tp", "0", "a tensor-parallel group needs at least one rank");
    for (std::size_t r = 0; r < ranks.size(); ++r)
      if (!ranks[r])
        throw ConfigError("--tp", std::to_string(ranks.size()),
                          "rank " + std::to_string(r) + " has no backend");
    s_->ranks = std::move(ranks);
    const std::size_t tp = s_->ranks.size();
    s_->outs.resize(tp);
    s_->change_errors.resize(tp);
    s_->errors.resize(tp);
    for (std::uint32_t r = 1; r < tp; ++r) s_->threads.emplace_back([s = s_.get(), r] { s->worker(r); });
  }
  TpGroup(TpGroup&&) noexcept = default;
  TpGroup& operator=(TpGroup&&) noexcept = default;
  ~TpGroup() {
    if (s_) s_->stop();
  }

  std::uint32_t tp() const noexcept { return static_cast<std::uint32_t>(s_->ranks.size()); }
  RankBackend& rank(std::uint32_t r) { return *s_->ranks.at(r); }
  const RankBackend& rank(std::uint32_t r) const { return *s_->ranks.at(r); }

  std::string_view name() const { return s_->ranks[0]->name(); }
  double idle_step_s() const { return s_->ranks[0]->idle_step_s(); }

  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    if (tp() == 1) return s_->ranks[0]->forward(in, out);
    s_->run([&](std::uint32_t r) { s_->change_errors[r] = s_->ranks[r]->forward(in, s_->outs[r]); });
    check_agreement();
    if (s_->change_errors[0]) return s_->change_errors[0];
    combine(out);
    return std::nullopt;
  }

  // Every rank writes the experts resident in `r` into its own pages (its slices), all at once.
  void populate(const ResidencyTable& r) requires populating_backend<RankBackend> {
    if (tp() == 1) return s_->ranks[0]->populate(r);
    s_->run([&](std::uint32_t k) { s_->ranks[k]->populate(r); });
  }

  // Every rank forgets the request.
  void release(std::uint64_t request) requires releasing_backend<RankBackend> {
    for (auto& b : s_->ranks) b->release(request);
  }

 private:
  // Everything the rank threads touch lives here, so that moving a group moves a pointer.
  struct State {
    std::vector<std::unique_ptr<RankBackend>> ranks;
    std::vector<StepResult> outs;
    std::vector<std::optional<ChangeError>> change_errors;
    std::vector<std::exception_ptr> errors;
    std::vector<std::thread> threads;
    std::mutex m;
    std::condition_variable go, done;
    const std::function<void(std::uint32_t)>* job = nullptr;
    std::uint64_t generation = 0;
    std::size_t finished = 0;
    bool stopping = false;

    void worker(std::uint32_t r) {
      std::uint64_t seen = 0;
      for (;;) {
        std::unique_lock lock(m);
        go.wait(lock, [&] { return stopping || generation != seen; });
        if (stopping) return;
        seen = generation;
        const auto* j = job;
        lock.unlock();
        try {
          (*j)(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
        lock.lock();
        if (++finished == ranks.size() - 1) done.notify_one();
      }
    }

    // Runs job(r) for every rank at once (rank 0 on this thread) and returns when all have returned;
    // then rethrows the lowest rank's exception, if any.
    void run(const std::function<void(std::uint32_t)>& j) {
      std::fill(errors.begin(), errors.end(), nullptr);
      {
        std::lock_guard lock(m);
        job = &j;
        finished = 0;
        ++generation;
      }
      go.notify_all();
      try {
        j(0);
      } catch (...) {
        errors[0] = std::current_exception();
      }
      {
        std::unique_lock lock(m);
        done.wait(lock, [&] { return finished == ranks.size() - 1; });
        job = nullptr;
      }
      if (errors[0]) std::rethrow_exception(errors[0]);
      for (std::size_t r = 1; r < errors.size(); ++r) {
        if (!errors[r]) continue;
        try {
          std::rethrow_exception(errors[r]);
        } catch (const std::exception& e) {
          throw std::runtime_error("tensor-parallel rank " + std::to_string(r) + ": " + e.what());
        } catch (...) {
          throw std::runtime_error("tensor-parallel rank " + std::to_string(r) + ": unknown exception");
        }
      }
    }

    void stop() {
      {
        std::lock_guard lock(m);
        stopping = true;
      }
      go.notify_all();
      for (std::thread& t : threads) t.join();
    }
  };

  void check_agreement() const {
    const auto& e0 = s_->change_errors[0];
    for (std::size_t r = 1; r < s_->ranks.size(); ++r) {
      const auto& e = s_->change_errors[r];
      if (e.has_value() != e0.has_value() || (e && (e->code != e0->code || !(e->expert == e0->expert))))
        throw std::runtime_error("tensor-parallel ranks disagree on the change list: rank 0 " +
                                 std::string(e0 ? "refused it (" + e0->message + ")" : "applied it") +
                                 ", rank " + std::to_string(r) + " " +
                                 std::string(e ? "refused it (" + e->message + ")" : "applied it"));
    }
    if (e0) return;
    const StepResult& a = s_->outs[0];
    for (std::size_t r = 1; r < s_->ranks.size(); ++r) {
      const StepResult& b = s_->outs[r];
      if (a.routed == b.routed && a.routed_offsets == b.routed_offsets) continue;
      std::uint32_t layer = 0;
      const std::uint32_t layers = std::min(a.routed_layers(), b.routed_layers());
      while (layer < layers && std::ranges::equal(a.routed_at(layer), b.routed_at(layer))) ++layer;
      throw std::runtime_error(
          "tensor-parallel ranks disagree on the routing: rank " + std::to_string(r) + " routed MoE layer " +
          std::to_string(layer) + " to " + experts(b, layer) + ", rank 0 to " + experts(a, layer) +
          " (their hidden states differ: every rank must see the all-reduce's same bits)");
    }
  }

  static std::string experts(const StepResult& s, std::uint32_t layer) {
    if (layer >= s.routed_layers()) return "nothing (" + std::to_string(s.routed_layers()) + " MoE layers)";
    std::string out = "{";
    for (std::uint32_t e : s.routed_at(layer)) out += (out.size() > 1 ? ", " : "") + std::to_string(e);
    return out + "}";
  }

  void combine(StepResult& out) const {
    out = s_->outs[0];
    for (std::size_t r = 1; r < s_->ranks.size(); ++r) {
      const StepResult& b = s_->outs[r];
      for (double StepCounters::*t :
           {&StepCounters::step_s, &StepCounters::compute_s, &StepCounters::attention_s, &StepCounters::moe_s,
            &StepCounters::dense_s, &StepCounters::copy_s, &StepCounters::stall_s, &StepCounters::host_s,
            &StepCounters::allreduce_s})
        out.*t = std::max(out.*t, b.*t);
    }
  }

  std::unique_ptr<State> s_;
};

}  // namespace amoeba::engine
