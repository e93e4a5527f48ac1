// The GPU backend's wiring, on the CPU: the dispatch table's cuda entry and the stub that refuses where the
// build has none; routing "model" and the backends' defaults; a measured backend's clock (forward times plus
// the engine's host time) against a simulated one's; the reports' simulated/measured marker; --weights as
// the model; and the generate driver's page bookkeeping, driven with a fake backend.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include "ablate.hpp"
#include "amoeba/core/errors.hpp"
#include "amoeba/policies/stacks.hpp"
#include "engine/checkpoint.hpp"
#include "engine/cuda_backend.hpp"
#include "engine/engine.hpp"
#include "engine/generate_driver.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/routing_source.hpp"
#include "engine/safetensors.hpp"
#include "engine/scenario.hpp"
#include "engine/sim_backend.hpp"

using namespace amoeba;
using namespace amoeba::engine;
namespace fs = std::filesystem;

static_assert(backend<CudaBackend, MoePool> && measured_backend<CudaBackend> &&
              populating_backend<CudaBackend>);
static_assert(!measured_backend<SimBackend> && !populating_backend<SimBackend>);

namespace {

constexpr const char* kStubRule =
    "--backend = cuda: this build has no CUDA backend: configure with the gpu preset (cmake --preset gpu) on "
    "a "
    "machine with nvcc and a GPU";

// A small Qwen3-MoE checkpoint (16 experts of 16 x 64; one KV head of 32: KV page = expert page = 2 KiB),
// zero weights: what --weights reads is the config and the headers.
fs::path write_tiny_checkpoint() {
  const fs::path dir = fs::temp_directory_path() / "amoeba_wiring_ckpt";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const char* config = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "vocab_size": 96, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 16,
    "norm_topk_prob": true})";
  std::ofstream(dir / "config.json") << config;
  std::vector<TensorInfo> t;
  for (const ExpectedTensor& e : expected_tensors(parse_hf_moe_config(config, "config.json")))
    t.push_back(TensorInfo{e.name, TensorDtype::kBF16, e.shape, 0, 0});
  std::string out = SafetensorsFile::make_header(t);
  out.append(t.back().end, '\0');
  std::ofstream(dir / "model.safetensors", std::ios::binary) << out;
  return dir;
}

// A backend whose every forward takes kStepS, measured or not; it counts forwards and what populate saw.
template <bool Measured>
struct ClockBackend {
  static constexpr bool kMeasured = Measured;
  static constexpr double kStepS = 1e-3;
  static constexpr std::string_view name() noexcept { return "clock"; }
  double idle_step_s() const noexcept { return 0.0; }
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    out.clear();
    out.step_s = kStepS;
    for (std::uint32_t l = 0; l < in.routing.layers(); ++l) out.add_routed({});
    ++forwards;
    return std::nullopt;
  }
  void populate(const ResidencyTable& r) { populated = r.resident_total(); }
  std::uint64_t forwards = 0, populated = 0;
};
static_assert(measured_backend<ClockBackend<true>> && !measured_backend<ClockBackend<false>>);

template <bool Measured>
struct ClockRun {
  using Backend = ClockBackend<Measured>;
  ModelSpec model = find_model("qwen1.5-moe-a2.7b");
  PageGeometry geometry = page_geometry(model);
  std::unique_ptr<Engine<MoePool, policies::StaticAdjuster, Backend>> engine;
  RunResult result;

  explicit ClockRun(const std::vector<Request>& trace) {
    MoePool pool(ArenaSpan{nullptr, (model.total_experts() * 3 + 64) * geometry.expert_page_bytes},
                 pool_layout<MoePool>(geometry));
    policies::StaticAdjuster adj(ExpertRanker::uniform(model.moe_layers(), model.num_experts),
                                 AdjusterConfig{}, policies::StaticCapacity{});
    EngineOptions eo;
    eo.record_timeline = true;
    engine = std::make_unique<Engine<MoePool, policies::StaticAdjuster, Backend>>(
        model, geometry, SchedulerConfig{}, std::move(pool), std::move(adj), Backend{},
        std::make_unique<ModelRouting>(model.moe_layers(), model.num_experts), trace, eo);
    result = engine->run();
  }
};

}  // namespace

TEST_CASE("the dispatch table lists cuda: measured, h200 and the model's router by default",
          "[engine][cuda]") {
  const auto table = backend_table();
  const auto it =
      std::find_if(table.begin(), table.end(), [](const BackendEntry& e) { return e.name == "cuda"; });
  REQUIRE(it != table.end());
  CHECK(it->kind == BackendKind::kCuda);
  CHECK_FALSE(it->simulated);
  CHECK(it->description ==
        "an NVIDIA GPU: the real kernels and copies (needs a build with the CUDA backend)");
  CHECK(it->gpu == "h200");
  CHECK(it->routing == "model");
  CHECK(find_backend("sim").gpu == Scenario{}.gpu);
  CHECK(find_backend("sim").routing == Scenario{}.routing_source);
}

TEST_CASE("without the CUDA backend, --backend cuda is refused by the stub, naming the flag",
          "[engine][cuda]") {
  if (cuda_backend_available()) {
    SUCCEED("this build has the CUDA backend");
    return;
  }
  CHECK_THROWS_WITH(CudaBackend(CudaBackendConfig{}, {}), kStubRule);
  Scenario s;
  s.backend = "cuda";
  s.requests = 4;
  s.policies = {"static"};
  apply_backend_defaults(s);
  validate_scenario(s);
  CHECK_THROWS_AS(testing::ablate(s), ConfigError);
  CHECK_THROWS_WITH(testing::ablate(s), kStubRule);
  const Checkpoint ck = open_checkpoint(write_tiny_checkpoint().string());
  const std::vector<std::int32_t> prompt{1, 2, 3};
  CHECK_THROWS_WITH(generate_on_cuda(ck, prompt, 4, {}), kStubRule);
}

TEST_CASE("routing model: refused by the simulator, the default of cuda, ModelRouting has no choices",
          "[engine][cuda]") {
  Scenario s;
  s.routing_source = "model";
  CHECK_THROWS_WITH(validate_scenario(s),
                    Catch::StartsWith("--routing = model: the simulator (--backend sim) has no router"));
  s.policies = {"static"};
  s.requests = 4;
  CHECK_THROWS_WITH(testing::ablate(s), Catch::StartsWith("--routing = model: the simulator"));

  // Defaults follow the backend where nothing named the GPU or the routing; named ones stay.
  Scenario c = parse_scenario(R"({"backend": "cuda"})", "c.json");
  apply_backend_defaults(c);
  CHECK(c.gpu == "h200");
  CHECK(c.routing_source == "model");
  c = parse_scenario(R"({"backend": "cuda", "gpu": "rtx5090", "routing": {"source": "synthetic"}})",
                     "c.json");
  apply_backend_defaults(c);
  CHECK(c.gpu == "rtx5090");
  CHECK(c.routing_source == "synthetic");
  Scenario d;
  apply_backend_defaults(d);
  CHECK(d.gpu == Scenario{}.gpu);
  CHECK(d.routing_source == "synthetic");

  ModelRouting r(3, 8);
  CHECK(r.kind() == RoutingKind::kModel);
  CHECK(r.layers() == 3);
  CHECK(r.experts() == 8);
  r.begin_step(StepBatch{});
  CHECK_THROWS_AS(r.layer_experts(0), std::logic_error);
  CHECK_THROWS_WITH(ModelRouting(0, 8), Catch::StartsWith("routing.layers = 0"));
}

TEST_CASE("a measured backend's clock adds the engine's host time, a simulated one's does not",
          "[engine][cuda][clock]") {
  const std::vector<Request> one{{0, 0.0, 40, 5}};
  ClockRun<false> sim(one);
  ClockRun<true> gpu(one);
  for (const RunResult* r : {&sim.result, &gpu.result}) {
    REQUIRE(r->completed_requests == 1);
    REQUIRE(r->forward_steps == 5);  // the prompt in one step, then 4 decodes
  }
  CHECK(sim.engine->backend().populated == sim.engine->adjuster().residency().resident_total());
  CHECK(gpu.engine->backend().populated == gpu.engine->adjuster().residency().resident_total());

  // Simulated: the clock is the forwards' time, nothing else; no host time anywhere.
  CHECK(sim.engine->now() == Approx(5 * ClockBackend<false>::kStepS).epsilon(1e-12));
  CHECK(sim.result.host_s == 0.0);
  CHECK(std::all_of(sim.result.timeline.begin(), sim.result.timeline.end(),
                    [](const TimelineRow& t) { return t.host_ms == 0.0; }));
  CHECK(sim.result.ttft_ms.p50 == Approx(1.0));

  // Measured: forwards + host time; every step has some host time; TTFT between the first forward alone and
  // the first forward plus all the host time.
  const double host = gpu.result.host_s;
  CHECK(host > 0);
  CHECK(gpu.engine->now() == Approx(5 * ClockBackend<true>::kStepS + host).epsilon(1e-9));
  double rows = 0;
  for (const TimelineRow& t : gpu.result.timeline) {
    CHECK(t.host_ms > 0);
    rows += t.host_ms / 1e3;
  }
  CHECK(rows == Approx(host).epsilon(1e-9));
  CHECK(gpu.result.ttft_ms.p50 > 1.0);
  CHECK(gpu.result.ttft_ms.p50 <= (1e-3 + host) * 1e3 + 1e-9);
  CHECK(gpu.result.makespan_s <= gpu.engine->now());  // the last step's host time after its tokens

  // An idle gap still jumps to the next arrival: no sleep is counted.
  const std::vector<Request> gap{{0, 0.0, 40, 2}, {1, 5.0, 40, 2}};
  ClockRun<true> later(gap);
  CHECK(later.result.completed_requests == 2);
  CHECK(later.engine->now() > 5.0 + 2 * ClockBackend<true>::kStepS);
  CHECK(later.engine->now() <= 5.0 + 4 * ClockBackend<true>::kStepS + later.result.host_s + 1e-9);
}

TEST_CASE("reports say when a quantized run is priced by a cost model without a fit for its precision",
          "[engine][report]") {
  RunResult r;
  r.policy = "static";
  r.total_requests = r.completed_requests = 1;
  Scenario s;
  s.requests = 1;
  const auto note = [&] {
    const std::string table = ablation_table(s, describe_workload(s, {}), {r});
    const auto j = nlohmann::json::parse(ablation_json(s, {r}));
    const bool in_table = table.find("note: cost model") != std::string::npos;
    CHECK(in_table == j.contains("cost_model_note"));
    return j.contains("cost_model_note") ? j.at("cost_model_note").get<std::string>() : std::string();
  };
  CHECK(note().empty());  // bf16: the cost model's own efficiencies
  s.expert_precision = ExpertPrecision::kInt8;
  CHECK(
      note() ==
      "cost model default has no int8 fit (no int8_moe_token_scale: not calibrated on the quantized kernel): "
      "int8 experts are priced with prior factors on its bf16 MoE efficiencies (memory x 0.95, compute x "
      "0.85)");
  s.expert_precision = ExpertPrecision::kInt4;
  CHECK_THAT(note(), Catch::Contains("has no int4 fit") && Catch::Contains("memory x 0.90, compute x 0.75"));
  s.cost_model = "h200-qwen3";  // calibrated for bf16 only
  CHECK_THAT(note(), Catch::StartsWith("cost model h200-qwen3 has no int4 fit"));
  s.cost_model = "h200-qwen1.5";  // int8 and int4 fitted on the H200 (docs/results/quantized_h200.md)
  CHECK(note().empty());
  s.expert_precision = ExpertPrecision::kInt8;
  CHECK(note().empty());
  s.cost_model = "default";
  s.backend = "cuda";  // measured: nothing is priced
  s.gpu = "h200";
  CHECK(precision_cost_note(s).empty());
}

TEST_CASE("reports mark a cuda run measured: table, JSON (with host_s) and CSV", "[engine][cuda][report]") {
  RunResult r;
  r.policy = "static";
  r.total_requests = r.completed_requests = 1;
  r.host_s = 0.25;
  Scenario s;
  s.requests = 1;
  const auto sim_json = nlohmann::json::parse(ablation_json(s, {r}));
  CHECK(sim_json.at("simulated") == true);
  CHECK_FALSE(sim_json.at("results").at(0).contains("host_s"));
  CHECK(ablation_table(s, describe_workload(s, {}), {r}).rfind("SIMULATED GPU", 0) == 0);
  s.backend = "cuda";
  s.gpu = "h200";
  const auto gpu_json = nlohmann::json::parse(ablation_json(s, {r}));
  CHECK(gpu_json.at("simulated") == false);
  CHECK_THAT(gpu_json.at("note").get<std::string>(), Catch::StartsWith("measured on a GPU (backend cuda)"));
  CHECK(gpu_json.at("results").at(0).at("host_s") == 0.25);
  CHECK(ablation_table(s, describe_workload(s, {}), {r}).rfind("MEASURED on a GPU (backend cuda)", 0) == 0);
  const std::string csv = ablation_csv(s, describe_workload(s, {}), {r});
  CHECK(csv.substr(csv.find('\n') + 1).rfind("false,qwen1.5-moe-a2.7b,h200,", 0) == 0);
  // A checkpoint path is one CSV cell even with a comma in it.
  s.weights = "/ckpt/a,b";
  const std::string quoted = ablation_csv(s, describe_workload(s, {}), {r});
  CHECK(quoted.substr(quoted.find('\n') + 1).rfind("false,\"checkpoint /ckpt/a,b\",h200,", 0) == 0);
}

TEST_CASE("weights: the checkpoint's config is the model (the simulator reads its shapes)",
          "[engine][cuda]") {
  const fs::path dir = write_tiny_checkpoint();
  Scenario s;
  s.weights = dir.string();
  s.memory.memory_cap_bytes = 1ull << 30;  // 2 KiB pages: keep the pool's bookkeeping small
  s.policies = {"static", "elastic"};
  s.expert_offload_limit = 4;
  s.requests = 20;
  const auto trace = scenario_requests(s);
  const auto setups = prepare_runs(s, trace, RunOptions{});
  REQUIRE(setups.size() == 2);
  for (const RunSetup& r : setups) {
    CHECK(r.model.name == "checkpoint " + dir.string());
    CHECK(r.model.num_experts == 16);
    CHECK(r.model.moe_layers() == 2);
    REQUIRE(r.hf_model);
    CHECK(r.hf_model->arch == MoeArchitecture::kQwen3Moe);
    CHECK(r.routing == RoutingKind::kSynthetic);
  }
  for (const RunResult& r : testing::ablate(s)) CHECK(r.completed_requests == 20);
  // The scenario JSON names the checkpoint instead of the model, and reads back.
  const Scenario back = parse_scenario(scenario_to_json(s), "out.json");
  CHECK(back.weights == s.weights);
  CHECK_THROWS_WITH(
      parse_scenario(R"({"model": "qwen3-30b-a3b", "weights": "/x"})", "c.json"),
      Catch::StartsWith("config.model = \"qwen3-30b-a3b\": must not be given with config.weights"));
  s.weights = (dir / "missing").string();
  CHECK_THROWS_AS(testing::ablate(s), ConfigError);
}

TEST_CASE("config tp: the cuda backend's tensor parallelism reads back from a config, 1 when absent",
          "[engine][cuda][tp]") {
  Scenario s;
  CHECK(scenario_to_json(s).find("\"tp\"") == std::string::npos);  // one GPU: files as before
  s.backend = "cuda";
  s.tp = 4;
  const Scenario back = parse_scenario(scenario_to_json(s), "out.json");
  CHECK(back.tp == 4);
  CHECK(parse_scenario(R"({"backend": "cuda"})", "c.json").tp == 1);
  CHECK_THROWS_WITH(parse_scenario(R"({"backend": "cuda", "tp": 9})", "c.json"),
                    Catch::StartsWith("config.tp = 9"));
  CHECK_THROWS_WITH(parse_scenario(R"({"tp": 0})", "c.json"), Catch::StartsWith("config.tp = 0"));
  Scenario sim;
  sim.tp = 2;
  CHECK_THROWS_WITH(validate_scenario(sim),
                    Catch::StartsWith("--tp = 2: tensor parallelism over GPUs runs on "
                                      "--backend cuda"));
}

TEST_CASE("cuda setups refuse what the GPU backend does not run, naming the flag", "[engine][cuda]") {
  Scenario s;
  s.backend = "cuda";
  s.policies = {"static"};
  s.requests = 4;
  apply_backend_defaults(s);
  const auto trace = scenario_requests(s);
  Scenario multi = s;
  multi.gpu = "2x-rtx5090";
  CHECK_THROWS_WITH(prepare_runs(multi, trace, {}),
                    Catch::StartsWith("--gpu = 2x-rtx5090: the cuda backend runs on one GPU"));
  // Quantized experts are served: the setup carries the precision and the packed page.
  Scenario q = s;
  q.expert_precision = ExpertPrecision::kInt8;
  const auto quantized = prepare_runs(q, trace, {});
  REQUIRE(quantized.size() == 1);
  CHECK(quantized[0].model.expert_precision == ExpertPrecision::kInt8);
  CHECK(quantized[0].geometry.expert_page_bytes == quantized[0].model.expert_page_bytes());
  CHECK(quantized[0].geometry.expert_page_bytes <
        2ull * quantized[0].model.moe_intermediate_size * quantized[0].model.hidden_size);
  Scenario g = s;
  g.moe_kernel = MoeKernel::kGather;
  CHECK_THROWS_WITH(prepare_runs(g, trace, {}), Catch::StartsWith("--moe-kernel = gather"));
  // A catalog model goes through its Hugging Face configuration, routed by the model.
  const auto setups = prepare_runs(s, trace, {});
  REQUIRE(setups.size() == 1);
  REQUIRE(setups[0].hf_model);
  CHECK(setups[0].routing == RoutingKind::kModel);
  CHECK(setups[0].gpu.name == "h200");
  CHECK(setups[0].model.num_experts == 60);
}

namespace {

// A backend for the generate driver: records each step's batch (page lists copied), checks the pages are
// request 0's, "samples" token = 1000 + step and keeps one logit per step.
struct GenerateFake {
  static constexpr std::string_view name() noexcept { return "generate-fake"; }
  double idle_step_s() const noexcept { return 0; }
  struct Seen {
    std::uint32_t context_before, new_tokens;
    bool samples;
    std::vector<PageHandle> kv_pages;
    std::uint32_t attention_layers;
    std::int32_t fed;  // the token this step fed after the prompt (the previous step's, maybe replaced)
    bool owners_ok;
  };
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    out.clear();
    REQUIRE(in.batch.size() == 1);
    REQUIRE(in.changes.empty());
    REQUIRE(in.routing.kind() == RoutingKind::kModel);
    const SequenceStep& q = in.batch.seqs[0];
    bool owners = true;
    for (PageHandle p : q.kv_pages) owners = owners && in.pool.owner_of(p) == OwnerId{0};
    seen.push_back({q.context_before,
                    q.new_tokens,
                    q.samples,
                    {q.kv_pages.begin(), q.kv_pages.end()},
                    in.batch.attention_layers,
                    tokens_.empty() ? -1 : tokens_.back(),
                    owners});
    tokens_.push_back(static_cast<std::int32_t>(1000 + seen.size() - 1));
    logits_.assign(1, std::vector<float>{float(tokens_.back())});
    return std::nullopt;
  }
  void populate(const ResidencyTable& r) { populated = r.resident_total(); }
  std::span<const std::int32_t> tokens(std::uint64_t) const { return tokens_; }
  void replace_last_token(std::uint64_t, std::int32_t t) { tokens_.back() = t; }
  const std::vector<std::vector<float>>& last_logits() const { return logits_; }

  std::vector<Seen> seen;
  std::uint64_t populated = 0;
  std::vector<std::int32_t> tokens_;
  std::vector<std::vector<float>> logits_;
};

}  // namespace

TEST_CASE("generate driver: every expert resident, KV pages block-major as the sequence grows",
          "[engine][generate]") {
  const ModelSpec m = find_model("qwen3-30b-a3b");  // 48 attention layers, KV page 16 x 2 x 4 x 128 x 2 B
  const PageGeometry g = page_geometry(m);
  const std::vector<std::int32_t> prompt(21, 7);  // two blocks; the third begins at token 33
  const std::uint32_t new_tokens = 14;
  const std::uint64_t bytes = generate_pool_bytes(m, g, std::uint32_t(prompt.size() + new_tokens));
  CHECK(bytes % g.expert_page_bytes == 0);
  GenerateFake fake;
  const auto out = generate_greedy(fake, m, g, bytes, prompt, new_tokens);
  CHECK(fake.populated == m.total_experts());
  REQUIRE(out.size() == new_tokens);
  REQUIRE(fake.seen.size() == new_tokens);
  const std::uint32_t layers = m.attention_layers();
  std::uint32_t context = 0;
  for (std::size_t s = 0; s < fake.seen.size(); ++s) {
    INFO("step " << s);
    const auto& x = fake.seen[s];
    CHECK(x.context_before == context);
    CHECK(x.new_tokens == (s == 0 ? prompt.size() : 1));
    CHECK(x.samples);
    CHECK(x.attention_layers == layers);
    CHECK(x.owners_ok);
    context += x.new_tokens;
    CHECK(x.kv_pages.size() == (context + 15) / 16 * layers);  // whole blocks, one page per layer each
    if (s > 0) {  // pages never move: a block's pages stay where they were, new blocks are appended
      const auto& before = fake.seen[s - 1].kv_pages;
      CHECK(std::equal(before.begin(), before.end(), x.kv_pages.begin()));
      CHECK(x.fed == out[s - 1].token);  // greedy: the previous step's token is fed
    }
    CHECK(out[s].token == std::int32_t(1000 + s));
    CHECK(out[s].logits == std::vector<float>{float(1000 + s)});
  }
  std::set<PageHandle> distinct(fake.seen.back().kv_pages.begin(), fake.seen.back().kv_pages.end());
  CHECK(distinct.size() == fake.seen.back().kv_pages.size());
  CHECK(fake.seen.back().kv_pages.size() == 3 * layers);  // 21 + 13 fed tokens = 34: three blocks

  // Teacher forcing: each teacher token is fed to the next step; the steps are the teacher's count.
  GenerateFake forced;
  const std::vector<std::int32_t> teacher{5, 6, 7, 8};
  const auto f = generate_greedy(forced, m, g, bytes, prompt, new_tokens, teacher);
  REQUIRE(f.size() == teacher.size());
  for (std::size_t s = 1; s < forced.seen.size(); ++s) CHECK(forced.seen[s].fed == teacher[s - 1]);
  CHECK(f[0].token == 1000);

  // A pool one expert page short is refused before any step.
  GenerateFake small;
  CHECK_THROWS_AS(
      generate_greedy(small, m, g, 3 * m.total_experts() * g.expert_page_bytes - g.expert_page_bytes, prompt,
                      new_tokens),
      std::logic_error);
  CHECK(small.seen.empty());
  CHECK_THROWS_WITH(generate_greedy(small, m, g, bytes, std::span<const std::int32_t>{}, 1),
                    Catch::StartsWith("--prompt"));
}

TEST_CASE(
    "kv_page_limit: runs whose pools differ schedule alike, past the limit the scheduler preempts and "
    "reports no shortfall",
    "[engine][scheduler]") {
  using Backend = ClockBackend<false>;
  const ModelSpec model = find_model("qwen1.5-moe-a2.7b");
  const PageGeometry geometry = page_geometry(model);
  std::vector<Request> trace;
  for (std::uint32_t i = 0; i < 24; ++i)
    trace.push_back(Request{i, 0.0, 40 + 53 * i % 200, 30 + 17 * i % 60});
  // One request of 300 tokens holds ceil(300 / 16) x 24 = 456 KV pages; 1200 hold about three of them.
  auto serve = [&](std::uint64_t extra_expert_pages, std::uint64_t limit) {
    MoePool pool(
        ArenaSpan{nullptr, (model.total_experts() * 3 + extra_expert_pages) * geometry.expert_page_bytes},
        pool_layout<MoePool>(geometry));
    policies::StaticAdjuster adj(ExpertRanker::uniform(model.moe_layers(), model.num_experts),
                                 AdjusterConfig{}, policies::StaticCapacity{});
    SchedulerConfig sc;
    sc.kv_page_limit = limit;
    EngineOptions eo;
    eo.record_timeline = true;
    Engine<MoePool, policies::StaticAdjuster, Backend> engine(
        model, geometry, sc, std::move(pool), std::move(adj), Backend{},
        std::make_unique<ModelRouting>(model.moe_layers(), model.num_experts), trace, eo);
    RunResult r = engine.run();
    REQUIRE_FALSE(engine.drain().has_value());
    return r;
  };
  const std::uint64_t kv_per_expert_page = geometry.expert_page_bytes / geometry.kv_page_bytes;
  const RunResult roomy = serve(400, 0);
  const RunResult a = serve(400, 1200), b = serve(900, 1200);
  CHECK(roomy.preemptions == 0);
  CHECK(a.preemptions > 0);
  CHECK(a.completed_requests == trace.size());
  REQUIRE(a.timeline.size() == b.timeline.size());
  CHECK(a.preemptions == b.preemptions);
  for (std::size_t i = 0; i < a.timeline.size(); ++i) {
    INFO("step " << i);
    CHECK(a.timeline[i].batch_tokens == b.timeline[i].batch_tokens);
    CHECK(a.timeline[i].running == b.timeline[i].running);
    CHECK(a.timeline[i].shortfall_pages == 0);
    CHECK(b.timeline[i].free_kv_pages >= a.timeline[i].free_kv_pages);  // b's pool is larger
  }
  CHECK(400 * kv_per_expert_page > 1200);  // the limit, not the pool, binds in a
}
