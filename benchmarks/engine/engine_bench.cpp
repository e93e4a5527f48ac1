// Host cost of one engine step (DESIGN §8: a whole scheduler + adjuster step <= 20 us at 256 running
// requests). BM_SchedulerAdjusterStep: Scheduler::schedule() + Adjuster::adjust() + Adjuster::commit() +
// Scheduler::complete() on a Qwen1.5-MoE-sized pool with N running requests in steady state (finished
// requests are re-queued, so prefill chunks and KV growth happen at their natural rate), elastic policy.
// BM_StepWithPlanning: the same step plus what the step contract adds on the host for any backend: the
// LoadPlanner's per-layer plan (begin_forward, plan_prefetch, plan_demand, end_forward) over routing read
// from a source, i.e. everything but the forward's compute. The routing is drawn before timing (64 steps of
// the synthetic model, replayed in a cycle): a GPU backend's router decides it on the device, and the
// synthetic draw is the simulator's own cost (in BM_RoutingAndSimForward). BM_RoutingAndSimForward: the
// simulator's own per-step cost (routing sample + cost model over the plan), for reference.
#include <deque>
#include <vector>

#include <benchmark/benchmark.h>

#include "amoeba/loader/load_planner.hpp"
#include "amoeba/policies/stacks.hpp"
#include "engine/model.hpp"
#include "engine/random.hpp"
#include "engine/routing.hpp"
#include "engine/routing_source.hpp"
#include "engine/scheduler.hpp"
#include "engine/sim_backend.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

// `steps` steps of the synthetic routing model for batches of `tokens` tokens, replayed in a cycle.
RecordedRouting predrawn_routing(SyntheticRouting& source, std::uint64_t tokens, std::size_t steps) {
  StepBatch b;
  b.tokens = tokens;
  std::vector<RecordedStep> record;
  for (std::size_t i = 0; i < steps; ++i) {
    source.begin_step(b);
    RecordedStep s;
    for (std::uint32_t l = 0; l < source.layers(); ++l) {
      const auto e = source.layer_experts(l);
      s.emplace_back(e.begin(), e.end());
    }
    record.push_back(std::move(s));
  }
  return RecordedRouting(source.layers(), source.experts(), source.model().top_k(), std::move(record),
                         /*wrap=*/true);
}

ExpertRanker ranker_for(const ModelSpec& m) {
  RoutingModel r(m.moe_layers(), m.num_experts, m.top_k, RoutingParams{}, 0);
  const auto c = r.calibration_counts(1024);
  std::vector<std::vector<double>> p(m.moe_layers(), std::vector<double>(m.num_experts));
  for (std::uint32_t l = 0; l < m.moe_layers(); ++l)
    for (std::uint32_t e = 0; e < m.num_experts; ++e) p[l][e] = c[l * m.num_experts + e] / 1024.0;
  return ExpertRanker::from_probabilities(p);
}

// A Qwen1.5-MoE-sized pool with n running requests in steady state, elastic policy; `plan` adds the routing
// draw and the LoadPlanner's plan for every MoE layer (oracle prediction of the routed offloaded experts).
void step_bench(benchmark::State& state, bool plan_loads) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  const ModelSpec m = find_model("qwen1.5-moe-a2.7b");
  const PageGeometry g = page_geometry(m);
  // Experts (24.9 GB) plus room for the KV of n requests of up to 600 tokens.
  const std::uint64_t kv = std::uint64_t(n) * 40 * m.attention_layers() * g.kv_page_bytes;
  MoePool pool(ArenaSpan{nullptr, m.total_experts() * m.expert_bytes() + kv + (64ull << 20)},
               {PageSpec{g.expert_page_bytes, 0}, PageSpec{g.kv_page_bytes, 0}});
  policies::ElasticHysteresis cap;
  policies::ElasticAdjuster adj(ranker_for(m), AdjusterConfig{10}, cap);
  if (adj.populate(pool)) state.SkipWithError("populate failed");
  SchedulerConfig cfg;
  cfg.max_num_seqs = n;
  Scheduler<MoePool> sched(m, g, cfg, pool);
  SyntheticRouting synthetic(RoutingModel(m.moe_layers(), m.num_experts, m.top_k, RoutingParams{}, 0));
  RecordedRouting routing = predrawn_routing(synthetic, n, 64);
  LoadPlanner planner(LoaderShape{m.moe_layers(), m.num_experts, 10});
  std::vector<std::uint32_t> predicted;
  Rng rng(1);
  std::deque<Sequence> seqs;
  for (std::uint32_t i = 0; i < n; ++i) {
    seqs.emplace_back(Request{i, 0.0, static_cast<std::uint32_t>(16 + rng.below(200)),
                              static_cast<std::uint32_t>(100 + rng.below(300))});
    sched.add(seqs.back());
  }
  double now = 0;
  StepPlan plan;
  auto one_step = [&] {
    sched.schedule(plan);
    ChangeList c = adj.adjust(AdjustSignal{plan.shortfall_pages, pool.available<ExpertPage>()}, pool);
    if (plan_loads && !plan.empty()) {
      routing.begin_step(plan.batch);
      if (planner.begin_forward(c, adj.residency(), pool)) state.SkipWithError("begin_forward");
      for (std::uint32_t l = 0; l < m.moe_layers(); ++l) {
        predicted.clear();
        for (std::uint32_t e : routing.layer_experts(l))
          if (!adj.residency().is_resident({l, e})) predicted.push_back(e);
        benchmark::DoNotOptimize(planner.plan_prefetch(l, predicted));
        benchmark::DoNotOptimize(planner.plan_demand(l, routing.layer_experts(l)));
      }
      benchmark::DoNotOptimize(planner.end_forward());
    }
    if (!c.empty()) (void)adj.commit(c, pool);
    sched.complete(plan, now += 0.02);
    for (Sequence& s : seqs)
      if (s.status == SeqStatus::kFinished) {  // re-queue: steady state (vectors keep their capacity)
        s.generated = s.computed = s.blocks = 0;
        s.first_token_s = s.finish_s = -1;
        sched.add(s);
      }
    return plan.size();
  };
  for (int i = 0; i < 600; ++i) one_step();  // warm up into steady state
  std::size_t batch = 0;
  for (auto _ : state) batch += one_step();
  state.counters["running"] = benchmark::Counter(double(batch) / double(state.iterations()));
}

void BM_SchedulerAdjusterStep(benchmark::State& state) {
  step_bench(state, false);
}
BENCHMARK(BM_SchedulerAdjusterStep)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_StepWithPlanning(benchmark::State& state) {
  step_bench(state, true);
}
BENCHMARK(BM_StepWithPlanning)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_RoutingAndSimForward(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  const ModelSpec m = find_model("qwen1.5-moe-a2.7b");
  SyntheticRouting routing(RoutingModel(m.moe_layers(), m.num_experts, m.top_k, RoutingParams{}, 0));
  SimBackend b(m, find_gpu("rtx5090"), find_cost_model("default"), PredictorParams{}, 10, 0);
  StepBatch batch;
  for (std::uint32_t i = 0; i < n; ++i) batch.seqs.push_back(SequenceStep{i, 300, 1, true, {}, {}});
  batch.tokens = batch.sampling_seqs = n;
  // 10 of 60 experts offloaded per layer (every sixth).
  MoePool pool(ArenaSpan{nullptr, m.total_experts() * 3 * 4096}, {PageSpec{4096, 0}, PageSpec{1024, 0}});
  ResidencyTable table(m.moe_layers(), m.num_experts);
  for (std::uint32_t l = 0; l < m.moe_layers(); ++l)
    for (std::uint32_t e = 0; e < m.num_experts; ++e) {
      if (e % 6 == 0) continue;
      ExpertPages p;
      for (ExpertMatrix x : kExpertMatrices) p[x] = *pool.allocate<ExpertPage>(expert_owner({l, e}, x));
      (void)table.mark_resident({l, e}, p);
    }
  const ChangeList none;
  StepResult r;
  for (auto _ : state) {
    routing.begin_step(batch);
    if (b.forward(StepInput<MoePool>{batch, none, table, pool, routing}, r)) state.SkipWithError("forward");
    benchmark::DoNotOptimize(r.step_s);
  }
}
BENCHMARK(BM_RoutingAndSimForward)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
