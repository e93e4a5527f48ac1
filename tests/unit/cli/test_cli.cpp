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
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

namespace fs = std::filesystem;

namespace {
// Built for the sanitizer preset (slower, and unable to run under an address-space limit).
#ifdef AMOEBA_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
}  // namespace

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

// `err` without the progress lines of runs of `total` requests whose lines start with `prefix` (taken as
// text, so ablate's "[2/6] simulating fixed: " works too), and without the closing "done in X s": what a run
// printed to stderr besides its progress (Progress in cli/main.cpp).
std::string without_progress(const std::string& err, const std::string& prefix, int total) {
  const std::regex progress("[0-9]+/" + std::to_string(total) +
                            " requests, [0-9]+ steps, [0-9.]+ s(, ~[0-9]+ s left)?");
  const std::regex done("done in [0-9.]+ s");
  std::istringstream in(err);
  std::string rest;
  for (std::string line; std::getline(in, line);) {
    const bool is_progress =
        line.starts_with(prefix) && std::regex_match(line.substr(prefix.size()), progress);
    if (!is_progress && !std::regex_match(line, done)) rest += line + "\n";
  }
  return rest;
}

std::string nested(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

}  // namespace

TEST_CASE("help names the policies and the built-in cost models that the refusals list", "[cli]") {
  TempDir t;
  const std::string policies = "static, fixed, lru, lfu, elastic, elastic-lru";
  const std::string profiles = "default, h200-qwen1.5, h200-qwen3";
  // The same lists as the errors for an unknown name (the dispatch table, the embedded profiles).
  Outcome o = amoeba(t, "run --policy mru");
  CHECK_THAT(o.err, Catch::Contains("unknown policy (known: " + policies + ")"));
  o = amoeba(t, "run --cost-model nope --requests 2 --quiet");
  CHECK_THAT(o.err, Catch::Contains("unknown cost model (built in: " + profiles + "; or a .json path)"));
  for (const char* cmd : {"run", "validate"}) {
    o = amoeba(t, std::string(cmd) + " --help");
    CHECK(o.status == 0);
    CHECK_THAT(o.out, Catch::Contains("policy name: " + policies + " (default elastic)"));
  }
  o = amoeba(t, "ablate --help");
  CHECK_THAT(o.out, Catch::Contains("comma-separated policies of " + policies + " (default: all)"));
  for (const char* cmd : {"run", "ablate", "validate", "calibrate"}) {
    o = amoeba(t, std::string(cmd) + " --help");
    CHECK_THAT(o.out, Catch::Contains(profiles + ", or a .json file"));
  }
}

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

TEST_CASE("hostile: outputs replace only regular files, are checked before the run, never name an input",
          "[cli][hostile]") {
  TempDir t;
  const std::string small = "ablate --quiet --requests 20 --policies static ";
  // A FIFO stays a FIFO and its reader gets the JSON (a rename would have replaced the node, as it did
  // /dev/null when run as root).
  const fs::path fifo = t / "fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  Outcome o = amoeba(t, small + "--json " + fifo.string());
  CHECK(o.status == 0);
  struct stat st {};
  REQUIRE(stat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  char buf[256] = {};
  CHECK(read(reader, buf, sizeof buf - 1) > 0);
  CHECK_THAT(std::string(buf), Catch::Contains("\"simulated\": true"));
  close(reader);
  // A FIFO nobody reads is refused at once instead of blocking the run.
  o = amoeba(t, small + "--json " + fifo.string(), "timeout 60");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("is a FIFO that no process is reading"));
  // A link to a regular file stays a link; the file behind it gets the output.
  write(t / "real.json", "old");
  fs::create_symlink(t / "real.json", t / "link.json");
  o = amoeba(t, small + "--json " + (t / "link.json").string());
  CHECK(o.status == 0);
  CHECK(fs::is_symlink(t / "link.json"));
  CHECK_THAT(slurp(t / "real.json"), Catch::Contains("\"simulated\": true"));
  // A user's own FILE.tmp is not used as the temporary file.
  write(t / "r.json.tmp", "mine");
  REQUIRE(amoeba(t, small + "--json " + (t / "r.json").string()).status == 0);
  CHECK(slurp(t / "r.json.tmp") == "mine");
  // An empty path, one file for two outputs, an output naming the input: refused, nothing written.
  o = amoeba(t, small + "--json ''");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--json = \"\": must name a file"));
  o = amoeba(t, small + "--json " + (t / "same").string() + " --csv " + (t / "." / "same").string());
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--csv = ") && Catch::Contains("names the same file as --json"));
  CHECK_FALSE(fs::exists(t / "same"));
  REQUIRE(amoeba(t, "trace generate --requests 5 -o " + (t / "in.jsonl").string()).status == 0);
  const std::string trace_before = slurp(t / "in.jsonl");
  o = amoeba(t,
             "ablate --quiet --trace " + (t / "in.jsonl").string() + " --csv " + (t / "in.jsonl").string());
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("names the input --trace"));
  CHECK(slurp(t / "in.jsonl") == trace_before);
  // A path that cannot be created is refused before the run starts, not after it.
  const auto t0 = std::chrono::steady_clock::now();
  o = amoeba(t, "ablate --quiet --requests 5000 --policies static --json /proc/amoeba_no_such_file");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--json = /proc/amoeba_no_such_file: cannot be written"));
  CHECK(secs < 1.0);
}

TEST_CASE("hostile: calibration sampling is bounded at the top of the skew range", "[cli][hostile]") {
  TempDir t;
  // Rejection sampling of distinct top-k experts ran for minutes (skew 8: the last pick has ~1e-5 of the
  // mass; 128 experts top-8 worse). `timeout` turns a hang into status 124.
  for (const char* model : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    INFO(model);
    const Outcome o = amoeba(
        t, std::string("ablate --quiet --requests 5 --policies elastic --gpu h200 --skew 8 --model ") + model,
        kSanitized ? "timeout 900" : "timeout 60");  // a debug ASan build runs ~20x slower, still bounded
    CHECK(o.status == 0);
  }
}

TEST_CASE("hostile: every count has a range - a run too large for host memory is refused with the estimate",
          "[cli][hostile]") {
  TempDir t;
  Outcome o = amoeba(t, "ablate --quiet --requests -5");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--requests = -5: must be a non-negative integer"));
  o = amoeba(t, "ablate --quiet --requests 10000001", "timeout 60");  // accepted, it would run for hours
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--requests = 10000001: must be in [1, 10000000]"));
  for (const std::string& args :
       std::vector<std::string>{"--max-num-seqs 0", "--max-num-seqs 65537", "--expert-offload-limit 65537",
                                "--fixed-offload -1", "--max-num-batched-tokens 15"}) {
    INFO(args);
    o = amoeba(t, "ablate --quiet " + args);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::Contains(args.substr(0, args.find(' ')) + " = "));
  }
  // ASan maps terabytes of shadow address space, so an address-space limit kills a sanitized binary at start:
  // the memory refusal is checked in the ordinary builds only.
  if (kSanitized) return;
  // 1 GB of address space: the binary maps cuBLASLt (~540 MB) where it is built with the CUDA backend.
  o = amoeba(t, "trace generate --requests 10000001", "ulimit -v 1000000;");
  CHECK(o.status == 2);
  // 10^7 requests are allowed, but not in 1 GB of address space (they need 2.6 GB): refused up front with the
  // numbers.
  o = amoeba(t, "ablate --quiet --requests 10000000", "ulimit -v 1000000;");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--requests = 10000000: the run needs at least") &&
                        Catch::Contains("GB of host memory"));
}

TEST_CASE("hostile: flags have the config file's bounds - times keep their precision at every rate",
          "[cli][hostile]") {
  TempDir t;
  for (const std::string& args : std::vector<std::string>{
           "--rate 1e-300", "--rate 1e7", "--burstiness 1e308", "--burstiness 0", "--memory-cap-gib 1e-300",
           "--usable-fraction 0.01", "--rate nan", "--skew inf"}) {
    INFO(args);
    const Outcome o = amoeba(t, "ablate --quiet --requests 3 --policies static " + args);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::Contains(args.substr(0, args.find(' ')) + " = "));
  }
  // Arrivals past 1e9 s would lose sub-microsecond time: refused, naming the rate.
  Outcome o = amoeba(t, "trace generate --rate 1e-6 --requests 5000");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--rate = ") && Catch::Contains("1e9 s"));
  // At the slowest accepted rate every request runs alone, as at a merely slow one: same TTFT and TPOT.
  auto latencies = [&](const std::string& rate) {
    const fs::path j = t / ("r" + rate + ".json");
    REQUIRE(
        amoeba(t, "ablate --quiet --requests 4 --policies static --rate " + rate + " --json " + j.string())
            .status == 0);
    const auto r = nlohmann::json::parse(slurp(j))["results"][0];
    return std::vector<double>{r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["tpot_ms"]["p50"],
                               r["tpot_ms"]["p99"]};
  };
  const auto slow = latencies("1e-6"), ref = latencies("1e-3");
  for (std::size_t i = 0; i < slow.size(); ++i) {
    CHECK(slow[i] > 1.0);
    CHECK(slow[i] == Approx(ref[i]).epsilon(1e-6));
  }
  // 0 is "no cap" in both places.
  CHECK(amoeba(t, "ablate --quiet --requests 3 --policies static --memory-cap-gib 0").status == 0);
}

TEST_CASE("hostile: with --trace the table, CSV and JSON report the trace's requests and rate",
          "[cli][hostile]") {
  TempDir t;
  REQUIRE(amoeba(t, "trace generate --requests 30 --rate 2 -o " + (t / "t.jsonl").string()).status == 0);
  const Outcome o = amoeba(t, "ablate --quiet --policies static --trace " + (t / "t.jsonl").string() +
                                  " --json " + (t / "r.json").string() + " --csv " + (t / "r.csv").string());
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("30 requests, ") && Catch::Contains("req/s over"));
  CHECK_THAT(o.out, !Catch::Contains("10 req/s"));
  const auto j = nlohmann::json::parse(slurp(t / "r.json"));
  CHECK(j["trace"]["requests"] == 30);
  const double rate = j["trace"]["rate_req_s"];
  CHECK(rate == Approx(2).epsilon(0.6));
  CHECK_FALSE(j["scenario"]["workload"].contains("rate"));
  CHECK_FALSE(j["scenario"]["workload"].contains("requests"));
  std::istringstream csv(slurp(t / "r.csv"));
  std::string header, row, cell;
  std::getline(csv, header);
  std::getline(csv, row);
  std::vector<std::string> cells;
  std::istringstream cols(row);
  while (std::getline(cols, cell, ',')) cells.push_back(cell);
  REQUIRE(cells.size() > 4);
  CHECK(std::stod(cells[3]) == Approx(rate));  // rate
  CHECK(cells[4] == "30");                     // requests
  // The JSON's scenario is still a valid config and replays the same run.
  write(t / "c.json", j["scenario"].dump());
  CHECK(amoeba(t, "ablate --quiet --config " + (t / "c.json").string()).status == 0);
}

TEST_CASE("hostile: errors are clear and consistent - exit 2, the field named, nothing silently changed",
          "[cli][hostile]") {
  TempDir t;
  auto refused = [&](const std::string& args, const std::string& says) {
    INFO(args);
    const Outcome o = amoeba(t, args);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::StartsWith("amoeba: error: ") && Catch::Contains(says));
  };
  refused("ablate --quiet --trace " + t.dir.string(), "is a directory, not a file");
  refused("trace inspect " + t.dir.string(), "is a directory, not a file");
  write(t / "t.jsonl", "{\"arrival_s\": 0, \"prompt_tokens\": 5, \"output_tokens\": 5}\n");
  refused("trace inspect " + (t / "t.jsonl").string() + " --max-model-len 1",
          "--max-model-len = 1: must be in [16, 1048576]");
  refused("ablate --quiet --max-num-batched-tokens 16",
          "--max-num-batched-tokens = 16: must be >= max_model_len");
  refused("frobnicate", "subcommand = frobnicate: is not known (known: ablate, run, generate, rank, trace");
  refused("trace frobnicate", "frobnicate: is not known (known: generate, inspect)");
  refused("ablate --no-such-flag", "--no-such-flag");
  refused("ablate --rate", "--rate");
  refused("", "subcommand is required");
  refused("ablate --quiet --seed -1", "--seed = -1: must be a non-negative integer");
  refused("ablate --quiet --seed 18446744073709551616", "--seed = 18446744073709551616: must be in [0, ");
  refused("trace generate --seed -1", "--seed = -1");
  write(t / "dup.json", R"({"workload": {"rate": 5, "rate": 50}})");
  refused("ablate --quiet --config " + (t / "dup.json").string(), "workload.rate = (given twice)");
  write(t / "dup.jsonl",
        "{\"arrival_s\": 0, \"prompt_tokens\": 5, \"output_tokens\": 5, \"output_tokens\": 9}\n");
  refused("trace inspect " + (t / "dup.jsonl").string(), "output_tokens = (given twice)");
  // TPOT is undefined when every output is one token: shown as "-" / null, never as 0 ms.
  write(t / "one.jsonl",
        "{\"arrival_s\": 0, \"prompt_tokens\": 50, \"output_tokens\": 1}\n"
        "{\"arrival_s\": 1, \"prompt_tokens\": 60, \"output_tokens\": 1}\n");
  Outcome o = amoeba(t, "ablate --quiet --policies static --trace " + (t / "one.jsonl").string() +
                            " --json " + (t / "one.json").string());
  REQUIRE(o.status == 0);
  const auto j = nlohmann::json::parse(slurp(t / "one.json"));
  CHECK(j["results"][0]["tpot_ms"].is_null());
  CHECK(j["results"][0]["ttft_ms"]["p50"] > 0);
  CHECK_THAT(o.out, Catch::Contains("       -        -"));  // TPOT p50 and p99 cells
  // A full disk is an error, not status 0.
  const std::string cmd =
      cli_path() + " ablate --quiet --requests 3 --policies static >/dev/full 2>" + (t / "stderr").string();
  const int raw = std::system(cmd.c_str());
  CHECK((WIFEXITED(raw) ? WEXITSTATUS(raw) : -1) == 2);
  CHECK_THAT(slurp(t / "stderr"), Catch::Contains("write failed"));
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

TEST_CASE("the progress filter drops progress lines and keeps everything else", "[cli]") {
  // Lines as a run printed them under the sanitizer preset (Progress in cli/main.cpp, stderr not a terminal).
  const std::string printed =
      "simulating static: 19/20 requests, 1109 steps, 2.0 s, ~0 s left\ndone in 2.1 s\n";
  CHECK(without_progress(printed, "simulating static: ", 20).empty());
  CHECK(without_progress("simulating static: 20/20 requests, 1200 steps, 12.5 s\n", "simulating static: ", 20)
            .empty());
  CHECK(without_progress("warning: x\n" + printed, "simulating static: ", 20) == "warning: x\n");
  CHECK(without_progress(printed, "simulating lru: ", 20) ==
        "simulating static: 19/20 requests, 1109 steps, "
        "2.0 s, ~0 s left\n");
  CHECK(without_progress("[2/6] simulating fixed: 7/20 requests, 30 steps, 2.0 s, ~4 s left\n",
                         "[2/6] simulating fixed: ", 20)
            .empty());
  CHECK(without_progress(printed, "simulating static: ", 30) ==
        "simulating static: 19/20 requests, 1109 steps, "
        "2.0 s, ~0 s left\n");
}

TEST_CASE("backend cuda, routing model, --weights and --gpu-memory-gib on the command line", "[cli][cuda]") {
  TempDir t;
#ifndef AMOEBA_HAS_CUDA_BACKEND
  // This build has no CUDA backend: the stub refuses, naming the flag and how to get one; nothing is written.
  const Outcome c = amoeba(t, "run --backend cuda --requests 4 --json " + (t / "c.json").string());
  CHECK(c.status == 2);
  CHECK_THAT(c.err,
             Catch::Contains("--backend = cuda: this build has no CUDA backend: configure with the gpu "
                             "preset (cmake --preset gpu)"));
  CHECK_FALSE(fs::exists(t / "c.json"));
#endif
  Outcome o = amoeba(t, "run --routing model --requests 4");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--routing = model: the simulator (--backend sim) has no router"));
  o = amoeba(t, "ablate --model qwen3-30b-a3b --weights " + t.dir.string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--model = qwen3-30b-a3b: must not be given with --weights"));
  o = amoeba(t, "ablate --weights " + (t / "none").string() + " --quiet");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--weights = "));
  o = amoeba(t, "run --gpu-memory-gib 20 --memory-cap-gib 20");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--gpu-memory-gib = 20: is --memory-cap-gib under another name"));
  o = amoeba(t, "run --gpu-memory-gib 0.01");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--gpu-memory-gib = 0.01: must be 0 (no cap) or in"));
  // The alias gives the same run, and stderr holds nothing but progress lines: none where the run ends within
  // 2 s, as it does in a release build; a slower build (the sanitizer preset's) may print one and "done in".
  const Outcome a = amoeba(t, "run --policy static --requests 20 --gpu h200 --gpu-memory-gib 40");
  const Outcome b = amoeba(t, "run --policy static --requests 20 --gpu h200 --memory-cap-gib 40");
  REQUIRE(a.status == 0);
  CHECK(a.out == b.out);
  CHECK_THAT(a.out, Catch::Contains("budget 38.87 GB of 42.95 GB"));
  CHECK(without_progress(a.err, "simulating static: ", 20).empty());
  o = amoeba(t, "generate --backend tpu --weights " + t.dir.string() + " --prompt 1");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--backend = tpu: unknown generation backend (known: reference, the host "
                                    "reference; cuda, the GPU)"));
}

namespace {

// A cost-model file with every parameter given.
std::string cost_model_file(const std::string& name, double scale_efficiency, double scale_overhead) {
  nlohmann::json j;
  j["name"] = name;
  j["attention_memory_efficiency"] = 0.47 * scale_efficiency;
  j["attention_compute_efficiency"] = 0.33 * scale_efficiency;
  j["moe_memory_efficiency"] = 0.62 * scale_efficiency;
  j["moe_compute_efficiency"] = 0.41 * scale_efficiency;
  j["dense_memory_efficiency"] = 0.55 * scale_efficiency;
  j["dense_compute_efficiency"] = 0.9 * scale_efficiency;
  j["per_layer_overhead_us"] = 12.5 * scale_overhead;
  j["step_overhead_us"] = 2300.0 * scale_overhead;
  j["h2d_bandwidth_scale"] = 0.85;
  j["h2d_copy_latency_scale"] = 1.7;
  return j.dump();
}

nlohmann::json read_json(const fs::path& p) {
  return nlohmann::json::parse(slurp(p));
}

}  // namespace

TEST_CASE("calibrate: the simulator measured with a hidden cost model is fitted back, run loads the file",
          "[cli][calibration]") {
  TempDir t;
  const std::string hidden = (t / "hidden.json").string(), fit = (t / "fit.json").string();
  write(hidden, cost_model_file("hidden", 1.0, 1.0));
  const std::string cmd = "calibrate --backend sim --gpu h200 --max-num-seqs 1024 --measured-cost-model " +
                          hidden + " --quiet --out ";
  const Outcome o = amoeba(t, cmd + fit);
  REQUIRE(o.status == 0);
  CHECK(o.err.empty());
  CHECK_THAT(o.out, Catch::Contains("SIMULATED GPU (backend sim, cost model " + hidden));
  CHECK_THAT(o.out, Catch::Contains("calibrated cost model \"fit\" for qwen1.5-moe-a2.7b on h200"));
  const nlohmann::json j = read_json(fit);
  CHECK(j["name"] == "fit");
  CHECK(j["calibrated"] == true);
  CHECK_THAT(j["source"].get<std::string>(),
             Catch::Contains("fit_cost_model") && Catch::Contains("backend sim"));
  const double grid = 0.0005;
  CHECK(j["attention_memory_efficiency"].get<double>() == Approx(0.47).margin(grid));
  CHECK(j["attention_compute_efficiency"].get<double>() == Approx(0.33).margin(grid));
  CHECK(j["moe_memory_efficiency"].get<double>() == Approx(0.62).margin(grid));
  CHECK(j["moe_compute_efficiency"].get<double>() == Approx(0.41).margin(grid));
  CHECK(j["dense_memory_efficiency"].get<double>() == Approx(0.55).margin(grid));
  CHECK(j["dense_compute_efficiency"].get<double>() == Approx(0.9).margin(grid));
  CHECK(j["per_layer_overhead_us"].get<double>() == Approx(12.5).margin(0.05));
  CHECK(j["step_overhead_us"].get<double>() == Approx(2300).epsilon(1e-9));
  CHECK(j["h2d_bandwidth_scale"].get<double>() == Approx(0.85).epsilon(1e-9));
  CHECK(j["h2d_copy_latency_scale"].get<double>() == Approx(1.7).epsilon(1e-6));
  for (const char* phase : {"attention", "moe", "dense", "step", "copy"}) {
    INFO(phase);
    REQUIRE(j["residuals"].contains(phase));
    CHECK(j["residuals"][phase]["samples"].get<int>() > 0);
    CHECK(j["residuals"][phase]["p90_abs_rel_error"].get<double>() < 1e-6);
  }
  // Deterministic: the same command writes the same file.
  const std::string again = (t / "again.json").string();
  REQUIRE(amoeba(t, cmd + again + " --name fit").status == 0);
  CHECK(slurp(again) == slurp(fit));
  // The simulator loads it with --cost-model, and it prices a run as the hidden model does.
  const std::string run = "run --policy elastic --gpu h200 --gpu-memory-gib 40 --requests 60 --quiet --json ";
  REQUIRE(amoeba(t, run + (t / "a.json").string() + " --cost-model " + hidden).status == 0);
  REQUIRE(amoeba(t, run + (t / "b.json").string() + " --cost-model " + fit).status == 0);
  const nlohmann::json a = read_json(t / "a.json")["results"][0], b = read_json(t / "b.json")["results"][0];
  CHECK(b["forward_steps"] == a["forward_steps"]);
  CHECK(b["throughput_tok_s"].get<double>() == Approx(a["throughput_tok_s"].get<double>()).epsilon(1e-4));
  // Against the default cost model the same run differs.
  REQUIRE(amoeba(t, run + (t / "c.json").string()).status == 0);
  const nlohmann::json c = read_json(t / "c.json")["results"][0];
  CHECK(c["throughput_tok_s"].get<double>() != Approx(a["throughput_tok_s"].get<double>()).epsilon(1e-2));
}

TEST_CASE("validate: the simulator against itself: no error with one cost model, the expected with another",
          "[cli][calibration]") {
  TempDir t;
  const std::string hidden = (t / "hidden.json").string(), slow = (t / "slow.json").string();
  write(hidden, cost_model_file("hidden", 1.0, 1.0));
  // Half the efficiencies and twice the overheads: every step of a run without copies takes twice as long.
  write(slow, cost_model_file("slow", 0.5, 2.0));
  // Every request at t = 0: the schedule does not depend on the clock, so both sides run the same steps.
  std::string trace;
  for (int i = 0; i < 40; ++i)
    trace += "{\"arrival_s\": 0, \"prompt_tokens\": " + std::to_string(20 + 37 * i % 400) +
             ", \"output_tokens\": " + std::to_string(5 + 11 * i % 60) + "}\n";
  write(t / "t.jsonl", trace);
  const std::string cmd = "validate --backend sim --policy static --quiet --trace " +
                          (t / "t.jsonl").string() + " --measured-cost-model " + hidden + " --json ";
  Outcome o = amoeba(t, cmd + (t / "same.json").string() + " --cost-model " + hidden);
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("validate: SIMULATED GPU (backend sim, cost model " + hidden));
  CHECK_THAT(o.out, Catch::Contains("|error| median 0.00%, p90 0.00%, max 0.00%"));
  nlohmann::json j = read_json(t / "same.json");
  CHECK(j["steps"]["pairing"] == "by-index");
  CHECK(j["steps"]["paired"].get<int>() > 10);
  CHECK(j["steps"]["paired"] == j["steps"]["measured"]);
  CHECK(j["steps"]["max_abs_rel_error"].get<double>() == 0.0);
  // Every measured forward priced by the simulator on its own input: the same cost model, no error.
  CHECK(j["priced_steps"]["steps"] == j["steps"]["measured"]);
  CHECK(j["priced_steps"]["max_abs_rel_error"].get<double>() == 0.0);
  CHECK(j["end_to_end"]["measured"] == j["end_to_end"]["simulated"]);
  CHECK(j["end_to_end"]["measured"]["expert_bytes_h2d"] == 0);  // static copies nothing

  // A policy that copies experts: the movement's counters are reported on both sides, equal here.
  const std::string fixed_cmd = "validate --backend sim --policy fixed --quiet --trace " +
                                (t / "t.jsonl").string() + " --measured-cost-model " + hidden +
                                " --cost-model " + hidden + " --json ";
  o = amoeba(t, fixed_cmd + (t / "fixed.json").string() + " --csv-measured " + (t / "m.csv").string() +
                    " --csv-simulated " + (t / "s.csv").string());
  REQUIRE(o.status == 0);
  // Both timelines, the same columns; equal here (the same cost model on both sides) but for priced_ms: the
  // measured forwards' price (here equal to their step_ms), empty on the simulated side.
  const std::string mcsv = slurp(t / "m.csv"), scsv = slurp(t / "s.csv");
  CHECK(mcsv.rfind("step,time_s,step_ms,", 0) == 0);
  auto split_priced = [](const std::string& csv) {  // (every line without priced_ms, the priced_ms fields)
    std::string rest;
    std::vector<std::string> priced;
    std::size_t column = 0;  // priced_ms's, from the header (the first line)
    std::istringstream in(csv);
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> cells;
      std::istringstream cs(line);
      for (std::string cell; std::getline(cs, cell, ',');) cells.push_back(cell);
      if (!line.empty() && line.back() == ',') cells.emplace_back();
      if (priced.empty())
        column = std::size_t(std::find(cells.begin(), cells.end(), "priced_ms") - cells.begin());
      REQUIRE(column < cells.size());
      priced.push_back(cells[column]);
      cells.erase(cells.begin() + std::ptrdiff_t(column));
      for (const std::string& c : cells) rest += c + ",";
      rest += "\n";
    }
    return std::make_pair(rest, priced);
  };
  const auto [m_rest, m_priced] = split_priced(mcsv);
  const auto [s_rest, s_priced] = split_priced(scsv);
  CHECK(m_rest == s_rest);
  REQUIRE(m_priced.size() > 10);
  CHECK(m_priced.front() == "priced_ms");
  std::size_t priced_rows = 0;
  for (std::size_t i = 1; i < s_priced.size(); ++i) {
    CHECK(s_priced[i].empty());
    priced_rows += !m_priced[i].empty();
  }
  CHECK(priced_rows == read_json(t / "fixed.json")["steps"]["measured"].get<std::size_t>());
  CHECK_THAT(o.out, Catch::Contains("expert GB over PCIe"));
  CHECK_THAT(o.out, Catch::Contains("copy stall s"));
  j = read_json(t / "fixed.json");
  CHECK(j["end_to_end"]["measured"]["expert_bytes_h2d"].get<std::uint64_t>() > 0);
  CHECK(j["end_to_end"]["measured"]["copy_stall_s"].get<double>() > 0);
  CHECK(j["end_to_end"]["measured"] == j["end_to_end"]["simulated"]);

  o = amoeba(t, cmd + (t / "slow_v.json").string() + " --cost-model " + slow);
  REQUIRE(o.status == 0);
  CHECK_THAT(o.out, Catch::Contains("signed median 100.00% (the simulator is slower)"));
  j = read_json(t / "slow_v.json");
  CHECK(j["steps"]["pairing"] == "by-index");
  CHECK(j["steps"]["median_abs_rel_error"].get<double>() == Approx(1.0).epsilon(1e-9));
  CHECK(j["steps"]["max_abs_rel_error"].get<double>() == Approx(1.0).epsilon(1e-9));
  CHECK(j["steps"]["median_rel_error"].get<double>() == Approx(1.0).epsilon(1e-9));
  CHECK(j["priced_steps"]["median_rel_error"].get<double>() == Approx(1.0).epsilon(1e-9));
  CHECK(j["priced_steps"]["max_abs_rel_error"].get<double>() == Approx(1.0).epsilon(1e-9));
  CHECK_THAT(o.out, Catch::Contains("the simulator pricing each measured step itself"));
  const nlohmann::json& buckets = j["steps"]["abs_error_buckets"];
  CHECK(buckets.back()["below"].is_null());
  CHECK(buckets.back()["steps"] == j["steps"]["paired"]);  // every step is off by 100%
  CHECK(j["end_to_end"]["simulated"]["makespan_s"].get<double>() ==
        Approx(2 * j["end_to_end"]["measured"]["makespan_s"].get<double>()).epsilon(1e-9));
  CHECK(j["end_to_end"]["simulated"]["forward_steps"] == j["end_to_end"]["measured"]["forward_steps"]);
}

TEST_CASE("calibrate and validate: bad arguments name the flag and the value, and write nothing",
          "[cli][calibration]") {
  TempDir t;
  const std::string out = (t / "x.json").string();
  auto refused = [&](const std::string& args, const std::string& message) {
    const Outcome o = amoeba(t, args);
    INFO(args);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::Contains(message));
    CHECK(o.out.empty());
    CHECK_FALSE(fs::exists(out));
    std::size_t files = 0;  // nothing left behind: no output, no temporary file
    for (const auto& e : fs::directory_iterator(t.dir))
      files += e.path().filename() != "stdout" && e.path().filename() != "stderr";
    CHECK(files == 0);
  };
  refused("calibrate --backend sim", "--out = (none): calibrate writes the fitted cost model to a file");
  refused("calibrate --backend sim --model gpt-5 --out " + out, "--model = gpt-5: unknown model");
  refused("calibrate --backend sim --out " + (t / "no_such_dir" / "x.json").string(),
          "--out = " + (t / "no_such_dir" / "x.json").string());
  refused("calibrate --backend tpu --out " + out, "--backend = tpu: unknown backend (known: sim, cuda)");
  refused("calibrate --backend sim --policy belady --out " + out, "--policy = belady: unknown policy");
  refused("calibrate --backend sim --model qwen3.5-35b-a3b --out " + out,
          "--model = qwen3.5-35b-a3b: calibration measures models whose every layer has full attention");
  refused("calibrate --backend sim --gpu 2x-rtx5090 --out " + out,
          "--gpu = 2x-rtx5090: calibration measures one GPU");
  refused("calibrate --backend sim --measured-cost-model " + (t / "none.json").string() + " --out " + out,
          "--measured-cost-model = ");
  refused("calibrate --backend sim --cost-model fast --out " + out,
          "--cost-model = fast: unknown cost model (built in: default, h200-qwen1.5, h200-qwen3; or a .json "
          "path)");
  refused("validate --backend sim --routing model --requests 4",
          "--routing = model: validate runs both backends on the same expert choices");
  refused("validate --backend sim --predictor oracle --requests 4",
          "--predictor = oracle: validate compares with a backend that prefetches no predicted experts");
  refused("validate --backend sim --requests 4 --json " + (t / "no_such_dir" / "v.json").string(),
          "--json = " + (t / "no_such_dir" / "v.json").string());
#ifndef AMOEBA_HAS_CUDA_BACKEND
  // cuda is the default of both commands; this build has none.
  refused("calibrate --out " + out, "--backend = cuda: this build has no CUDA backend");
  refused("calibrate --backend cuda --model qwen3-30b-a3b --out " + out,
          "--backend = cuda: this build has no CUDA backend");
  refused("validate --requests 4", "--backend = cuda: this build has no CUDA backend");
#endif
  refused("validate --backend sim --measured-cost-model default --cost-model nope --requests 4",
          "--cost-model = nope: unknown cost model");
#ifdef AMOEBA_HAS_CUDA_BACKEND
  refused("validate --backend cuda --measured-cost-model default --requests 4",
          "--measured-cost-model = default: only with --backend sim");
#else
  refused("validate --backend cuda --measured-cost-model default --requests 4",
          "--backend = cuda: this build has no CUDA backend");
#endif
}

TEST_CASE(
    "tensor parallelism (--tp) is the cuda backend's, in [1, 8], split as the model allows - refused "
    "before anything runs",
    "[cli][tp]") {
  TempDir t;
  Outcome o = amoeba(t, "run --tp 2 --requests 4");  // the simulator: several GPUs are a GPU profile
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--tp = 2: tensor parallelism over GPUs runs on --backend cuda"));
  for (const std::string v : {"0", "9", "-1", "two"}) {
    INFO(v);
    o = amoeba(t, "ablate --quiet --backend cuda --tp " + v);
    CHECK(o.status == 2);
    CHECK_THAT(o.err, Catch::Contains("--tp = " + v));
  }
  // (the measured side on the simulator, so that a build without the CUDA backend reaches the check too)
  o = amoeba(t, "validate --backend sim --measured-cost-model default --tp 2 --model qwen1.5-moe-a2.7b");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--tp = 2: validate compares one GPU with the simulator"));
  // Qwen1.5-MoE-A2.7B's 16 heads do not split over 3 GPUs: refused from the model's shapes, before any GPU.
  o = amoeba(t, "run --backend cuda --tp 3 --model qwen1.5-moe-a2.7b --requests 4");
  CHECK(o.status == 2);
  CHECK_THAT(o.err, Catch::Contains("--tp = 3: config.num_attention_heads = 16 must be a multiple of --tp"));
  CHECK(o.out.empty());
  // Its experts split over 2 GPUs (1408 rows of W1/W3 each), but a rank's 704 rows are not a whole number of
  // the paged MoE kernel's 128-row blocks: refused before any GPU, not once the ranks are set up.
  o = amoeba(t, "run --backend cuda --tp 2 --model qwen1.5-moe-a2.7b --requests 4");
  CHECK(o.status == 2);
  CHECK_THAT(o.err,
             Catch::Contains("--tp = 2: config.moe_intermediate_size / --tp = 1408 / 2 = 704 must be a "
                             "multiple of 128"));
  CHECK(o.out.empty());
}
