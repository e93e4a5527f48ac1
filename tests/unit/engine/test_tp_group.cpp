// TpGroup (engine/tp_group.hpp), tensor parallelism's step seam, on the CPU: every rank gets the step's
// one decision at once and concurrently; the ranks' agreement is checked (change list, routing); a rank's
// exception reaches the caller after every rank has returned and leaves the group usable; times are the
// slowest rank's; tp 1 runs on the caller's thread; and an engine over a group of identical simulated ranks
// gives exactly the single backend's run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/policies/stacks.hpp"
#include "engine/engine.hpp"
#include "engine/gpu.hpp"
#include "engine/pool_layout.hpp"
#include "engine/routing_source.hpp"
#include "engine/sim_backend.hpp"
#include "engine/tp_group.hpp"
#include "engine/tp_shard.hpp"
#include "engine/workload.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

// What every fake rank saw and does; shared by the ranks of one group.
struct Shared {
  explicit Shared(std::uint32_t tp) : arrived(tp) {}
  std::latch arrived;                // every rank counts down inside its first forward
  std::atomic<int> concurrent{0};    // ranks that saw every rank inside forward at once
  std::atomic<int> throw_rank{-1};   // this rank throws in its next forward
  std::atomic<int> stray_rank{-1};   // this rank routes layer 1 elsewhere
  std::atomic<int> refuse_rank{-1};  // this rank alone returns a ChangeError
};

struct FakeRank {
  static constexpr std::string_view name() noexcept { return "fake"; }
  double idle_step_s() const noexcept { return 0.25; }

  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    thread_ids.push_back(std::this_thread::get_id());
    digests.push_back(change_list_digest(in.changes));
    tokens.push_back(in.batch.tokens);
    if (forwards++ == 0) {  // the first forward checks that the ranks run at once
      shared->arrived.count_down();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!shared->arrived.try_wait() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (shared->arrived.try_wait()) ++shared->concurrent;
    }
    if (shared->throw_rank == int(rank)) throw ConfigError("fake", std::to_string(rank), "asked to throw");
    if (shared->refuse_rank == int(rank) || !in.changes.evictions.empty())
      return ChangeError{ChangeErrorCode::kOutOfRange, ExpertKey{0, 1},
                         "refused by rank " + std::to_string(rank)};
    out.clear();
    for (std::uint32_t l = 0; l < in.routing.layers(); ++l) {
      std::vector<std::uint32_t> set(in.routing.layer_experts(l).begin(), in.routing.layer_experts(l).end());
      if (l == 1 && shared->stray_rank == int(rank)) set = {99};
      out.add_routed(set);
    }
    out.h2d_bytes = 1000 + rank;  // rank 0's is reported
    out.step_s = 1.0 + rank;      // the slowest rank's is reported
    out.moe_s = 0.5 * (3 - rank);
    return std::nullopt;
  }
  void populate(const ResidencyTable&) { ++populated; }
  void release(std::uint64_t request) { released.push_back(request); }

  std::uint32_t rank = 0;
  std::shared_ptr<Shared> shared;
  std::uint64_t forwards = 0, populated = 0;
  std::vector<std::thread::id> thread_ids;
  std::vector<std::uint64_t> digests, tokens;
  std::vector<std::uint64_t> released;
};
static_assert(backend<TpGroup<FakeRank>, MoePool> && populating_backend<TpGroup<FakeRank>> &&
              releasing_backend<TpGroup<FakeRank>> && !measured_backend<TpGroup<FakeRank>>);
static_assert(measured_backend<TpGroup<FakeRank>> == measured_backend<FakeRank>);

TpGroup<FakeRank> group_of(std::uint32_t tp, std::shared_ptr<Shared> shared) {
  std::vector<std::unique_ptr<FakeRank>> ranks;
  for (std::uint32_t r = 0; r < tp; ++r) {
    ranks.push_back(std::make_unique<FakeRank>());
    ranks.back()->rank = r;
    ranks.back()->shared = shared;
  }
  return TpGroup<FakeRank>(std::move(ranks));
}

// Three MoE layers of 8 experts routed to fixed sets.
struct FixedRouting final : RoutingSource {
  RoutingKind kind() const noexcept override { return RoutingKind::kSynthetic; }
  std::uint32_t layers() const noexcept override { return 3; }
  std::uint32_t experts() const noexcept override { return 8; }
  void begin_step(const StepBatch&) override {}
  std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const override { return sets[layer]; }
  std::vector<std::uint32_t> sets[3] = {{0, 3}, {1, 2, 5}, {7}};
};

struct Step {
  MoePool pool{ArenaSpan{nullptr, 64 * 4096}, {PageSpec{4096, 0}, PageSpec{1024, 0}}};
  ResidencyTable residency{3, 8};
  FixedRouting routing;
  StepBatch batch;
  ChangeList changes;
  Step() {
    batch.seqs.push_back(SequenceStep{7, 10, 1, true, {}, {}});
    batch.tokens = 1;
    batch.sampling_seqs = 1;
  }
  StepInput<MoePool> input() { return {batch, changes, residency, pool, routing}; }
};

}  // namespace

TEST_CASE("tp group: every rank gets the step at once, the slowest rank's times, rank 0's counts", "[tp]") {
  auto shared = std::make_shared<Shared>(4);
  TpGroup<FakeRank> g = group_of(4, shared);
  CHECK(g.tp() == 4);
  CHECK(g.name() == "fake");
  CHECK(g.idle_step_s() == 0.25);
  Step s;
  StepResult out;
  REQUIRE_FALSE(g.forward(s.input(), out).has_value());
  CHECK(shared->concurrent == 4);  // each rank saw all four inside forward at once
  CHECK(out.step_s == 4.0);        // rank 3's
  CHECK(out.moe_s == 1.5);         // rank 0's is the slowest here
  CHECK(out.h2d_bytes == 1000);    // rank 0's
  REQUIRE(out.routed_layers() == 3);
  CHECK(std::vector<std::uint32_t>(out.routed_at(1).begin(), out.routed_at(1).end()) ==
        std::vector<std::uint32_t>{1, 2, 5});
  // Rank 0 on the caller's thread, the others on their own; the same decision everywhere.
  CHECK(g.rank(0).thread_ids.front() == std::this_thread::get_id());
  for (std::uint32_t r = 1; r < 4; ++r) {
    CHECK(g.rank(r).thread_ids.front() != std::this_thread::get_id());
    CHECK(g.rank(r).thread_ids.front() != g.rank(r - 1).thread_ids.front());
    CHECK(g.rank(r).digests == g.rank(0).digests);
    CHECK(g.rank(r).tokens == g.rank(0).tokens);
  }
  // Many steps: the workers keep their threads and see every step once.
  for (int i = 0; i < 200; ++i) {
    s.batch.tokens = 2 + i;
    REQUIRE_FALSE(g.forward(s.input(), out).has_value());
  }
  for (std::uint32_t r = 0; r < 4; ++r) {
    CHECK(g.rank(r).forwards == 201);
    CHECK(g.rank(r).tokens.back() == 201);
    CHECK(g.rank(r).thread_ids.back() == g.rank(r).thread_ids.front());
  }
  g.populate(s.residency);
  g.release(42);
  for (std::uint32_t r = 0; r < 4; ++r) {
    CHECK(g.rank(r).populated == 1);
    CHECK(g.rank(r).released == std::vector<std::uint64_t>{42});
  }
}

TEST_CASE("tp group: tp 1 is the one backend on the caller's thread", "[tp]") {
  auto shared = std::make_shared<Shared>(1);
  TpGroup<FakeRank> g = group_of(1, shared);
  Step s;
  StepResult out;
  REQUIRE_FALSE(g.forward(s.input(), out).has_value());
  CHECK(g.rank(0).thread_ids.front() == std::this_thread::get_id());
  CHECK(out.step_s == 1.0);
  shared->throw_rank = 0;
  CHECK_THROWS_AS(g.forward(s.input(), out), ConfigError);  // as it is, no wrapping
}

TEST_CASE("tp group: a rank's exception reaches the caller after every rank returned, the group goes on",
          "[tp]") {
  auto shared = std::make_shared<Shared>(3);
  TpGroup<FakeRank> g = group_of(3, shared);
  Step s;
  StepResult out;
  REQUIRE_FALSE(g.forward(s.input(), out).has_value());
  shared->throw_rank = 2;
  CHECK_THROWS_WITH(g.forward(s.input(), out), Catch::StartsWith("tensor-parallel rank 2: fake = 2"));
  for (std::uint32_t r = 0; r < 3; ++r)
    CHECK(g.rank(r).forwards == 2);  // everyone ran, no one is left inside
  shared->throw_rank = 0;
  CHECK_THROWS_AS(g.forward(s.input(), out), ConfigError);  // rank 0's as it is
  shared->throw_rank = -1;
  REQUIRE_FALSE(g.forward(s.input(), out).has_value());
  CHECK(out.step_s == 3.0);
  CHECK_THROWS_WITH(TpGroup<FakeRank>({}), Catch::Contains("--tp") && Catch::Contains("at least one rank"));
}

TEST_CASE("tp group: ranks that disagree on the routing or the change list stop the step, naming the rank",
          "[tp]") {
  auto shared = std::make_shared<Shared>(3);
  TpGroup<FakeRank> g = group_of(3, shared);
  Step s;
  StepResult out;
  shared->stray_rank = 1;
  CHECK_THROWS_WITH(g.forward(s.input(), out),
                    Catch::Contains("rank 1 routed MoE layer 1 to {99}, rank 0 to {1, 2, 5}"));
  shared->stray_rank = -1;
  shared->refuse_rank = 2;
  CHECK_THROWS_WITH(g.forward(s.input(), out), Catch::Contains("disagree on the change list") &&
                                                   Catch::Contains("rank 2 refused it (refused by rank 2)"));
  shared->refuse_rank = -1;
  // Every rank refusing the same list: the ChangeError comes back, as from one backend.
  s.changes.evictions.push_back(Eviction{ExpertKey{0, 1}, {}});
  const auto e = g.forward(s.input(), out);
  REQUIRE(e.has_value());
  CHECK(e->message == "refused by rank 0");
}

TEST_CASE("tp group: an engine over two identical simulated ranks runs exactly as over one", "[tp]") {
  const ModelSpec model = find_model("qwen1.5-moe-a2.7b");
  const PageGeometry geometry = page_geometry(model);
  const GpuProfile gpu = find_gpu("h200");
  const CostModelParams cost = find_cost_model("default");
  ShareGptLikeParams w;
  w.requests = 24;
  w.rate = 20;
  const std::vector<Request> trace = generate_sharegpt_like(w);
  auto sim = [&] { return std::make_unique<SimBackend>(model, gpu, cost, PredictorParams{}, 0, 11); };
  auto run = [&](auto backend) {
    using Backend = decltype(backend);
    MoePool pool(ArenaSpan{nullptr, (model.total_experts() * 3 + 4096) * geometry.expert_page_bytes},
                 pool_layout<MoePool>(geometry));
    policies::StaticAdjuster adj(ExpertRanker::uniform(model.moe_layers(), model.num_experts),
                                 AdjusterConfig{}, policies::StaticCapacity{});
    EngineOptions eo;
    eo.record_timeline = true;
    Engine<MoePool, policies::StaticAdjuster, Backend> engine(
        model, geometry, SchedulerConfig{}, std::move(pool), std::move(adj), std::move(backend),
        std::make_unique<SyntheticRouting>(
            RoutingModel(model.moe_layers(), model.num_experts, model.top_k, RoutingParams{}, 5)),
        trace, eo);
    return engine.run();
  };
  const RunResult one = run(std::move(*sim()));
  std::vector<std::unique_ptr<SimBackend>> ranks;
  ranks.push_back(sim());
  ranks.push_back(sim());
  const RunResult two = run(TpGroup<SimBackend>(std::move(ranks)));
  REQUIRE(one.timeline.size() == two.timeline.size());
  REQUIRE(one.forward_steps > 20);
  CHECK(one.forward_steps == two.forward_steps);
  CHECK(one.throughput_tok_s == two.throughput_tok_s);
  CHECK(one.ttft_ms.p50 == two.ttft_ms.p50);
  // With the timeline, every request's TTFT in trace order (what validate pairs request by request).
  REQUIRE(one.request_ttft_ms.size() == trace.size());
  CHECK(one.request_ttft_ms == two.request_ttft_ms);
  CHECK(std::all_of(one.request_ttft_ms.begin(), one.request_ttft_ms.end(), [](double t) { return t > 0; }));
  for (std::size_t i = 0; i < one.timeline.size(); ++i) {
    INFO("step " << i);
    CHECK(one.timeline[i].step_ms == two.timeline[i].step_ms);
    CHECK(one.timeline[i].batch_tokens == two.timeline[i].batch_tokens);
  }
}
