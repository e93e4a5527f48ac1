// The `amoeba` CLI as a user meets it: the exit status and message for bad input (unknown names, bad traces,
// bad configs, impossible memory), no half-written output files, and the JSON/CSV a good run writes. The
// cases tagged [hostile] are classes of malformed input a hostile user tried (no crash, no hang, no lost
// file, no silent wrong number). The binary under test is the build's, or $AMOEBA_CLI when set (to try
// another build).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path dir;
  TempDir() {
    char tmpl[] = "/tmp/amoeba_cli_XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path operator/(const std::string& n) const { return dir / n; }
};

std::string cli_path() {
  const char* env = std::getenv("AMOEBA_CLI");
  return env && *env ? env : AMOEBA_CLI;
}

// Runs `prefix amoeba args` through the shell (prefix: "ulimit -v N;", "timeout 60", ...).
Outcome amoeba(const TempDir& t, const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + " " + cli_path() + " " + args + " >" + (t / "stdout").string() + " 2>" +
                          (t / "stderr").string();
  const int raw = std::system(cmd.c_str());
  Outcome o;
  o.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  o.out = slurp(t / "stdout");
  o.err = slurp(t / "stderr");
  return o;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

std::string nested(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

}  // namespace

TEST_CASE("unknown model / GPU and policy names exit 2 naming the field and value", "[cli]") {
  TempDir t;
  Outcome o = amoeba(t, "ablate --model gpt-5 --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--model = gpt-5: unknown model"));
  o = amoeba(t, "ablate --gpu tpu --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--gpu = tpu: unknown GPU"));
  o = amoeba(t, "ablate --policies static,belady --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err,
             Catch::Contains("--policies = belady: unknown policy (known: static, fixed, lru, lfu, elastic"));
  o = amoeba(t, "run --policy mru");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--policy = mru"));
  o = amoeba(t, "ablate --rate -3 --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--rate = -3"));
}

TEST_CASE("a configuration that cannot fit is refused before start / with the numbers", "[cli]") {
  TempDir t;
  const Outcome o = amoeba(t, "ablate --model qwen3-30b-a3b --gpu rtx4090d --policies static --json " +
                                  (t / "r.json").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("memory = qwen3-30b-a3b on rtx4090d (policy static): does not fit") &&
                        Catch::Contains(" GB"));
  CHECK(o.out.empty());
  CHECK_FALSE(fs::exists(t / "r.json"));  // nothing half-written
}

TEST_CASE("bad trace and config files exit 2 naming file / line / field and rule - no output file", "[cli]") {
  TempDir t;
  write(t / "bad.jsonl",
        "{\"arrival_s\": 0, \"prompt_tokens\": 10, \"output_tokens\": 5}\n"
        "{\"arrival_s\": 1, \"prompt_tokens\": 10, \"output_tokens\": 4000}\n");
  Outcome o = amoeba(t, "ablate --trace " + (t / "bad.jsonl").string() + " --json " +
                            (t / "r.json").string() + " --csv " + (t / "r.csv").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("bad.jsonl:2.output_tokens = 4000"));
  CHECK_FALSE(fs::exists(t / "r.json"));
  CHECK_FALSE(fs::exists(t / "r.csv"));
  o = amoeba(t, "trace inspect " + (t / "bad.jsonl").string());
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("bad.jsonl:2.output_tokens"));
  write(t / "c.json", R"({"workload": {"requests": 0}})");
  o = amoeba(t, "ablate --config " + (t / "c.json").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("config.workload.requests = 0: must be in [1, "));
  o = amoeba(t, "ablate --requests 20 --json " + (t / "r.json").string() + " --csv " +
                    (t / "no_such_dir" / "r.csv").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--csv = ") && Catch::Contains("its directory does not exist"));
  CHECK_FALSE(fs::exists(t / "r.json"));  // refused before the run: not even the good file is written
  o = amoeba(t, "ablate --config " + (t / "missing.json").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--config = ") && Catch::Contains("cannot be opened"));
}

TEST_CASE("a good ablation prints one table / says the GPU is simulated / and writes JSON and CSV", "[cli]") {
  TempDir t;
  const Outcome o = amoeba(t, "ablate --requests 60 --policies static,elastic --json " +
                                  (t / "r.json").string() + " --csv " + (t / "r.csv").string() + " --quiet");
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("SIMULATED GPU"));
  CHECK_THAT(o.out, Catch::Contains("static") && Catch::Contains("elastic"));
  const std::string j = slurp(t / "r.json");
  CHECK_THAT(j, Catch::Contains("\"simulated\": true"));
  CHECK_THAT(j, Catch::Contains("\"peak_concurrency\""));
  const std::string c = slurp(t / "r.csv");
  CHECK(std::count(c.begin(), c.end(), '\n') == 3);
  CHECK_FALSE(fs::exists(t / "r.json.tmp"));
  // Same seed twice: byte-identical JSON.
  REQUIRE(amoeba(t, "ablate --requests 60 --policies static,elastic --json " + (t / "s.json").string() +
                        " --quiet")
              .status == 0);
  CHECK(slurp(t / "s.json") == j);
}

TEST_CASE("trace generate writes a trace that inspect and run accept - run writes a timeline", "[cli]") {
  TempDir t;
  REQUIRE(amoeba(t, "trace generate --requests 40 --rate 5 -o " + (t / "t.jsonl").string()).status == 0);
  Outcome o = amoeba(t, "trace inspect " + (t / "t.jsonl").string());
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("40 requests"));
  o = amoeba(
      t, "run --policy elastic --trace " + (t / "t.jsonl").string() + " --csv " + (t / "tl.csv").string());
  REQUIRE(o.status == 0);
  const std::string tl = slurp(t / "tl.csv");
  CHECK(tl.rfind("step,time_s,step_ms,running,waiting", 0) == 0);
  CHECK(std::count(tl.begin(), tl.end(), '\n') > 40);
  o = amoeba(t, "models");
  CHECK(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("deepseek-v2-lite") && Catch::Contains("22528"));
  o = amoeba(t, "gpus");
  CHECK(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("rtx5090") && Catch::Contains("GPU_NOTES"));
}

TEST_CASE("hostile: deep nesting, huge values and numbers in any input file are refused, not a crash",
          "[cli][hostile]") {
  TempDir t;
  const std::string deep = nested(50000);
  const std::string rule = "nests arrays/objects more than 32 levels deep";
  write(t / "c1.json", R"({"no_such_key": )" + deep + "}");  // under an unknown key: the error quoted it
  write(t / "c2.json", R"({"workload": {"rate": )" + deep + "}}");
  write(t / "t.jsonl", R"({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": )" + deep + "}\n");
  write(t / "m.json", R"({"name": "m", "attention": )" + deep + "}");
  write(t / "g.json", R"({"name": "g", "sources": )" + deep + "}");
  write(t / "k.json", R"({"name": "k", "x": )" + deep + "}");
  for (const std::string& args : std::vector<std::string>{
           "ablate --quiet --config " + (t / "c1.json").string(),
           "ablate --quiet --config " + (t / "c2.json").string(),
           "ablate --quiet --trace " + (t / "t.jsonl").string(), "trace inspect " + (t / "t.jsonl").string(),
           "ablate --quiet --model " + (t / "m.json").string(),
           "ablate --quiet --gpu " + (t / "g.json").string(),
           "ablate --quiet --cost-model " + (t / "k.json").string()}) {
    INFO(args);
    const Outcome o = amoeba(t, args);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::Contains(rule));
  }
  // A huge value in the wrong place is quoted in a few dozen characters, not in full.
  write(t / "c3.json", R"({"no_such_key": [)" + std::string(1 << 20, '1') + "]}");
  write(t / "c4.json", R"({"model": ")" + std::string(1 << 20, 'x') + R"("})");
  for (const char* f : {"c3.json", "c4.json"}) {
    const Outcome o = amoeba(t, "ablate --quiet --config " + (t / f).string());
    CHECK(o.status == 2);
    CHECK(o.err.size() < 1000);
  }
  // Numbers past a double, and integers past 2^64, are refused with the field named.
  write(t / "c5.json", R"({"workload": {"rate": 1e400}})");
  Outcome o = amoeba(t, "ablate --quiet --config " + (t / "c5.json").string());
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("c5.json = byte"));
  write(t / "c6.json", R"({"workload": {"seed": 184467440737095516160}})");
  o = amoeba(t, "ablate --quiet --config " + (t / "c6.json").string());
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("config.workload.seed"));
}

TEST_CASE("hostile: calibration sampling is bounded at the top of the skew range", "[cli][hostile]") {
  TempDir t;
  // Rejection sampling of distinct top-k experts ran for minutes (skew 8: the last pick has ~1e-5 of the
  // mass; 128 experts top-8 worse). `timeout` turns a hang into status 124.
  for (const char* model : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    INFO(model);
    const Outcome o = amoeba(
        t, std::string("ablate --quiet --requests 5 --policies elastic --gpu h200 --skew 8 --model ") + model,
        "timeout 60");
    CHECK(o.status == 0);
  }
}
