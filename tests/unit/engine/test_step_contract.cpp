// The step contract (amoeba/engine/step.hpp, backend.hpp) on the CPU: one step plan with real evictions and
// restores is driven through SimBackend and through a recording fake backend that executes the LoadPlanner's
// plan the way the CUDA loader does; both must see the same copies in the same order. Also the simulator's
// cost laws over the plan: a buffered expert is one copy call, a restore three; misses stall only the MoE.
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/engine/backend.hpp"
#include "amoeba/loader/load_planner.hpp"
#include "amoeba/policies/stacks.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/routing_source.hpp"
#include "engine/scenario.hpp"
#include "engine/scheduler.hpp"
#include "engine/sim_backend.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

// A backend that does what a GPU backend does with the plan (restores and predictions before the layer,
// misses after routing) and records it instead of copying. Its predictor is the oracle: the routed experts
// that are not resident.
class RecordingBackend {
 public:
  RecordingBackend(std::uint32_t layers, std::uint32_t experts, std::uint32_t slots)
      : planner_(LoaderShape{layers, experts, slots}) {}
  static constexpr std::string_view name() noexcept { return "recording"; }
  double idle_step_s() const noexcept { return 0; }

  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    if (auto e = planner_.begin_forward(in.changes, in.residency, in.pool)) return e;
    out.clear();
    copies.clear();
    const std::uint32_t layers = in.routing.layers();
    auto prefetch = [&](std::uint32_t l) {
      std::vector<std::uint32_t> predicted;
      for (std::uint32_t e : in.routing.layer_experts(l))
        if (!in.residency.is_resident({l, e})) predicted.push_back(e);
      const auto plan = planner_.plan_prefetch(l, predicted);
      for (const ExpertCopy& c : plan.value()) copies.push_back({l, false, c});
    };
    prefetch(0);
    for (std::uint32_t l = 0; l < layers; ++l) {
      const auto routed = in.routing.layer_experts(l);
      out.add_routed(routed);
      const auto demand = planner_.plan_demand(l, routed);
      for (const ExpertCopy& c : demand.value()) copies.push_back({l, true, c});
      if (l + 1 < layers) prefetch(l + 1);
    }
    (void)planner_.end_forward();
    return std::nullopt;
  }

  std::vector<SimBackend::CopyRecord> copies;

 private:
  LoadPlanner planner_;
};
static_assert(backend<RecordingBackend, MoePool>);
static_assert(backend<SimBackend, MoePool> && backend<SimBackend, HybridMoePool>);

ExpertRanker ranker_for(const ModelSpec& m, const RoutingModel& r) {
  const auto c = r.calibration_counts(2048);
  std::vector<std::vector<double>> p(m.moe_layers(), std::vector<double>(m.num_experts));
  for (std::uint32_t l = 0; l < m.moe_layers(); ++l)
    for (std::uint32_t e = 0; e < m.num_experts; ++e) p[l][e] = c[l * m.num_experts + e] / 2048.0;
  return ExpertRanker::from_probabilities(p);
}

// A decode batch of n sequences with `context` tokens each (the simulator reads no page list).
StepBatch decode_batch(std::uint32_t n, std::uint32_t context) {
  StepBatch b;
  for (std::uint32_t i = 0; i < n; ++i) b.seqs.push_back(SequenceStep{i, context, 1, true, {}, {}});
  b.tokens = b.sampling_seqs = n;
  return b;
}

struct World {
  ModelSpec model = find_model("qwen1.5-moe-a2.7b");
  PageGeometry geometry = page_geometry(model);
  RoutingModel routing{model.moe_layers(), model.num_experts, model.top_k, RoutingParams{}, 7};
  MoePool pool{ArenaSpan{nullptr, (model.total_experts() * 3 + 64) * geometry.expert_page_bytes},
               {PageSpec{geometry.expert_page_bytes, 0}, PageSpec{geometry.kv_page_bytes, 0}}};
  policies::ElasticAdjuster adj{ranker_for(model, routing), AdjusterConfig{10},
                                policies::ElasticHysteresis{}};
  static constexpr std::uint32_t kSlots = 10;
  World() { REQUIRE_FALSE(adj.populate(pool).has_value()); }
};

}  // namespace

TEST_CASE("one step plan through SimBackend and a recording backend: the same LoadPlanner copies",
          "[engine][contract]") {
  World w;
  const CostModelParams cost = find_cost_model("default");
  SimBackend sim(w.model, find_gpu("rtx5090"), cost, PredictorParams{PredictorKind::kOracle, 1},
                 World::kSlots, 3);
  RecordingBackend rec(w.model.moe_layers(), w.model.num_experts, World::kSlots);
  SyntheticRouting routing(w.routing);
  const StepBatch batch = decode_batch(64, 300);

  // Step 1 evicts under pressure; step 2 restores into the free pages; step 3 runs with experts offloaded.
  const AdjustSignal signals[] = {{40, 0}, {0, 0}, {0, 0}};
  std::uint64_t restores_seen = 0, evictions_seen = 0, misses_or_prefetches = 0;
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    AdjustSignal sig = signals[step];
    if (step > 0) sig.free_expert_pages = w.pool.available<ExpertPage>();
    ChangeList changes = w.adj.adjust(sig, w.pool);
    evictions_seen += changes.evictions.size();
    restores_seen += changes.restores.size();
    routing.begin_step(batch);
    StepResult a, b;
    REQUIRE_FALSE(sim.forward(StepInput<MoePool>{batch, changes, w.adj.residency(), w.pool, routing}, a));
    REQUIRE_FALSE(rec.forward(StepInput<MoePool>{batch, changes, w.adj.residency(), w.pool, routing}, b));
    CHECK(sim.last_copies() == rec.copies);
    CHECK(a.routed == b.routed);
    CHECK(a.routed_offsets == b.routed_offsets);
    // The result accounts for exactly the planned copies.
    std::uint64_t calls = 0, restores = 0;
    for (const auto& c : rec.copies) {
      calls += c.copy.copy_calls();
      restores += c.copy.target == CopyTarget::kReservedPages;
    }
    CHECK(a.copy_calls == calls);
    CHECK(a.restores_copied == restores);
    CHECK(a.restores_copied + a.prefetches + a.on_demand == rec.copies.size());
    CHECK(a.h2d_bytes == rec.copies.size() * w.model.expert_bytes());
    CHECK(a.expert_touches == a.expert_hits + a.expert_prefetched + a.expert_misses);
    CHECK(a.expert_touches == a.routed.size());
    misses_or_prefetches += a.prefetches + a.on_demand;
    REQUIRE_FALSE(w.adj.commit(changes, w.pool).has_value());
  }
  CHECK(evictions_seen > 0);
  CHECK(restores_seen > 0);
  CHECK(misses_or_prefetches > 0);
}

TEST_CASE("both backends refuse a bad change list before anything runs", "[engine][contract]") {
  World w;
  SimBackend sim(w.model, find_gpu("rtx5090"), find_cost_model("default"), PredictorParams{}, World::kSlots,
                 0);
  SyntheticRouting routing(w.routing);
  const StepBatch batch = decode_batch(4, 10);
  routing.begin_step(batch);
  ChangeList bad;
  bad.evictions.push_back(Eviction{{0, 0}, {}, EvictionCause::kPressure});  // pages it does not hold
  StepResult r;
  const auto e = sim.forward(StepInput<MoePool>{batch, bad, w.adj.residency(), w.pool, routing}, r);
  REQUIRE(e.has_value());
  CHECK(e->code == ChangeErrorCode::kPagesMismatch);
  CHECK_FALSE(sim.planner().in_forward());
  CHECK(sim.last_copies().empty());
}

TEST_CASE("cost model over the plan: copy calls, misses stall the MoE, prefetch overlaps", "[engine][sim]") {
  const ModelSpec m = find_model("qwen1.5-moe-a2.7b");
  const GpuProfile g = find_gpu("h200");
  const CostModelParams c = find_cost_model("default");
  SimBackend b(m, g, c, PredictorParams{PredictorKind::kNone, 0}, 8, 0);
  CHECK(b.copy_time(0, 0) == 0);
  // A buffered expert is one call, a restore three (DESIGN §3.4: W1, W3, W2 contiguous in the host store).
  CHECK(b.copy_time(1, m.expert_bytes()) == Approx(9.5e-6 + double(m.expert_bytes()) / 54.3e9));
  CHECK(b.copy_time(3, m.expert_bytes()) == Approx(3 * 9.5e-6 + double(m.expert_bytes()) / 54.3e9));
  CHECK(b.moe_time(1, 4) < b.moe_time(1, 60));       // decode: bytes of distinct experts
  CHECK(b.moe_time(4096, 60) > b.moe_time(64, 60));  // prefill: FLOPs

  // Every layer routes all 60 experts; 8 of them (0..7) are offloaded in every layer.
  const std::uint32_t layers = m.moe_layers();
  std::vector<std::uint32_t> all(60);
  std::iota(all.begin(), all.end(), 0u);
  std::vector<RecordedStep> steps(2, RecordedStep(layers, all));
  const ExpertRanker uniform = ExpertRanker::uniform(layers, 60);
  MoePool pool(ArenaSpan{nullptr, std::uint64_t(layers) * 60 * 3 * 4096},
               {PageSpec{4096, 0}, PageSpec{1024, 0}});
  ResidencyTable resident_all(uniform), resident_some(uniform);
  for (std::uint32_t l = 0; l < layers; ++l)
    for (std::uint32_t e = 0; e < 60; ++e) {
      ExpertPages p;
      for (ExpertMatrix x : kExpertMatrices) p[x] = *pool.allocate<ExpertPage>(expert_owner({l, e}, x));
      REQUIRE(resident_all.mark_resident({l, e}, p));
      if (e >= 8) REQUIRE(resident_some.mark_resident({l, e}, p));
    }
  const StepBatch batch = decode_batch(15, 100);  // 15 tokens x top-4 can route to all 60 experts
  const ChangeList none;
  auto run = [&](SimBackend& backend, const ResidencyTable& table) {
    RecordedRouting routing(layers, 60, m.top_k, steps);
    routing.begin_step(batch);
    StepResult r;
    REQUIRE_FALSE(backend.forward(StepInput<MoePool>{batch, none, table, pool, routing}, r));
    return r;
  };
  const StepResult a = run(b, resident_all), o = run(b, resident_some);
  CHECK(a.h2d_bytes == 0);
  CHECK(a.stall_s == 0);
  CHECK(a.expert_hits == layers * 60);
  CHECK(o.expert_misses == layers * 8);
  CHECK(o.on_demand == layers * 8);
  CHECK(o.copy_calls == layers * 8);  // buffered experts: one call each
  CHECK(o.h2d_bytes == layers * 8 * m.expert_bytes());
  CHECK(o.stall_s > 0);
  // Compute is serial: the step is compute plus the time the MoE waited, nothing else.
  CHECK(o.step_s == Approx(o.compute_s + o.stall_s));
  CHECK(a.step_s == Approx(a.compute_s));
  // Misses are loaded after routing and nothing overlaps them: each layer waits for its whole load.
  CHECK(o.stall_s == Approx(layers * b.copy_time(8, 8 * m.expert_bytes())).epsilon(1e-9));
  // The same experts prefetched (oracle) overlap the previous layer: less stall than on-demand loads.
  SimBackend oracle(m, g, c, PredictorParams{PredictorKind::kOracle, 1}, 8, 0);
  const StepResult p = run(oracle, resident_some);
  CHECK(p.expert_prefetched == layers * 8);
  CHECK(p.expert_misses == 0);
  CHECK(p.prefetches == layers * 8);
  CHECK(p.stall_s < o.stall_s);
  CHECK(p.step_s < o.step_s);
  // Layer 0's prefetch is issued at the start of the step and its attention does not wait for it: the stall
  // of layer 0 is the copy time minus that attention, not the whole copy time.
  CHECK(p.stall_s < layers * b.copy_time(8, 8 * m.expert_bytes()));
}

TEST_CASE("backend names: known ones resolve, unknown ones list the known", "[engine][contract]") {
  CHECK(find_backend("sim").kind == BackendKind::kSim);
  CHECK(find_backend("sim").simulated);
  CHECK(find_backend("cuda").kind == BackendKind::kCuda);
  CHECK_FALSE(find_backend("cuda").simulated);
  CHECK_THROWS_WITH(find_backend("tpu"),
                    Catch::Contains("--backend = tpu: unknown backend (known: sim, cuda)"));
  Scenario s;
  s.backend = "tpu";
  CHECK_THROWS_WITH(validate_scenario(s), Catch::Contains("--backend = tpu"));
  const Scenario t = parse_scenario(R"({"backend": "sim"})", "c.json");
  CHECK(t.backend == "sim");
}

TEST_CASE("recorded routing: replayed in order, checked on load, refused past its end",
          "[engine][contract]") {
  std::vector<RecordedStep> steps{{{3, 1, 3}, {}}, {{0}, {2, 2}}};
  RecordedRouting r(2, 4, /*top_k=*/1, steps);
  const StepBatch b = decode_batch(2, 1);  // 2 tokens, top-1: 1 or 2 distinct experts are routable
  auto at = [&](std::uint32_t l) {
    return std::vector<std::uint32_t>(r.layer_experts(l).begin(), r.layer_experts(l).end());
  };
  r.begin_step(b);
  CHECK(at(0) == std::vector<std::uint32_t>{1, 3});  // sorted, deduplicated
  // An empty set is not routable: it gains the expert the record routes to most often in that layer.
  CHECK(at(1) == std::vector<std::uint32_t>{2});
  r.begin_step(b);
  CHECK(at(0) == std::vector<std::uint32_t>{0});
  CHECK(at(1) == std::vector<std::uint32_t>{2});
  CHECK_THROWS_WITH(r.begin_step(b), Catch::Contains("routing.steps = 2: the recorded routing ends"));
  CHECK(at(1) == std::vector<std::uint32_t>{2});  // a refused step changes nothing
  CHECK_THROWS_WITH(RecordedRouting(2, 4, 1, {{{5}, {}}}), Catch::Contains("routing.steps[0][0] = 5"));
  CHECK_THROWS_WITH(RecordedRouting(3, 4, 1, {{{1}, {}}}), Catch::Contains("must list 3 MoE layers"));
  CHECK_THROWS_WITH(RecordedRouting(2, 4, 0, {{{1}, {}}}), Catch::Contains("routing.top_k = 0"));
  // The simulator has no router: a model-routed source is refused by name.
  struct ModelRouting final : RoutingSource {
    RoutingKind kind() const noexcept override { return RoutingKind::kModel; }
    std::uint32_t layers() const noexcept override { return 24; }
    std::uint32_t experts() const noexcept override { return 60; }
    void begin_step(const StepBatch&) override {}
    std::span<const std::uint32_t> layer_experts(std::uint32_t) const override { return {}; }
  } model_routing;
  World w;
  SimBackend sim(w.model, find_gpu("rtx5090"), find_cost_model("default"), PredictorParams{}, World::kSlots,
                 0);
  StepResult out;
  CHECK_THROWS_WITH(
      sim.forward(StepInput<MoePool>{b, ChangeList{}, w.adj.residency(), w.pool, model_routing}, out),
      Catch::Contains("routing = model: the simulator has no router"));
}
