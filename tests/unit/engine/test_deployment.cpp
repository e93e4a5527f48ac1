// Deployment parameters of the simulator (all simulated): tensor parallelism over N GPUs of a profile, expert
// precision (bf16/int8/int4 pages and PCIe bytes), the MoE kernel (paged or gather), and the named scenarios.
// One GPU in bf16 must be exactly today's engine; N GPUs must conserve requests, tokens and pages; int4 must
// move a quarter of bf16's expert bytes plus its scales when nothing else changes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ablate.hpp"
#include "amoeba/core/errors.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/routing_source.hpp"
#include "engine/scenario.hpp"
#include "engine/sim_backend.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

using testing::ablate;

std::string results_json(const Scenario& s) {
  return nlohmann::json::parse(ablation_json(s, ablate(s))).at("results").dump();
}

struct TempFile {
  std::filesystem::path path;
  TempFile(const std::string& name, const std::string& text)
      : path(std::filesystem::temp_directory_path() / name) {
    std::ofstream(path) << text;
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

}  // namespace

TEST_CASE("one GPU in bf16 is the catalog model and today's engine, interconnect or not", "[engine][tp]") {
  for (const ModelSpec& m : model_catalog()) {
    INFO(m.name);
    const ModelSpec s = shard_model(m, 1, ExpertPrecision::kBf16, "gpus");
    CHECK(s.expert_page_bytes() == m.expert_page_bytes());
    CHECK(s.expert_transfer_bytes() == m.expert_bytes());
    CHECK(s.kv_bytes_per_token() == m.kv_bytes_per_token());
    CHECK(s.non_expert_params() == m.non_expert_params());
    CHECK(s.logits_vocab() == m.vocab_size);
    CHECK(page_geometry(s).expert_padding_bytes() == 0);
  }
  // A one-GPU profile that names an interconnect charges nothing for it: every result is byte-identical.
  const TempFile gpu("amoeba_tp1_rtx5090.json",
                     R"({"name": "rtx5090-tp1", "base": "rtx5090", "gpus": 1,
                         "interconnect": {"description": "unused", "allreduce_bus_bandwidth_gbs": 1,
                                          "allreduce_latency_us": 1000}})");
  Scenario s;
  s.requests = 150;
  s.policies = all_policy_names();
  const std::string plain = results_json(s);
  s.gpu = gpu.path.string();
  CHECK(results_json(s) == plain);
}

TEST_CASE("tensor parallelism: each GPU holds 1/N of every expert, of the heads and its own KV share",
          "[engine][tp]") {
  const ModelSpec q = find_model("qwen3-30b-a3b");
  const ModelSpec s8 = shard_model(q, 8, ExpertPrecision::kBf16, "gpus");
  CHECK(s8.expert_page_bytes() * 8 == q.expert_page_bytes());
  CHECK(s8.routed_expert_params() * 8 == q.routed_expert_params());
  CHECK(s8.num_heads * 8 == q.num_heads);
  // 4 KV heads over 8 GPUs: one per GPU, each replicated twice (vLLM): a quarter of the KV, not an eighth.
  CHECK(s8.num_kv_heads == 1);
  CHECK(s8.kv_bytes_per_token() * 4 == q.kv_bytes_per_token());
  const ModelSpec s2 = shard_model(q, 2, ExpertPrecision::kBf16, "gpus");
  CHECK(s2.kv_bytes_per_token() * 2 == q.kv_bytes_per_token());
  // Hybrid: linear-attention heads split, so each GPU holds 1/N of every request's recurrent state.
  const ModelSpec h = find_model("qwen3.5-35b-a3b");
  const ModelSpec h8 = shard_model(h, 8, ExpertPrecision::kBf16, "gpus");
  CHECK(h8.ssm_state_bytes() * 8 == h.ssm_state_bytes());
  CHECK(h8.expert_page_bytes() * 8 == h.expert_page_bytes());
  CHECK(h8.logits_vocab() == h.vocab_size);
  CHECK(h8.vocab_size * 8 == h.vocab_size);
  // A dimension that does not split is refused, naming the field, the value and the rule.
  CHECK_THROWS_WITH(shard_model(find_model("qwen1.5-moe-a2.7b"), 3, ExpertPrecision::kBf16, "gpu x.gpus"),
                    Catch::Contains("gpu x.gpus = 3") && Catch::Contains("num_heads = 16") &&
                        Catch::Contains("multiple of the GPU count"));
  CHECK_THROWS_AS(shard_model(q, 0, ExpertPrecision::kBf16, "gpus"), ConfigError);
}

TEST_CASE("two all-reduces per layer over the profile's interconnect, only with several GPUs",
          "[engine][tp][sim]") {
  const GpuProfile g8 = find_gpu("8x-rtx5090");
  REQUIRE(g8.gpus == 8);
  REQUIRE(g8.base == "rtx5090");
  const double bytes = 100.0 * 2048 * 2;
  CHECK(g8.allreduce_time(bytes) ==
        Approx(g8.allreduce_latency_s + 2.0 * 7.0 / 8.0 * bytes / g8.allreduce_bus_bandwidth));
  CHECK(find_gpu("rtx5090").allreduce_time(bytes) == 0);

  // One decode step, every expert resident: the step on 8 GPUs minus the same step with a free interconnect
  // is exactly 2 all-reduces per layer.
  const ModelSpec m = shard_model(find_model("qwen3-30b-a3b"), 8, ExpertPrecision::kBf16, "gpus");
  GpuProfile free_link = g8;
  free_link.allreduce_latency_s = 0;
  free_link.allreduce_bus_bandwidth = 1e30;
  const CostModelParams c = find_cost_model("default");
  const PredictorParams none{PredictorKind::kNone, 0};
  SimBackend with(m, g8, c, none, 0, 0), without(m, free_link, c, none, 0, 0);
  StepBatch batch;
  for (std::uint32_t i = 0; i < 64; ++i) batch.seqs.push_back(SequenceStep{i, 300, 1, true, {}, {}});
  batch.tokens = batch.sampling_seqs = 64;
  const ExpertRanker uniform = ExpertRanker::uniform(m.moe_layers(), m.num_experts);
  const PageGeometry geo = page_geometry(m);
  MoePool pool(ArenaSpan{nullptr, (m.total_experts() * 3 + 8) * geo.expert_page_bytes},
               {PageSpec{geo.expert_page_bytes, 0}, PageSpec{geo.kv_page_bytes, 0}});
  ResidencyTable resident(uniform);
  for (std::uint32_t l = 0; l < m.moe_layers(); ++l)
    for (std::uint32_t e = 0; e < m.num_experts; ++e) {
      ExpertPages p;
      for (ExpertMatrix x : kExpertMatrices) p[x] = *pool.allocate<ExpertPage>(expert_owner({l, e}, x));
      REQUIRE(resident.mark_resident({l, e}, p));
    }
  std::vector<std::uint32_t> some(16);
  std::iota(some.begin(), some.end(), 0u);
  const std::vector<RecordedStep> steps(1, RecordedStep(m.moe_layers(), some));
  auto step = [&](SimBackend& b) {
    RecordedRouting routing(m.moe_layers(), m.num_experts, m.top_k, steps);
    routing.begin_step(batch);
    StepResult r;
    REQUIRE_FALSE(b.forward(StepInput<MoePool>{batch, ChangeList{}, resident, pool, routing}, r));
    return r;
  };
  const StepResult a = step(with), b = step(without);
  CHECK(a.h2d_bytes == 0);
  CHECK(a.step_s - b.step_s ==
        Approx(2.0 * m.num_layers * g8.allreduce_time(64.0 * m.hidden_size * 2)).epsilon(1e-9));
  CHECK(a.compute_s - b.compute_s == Approx(a.step_s - b.step_s).epsilon(1e-9));  // on the compute stream
  CHECK(a.moe_s == b.moe_s);
  CHECK(a.attention_s == b.attention_s);
  // The all-reduces' own time, reported apart (timeline column allreduce_ms).
  CHECK(a.allreduce_s ==
        Approx(2.0 * m.num_layers * g8.allreduce_time(64.0 * m.hidden_size * 2)).epsilon(1e-9));
  CHECK(a.allreduce_s - b.allreduce_s == Approx(a.step_s - b.step_s).epsilon(1e-9));
}

TEST_CASE("a run on N GPUs conserves requests, tokens and pages for every policy",
          "[engine][tp][conservation]") {
  struct Case {
    const char* model;
    const char* gpu;
    ExpertPrecision precision;
    std::uint32_t limit;
  };
  for (const Case& k : {Case{"qwen3-30b-a3b", "2x-rtx4090d", ExpertPrecision::kInt8, 32},
                        Case{"qwen3.5-35b-a3b", "8x-rtx5090", ExpertPrecision::kInt4, 64}}) {
    Scenario s;
    s.model = k.model;
    s.gpu = k.gpu;
    s.expert_precision = k.precision;
    s.expert_offload_limit = k.limit;
    s.requests = 60;
    s.rate = 40;
    const auto trace = scenario_requests(s);
    std::uint64_t tokens = 0;
    for (const Request& r : trace) tokens += r.output_tokens;
    for (const std::string& p : all_policy_names()) {
      INFO(k.model << " on " << k.gpu << ", " << p);
      RunOptions o;
      o.check_conservation = true;  // Engine::drain(): every page back, pool fully merged, invariants hold
      RunResult r;
      REQUIRE_NOTHROW(r = run_policy(prepare_run(s, p, trace, o)));
      CHECK(r.completed_requests == trace.size());
      CHECK(r.output_tokens == tokens);
    }
  }
  // Under memory pressure on 8 GPUs (122B in bf16, ~1 GB of KV per GPU) the elastic policy evicts and
  // restores, and still returns every page.
  Scenario s = apply_named_scenario(find_scenario("e2e-qwen3.5-122b-a10b-8x-rtx5090"));
  s.requests = 120;
  s.rate = 40;
  const auto trace = scenario_requests(s);
  RunOptions o;
  o.check_conservation = true;
  RunResult r;
  REQUIRE_NOTHROW(r = run_policy(prepare_run(s, "elastic", trace, o)));
  CHECK(r.completed_requests == 120);
  CHECK(r.evictions > 0);
}

TEST_CASE("int4 experts move a quarter of bf16's expert bytes plus their scales", "[engine][precision]") {
  const ModelSpec q = find_model("qwen1.5-moe-a2.7b");
  const ModelSpec q8 = shard_model(q, 1, ExpertPrecision::kInt8, "p");
  const ModelSpec q4 = shard_model(q, 1, ExpertPrecision::kInt4, "p");
  // bf16 scales, one per 128 values along K: W1/W3 1408 x 16 groups, W2 2048 x 11 groups -> 22528 scales.
  const std::uint64_t scales = 2 * std::max<std::uint64_t>(1408 * 16, 2048 * 11);
  CHECK(q4.expert_scale_bytes() == scales);
  CHECK(q4.expert_page_payload_bytes() == q.expert_page_bytes() / 4 + scales);
  CHECK(q8.expert_page_payload_bytes() == q.expert_page_bytes() / 2 + scales);
  // Pages nest: KV pages divide the (possibly padded) expert page.
  for (const ModelSpec* m : {&q8, &q4}) {
    const PageGeometry g = page_geometry(*m);
    CHECK(g.expert_page_bytes % g.kv_page_bytes == 0);
    CHECK(g.expert_payload_bytes == m->expert_page_payload_bytes());
  }

  // The same scenario in bf16 and int4 where nothing but the bytes changes: every request arrives at once,
  // an H200 holds all of them (no shortfall, no preemption), and the fixed cache offloads the same 6 experts
  // per layer in both. Same steps, same copies; int4's bytes are bf16's x (1/4 + scales / bf16 page).
  Scenario s;
  s.gpu = "h200";
  s.rate = 1e6;
  s.requests = 200;
  s.policies = {"fixed"};
  const auto trace = scenario_requests(s);
  const RunResult r16 = run_policy(prepare_run(s, "fixed", trace, RunOptions{}));
  s.expert_precision = ExpertPrecision::kInt4;
  const RunResult r4 = run_policy(prepare_run(s, "fixed", trace, RunOptions{}));
  CHECK(r4.preemptions == 0);
  CHECK(r4.forward_steps == r16.forward_steps);
  CHECK(r4.peak_concurrency == r16.peak_concurrency);
  CHECK(r4.expert_hit_rate == r16.expert_hit_rate);
  REQUIRE(r16.expert_bytes_h2d > 0);
  REQUIRE(r16.expert_bytes_h2d % q.expert_bytes() == 0);
  const std::uint64_t experts_moved = r16.expert_bytes_h2d / q.expert_bytes();
  CHECK(r4.expert_bytes_h2d == experts_moved * q4.expert_transfer_bytes());
  CHECK(r4.expert_bytes_h2d == experts_moved * (q.expert_bytes() / 4 + 3 * scales));
  // Fewer bytes over PCIe: the int4 run takes less time.
  CHECK(r4.makespan_s < r16.makespan_s);
}

TEST_CASE("the gather kernel copies each routed expert before the MoE, the paged kernel does not",
          "[engine][sim]") {
  const ModelSpec m = find_model("qwen3-30b-a3b");
  const GpuProfile g = find_gpu("rtx5090");
  const CostModelParams c = find_cost_model("default");
  const PredictorParams none{PredictorKind::kNone, 0};
  SimBackend paged(m, g, c, none, 0, 0, MoeKernel::kPaged), gather(m, g, c, none, 0, 0, MoeKernel::kGather);
  CHECK(paged.gather_time(100) == 0);
  CHECK(gather.gather_time(0) == 0);
  CHECK(gather.gather_time(100) ==
        Approx(2.0 * 100 * double(m.expert_transfer_bytes()) / (g.hbm_bandwidth * c.dense_memory_efficiency) +
               c.per_layer_overhead_s));
  // Prefill touches every expert: the gather costs more per layer there than in a small decode step.
  CHECK(gather.gather_time(128) > gather.gather_time(16));
}

TEST_CASE("named scenarios: every one plans for every run it names / motivating is the default",
          "[engine][scenario]") {
  REQUIRE(scenario_catalog().size() >= 7);
  for (const NamedScenario& n : scenario_catalog()) {
    INFO(n.name);
    Scenario s = apply_named_scenario(n);
    CHECK(s.name == n.name);
    if (s.policies.empty() && s.runs.empty()) s.policies = all_policy_names();
    REQUIRE_NOTHROW(validate_scenario(s));
    const auto trace = scenario_requests(s);
    for (const RunVariant& v : scenario_runs(s)) {
      INFO(v.label);
      CHECK_NOTHROW(prepare_run(s, v, trace, RunOptions{}));
    }
  }
  Scenario m = apply_named_scenario(find_scenario("motivating"));
  m.name.clear();
  CHECK(scenario_to_json(m) == scenario_to_json(Scenario{}));
  CHECK_THROWS_WITH(find_scenario("nope"),
                    Catch::Contains("--scenario = nope") && Catch::Contains("motivating"));
  // Labelled runs: labels must be unique, policies known, kernels paged or gather.
  CHECK_THROWS_WITH(
      parse_scenario(R"({"runs": [{"label": "a", "policy": "fixed"}, {"label": "a", "policy": "static"}]})",
                     "c"),
      Catch::Contains("config.runs[1].label = a") && Catch::Contains("unique"));
  CHECK_THROWS_WITH(
      parse_scenario(R"({"runs": [{"policy": "fixed", "moe_kernel": "fast"}]})", "c"),
      Catch::Contains("config.runs[0].moe_kernel = fast") && Catch::Contains("paged or gather"));
  CHECK_THROWS_WITH(
      parse_scenario(R"({"expert_precision": "fp8"})", "c"),
      Catch::Contains("config.expert_precision = fp8") && Catch::Contains("bf16, int8 or int4"));
  Scenario bad = parse_scenario(R"({"runs": [{"label": "x", "policy": "nope"}]})", "c");
  CHECK_THROWS_WITH(validate_scenario(bad), Catch::Contains("config.runs (x).policy = nope"));
}

TEST_CASE("multi-GPU profiles: a base, a count and an interconnect, each checked", "[catalog][tp]") {
  CHECK_THROWS_WITH(parse_gpu(R"({"name": "x", "base": "nope", "gpus": 2})", "g"),
                    Catch::Contains("g.base = nope") && Catch::Contains("rtx5090"));
  CHECK_THROWS_WITH(parse_gpu(R"({"name": "x", "base": "rtx5090", "gpus": 2})", "g"),
                    Catch::Contains("g.interconnect") && Catch::Contains("gpus > 1"));
  CHECK_THROWS_WITH(parse_gpu(R"({"name": "x", "base": "rtx5090", "gpus": 65,
                                  "interconnect": {"allreduce_bus_bandwidth_gbs": 10,
                                                   "allreduce_latency_us": 5}})",
                              "g"),
                    Catch::Contains("g.gpus = 65"));
  const GpuProfile d = find_gpu("2x-rtx4090d");
  const GpuProfile one = find_gpu("rtx4090d");
  CHECK(d.memory_bytes == one.memory_bytes);
  CHECK(d.h2d_bandwidth == one.h2d_bandwidth);
  CHECK(d.gpus == 2);
  for (const GpuProfile& g : gpu_catalog())
    if (g.gpus > 1) {
      INFO(g.name);
      CHECK(g.allreduce_bus_bandwidth > 0);
      bool sourced = false;
      for (const auto& [field, src] : g.sources) sourced |= field == "allreduce_bus_bandwidth_gbs";
      CHECK(sourced);
    }
}
