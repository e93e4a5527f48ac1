// ExpertRanker: ranking from in-memory statistics, CSV and JSON files, and errors that name field/value/rule.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/expert/ranker_json.hpp"

using amoeba::ConfigError;
using amoeba::ExpertRanker;

namespace {
// Runs f, which must throw ConfigError; returns it.
template <class F>
ConfigError config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return ConfigError("", "", "");
}
}  // namespace

TEST_CASE("ranker: per-layer ranking by probability, ties by expert id", "[ranker]") {
  const auto r = ExpertRanker::from_probabilities({{0.25, 0.25, 0.35, 0.15}, {0.05, 0.5, 0.15, 0.3}});
  CHECK(r.layers() == 2);
  CHECK(r.experts_per_layer() == 4);
  CHECK(std::vector<std::uint32_t>(r.ranking(0).begin(), r.ranking(0).end()) ==
        std::vector<std::uint32_t>{2, 0, 1, 3});
  CHECK(std::vector<std::uint32_t>(r.ranking(1).begin(), r.ranking(1).end()) ==
        std::vector<std::uint32_t>{1, 3, 2, 0});
  for (std::uint32_t l = 0; l < 2; ++l)
    for (std::uint32_t k = 0; k < 4; ++k) CHECK(r.rank_of(l, r.expert_at(l, k)) == k);
  CHECK(r.probability(1, 3) == 0.3);
}

TEST_CASE("ranker: builder turns counts into per-layer shares", "[ranker]") {
  ExpertRanker::Builder b(2, 3);
  const std::uint32_t routed[] = {2, 1};
  b.add_routing(0, routed).add_count(0, 2, 2).add_count(1, 0, 5);
  const auto r = b.build();
  CHECK(r.probability(0, 2) == Approx(0.75));
  CHECK(r.probability(0, 1) == Approx(0.25));
  CHECK(r.probability(0, 0) == 0.0);
  CHECK(r.probability(1, 0) == 1.0);
  CHECK(r.expert_at(0, 0) == 2);
  CHECK(config_error_of([&] { ExpertRanker::Builder(2, 3).add_count(2, 0); }).field() == "builder.layer");
  CHECK(config_error_of([&] {
          ExpertRanker::Builder(2, 3).add_count(0, 0).set_probability(0, 1, 0.5);
        }).rule() == "cannot mix counts and probabilities");
}

TEST_CASE("ranker: CSV with probabilities and with counts", "[ranker][csv]") {
  const auto r = ExpertRanker::from_csv_string(
      "# sample of 1000 tokens\n"
      "layer,expert,probability\n"
      "0,0,0.1\n0,1,0.6\r\n0,2,0.3\n"
      "\n"
      "1,2,0.9\n1,0,0.05\n1,1,0.05\n",
      "s.csv");
  CHECK(r.layers() == 2);
  CHECK(r.experts_per_layer() == 3);
  CHECK(r.expert_at(0, 0) == 1);
  CHECK(r.expert_at(0, 2) == 0);
  CHECK(r.expert_at(1, 0) == 2);
  CHECK(r.expert_at(1, 1) == 0);  // tie with expert 1: lower id first
  const auto c = ExpertRanker::from_csv_string("layer,expert,count\n0,0,1\n0,1,3\n", "c.csv");
  CHECK(c.probability(0, 1) == Approx(0.75));
}

TEST_CASE("ranker: bad CSV names the field, the value and the rule", "[ranker][csv]") {
  auto err = [](const std::string& text) {
    return config_error_of([&] { ExpertRanker::from_csv_string(text, "s.csv"); });
  };
  auto e = err("layer,expert,probability\n0,0,0.5\n0,1,1.5\n");
  CHECK(e.field() == "s.csv:3.probability");
  CHECK(e.value() == "1.5");
  CHECK(e.rule() == "must be a finite number in [0, 1]");
  e = err("layer,expert,probability\n0,0,-0.1\n");
  CHECK(e.field() == "s.csv:2.probability");
  e = err("layer,expert,probability\n0,0,nan\n");
  CHECK(e.field() == "s.csv:2.probability");
  e = err("layer,expert,probability\n0,0,abc\n");
  CHECK(e.rule() == "must be a number");
  e = err("layer,expert,prob\n");
  CHECK(e.field() == "s.csv:1.header");
  e = err("# nothing\n");
  CHECK(e.field() == "s.csv.header");
  e = err("layer,expert,count\n0,0,2.5\n");
  CHECK(e.field() == "s.csv:2.count");
  CHECK(e.rule() == "must be a non-negative decimal integer");
  e = err("layer,expert,count\n0,x,2\n");
  CHECK(e.field() == "s.csv:2.expert");
  e = err("layer,expert,count\n0,0,2,4\n");
  CHECK(e.field() == "s.csv:2.columns");
  e = err("layer,expert,probability\n0,0,0.5\n0,1,0.5\n0,1,0.2\n");
  CHECK(e.field() == "s.csv:4.expert");
  CHECK(e.value() == "(0, 1)");
  CHECK(e.rule() == "duplicate row; first given on line 3");
  e = err("layer,expert,probability\n0,0,0.5\n0,1,0.5\n1,0,0.2\n");
  CHECK(e.field() == "s.csv.rows");
  CHECK(e.value() == "(1, 1)");
  e = err("layer,expert,probability\n");
  CHECK(e.field() == "s.csv.rows");
  e = err("layer,expert,probability\n16777215,16777215,0.5\n");
  CHECK(e.field() == "s.csv.rows");
  e = err("layer,expert,probability\n16777216,0,0.5\n");
  CHECK(e.field() == "s.csv:2.layer");
  CHECK(std::string(e.what()) == "s.csv:2.layer = 16777216: must not exceed 16777215");
}

TEST_CASE("ranker: JSON statistics", "[ranker][json]") {
  const auto r = amoeba::expert_ranker_from_json_string(
      R"({"format": "amoeba.expert_stats", "version": 1, "kind": "probability", "layers": 2, "experts": 3,
          "values": [[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]})",
      "s.json");
  CHECK(r.expert_at(0, 0) == 1);
  CHECK(r.expert_at(1, 2) == 1);
  const auto c = amoeba::expert_ranker_from_json_string(
      R"({"format": "amoeba.expert_stats", "version": 1, "kind": "count", "values": [[1, 3]]})");
  CHECK(c.probability(0, 1) == Approx(0.75));

  const std::string path = "unit_ranker_stats.json";
  {
    std::ofstream f(path);
    f << R"({"format": "amoeba.expert_stats", "version": 1, "kind": "count", "values": [[7, 1, 2]]})";
  }
  CHECK(amoeba::expert_ranker_from_json_file(path).expert_at(0, 2) == 1);
  std::remove(path.c_str());
}

TEST_CASE("ranker: bad JSON names the field, the value and the rule", "[ranker][json]") {
  auto err = [](const std::string& text) {
    return config_error_of([&] { amoeba::expert_ranker_from_json_string(text, "s.json"); });
  };
  const std::string head = R"({"format": "amoeba.expert_stats", "version": 1, "kind": "probability", )";
  auto e = err(head + R"("values": [[0.2, 0.5], [0.6, 1.1]]})");
  CHECK(e.field() == "s.json.values[1][1]");
  CHECK(e.value() == "1.1");
  CHECK(e.rule() == "must be a number in [0, 1]");
  e = err(head + R"("values": [[0.2, 0.5], [0.6]]})");
  CHECK(e.field() == "s.json.values[1]");
  e = err(head + R"("values": [[0.2, "x"]]})");
  CHECK(e.field() == "s.json.values[0][1]");
  e = err(head + R"("layers": 3, "values": [[0.2, 0.5]]})");
  CHECK(e.field() == "s.json.layers");
  e = err(head + R"("values": []})");
  CHECK(e.field() == "s.json.values");
  e = err(R"({"format": "amoeba.expert_stats", "version": 2, "kind": "count", "values": [[1]]})");
  CHECK(e.field() == "s.json.version");
  e = err(R"({"format": "other", "version": 1, "kind": "count", "values": [[1]]})");
  CHECK(e.field() == "s.json.format");
  e = err(R"({"format": "amoeba.expert_stats", "version": 1, "kind": "count", "values": [[-1]]})");
  CHECK(e.field() == "s.json.values[0][0]");
  e = err(R"({"format": "amoeba.expert_stats", "version": 1, "values": [[1]]})");
  CHECK(e.field() == "s.json.kind");
  CHECK(e.value() == "(missing)");
  e = err(R"({"format": )");
  CHECK(e.field() == "s.json");
  CHECK(e.rule() == "must be valid JSON");
}
