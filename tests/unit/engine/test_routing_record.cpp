// Routing records (engine/routing_record.hpp): a run's routing recorded and replayed gives the same run; the
// parser names file, line, field, value and rule for every broken rule; `amoeba rank`'s statistics rank
// experts by what the record routed.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/ranker_json.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/routing_record.hpp"
#include "engine/scenario.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {
const char* kHeader =
    R"({"format": "amoeba.routing", "version": 1, "model": "m", "moe_layers": 2, "experts": 4, "top_k": 2,)"
    R"( "backend": "sim", "routing": "synthetic"})";

std::string record(const std::vector<std::string>& steps) {
  std::string t = std::string(kHeader) + "\n";
  for (const auto& s : steps) t += s + "\n";
  return t;
}
}  // namespace

TEST_CASE("a recorded run replayed gives the same run", "[engine][routing]") {
  Scenario s;
  s.requests = 120;
  s.policies = {"elastic"};
  const auto trace = scenario_requests(s);
  RunSetup setup = prepare_run(s, "elastic", trace, RunOptions{});
  RoutingRecorder rec(RoutingRecordHeader{s.model, setup.model.moe_layers(), setup.model.num_experts,
                                          setup.model.top_k, "sim", "synthetic"});
  setup.options.recorder = &rec;
  const RunResult original = run_policy(setup);
  REQUIRE(rec.steps() == original.forward_steps);

  const RoutingRecord r = parse_routing_record(rec.text(), "rec.jsonl");
  CHECK(r.steps.size() == original.forward_steps);
  CHECK(r.counts.empty());
  CHECK(r.header.moe_layers == 24);
  // Replay through a file, as `--routing FILE` does.
  const std::string path = "routing_record_test.jsonl";
  std::ofstream(path, std::ios::binary) << rec.text();
  Scenario replayed = s;
  replayed.routing_source = path;
  const RunResult again = run_policy(prepare_run(replayed, "elastic", trace, RunOptions{}));
  CHECK(ablation_json(s, {again}) == ablation_json(s, {original}));
  // Another policy takes more steps than the record holds: the replay starts again from its first step.
  const RunResult stat = run_policy(prepare_run(replayed, "static", trace, RunOptions{}));
  CHECK(stat.forward_steps > original.forward_steps);
  CHECK(stat.completed_requests == 120);
  // A record of another model's shape is refused by name.
  Scenario other = replayed;
  other.model = "qwen3-30b-a3b";
  other.gpu = "h200";
  CHECK_THROWS_WITH(prepare_run(other, "elastic", scenario_requests(other), RunOptions{}),
                    Catch::Contains("24 x 60 experts (qwen1.5-moe-a2.7b)") &&
                        Catch::Contains("must be recorded for the model's 48 MoE layers x 128 experts"));
  std::remove(path.c_str());
}

TEST_CASE("routing record parser: every rule named with file, line and field", "[engine][routing]") {
  const RoutingRecord ok =
      parse_routing_record(record({R"({"step": 0, "tokens": 3, "experts": [[0, 2], [3]]})",
                                   R"({"step": 1, "tokens": 1, "experts": [[], [1]]})"}),
                           "r.jsonl");
  CHECK(ok.steps.size() == 2);
  CHECK(ok.steps[0][0] == std::vector<std::uint32_t>{0, 2});
  CHECK(ok.tokens == std::vector<std::uint64_t>{3, 1});
  struct Bad {
    std::string text, message;
  };
  const std::vector<Bad> bad{
      {"", "r.jsonl = (empty): must start with an amoeba.routing header line"},
      {record({}), "r.jsonl = (no steps): must record at least one step"},
      {R"({"format": "other", "version": 1})", "r.jsonl:1.format = \"other\""},
      {record({R"({"step": 1, "tokens": 3, "experts": [[0], [1]]})"}),
       "r.jsonl:2.step = 1: steps must count up"},
      {record({R"({"step": 0, "tokens": 0, "experts": [[0], [1]]})"}), "r.jsonl:2.tokens = 0"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[0]]})"}), "r.jsonl:2.experts = 1 arrays"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[0], [4]]})"}), "r.jsonl:2.experts[1][0] = 4"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[2, 1], [0]]})"}),
       "r.jsonl:2.experts[0][1] = 1: experts must be listed ascending, each once"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[1], [0]], "counts": [[1], [1, 2]]})"}),
       "r.jsonl:2.counts[1] = 2: must have one count per listed expert (1)"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[1], [0]], "counts": [[1], [1]]})",
               R"({"step": 1, "tokens": 2, "experts": [[1], [0]]})"}),
       "r.jsonl:3.counts = (missing): either every step has counts or none has"},
      {record({R"({"step": 0, "tokens": 2, "experts": [[1], [0]], "counts": [[0], [1]]})"}),
       "r.jsonl:2.counts[0][0] = 0"},
      {record({"[1, 2]"}), "r.jsonl:2 = array: each line must be a JSON object"},
  };
  for (const Bad& b : bad) {
    INFO(b.text);
    CHECK_THROWS_WITH(parse_routing_record(b.text, "r.jsonl"), Catch::Contains(b.message));
  }
}

TEST_CASE("rank: expert statistics from a record order experts by what was routed", "[engine][routing]") {
  // Layer 0: expert 2 routed in both steps, 0 once; layer 1: expert 3 twice. With counts, tokens decide.
  const RoutingRecord sets =
      parse_routing_record(record({R"({"step": 0, "tokens": 3, "experts": [[0, 2], [3]]})",
                                   R"({"step": 1, "tokens": 1, "experts": [[2], [1, 3]]})"}),
                           "r.jsonl");
  auto c = routing_counts(sets);
  CHECK(c[0] == std::vector<double>{1, 0, 2, 0});
  CHECK(c[1] == std::vector<double>{0, 1, 0, 2});
  const ExpertRanker a = expert_ranker_from_json_string(expert_stats_json(sets, "r.jsonl"), "stats");
  CHECK(a.expert_at(0, 0) == 2);
  CHECK(a.expert_at(0, 1) == 0);
  CHECK(a.expert_at(1, 0) == 3);
  const RoutingRecord counted = parse_routing_record(
      record({R"({"step": 0, "tokens": 9, "experts": [[0, 2], [3]], "counts": [[8, 1], [9]]})",
              R"({"step": 1, "tokens": 1, "experts": [[2], [1]], "counts": [[1], [1]]})"}),
      "r.jsonl");
  c = routing_counts(counted);
  CHECK(c[0] == std::vector<double>{8, 0, 2, 0});
  const ExpertRanker b = expert_ranker_from_json_string(expert_stats_json(counted, "r.jsonl"), "stats");
  CHECK(b.expert_at(0, 0) == 0);  // the token counts, not the step counts, decide
  const auto j = nlohmann::json::parse(expert_stats_json(counted, "r.jsonl"));
  CHECK(j.at("kind") == "count");
  CHECK(j.at("source").get<std::string>().find("tokens routed") != std::string::npos);
}
