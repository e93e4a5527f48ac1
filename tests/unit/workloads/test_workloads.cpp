// Workloads: the ShareGPT-like generator (vLLM's filter, means, arrival process), JSONL traces (round trip
// and every rejection rule) and the synthetic routing model.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/json_fields.hpp"
#include "engine/routing.hpp"
#include "engine/scheduler.hpp"
#include "engine/workload.hpp"

using namespace amoeba;
using namespace amoeba::engine;

TEST_CASE("ShareGPT-like requests obey vLLM's filter and have the expected means", "[workloads]") {
  ShareGptLikeParams p;
  p.requests = 20000;
  const auto t = generate_sharegpt_like(p);
  REQUIRE(t.size() == 20000);
  double sp = 0, so = 0;
  for (const Request& r : t) {
    REQUIRE(r.prompt_tokens >= 4);
    REQUIRE(r.output_tokens >= 4);
    REQUIRE(r.prompt_tokens <= 1024);
    REQUIRE(r.prompt_tokens + r.output_tokens <= 2048);
    sp += r.prompt_tokens;
    so += r.output_tokens;
  }
  CHECK(sp / 20000 == Approx(230).margin(12));
  CHECK(so / 20000 == Approx(200).margin(12));
  for (std::size_t i = 0; i < t.size(); ++i) REQUIRE(t[i].id == i);
}

TEST_CASE("arrivals follow the rate - burstiness < 1 makes gaps more variable", "[workloads]") {
  auto cv = [](double burst) {
    ShareGptLikeParams p;
    p.requests = 20000;
    p.rate = 10;
    p.burstiness = burst;
    const auto t = generate_sharegpt_like(p);
    std::vector<double> gaps;
    for (std::size_t i = 1; i < t.size(); ++i) {
      REQUIRE(t[i].arrival_s >= t[i - 1].arrival_s);
      gaps.push_back(t[i].arrival_s - t[i - 1].arrival_s);
    }
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / double(gaps.size());
    double var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= double(gaps.size());
    CHECK(mean == Approx(0.1).epsilon(0.05));
    return std::sqrt(var) / mean;
  };
  CHECK(cv(1.0) == Approx(1.0).margin(0.05));  // Poisson: exponential gaps
  CHECK(cv(0.25) == Approx(2.0).margin(0.2));  // gamma shape 0.25: CV = 1 / sqrt(shape)
}

TEST_CASE("same seed gives the same trace / another seed another", "[workloads]") {
  ShareGptLikeParams p;
  p.requests = 500;
  const auto a = generate_sharegpt_like(p), b = generate_sharegpt_like(p);
  CHECK(a == b);
  p.seed = 1;
  CHECK(generate_sharegpt_like(p) != a);
}

TEST_CASE("a trace written as JSONL reads back identically", "[workloads]") {
  ShareGptLikeParams p;
  p.requests = 300;
  const auto t = generate_sharegpt_like(p);
  const std::string text = trace_to_jsonl(t);
  CHECK(std::count(text.begin(), text.end(), '\n') == 300);
  CHECK(parse_trace(text, "t.jsonl", {}) == t);
}

namespace {
std::string error_of(const std::string& text, TraceLimits lim = {}) {
  try {
    parse_trace(text, "t.jsonl", lim);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("bad trace lines are rejected naming the line / field / value and rule", "[workloads]") {
  const std::string ok = "{\"arrival_s\": 0.5, \"prompt_tokens\": 10, \"output_tokens\": 5}\n";
  CHECK(parse_trace(ok + "\n  \n" + ok, "t", {}).size() == 2);  // blank lines skipped

  CHECK_THAT(error_of(ok + "{\"arrival_s\": 1, \"prompt_tokens\": 0, \"output_tokens\": 5}"),
             Catch::Contains("t.jsonl:2.prompt_tokens = 0") && Catch::Contains("must be in [1, 2047]"));
  CHECK_THAT(error_of("{\"arrival_s\": -1, \"prompt_tokens\": 3, \"output_tokens\": 5}"),
             Catch::Contains("t.jsonl:1.arrival_s = -1"));
  CHECK_THAT(error_of("{\"arrival_s\": 1, \"prompt_tokens\": 3}"),
             Catch::Contains("t.jsonl:1.output_tokens = (missing): is required"));
  CHECK_THAT(error_of("{\"arrival_s\": 1, \"prompt_tokens\": 3.5, \"output_tokens\": 5}"),
             Catch::Contains("prompt_tokens = 3.5: must be a non-negative integer"));
  CHECK_THAT(error_of("{\"arrival_s\": \"soon\", \"prompt_tokens\": 3, \"output_tokens\": 5}"),
             Catch::Contains("arrival_s = \"soon\": must be a number"));
  CHECK_THAT(error_of("{\"arrival_s\": 1, \"prompt_tokens\": 3, \"output_tokens\": 5, \"x\": 1}"),
             Catch::Contains("t.jsonl:1.x = 1: is not a known field"));
  CHECK_THAT(error_of("{\"arrival_s\": 1, \"prompt_tokens\": 3, "),
             Catch::Contains("t.jsonl:1") && Catch::Contains("is not valid JSON"));
  CHECK_THAT(error_of("[1, 2, 3]"), Catch::Contains("t.jsonl:1 = [1,2,3]: must be a JSON object"));
  CHECK_THAT(error_of("{\"arrival_s\": 2, \"prompt_tokens\": 3, \"output_tokens\": 5}\n"
                      "{\"arrival_s\": 1, \"prompt_tokens\": 3, \"output_tokens\": 5}"),
             Catch::Contains("t.jsonl:2.arrival_s = 1: must not be earlier than the previous request's"));
  CHECK_THAT(
      error_of("{\"arrival_s\": 1, \"prompt_tokens\": 100, \"output_tokens\": 100}", TraceLimits{128}),
      Catch::Contains("output_tokens = 100: prompt_tokens + output_tokens must be <= max_model_len (128)"));
  CHECK_THAT(error_of("\n\n"), Catch::Contains("a trace needs at least one request line"));
  CHECK_THAT(error_of("{\"arrival_s\": 1e999, \"prompt_tokens\": 3, \"output_tokens\": 5}"),
             Catch::Contains("t.jsonl:1"));
}

TEST_CASE("reading a missing trace file names the flag and the path", "[workloads]") {
  CHECK_THROWS_WITH(read_trace("/nonexistent/x.jsonl", {}),
                    Catch::Contains("--trace = /nonexistent/x.jsonl: cannot be opened"));
}

TEST_CASE("routing model: calibration counts / skew and drift", "[workloads][routing]") {
  RoutingParams p;
  p.skew = 1.0;
  RoutingModel m(4, 16, 2, p, 7);
  const auto counts = m.calibration_counts(4000);
  for (std::uint32_t l = 0; l < 4; ++l) {
    double sum = 0, hi = 0, lo = 1e9;
    for (std::uint32_t e = 0; e < 16; ++e) {
      const double c = counts[l * 16 + e];
      sum += c;
      hi = std::max(hi, c);
      lo = std::min(lo, c);
    }
    CHECK(sum == 8000);  // tokens x top_k
    CHECK(hi > 4 * lo);  // skewed
  }
  // Touch frequencies follow the calibration popularity without drift...
  std::vector<std::uint8_t> touched;
  std::vector<double> freq(64, 0);
  for (int s = 0; s < 2000; ++s) {
    m.step(1, touched);
    REQUIRE(touched.size() == 64);
    for (std::size_t i = 0; i < 64; ++i) freq[i] += touched[i];
  }
  const auto hottest = std::max_element(counts.begin(), counts.begin() + 16) - counts.begin();
  const auto coldest = std::min_element(counts.begin(), counts.begin() + 16) - counts.begin();
  CHECK(freq[std::size_t(hottest)] > 3 * freq[std::size_t(coldest)]);
  // ...and a batch of many tokens touches almost every expert.
  m.step(4096, touched);
  CHECK(std::count(touched.begin(), touched.end(), 1) >= 60);
  // Full drift reorders the live ranking: the calibration's hottest expert is no longer reliably hottest.
  p.drift = 1.0;
  RoutingModel d(4, 16, 2, p, 7);
  CHECK(d.calibration_counts(4000) == counts);  // the offline sample does not drift
  std::vector<double> dfreq(64, 0);
  for (int s = 0; s < 2000; ++s) {
    d.step(1, touched);
    for (std::size_t i = 0; i < 64; ++i) dfreq[i] += touched[i];
  }
  CHECK(dfreq != freq);
}

TEST_CASE("routing model: calibration sampling is bounded and exact at the top of the skew range",
          "[workloads][routing][hostile]") {
  // Skew 8, 8 experts, top-4: the fourth distinct pick holds ~2e-5 of the mass, so redrawing until it came up
  // took ~5e4 draws per token. Whatever the sampler does, each expert's share of tokens must match the exact
  // inclusion probability of sequential top-4 sampling without replacement (enumerated here).
  RoutingParams p;
  p.skew = 8;
  const std::uint64_t tokens = 20000;
  std::vector<double> c = RoutingModel(1, 8, 4, p, 3).calibration_counts(tokens);
  std::sort(c.rbegin(), c.rend());
  double w[8], incl[8] = {};
  for (int r = 0; r < 8; ++r) w[r] = std::pow(r + 1, -8.0);
  auto walk = [&](auto&& self, unsigned picked, double prob, int depth) -> void {
    if (depth == 4) {
      for (int r = 0; r < 8; ++r)
        if (picked >> r & 1) incl[r] += prob;
      return;
    }
    double rest = 0;
    for (int r = 0; r < 8; ++r)
      if (!(picked >> r & 1)) rest += w[r];
    for (int r = 0; r < 8; ++r)
      if (!(picked >> r & 1)) self(self, picked | 1u << r, prob * w[r] / rest, depth + 1);
  };
  walk(walk, 0u, 1.0, 0);
  for (int r = 0; r < 8; ++r) CHECK(c[r] / double(tokens) == Approx(incl[r]).margin(0.01));
  CHECK(std::accumulate(c.begin(), c.end(), 0.0) == double(4 * tokens));
  // 128 experts top-8: tail experts fall below the cdf's rounding, where redrawing never ended.
  const auto big = RoutingModel(2, 128, 8, p, 3).calibration_counts(8192);
  CHECK(std::accumulate(big.begin(), big.end(), 0.0) == 2.0 * 8 * 8192);
  CHECK(std::count_if(big.begin(), big.end(), [](double x) { return x > 8192; }) == 0);  // distinct picks
}

TEST_CASE("a finished request gives its page lists' memory back", "[workloads][scheduler]") {
  ModelSpec m;  // 2 layers, expert page 4096 B, KV page 1024 B
  m.name = "tiny";
  m.num_layers = 2;
  m.hidden_size = 64;
  m.vocab_size = 100;
  m.num_heads = m.num_kv_heads = 1;
  m.head_dim = 16;
  m.num_experts = 4;
  m.top_k = 1;
  m.moe_intermediate_size = 32;
  const PageGeometry g = page_geometry(m);
  MoePool pool(ArenaSpan{nullptr, 64 * 4096}, {PageSpec{4096, 0}, PageSpec{1024, 0}});
  Scheduler<MoePool> sched(m, g, SchedulerConfig{256, 8, 2048}, pool);
  Sequence s(Request{0, 0.0, 100, 3});
  sched.add(s);
  for (int step = 0; step < 10 && s.status != SeqStatus::kFinished; ++step) {
    const StepPlan plan = sched.schedule();
    sched.complete(plan, double(step));
  }
  REQUIRE(s.status == SeqStatus::kFinished);
  CHECK(pool.available<KvPage>() > 0);
  CHECK(s.kv_pages.capacity() == 0);  // held ~8 KB per finished request at real sizes
  CHECK(s.state_pages.capacity() == 0);
}

TEST_CASE("JSON text: nesting depth and repeated keys are refused - quoted values are bounded",
          "[workloads][json][hostile]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THROWS_WITH(parse_json_text(deep, "f"), Catch::Contains("f = byte 32: nests arrays/objects"));
  const std::string ok = std::string(32, '[') + std::string(32, ']');
  CHECK_NOTHROW(parse_json_text(ok, "f"));
  CHECK_NOTHROW(
      parse_json_text(R"({"s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[[["})", "f"));  // in strings
  CHECK_THROWS_WITH(parse_json_text(R"({"a": {"b": [1, {"c": 1, "c": 2}]}})", "f"),
                    Catch::Contains("f.a.b[1].c = (given twice)"));
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 1000000; ++i) big.push_back(i);
  CHECK(quote_json(big).size() <= kMaxQuotedChars);
  CHECK(quote_json(nlohmann::json(std::string(1 << 20, 'x'))).size() <= kMaxQuotedChars);
  CHECK(quote_text("a\x1b[2Jb") == "a\\x1b[2Jb");  // no terminal escape reaches the screen
  CHECK(quote_text(std::string(1000, 'y')).size() == kMaxQuotedChars);
  try {
    (void)parse_json_text(R"({"x": 1e400})", "f");
    FAIL("a number past a double parsed");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.value(), Catch::StartsWith("byte "));
  }
}

TEST_CASE("arrivals stay within 1e9 s and traces within their limits", "[workloads][hostile]") {
  ShareGptLikeParams p;
  p.rate = 1e-6;  // the slowest accepted rate: ~1e6 s between arrivals
  p.requests = 100;
  const auto t = generate_sharegpt_like(p);
  CHECK(t.back().arrival_s > 1e7);
  CHECK(t.back().arrival_s <= kMaxArrivalS);
  p.requests = 5000;  // would reach ~5e9 s, where a double cannot keep microseconds
  CHECK_THROWS_WITH(generate_sharegpt_like(p), Catch::Contains("--rate = ") && Catch::Contains("1e9 s"));
  const std::string two =
      "{\"arrival_s\": 0, \"prompt_tokens\": 1, \"output_tokens\": 1}\n"
      "{\"arrival_s\": 1, \"prompt_tokens\": 1, \"output_tokens\": 1}\n";
  CHECK_THROWS_WITH(parse_trace(two, "t", TraceLimits{2, 1}),
                    Catch::Contains("t = line 2: holds more than 1"));
  CHECK_THROWS_WITH(parse_trace(two, "t", TraceLimits{1, 10}),
                    Catch::Contains("max_model_len = 1: must be at least 2"));
  CHECK(parse_trace(two, "t", TraceLimits{2, 2}).size() == 2);
}

TEST_CASE("predictors: oracle fetches exactly the needed offloaded experts", "[workloads][routing]") {
  const std::uint8_t touched[6] = {1, 1, 0, 1, 0, 0}, resident[6] = {1, 0, 0, 0, 0, 1};
  std::uint8_t out[6];
  Rng rng(1);
  predict_layer({PredictorKind::kOracle, 0}, touched, resident, 6, rng, out);
  CHECK(std::vector<int>(out, out + 6) == std::vector<int>{0, 1, 0, 1, 0, 0});
  predict_layer({PredictorKind::kNone, 1}, touched, resident, 6, rng, out);
  CHECK(std::count(out, out + 6, 1) == 0);
  predict_layer({PredictorKind::kCrossLayer, 0.0}, touched, resident, 6, rng, out);  // always wrong
  CHECK(out[1] == 0);
  CHECK(out[3] == 0);
  CHECK(std::count(out, out + 6, 1) == 2);  // two wasted predictions among non-needed offloaded experts
  CHECK_THROWS_WITH(predictor_from_string("psychic"), Catch::Contains("predictor = psychic"));
}
