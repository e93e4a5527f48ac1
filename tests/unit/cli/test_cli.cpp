// The `amoeba` CLI as a user meets it: the exit status and message for bad input (unknown names, bad traces,
// bad configs, impossible memory), no half-written output files, and the JSON/CSV a good run writes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

Outcome amoeba(const TempDir& t, const std::string& args) {
  const std::string cmd =
      std::string(AMOEBA_CLI) + " " + args + " >" + (t / "stdout").string() + " 2>" + (t / "stderr").string();
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

TEST_CASE("named scenarios, GPU sets and expert precision from the command line", "[cli][scenario]") {
  TempDir t;
  const Outcome l = amoeba(t, "scenarios");
  REQUIRE(l.status == 0);
  CHECK_THAT(l.out, Catch::Contains("motivating") && Catch::Contains("fate-ablation") &&
                        Catch::Contains("e2e-qwen3.5-122b-a10b-8x-rtx5090") && Catch::Contains("paper:"));
  // A labelled ablation on 2 simulated GPUs: every label in the table and the JSON, the deployment stated.
  const Outcome o =
      amoeba(t, "ablate --scenario fate-ablation --requests 40 --quiet --json " + (t / "f.json").string());
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("SIMULATED GPU") && Catch::Contains("+paged-kernel") &&
                        Catch::Contains("2 x rtx5090, tensor parallel") && Catch::Contains("per GPU"));
  const std::string j = slurp(t / "f.json");
  CHECK_THAT(
      j, Catch::Contains("\"label\": \"+unified-pool\"") && Catch::Contains("\"moe_kernel\": \"gather\""));
  // Bad names and values exit 2 naming the flag, the value and the rule; nothing is written.
  const Outcome s = amoeba(t, "ablate --scenario nope --json " + (t / "x.json").string());
  CHECK(s.status == 2);
  CHECK_THAT(s.err, Catch::Contains("--scenario = nope") && Catch::Contains("unknown scenario"));
  const Outcome p = amoeba(t, "ablate --expert-precision fp8 --json " + (t / "x.json").string());
  CHECK(p.status == 2);
  CHECK_THAT(p.err, Catch::Contains("--expert-precision = fp8") && Catch::Contains("bf16, int8 or int4"));
  const Outcome k = amoeba(t, "ablate --moe-kernel fast");
  CHECK(k.status == 2);
  CHECK_THAT(k.err, Catch::Contains("--moe-kernel = fast"));
  CHECK_FALSE(fs::exists(t / "x.json"));
}
