// The engine end to end on the simulated GPU: the paper's motivating shape, determinism (same seed ->
// byte-identical JSON), conservation (every request completes, every page back, pool fully merged) for every
// policy and for MLA and hybrid models, and the cost model's basic laws.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ablate.hpp"
#include "amoeba/core/errors.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/scenario.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {
using testing::ablate;
}  // namespace

TEST_CASE("default scenario has the paper's shape: concurrency up / forward steps down", "[engine]") {
  Scenario s;
  s.requests = 400;
  s.policies = {"static", "fixed", "elastic"};
  const auto r = ablate(s);
  for (const RunResult& x : r) CHECK(x.completed_requests == 400);
  CHECK(r[0].peak_concurrency < r[1].peak_concurrency);
  CHECK(r[1].peak_concurrency < r[2].peak_concurrency);
  CHECK(r[0].forward_steps > r[1].forward_steps);
  CHECK(r[1].forward_steps > r[2].forward_steps);
  CHECK(r[0].expert_bytes_h2d == 0);
  CHECK(r[0].expert_hit_rate == 1.0);
  CHECK(r[2].evictions > 0);
  CHECK(r[2].min_resident_experts < 24 * 60);
}

TEST_CASE("same seed gives byte-identical JSON - another seed differs", "[engine][determinism]") {
  Scenario s;
  s.requests = 150;
  s.policies = all_policy_names();
  const std::string a = ablation_json(s, ablate(s));
  const std::string b = ablation_json(s, ablate(s));
  CHECK(a == b);
  const auto j = nlohmann::json::parse(a);
  CHECK(j.at("simulated") == true);
  CHECK(j.at("results").size() == s.policies.size());
  for (const char* k : {"policy", "peak_concurrency", "forward_steps", "completed_requests",
                        "throughput_tok_s", "ttft_ms", "tpot_ms", "expert_bytes_h2d", "expert_hit_rate"})
    CHECK(j["results"][0].contains(k));
  CHECK(j["results"][0]["ttft_ms"].contains("p90"));
  s.seed = 1;
  CHECK(ablation_json(s, ablate(s)) != a);
}

TEST_CASE("conservation: every policy completes every request and returns every page",
          "[engine][conservation]") {
  Scenario s;
  s.requests = 250;
  s.rate = 20;
  for (const std::string& p : all_policy_names()) {
    INFO(p);
    s.policies = {p};
    const auto trace = scenario_requests(s);
    RunOptions o;
    o.check_conservation = true;  // Engine::drain(): throws std::logic_error on a violation
    RunResult r;
    REQUIRE_NOTHROW(r = run_policy(prepare_run(s, p, trace, o)));
    CHECK(r.completed_requests == 250);
    CHECK(r.output_tokens > 0);
  }
}

TEST_CASE("conservation with MLA pages padding and a hybrid model SSM and conv pages",
          "[engine][conservation]") {
  Scenario s;
  s.requests = 120;
  s.rate = 20;
  s.model = "deepseek-v2-lite";
  s.gpu = "rtx4090d";
  s.fixed_offload = 28;  // 36 of 64 experts resident: 16.2 GB of a 24 GB card
  s.expert_offload_limit = 32;
  for (const char* p : {"fixed", "lru", "elastic"}) {
    INFO(p);
    const auto trace = scenario_requests(s);
    REQUIRE_NOTHROW(run_policy(prepare_run(s, p, trace, RunOptions{})));
  }
  s.model = "qwen3-next-80b-a3b";
  s.gpu = "h200";
  s.requests = 60;
  s.fixed_offload = 300;
  s.expert_offload_limit = 320;
  for (const char* p : {"fixed", "elastic"}) {
    INFO(p);
    const auto trace = scenario_requests(s);
    RunResult r;
    REQUIRE_NOTHROW(r = run_policy(prepare_run(s, p, trace, RunOptions{})));
    CHECK(r.completed_requests == 60);
  }
  // Static does not fit: 48 x 512 experts of 6.3 MB are more than an H200 holds.
  CHECK_THROWS_AS(prepare_run(s, "static", scenario_requests(s), RunOptions{}), ConfigError);
}

TEST_CASE("a timeline is recorded per step for `amoeba run`", "[engine]") {
  Scenario s;
  s.requests = 80;
  const auto trace = scenario_requests(s);
  RunOptions o;
  o.record_timeline = true;
  const RunResult r = run_policy(prepare_run(s, "elastic", trace, o));
  REQUIRE(r.timeline.size() >= r.forward_steps);
  std::uint32_t peak = 0;
  for (const TimelineRow& t : r.timeline) peak = std::max(peak, t.running);
  CHECK(peak == r.peak_concurrency);
  // Phases add up: a forward is its compute (attention, MoE, dense, the fixed step overhead) plus its stalls.
  const double overhead_ms = find_cost_model("default").step_overhead_s * 1e3;
  std::uint64_t forwards = 0;
  for (const TimelineRow& t : r.timeline) {
    if (t.running == 0) continue;
    ++forwards;
    CHECK(t.step_ms >= t.attention_ms + t.moe_ms + t.dense_ms + t.stall_ms - 1e-9);
    CHECK(t.step_ms ==
          Approx(t.attention_ms + t.moe_ms + t.dense_ms + t.stall_ms + overhead_ms).epsilon(1e-9));
    CHECK((t.h2d_bytes == 0) == (t.copy_calls == 0));
  }
  CHECK(forwards == r.forward_steps);
  const std::string csv = timeline_csv(r);
  CHECK(csv.rfind("step,time_s,step_ms,running,waiting,batch_tokens,free_kv_pages,free_expert_pages,"
                  "resident_experts",
                  0) == 0);
}

TEST_CASE("unknown policy names are errors listing the known ones", "[engine]") {
  CHECK_THROWS_WITH(find_policy("mru"),
                    Catch::Contains("--policy = mru: unknown policy (known: static, fixed"));
  Scenario s;
  s.policies = {"static", "belady"};
  CHECK_THROWS_WITH(validate_scenario(s), Catch::Contains("belady"));
}

TEST_CASE("scenario config files: fields applied / unknown keys and bad values rejected",
          "[engine][config]") {
  const Scenario s = parse_scenario(R"({"model": "mixtral-8x7b", "workload": {"rate": 3.5, "requests": 7},
      "experts": {"expert_offload_limit": 4}, "predictor": {"kind": "oracle"}})",
                                    "c.json");
  CHECK(s.model == "mixtral-8x7b");
  CHECK(s.rate == 3.5);
  CHECK(s.requests == 7);
  CHECK(s.expert_offload_limit == 4);
  CHECK(s.predictor.kind == PredictorKind::kOracle);
  // The JSON written into ablate's output is itself a valid config.
  const Scenario t = parse_scenario(scenario_to_json(s), "round-trip");
  CHECK(scenario_to_json(t) == scenario_to_json(s));
  CHECK_THROWS_WITH(parse_scenario(R"({"workload": {"rate": -2}})", "c.json"),
                    Catch::Contains("config.workload.rate = -2"));
  CHECK_THROWS_WITH(parse_scenario(R"({"workload": {"rat": 2}})", "c.json"),
                    Catch::Contains("config.workload.rat = 2: is not a known field"));
  CHECK_THROWS_WITH(parse_scenario(R"({"predictor": {"kind": "magic"}})", "c.json"),
                    Catch::Contains("config.predictor.kind = magic"));
  CHECK_THROWS_WITH(parse_scenario(R"({"policies": []})", "c.json"), Catch::Contains("config.policies"));
  CHECK_THROWS_WITH(parse_scenario("{\"model\": ", "c.json"), Catch::Contains("is not valid JSON"));
}
