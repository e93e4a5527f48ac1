// amoeba: the command-line front end of the reference engine. The GPU is simulated (SimBackend, the default)
// or, with --backend cuda in a build with the CUDA backend, a real one (CudaBackend: measured times).
//
//   amoeba ablate   run several policy stacks on one trace, print one table (the main job)
//   amoeba run      one policy; per-step timeline CSV (running requests, free pages, resident experts)
//   amoeba generate greedy tokens from a Hugging Face checkpoint: the host reference decoder, or the GPU
//   amoeba rank     turn a routing record (run --record-routing) into expert statistics (--ranking)
//   amoeba calibrate  measure chosen step shapes on a backend and fit the simulator's cost model to them
//   amoeba validate   one trace on a measured backend and on the simulator, compared step by step
//   amoeba trace    generate a ShareGPT-like JSONL trace, or inspect one
//   amoeba models   the model catalog with page sizes and weight split
//   amoeba gpus     the GPU profiles with the source of each number
//   amoeba scenarios  the named scenarios (--scenario NAME): the paper's settings, as data
//
// Settings come from built-in defaults, then --scenario NAME, then --config FILE (JSON, see
// engine/scenario.hpp), then flags.
// Bad input exits with status 2 and a message naming the field, the value and the rule; no output file is
// left half-written.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/calibration.hpp"
#include "engine/calibration_harness.hpp"
#include "engine/checkpoint.hpp"
#include "engine/cuda_backend.hpp"
#include "engine/decoder_reference.hpp"
#include "engine/generate_driver.hpp"
#include "engine/gpu.hpp"
#include "engine/h2d_copy_probe.hpp"
#include "engine/json_fields.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/routing_record.hpp"
#include "engine/scenario.hpp"
#include "engine/sim_backend.hpp"
#include "engine/workload.hpp"

namespace {

using namespace amoeba;
using namespace amoeba::engine;

// Numbers on the command line are read as text and converted here, not by CLI11: its unsigned options wrap
// "-5" to 2^64 - 5 and clamp values past 2^64. Each flag gets the config file's range (scenario.hpp) and a
// message naming the flag, the value and the rule.
std::uint64_t parse_count(const std::string& flag, const std::string& text, CountRange r) {
  const char* const b = text.data();
  const char* const e = b + text.size();
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(b, e, v);
  if (ec == std::errc::result_out_of_range && end == e)
    throw ConfigError(flag, quote_text(text), range_rule(r));
  if (ec != std::errc() || end != e) {
    // 1e6 or 5.0 name integers too (as in config files) while a double holds them exactly.
    double d = 0;
    const auto [dend, dec] = std::from_chars(b, e, d);
    if (dec != std::errc() || dend != e || !std::isfinite(d) || d < 0 || d != std::floor(d))
      throw ConfigError(flag, quote_text(text), "must be a non-negative integer");
    if (d > double(r.max)) throw ConfigError(flag, quote_text(text), range_rule(r));
    if (d > kMaxExactIntegerDouble)
      throw ConfigError(flag, quote_text(text),
                        "must be written in digits (an exponent form above 2^53 loses digits)");
    v = static_cast<std::uint64_t>(d);
  }
  if (v < r.min || v > r.max) throw ConfigError(flag, quote_text(text), range_rule(r));
  return v;
}

double parse_real(const std::string& flag, const std::string& text, RealRange r) {
  const char* const b = text.data();
  const char* const e = b + text.size();
  double d = 0;
  const auto [end, ec] = std::from_chars(b, e, d);
  if (ec == std::errc::result_out_of_range &&
      end == e)  // 1e-400, 1e400: outside a double, so outside the range
    throw ConfigError(flag, quote_text(text), range_rule(r));
  if (ec != std::errc() || end != e) throw ConfigError(flag, quote_text(text), "must be a number");
  if (!(d >= r.min && d <= r.max)) throw ConfigError(flag, quote_text(text), range_rule(r));  // NaN, inf too
  return d;
}

// Host memory a run needs, estimated before it starts so that a run too large is refused with the numbers
// instead of dying of std::bad_alloc hours in. Measured (peak RSS, 10^3 -> 10^5 requests, ablate --policies
// static): 187 B per request (the trace, the engine's sequences, the latency samples); `run --csv`: 272 B per
// timeline row (the row and its CSV line, both grown by doubling). Rounded up.
constexpr std::uint64_t kBytesPerRequest = 256, kBytesPerTimelineRow = 320, kBaseBytes = 64ull << 20;

// Memory this process may still take: the least of MemAvailable, the cgroup's headroom and RLIMIT_AS minus
// what is mapped already. 0 when none can be read (then nothing is refused).
std::uint64_t available_host_bytes() {
  std::uint64_t best = ~std::uint64_t{0};
  auto take = [&](std::uint64_t v) { best = std::min(best, v); };
  auto read_kib = [](const char* file, const char* key) -> std::optional<std::uint64_t> {
    std::ifstream in(file);
    std::string k;
    std::uint64_t v = 0;
    while (in >> k)
      if (k == key && in >> v) return v << 10;
    return std::nullopt;
  };
  if (auto v = read_kib("/proc/meminfo", "MemAvailable:")) take(*v);
  std::ifstream max_in("/sys/fs/cgroup/memory.max"), cur_in("/sys/fs/cgroup/memory.current");
  std::string max_text;
  std::uint64_t cur = 0;
  if (max_in >> max_text && max_text != "max" && cur_in >> cur) {
    const std::uint64_t max = std::strtoull(max_text.c_str(), nullptr, 10);
    take(max > cur ? max - cur : 0);
  }
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const std::uint64_t mapped = read_kib("/proc/self/status", "VmSize:").value_or(0);
    take(lim.rlim_cur > mapped ? lim.rlim_cur - mapped : 0);
  }
  return best == ~std::uint64_t{0} ? 0 : best;
}

void check_host_memory(const std::string& field, const std::string& value, std::uint64_t requests,
                       std::uint64_t timeline_rows) {
  const std::uint64_t need = kBaseBytes + requests * kBytesPerRequest + timeline_rows * kBytesPerTimelineRow;
  const std::uint64_t have = available_host_bytes();
  if (have == 0 || need <= have) return;
  throw ConfigError(
      field, value,
      fmt::format(
          "the run needs at least {:.2f} GB of host memory (64 MiB + {} requests x {} B{}) but {:.2f} GB "
          "are available: run fewer requests",
          double(need) / 1e9, requests, kBytesPerRequest,
          timeline_rows ? fmt::format(" + {} timeline rows x {} B", timeline_rows, kBytesPerTimelineRow)
                        : std::string(),
          double(have) / 1e9));
}

bool is_file_name(const std::string& name_or_path) {  // as find_model / find_gpu / find_cost_model decide
  return name_or_path.size() > 5 && name_or_path.ends_with(".json");
}

// The names the refusals of an unknown name list (the dispatch table, the embedded cost models), for the
// help.
std::string policy_names() {
  return fmt::format("{}", fmt::join(all_policy_names(), ", "));
}
std::string cost_model_names() {
  return fmt::format("{}", fmt::join(builtin_cost_model_names(), ", "));
}

// Flags shared by ablate and run; unset ones leave the config/defaults alone.
struct ScenarioFlags {
  std::optional<std::string> config, scenario, backend, model, weights, gpu, trace, cost_model, predictor,
      routing, ranking, expert_precision, moe_kernel;
  std::optional<std::string> rate, burstiness, memory_cap_gib, gpu_memory_gib, usable_fraction, drift,
      predictor_accuracy, skew;
  std::optional<std::string> requests, seed, offload_limit, fixed_offload, max_num_seqs, max_batched_tokens,
      tp;

  void add_to(CLI::App& app) {
    app.add_option("--tp", tp,
                   "--backend cuda: tensor parallelism over GPUs 0..tp-1 of this machine (NCCL), in [1, 8] "
                   "(default 1: one GPU)");
    app.add_option("--scenario", scenario, "named scenario from `amoeba scenarios` (default: motivating)");
    app.add_option("--config", config, "JSON config file (see docs/engine.md)");
    app.add_option("--backend", backend,
                   "what runs the forward passes: sim (simulated GPU, the default) or cuda (an NVIDIA GPU, "
                   "measured; needs a build with the CUDA backend)");
    app.add_option("--model", model, "model name from `amoeba models`, or a model .json file");
    app.add_option("--weights", weights,
                   "Hugging Face checkpoint directory (Qwen2-MoE, Qwen3-MoE) instead of --model: its "
                   "config.json is the model; --backend cuda serves its weights");
    app.add_option("--gpu", gpu,
                   "GPU profile from `amoeba gpus`, or a profile .json file (default: rtx5090; h200 with "
                   "--backend cuda)");
    app.add_option("--rate", rate, "request rate (req/s) of the generated trace, in [1e-6, 1e6]");
    app.add_option("--burstiness", burstiness,
                   "gamma shape of inter-arrival times (1 = Poisson), in [1e-3, 1e3]");
    app.add_option("--requests", requests, "number of generated requests, in [1, 10^7]");
    app.add_option("--seed", seed, "random seed, in [0, 2^64 - 1]");
    app.add_option("--trace", trace, "JSONL trace file instead of generated requests");
    add_memory_flags(app);
    app.add_option("--drift", drift, "fraction of live routing ranks reshuffled vs the offline sample");
    app.add_option("--skew", skew, "routing popularity skew (Zipf exponent), in [0, 8]");
    app.add_option("--predictor", predictor, "prefetch predictor: none, cross-layer, oracle");
    app.add_option("--predictor-accuracy", predictor_accuracy, "cross-layer predictor accuracy, in [0, 1]");
    app.add_option("--cost-model", cost_model,
                   fmt::format("cost-model profile: {}, or a .json file", cost_model_names()));
    app.add_option("--expert-precision", expert_precision,
                   "routed experts on the host, over PCIe and in pages: bf16, int8, int4 (group 128)");
    app.add_option("--moe-kernel", moe_kernel,
                   "paged (reads pages in place) or gather (copies to contiguous)");
    app.add_option(
        "--routing", routing,
        "where routing comes from: synthetic (the routing model; default with --backend sim), model "
        "(the GPU's router; default with --backend cuda), or a routing record to replay");
    app.add_option("--ranking", ranking, "expert statistics to rank experts by (e.g. from `amoeba rank`)");
  }

  // The memory plan's and the scheduler's flags, which run, ablate, validate and calibrate all take.
  void add_memory_flags(CLI::App& app) {
    app.add_option("--memory-cap-gib", memory_cap_gib,
                   "use at most this much GPU memory (GiB): 0 or [1/16, 1e6]");
    app.add_option("--gpu-memory-gib", gpu_memory_gib, "--memory-cap-gib under another name");
    app.add_option("--usable-fraction", usable_fraction,
                   "fraction of GPU memory the engine may use, [0.05, 1]");
    app.add_option("--expert-offload-limit", offload_limit,
                   "elastic policies: most experts offloaded per layer");
    app.add_option("--fixed-offload", fixed_offload, "fixed/lru/lfu: experts offloaded per layer");
    app.add_option("--max-num-seqs", max_num_seqs, "cap on running sequences, in [1, 65536]");
    app.add_option("--max-num-batched-tokens", max_batched_tokens, "token budget per step, in [16, 2^20]");
  }

  // The flags `amoeba calibrate` takes: what sets up the backend and the memory plan. The workload, the
  // routing and the predictor are the calibration's own (calibration_harness.hpp); --cost-model is the fit's
  // starting point.
  void add_calibration_to(CLI::App& app) {
    app.add_option("--backend", backend,
                   "what is measured: cuda (an NVIDIA GPU, the default; needs a build with the CUDA backend) "
                   "or sim (the simulated GPU, with --measured-cost-model: a self-check)");
    app.add_option("--model", model, "model name from `amoeba models`, or a model .json file");
    app.add_option("--weights", weights, "Hugging Face checkpoint directory instead of --model");
    app.add_option("--gpu", gpu, "GPU profile (default: h200 with --backend cuda, rtx5090 with sim)");
    app.add_option("--seed", seed, "random seed (the GPU's random weights), in [0, 2^64 - 1]");
    app.add_option("--expert-precision", expert_precision,
                   "bf16 (default), int8 or int4: quantized experts fit that precision's MoE scales "
                   "against --cost-model's bf16 efficiencies");
    add_memory_flags(app);
    app.add_option("--cost-model", cost_model,
                   fmt::format("the fit's starting point ({}, or a .json file): the values kept for what the "
                               "measurements cannot see",
                               cost_model_names()));
  }

  // The files the run reads (an output naming one of them is refused).
  std::vector<std::pair<std::string, std::string>> inputs(const Scenario& s) const {
    std::vector<std::pair<std::string, std::string>> in;
    if (config) in.emplace_back("--config", *config);
    if (!s.trace.empty()) in.emplace_back("--trace", s.trace);
    if (is_file_name(s.model)) in.emplace_back("--model", s.model);
    if (is_file_name(s.gpu)) in.emplace_back("--gpu", s.gpu);
    if (is_file_name(s.cost_model)) in.emplace_back("--cost-model", s.cost_model);
    if (s.routing_source != "synthetic" && s.routing_source != "model")
      in.emplace_back("--routing", s.routing_source);
    if (!s.ranking.empty()) in.emplace_back("--ranking", s.ranking);
    return in;
  }

  Scenario resolve() const {
    Scenario s;
    if (scenario) {
      if (scenario->empty())
        throw ConfigError("--scenario", "\"\"", "must name a scenario (amoeba scenarios)");
      s = apply_named_scenario(find_scenario(*scenario), s);
    }
    if (config) {
      if (config->empty())
        throw ConfigError("--config", "\"\"", "must name a file (an empty path names none)");
      s = parse_scenario(read_text_file(*config, "--config", kMaxConfigFileBytes), *config, s);
    }
    auto name = [](const char* flag, const std::optional<std::string>& v, std::string& out) {
      if (!v) return;
      if (v->empty()) throw ConfigError(flag, "\"\"", "must not be empty");
      out = *v;
    };
    name("--backend", backend, s.backend);
    name("--routing", routing, s.routing_source);
    s.routing_given = s.routing_given || routing.has_value();
    name("--ranking", ranking, s.ranking);
    if (model && weights)
      throw ConfigError("--model", quote_text(*model),
                        "must not be given with --weights: the checkpoint's config.json is the model");
    name("--model", model, s.model);
    if (model) s.weights.clear();  // the flag replaces a config's checkpoint
    name("--weights", weights, s.weights);
    name("--gpu", gpu, s.gpu);
    s.gpu_given = s.gpu_given || gpu.has_value();
    name("--trace", trace, s.trace);
    name("--cost-model", cost_model, s.cost_model);
    if (rate) s.rate = parse_real("--rate", *rate, ranges::kRate);
    if (burstiness) s.burstiness = parse_real("--burstiness", *burstiness, ranges::kBurstiness);
    if (requests) s.requests = parse_count("--requests", *requests, ranges::kRequests);
    if (seed) s.seed = parse_count("--seed", *seed, ranges::kSeed);
    if (memory_cap_gib && gpu_memory_gib)
      throw ConfigError("--gpu-memory-gib", quote_text(*gpu_memory_gib),
                        "is --memory-cap-gib under another name: give one of the two");
    if (memory_cap_gib || gpu_memory_gib) {
      const char* flag = memory_cap_gib ? "--memory-cap-gib" : "--gpu-memory-gib";
      const std::string& text = memory_cap_gib ? *memory_cap_gib : *gpu_memory_gib;
      // 0 = no cap, as in the config file; a tiny positive cap is refused, not rounded to 0 bytes = no cap.
      const double cap = parse_real(flag, text, RealRange{0, ranges::kMemoryCapGib.max});
      if (cap != 0 && cap < ranges::kMemoryCapGib.min)
        throw ConfigError(flag, quote_text(text), memory_cap_rule());
      s.memory.memory_cap_bytes = memory_cap_bytes(cap);
    }
    if (usable_fraction)
      s.memory.usable_fraction = parse_real("--usable-fraction", *usable_fraction, ranges::kUsableFraction);
    if (offload_limit)
      s.expert_offload_limit =
          static_cast<std::uint32_t>(parse_count("--expert-offload-limit", *offload_limit, ranges::kOffload));
    if (fixed_offload)
      s.fixed_offload =
          static_cast<std::uint32_t>(parse_count("--fixed-offload", *fixed_offload, ranges::kOffload));
    if (max_num_seqs)
      s.scheduler.max_num_seqs =
          static_cast<std::uint32_t>(parse_count("--max-num-seqs", *max_num_seqs, ranges::kMaxNumSeqs));
    if (max_batched_tokens)
      s.scheduler.max_num_batched_tokens = static_cast<std::uint32_t>(
          parse_count("--max-num-batched-tokens", *max_batched_tokens, ranges::kMaxNumBatchedTokens));
    if (drift) s.routing.drift = parse_real("--drift", *drift, ranges::kUnit);
    if (skew) s.routing.skew = parse_real("--skew", *skew, ranges::kSkew);
    if (predictor) {
      try {
        s.predictor.kind = predictor_from_string(*predictor);
      } catch (const ConfigError& e) {
        throw ConfigError("--predictor", quote_text(*predictor), e.rule());
      }
    }
    if (predictor_accuracy)
      s.predictor.accuracy = parse_real("--predictor-accuracy", *predictor_accuracy, ranges::kUnit);
    if (expert_precision)
      s.expert_precision = expert_precision_from_string(*expert_precision, "--expert-precision");
    if (moe_kernel) s.moe_kernel = moe_kernel_from_string(*moe_kernel, "--moe-kernel");
    if (tp) s.tp = static_cast<std::uint32_t>(parse_count("--tp", *tp, ranges::kTp));
    apply_backend_defaults(s);  // the GPU and routing of the backend, where nothing above named them
    return s;
  }
};

// The outputs of one command, checked together before anything runs: each path on its own (OutputFile), no
// two naming one file, none naming an input.
std::vector<OutputFile> prepare_outputs(
    const std::vector<std::pair<std::string, std::optional<std::string>>>& named,
    const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<std::pair<std::string, std::string>> given;
  for (const auto& [flag, path] : named)
    if (path) given.emplace_back(flag, *path);
  for (const auto& [flag, path] : given)
    if (path.empty()) throw ConfigError(flag, "\"\"", "must name a file (an empty path names none)");
  check_distinct_files(given, inputs);
  std::vector<OutputFile> out;
  for (const auto& [flag, path] : given) out.emplace_back(path, flag);
  return out;
}

OutputFile* output_for(std::vector<OutputFile>& outs, const std::string& flag) {
  for (OutputFile& o : outs)
    if (o.flag() == flag) return &o;
  return nullptr;
}

// Requests of a scenario, refusing one that would not fit in host memory: a generated trace before it is
// made, a trace file once its requests are counted.
std::vector<Request> requests_within_memory(const Scenario& s, bool timeline) {
  if (s.trace.empty()) check_host_memory("--requests", std::to_string(s.requests), s.requests, 0);
  std::vector<Request> trace = scenario_requests(s);
  // A recorded timeline has a row per step. Steps depend on how requests overlap; the fewest possible (each
  // step emits at most max_num_seqs tokens, and the longest output needs its own steps) is what is checked,
  // so that no run that could fit is refused.
  std::uint64_t rows = 0;
  if (timeline) {
    std::uint64_t tokens = 0, longest = 0;
    for (const Request& r : trace) {
      tokens += r.output_tokens;
      longest = std::max<std::uint64_t>(longest, r.output_tokens);
    }
    rows = std::max<std::uint64_t>(longest, tokens / s.scheduler.max_num_seqs);
  }
  if (!s.trace.empty() || timeline)
    check_host_memory(s.trace.empty() ? "--requests" : "--trace",
                      s.trace.empty() ? std::to_string(s.requests) : s.trace, trace.size(), rows);
  return trace;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Progress of runs on stderr: requests finished of the total, forward steps, elapsed time and an estimate of
// the time left (elapsed x unfinished / finished). On a terminal the line is redrawn in place, at most four
// times a second; elsewhere (a log, a pipe) a line every 10 s once the command has run for 2 s, so that short
// runs print nothing. Disabled by --quiet.
class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Progress(bool quiet)
      : enabled_(!quiet), tty_(isatty(STDERR_FILENO) == 1), start_(Clock::now()), next_(start_ + kFirstLog) {}

  // A run begins; its lines start with `prefix` (ablate: "[2/6] simulating fixed: ").
  void begin_run(std::string prefix) {
    prefix_ = std::move(prefix);
    run_start_ = Clock::now();
    if (tty_) next_ = run_start_;  // a terminal shows the new run at once
  }
  // Called after every step: cheap unless a line is due.
  void update(const RunProgress& p) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now < next_) return;
    next_ = now + (tty_ ? kRedraw : kLogEvery);
    const double run_s = seconds(run_start_, now);
    std::string line = fmt::format("{}{}/{} requests, {} steps, {:.1f} s", prefix_, p.finished_requests,
                                   p.total_requests, p.forward_steps, run_s);
    if (p.finished_requests > 0 && p.finished_requests < p.total_requests)
      line += fmt::format(", ~{:.0f} s left", run_s * double(p.total_requests - p.finished_requests) /
                                                  double(p.finished_requests));
    if (tty_)
      std::fprintf(stderr, "\r%-*s", int(std::max<std::size_t>(width_, line.size())), line.c_str());
    else
      std::fprintf(stderr, "%s\n", line.c_str());
    width_ = std::max(width_, line.size());
    drawn_ = true;
  }
  // After the last run: "done in X s" (a terminal's line is then cleared).
  void finish() {
    if (!enabled_ || !drawn_) return;
    const std::string done = fmt::format("done in {:.1f} s", seconds(start_, Clock::now()));
    if (tty_)
      std::fprintf(stderr, "\r%-*s\r", int(std::max<std::size_t>(width_, 60)), done.c_str());
    else
      std::fprintf(stderr, "%s\n", done.c_str());
  }

 private:
  static constexpr auto kFirstLog = std::chrono::seconds(2), kLogEvery = std::chrono::seconds(10);
  static constexpr auto kRedraw = std::chrono::milliseconds(250);
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  bool enabled_, tty_, drawn_ = false;
  Clock::time_point start_, next_, run_start_;
  std::string prefix_;
  std::size_t width_ = 0;
};

int cmd_ablate(const ScenarioFlags& flags, const std::optional<std::string>& policies_flag,
               const std::optional<std::string>& json_path, const std::optional<std::string>& csv_path,
               bool quiet) {
  Scenario s = flags.resolve();
  if (policies_flag) {
    s.policies = split_commas(*policies_flag);
    s.runs.clear();  // --policies replaces a scenario's labelled runs
    for (const std::string& p : s.policies)
      if (p.empty())
        throw ConfigError("--policies", quote_text(*policies_flag),
                          "must be a comma-separated list of names");
  }
  if (s.policies.empty() && s.runs.empty()) s.policies = all_policy_names();
  for (const std::string& p : s.policies) {
    try {
      (void)find_policy(p);
    } catch (const ConfigError& e) {
      throw ConfigError("--policies", quote_text(p), e.rule());
    }
  }
  validate_scenario(s);
  std::vector<OutputFile> outs =
      prepare_outputs({{"--json", json_path}, {"--csv", csv_path}}, flags.inputs(s));
  const std::vector<Request> trace = requests_within_memory(s, false);
  const WorkloadReport workload = describe_workload(s, trace);
  // Every policy is planned before any runs: a configuration that cannot fit is refused up front.
  std::vector<RunSetup> setups = prepare_runs(s, trace, RunOptions{});
  const bool simulated = find_backend(s.backend).simulated;
  Progress progress(quiet);
  std::vector<RunResult> results;
  for (std::size_t i = 0; i < setups.size(); ++i) {
    progress.begin_run(fmt::format("[{}/{}] {} {}: ", i + 1, setups.size(),
                                   simulated ? "simulating" : "running", setups[i].label));
    setups[i].options.progress = [&progress](const RunProgress& p) { progress.update(p); };
    results.push_back(run_policy(setups[i]));
  }
  progress.finish();
  if (OutputFile* o = output_for(outs, "--json")) o->write(ablation_json(s, workload, results));
  if (OutputFile* o = output_for(outs, "--csv")) o->write(ablation_csv(s, workload, results));
  std::cout << ablation_table(s, workload, results);
  const PageGeometry& g = setups.front().geometry;
  std::cout << fmt::format("\npages: expert {} B; KV {} B per 16 tokens per layer", g.expert_page_bytes,
                           g.kv_page_bytes);
  if (g.kv_padding_bytes() > 0)
    std::cout << fmt::format(" ({} B payload + {} B padding to divide the expert page, {:.1f}% of KV bytes)",
                             g.kv_payload_bytes, g.kv_padding_bytes(),
                             100.0 * double(g.kv_padding_bytes()) / double(g.kv_page_bytes));
  if (g.ssm_page_bytes > 0)
    std::cout << fmt::format("; SSM {} B, conv {} B ({} B padding)", g.ssm_page_bytes, g.conv_page_bytes,
                             g.conv_padding_bytes());
  std::cout << "\n";
  const RunSetup& first = setups.front();
  if (first.gpu.gpus > 1 || s.expert_precision != ExpertPrecision::kBf16 || s.tp > 1) {
    const GpuProfile& gp = first.gpu;
    std::cout << (simulated ? "deployment (simulated): " : "deployment: ");
    if (s.tp > 1)
      std::cout << fmt::format(
          "GPUs 0..{} x {}, tensor parallel over NCCL (each GPU holds 1/{} of every expert, its heads' KV "
          "and "
          "the whole vocabulary; one rank's plan below); ",
          s.tp - 1, gp.name, s.tp);
    if (gp.gpus > 1)
      std::cout << fmt::format(
          "{} x {}, tensor parallel (each GPU holds 1/{} of every expert and its own KV share); 2 "
          "all-reduces per "
          "layer, {:.0f} us + 2(N-1)/N x bytes / {:.1f} GB/s bus bandwidth ({}); ",
          gp.gpus, gp.base.empty() ? gp.name : gp.base, gp.gpus, gp.allreduce_latency_s * 1e6,
          gp.allreduce_bus_bandwidth / 1e9, gp.interconnect);
    std::cout << fmt::format(
        "experts {}: {:.3f} MB over PCIe per expert per GPU{}\n", to_string(s.expert_precision),
        double(first.model.expert_transfer_bytes()) / 1e6,
        g.expert_padding_bytes() > 0
            ? fmt::format(" (expert page padded by {} B so KV pages nest)", g.expert_padding_bytes())
            : std::string());
  }
  std::cout << "memory per policy (" << (simulated ? "simulated " : "planned for ") << s.gpu
            << (first.gpu.gpus > 1 || s.tp > 1 ? ", per GPU" : "") << "):\n";
  for (const RunSetup& r : setups)
    std::cout << "  " << fmt::format("{:<12}", r.label) << (r.label.size() >= 12 ? " " : "")
              << r.memory.describe() << "\n";
  return 0;
}

int cmd_run(const ScenarioFlags& flags, const std::string& policy,
            const std::optional<std::string>& json_path, const std::optional<std::string>& csv_path,
            const std::optional<std::string>& record_path, bool quiet) {
  Scenario s = flags.resolve();
  s.policies = {policy};
  s.runs.clear();  // one policy, with the scenario's MoE kernel
  validate_scenario(s);
  std::vector<OutputFile> outs = prepare_outputs(
      {{"--json", json_path}, {"--csv", csv_path}, {"--record-routing", record_path}}, flags.inputs(s));
  RunOptions opt;
  opt.record_timeline = csv_path.has_value();  // a row per step: kept only when it is written
  const std::vector<Request> trace = requests_within_memory(s, opt.record_timeline);
  const WorkloadReport workload = describe_workload(s, trace);
  const RunSetup setup = prepare_run(s, policy, trace, opt);
  std::optional<RoutingRecorder> recorder;
  if (record_path)
    recorder.emplace(RoutingRecordHeader{model_label(s), setup.model.moe_layers(), setup.model.num_experts,
                                         setup.model.top_k, s.backend,
                                         std::string(to_string(setup.routing))});
  const bool simulated = find_backend(s.backend).simulated;
  RunSetup to_run = setup;
  if (recorder) to_run.options.recorder = &*recorder;
  Progress progress(quiet);
  progress.begin_run(fmt::format("{} {}: ", simulated ? "simulating" : "running", setup.label));
  to_run.options.progress = [&progress](const RunProgress& p) { progress.update(p); };
  const RunResult r = run_policy(to_run);
  progress.finish();
  if (OutputFile* o = output_for(outs, "--json")) o->write(ablation_json(s, workload, {r}));
  if (OutputFile* o = output_for(outs, "--csv")) o->write(timeline_csv(r));
  if (OutputFile* o = output_for(outs, "--record-routing")) o->write(recorder->text());
  std::cout << ablation_table(s, workload, {r});
  std::cout << "\nmemory" << (setup.gpu.gpus > 1 ? " per GPU (simulated, tensor parallel)" : "") << ": "
            << setup.memory.describe() << "\n";
  std::cout << fmt::format(
      "preemptions {}, evictions {}, restores {}, resident experts min {} max {}, copy stall {:.2f} s\n",
      r.preemptions, r.evictions, r.restores, r.min_resident_experts, r.max_resident_experts, r.copy_stall_s);
  if (!simulated) {
    std::cout << fmt::format("engine host time {:.3f} s (on the clock besides the forwards)\n", r.host_s);
    std::cout << fmt::format(
        "device memory free: {:.2f} GB before the backend, {:.2f} GB after its setup, {:.2f} GB after the "
        "run{}\n",
        double(r.device_free_before) / 1e9, double(r.device_free_after_setup) / 1e9,
        double(r.device_free_end) / 1e9,
        r.device_free_end == r.device_free_after_setup ? " (nothing allocated in the step loop)" : "");
  }
  if (!csv_path) std::cout << "(per-step timeline: add --csv FILE)\n";
  return 0;
}

// --backend of calibrate and validate: cuda unless named; refused up front where this build has no CUDA
// backend, before any output is checked or any run starts.
void check_measured_backend(const Scenario& s) {
  const BackendEntry& b = find_backend(s.backend);
  if (b.kind == BackendKind::kCuda && !cuda_backend_available())
    throw ConfigError("--backend", "cuda",
                      "this build has no CUDA backend: configure with the gpu preset (cmake --preset gpu) on "
                      "a machine with nvcc and a GPU (or measure the simulator itself: --backend sim)");
}

// The cost model a simulated measured side runs with; refused beside a measured backend.
std::string measured_cost_model(const Scenario& s, const std::optional<std::string>& flag) {
  if (!flag) return "default";
  if (!find_backend(s.backend).simulated)
    throw ConfigError(
        "--measured-cost-model", quote_text(*flag),
        "only with --backend sim (the simulated GPU that stands in for a measured one); --backend " +
            s.backend + " measures itself");
  if (flag->empty()) throw ConfigError("--measured-cost-model", "\"\"", "must not be empty");
  try {
    (void)find_cost_model(*flag);  // an unknown name or a bad file is refused before anything runs
  } catch (const ConfigError& e) {
    if (e.field() != "--cost-model") throw;  // a field of the file: named by its path already
    throw ConfigError("--measured-cost-model", e.value(), e.rule());
  }
  return *flag;
}

// The scenario of calibrate's and validate's flags (their --backend already defaulted), its measured backend
// and --policy checked before anything runs.
Scenario resolve_measured(const ScenarioFlags& flags, const std::string& policy) {
  Scenario s = flags.resolve();
  check_measured_backend(s);
  try {
    (void)find_policy(policy);
  } catch (const ConfigError& e) {
    throw ConfigError("--policy", quote_text(policy), e.rule());
  }
  return s;
}

int cmd_calibrate(const ScenarioFlags& given, const std::optional<std::string>& out_path,
                  const std::optional<std::string>& measured_flag, const std::string& policy,
                  const std::optional<std::string>& name, bool quiet) {
  if (!out_path)
    throw ConfigError("--out", "(none)",
                      "calibrate writes the fitted cost model to a file: give --out FILE (e.g. "
                      "cost_models/h200.json)");
  const std::string fitted_name = name ? *name : std::filesystem::path(*out_path).stem().string();
  if (fitted_name.empty())
    throw ConfigError(name ? "--name" : "--out",
                      name && name->empty() ? "\"\"" : quote_text(name ? *name : *out_path),
                      "the fitted model needs a name: give --name NAME");
  ScenarioFlags flags = given;
  if (!flags.backend) flags.backend = "cuda";
  if (!phase_events_from_environment())
    throw ConfigError("AMOEBA_PHASE_EVENTS", "0",
                      "calibrate fits the per-layer phase times, which this setting turns off: unset it");
  Scenario s = resolve_measured(flags, policy);
  // The fit's start, and the cost model of a simulated measured side.
  const CostModelParams start = find_cost_model(s.cost_model);
  std::vector<std::pair<std::string, std::string>> inputs = flags.inputs(s);
  s.cost_model = measured_cost_model(s, measured_flag);
  if (is_file_name(s.cost_model)) inputs.emplace_back("--measured-cost-model", s.cost_model);
  s.routing_source = "synthetic";  // the harness routes (CalibrationRouting); the GPU reads its sets
  s.policies = {policy};
  s.runs.clear();
  validate_scenario(s);
  // What calibration measures: every layer with full attention (one measured attention time cannot be split
  // between a hybrid's kinds of layers), one GPU. A checkpoint (--weights) is a Qwen2/3-MoE: no hybrid.
  if (s.weights.empty() && find_model(s.model).is_hybrid())
    throw ConfigError("--model", quote_text(s.model),
                      "calibration measures models whose every layer has full attention (one measured "
                      "attention time cannot be split between a hybrid's full and linear-attention layers)");
  if (const GpuProfile g = find_gpu(s.gpu); g.gpus != 1)
    throw ConfigError("--gpu", quote_text(s.gpu),
                      "calibration measures one GPU; this profile describes " + std::to_string(g.gpus));
  // The model and the memory plan (nothing runs yet): what the plan's shapes must fit.
  const std::vector<Request> none;
  const RunSetup probe = prepare_run(s, policy, none, RunOptions{});
  std::vector<OutputFile> outs = prepare_outputs({{"--out", out_path}}, inputs);

  const CalibrationPlan plan = default_calibration_plan(
      probe.model, s.scheduler, probe.memory.initial_kv_bytes() / probe.geometry.kv_page_bytes,
      probe.geometry.kTokensPerKvPage);
  const std::vector<Request> trace = calibration_trace(plan);
  const RunSetup setup = prepare_run(s, policy, trace, RunOptions{});
  const bool simulated = find_backend(s.backend).simulated;
  CopyTimer copies;
  if (simulated) {
    copies = simulated_copy_timer(setup);
  } else {
    const std::uint64_t expert = setup.model.expert_transfer_bytes();
    auto probe_gpu = std::make_shared<std::unique_ptr<H2dCopyProbe>>();
    const std::uint64_t max_calls = *std::max_element(plan.copy_calls.begin(), plan.copy_calls.end());
    copies = [probe_gpu, expert, max_calls](std::uint64_t calls, std::uint64_t bytes_per_call) {
      if (!*probe_gpu)
        *probe_gpu = std::make_unique<H2dCopyProbe>(expert, max_calls);  // before the engine's run
      return (*probe_gpu)->time(calls, bytes_per_call);
    };
  }
  Progress progress(quiet);
  if (!quiet)
    std::cerr << fmt::format(
        "calibrate: {} shapes ({} requests, the first {} a warm-up) on {} ({}), then {} "
        "copy probes\n",
        plan.shapes.size(), trace.size(), plan.warmup_shapes, s.backend, setup.gpu.name,
        plan.copy_calls.size() * 2 * plan.copy_repeats * 2);
  progress.begin_run(fmt::format("{} shapes: ", simulated ? "simulating" : "measuring"));
  CalibrationProgress cp;
  cp.run = [&progress](const RunProgress& p) { progress.update(p); };
  const CalibrationMeasurement m = measure_for_calibration(setup, plan, copies, cp);
  progress.finish();
  CostModelParams fitted = fit_cost_model(m.samples, setup.model, setup.gpu, start);
  fitted.name = fitted_name;
  fitted.source += fmt::format(
      "; measured by `amoeba calibrate`: {}{} on {}, backend {}{}, policy {}, {} shapes, {} forward steps "
      "({} warm-up), {} copy probes",
      model_label(s), model_label(s) == setup.model.name ? std::string() : " (" + setup.model.name + ")",
      setup.gpu.name, s.backend, simulated ? " with cost model " + s.cost_model : std::string(), policy,
      plan.shapes.size(), m.forward_steps, m.warmup_steps, m.copy_probes);
  outs.front().write(cost_model_to_json(fitted));

  std::cout << (simulated
                    ? fmt::format("SIMULATED GPU (backend sim, cost model {}): a check of the fit, not a "
                                  "measurement\n",
                                  s.cost_model)
                    : std::string("MEASURED on a GPU (backend cuda)\n"));
  std::cout << fmt::format(
      "calibrated cost model \"{}\" for {} on {}: {} samples from {} forward steps and {} "
      "copy probes -> {}\n\n",
      fitted.name, model_label(s), setup.gpu.name, m.samples.size(), m.forward_steps - m.warmup_steps,
      m.copy_probes, *out_path);
  std::cout << fmt::format("{:<30} {:>12} {:>12}\n", "parameter", "fitted", start.name);
  auto param = [](const char* what, double f, double s0, const char* unit = "") {
    std::cout << fmt::format("{:<30} {:>12.4f} {:>12.4f}{}\n", what, f, s0, unit);
  };
  param("attention memory efficiency", fitted.attention_memory_efficiency, start.attention_memory_efficiency);
  param("attention compute efficiency", fitted.attention_compute_efficiency,
        start.attention_compute_efficiency);
  param("moe memory efficiency", fitted.moe_memory_efficiency, start.moe_memory_efficiency);
  param("moe compute efficiency", fitted.moe_compute_efficiency, start.moe_compute_efficiency);
  param("dense memory efficiency", fitted.dense_memory_efficiency, start.dense_memory_efficiency);
  param("dense compute efficiency", fitted.dense_compute_efficiency, start.dense_compute_efficiency);
  param("per-layer overhead", fitted.per_layer_overhead_s * 1e6, start.per_layer_overhead_s * 1e6, " us");
  param("step overhead", fitted.step_overhead_s * 1e6, start.step_overhead_s * 1e6, " us");
  param("h2d bandwidth scale", fitted.h2d_bandwidth_scale, start.h2d_bandwidth_scale);
  param("h2d copy latency scale", fitted.h2d_copy_latency_scale, start.h2d_copy_latency_scale);
  if (s.expert_precision != ExpertPrecision::kBf16) {
    const auto &f = moe_precision_scale(fitted, s.expert_precision),
               &st = moe_precision_scale(start, s.expert_precision);
    const std::string p(to_string(s.expert_precision));
    param((p + " moe memory scale").c_str(), f.memory, st.memory);
    param((p + " moe compute scale").c_str(), f.compute, st.compute);
  }
  std::cout << "\nresiduals |predicted / measured - 1| per phase:\n";
  for (const CostModelResidual& r : fitted.residuals)
    std::cout << fmt::format("  {:<10} {:>5} samples  median {:.2f}%  p90 {:.2f}%\n", r.phase, r.samples,
                             100 * r.median_abs_rel_error, 100 * r.p90_abs_rel_error);
  // The copy probes one by one: what the copy fit saw and what it predicts.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<double>> probes;  // (calls, bytes) -> s
  for (const CalibrationSample& c : m.samples)
    if (c.phase == CalibrationPhase::kCopy)
      probes[{c.copy_calls, std::uint64_t(c.bytes)}].push_back(c.seconds);
  if (!probes.empty()) {
    std::cout << fmt::format("\ncopy probes (fastest repeat)  {:>5} {:>10} {:>12} {:>8} {:>12}\n", "calls",
                             "MB/call", "measured us", "GB/s", "fitted us");
    for (auto& [key, secs] : probes) {
      CalibrationSample c{CalibrationPhase::kCopy, double(key.second), 0, 1, key.first};
      c.seconds = percentiles(secs).p50;
      std::cout << fmt::format("{:<29} {:>5} {:>10.3f} {:>12.1f} {:>8.2f} {:>12.1f}\n", "", key.first,
                               double(key.second) / double(key.first) / 1e6, c.seconds * 1e6,
                               c.bytes / c.seconds / 1e9, predicted_seconds(c, setup.gpu, fitted) * 1e6);
    }
  }
  std::cout << fmt::format("\nuse it: amoeba run|ablate --cost-model {} (held-out check: amoeba validate)\n",
                           *out_path);
  return 0;
}

int cmd_validate(const ScenarioFlags& given, const std::string& policy,
                 const std::optional<std::string>& measured_flag, const std::optional<std::string>& json_path,
                 const std::optional<std::string>& csv_measured,
                 const std::optional<std::string>& csv_simulated, bool quiet) {
  ScenarioFlags flags = given;
  if (!flags.backend) flags.backend = "cuda";
  Scenario s = resolve_measured(flags, policy);
  if (s.tp != 1)
    throw_config_error("--tp", s.tp,
                       "validate compares one GPU with the simulator: tensor-parallel runs are not validated "
                       "yet");
  // Both sides must see the same experts: the routing model (or a record), never a router.
  if (s.routing_source == "model") {
    if (s.routing_given)
      throw ConfigError("--routing", "model",
                        "validate runs both backends on the same expert choices: synthetic (the default) or "
                        "a routing record (the simulator has no router)");
    s.routing_source = "synthetic";
  }
  // The GPU backend runs no prefetch predictor, so the simulated side runs none either.
  if (flags.predictor && s.predictor.kind != PredictorKind::kNone)
    throw ConfigError("--predictor", quote_text(*flags.predictor),
                      "validate compares with a backend that prefetches no predicted experts: none only");
  s.predictor.kind = PredictorKind::kNone;
  s.policies = {policy};
  s.runs.clear();
  Scenario measured = s, simulated = s;
  measured.cost_model = measured_cost_model(s, measured_flag);
  simulated.backend = "sim";
  simulated.gpu_given = true;  // the measured side's GPU profile, resolved above
  (void)find_cost_model(simulated.cost_model);
  validate_scenario(measured);
  validate_scenario(simulated);
  std::vector<std::pair<std::string, std::string>> inputs = flags.inputs(s);
  if (is_file_name(measured.cost_model)) inputs.emplace_back("--measured-cost-model", measured.cost_model);
  std::vector<OutputFile> outs = prepare_outputs(
      {{"--json", json_path}, {"--csv-measured", csv_measured}, {"--csv-simulated", csv_simulated}}, inputs);
  const std::vector<Request> trace = requests_within_memory(s, true);
  const WorkloadReport workload = describe_workload(s, trace);
  RunOptions opt;
  opt.record_timeline = true;
  RunSetup meas_setup = prepare_run(measured, policy, trace, opt);
  // The simulated side runs the measured side's setup (its model's shapes, memory plan, pool, routing), with
  // the simulator and the cost model under test.
  RunSetup sim_setup = meas_setup;
  sim_setup.scenario = &simulated;
  sim_setup.backend = BackendKind::kSim;
  sim_setup.cost = find_cost_model(simulated.cost_model);
  // The measured run's forwards are also priced one by one by the simulator under test (priced_ms).
  meas_setup.options.price_with = sim_setup.cost;
  sim_setup.options.price_with.reset();
  const bool measured_is_simulated = find_backend(measured.backend).simulated;
  Progress progress(quiet);
  progress.begin_run(
      fmt::format("{} on {}: ", measured_is_simulated ? "simulating" : "running", measured.backend));
  meas_setup.options.progress = [&progress](const RunProgress& p) { progress.update(p); };
  const RunResult meas = run_policy(meas_setup);
  progress.begin_run("simulating: ");
  sim_setup.options.progress = [&progress](const RunProgress& p) { progress.update(p); };
  const RunResult sim = run_policy(sim_setup);
  progress.finish();
  const RunComparison c = compare_runs(meas, sim);
  ValidationLabels l;
  l.model = model_label(s);
  l.gpu = meas_setup.gpu.name;
  l.policy = policy;
  l.expert_precision = std::string(to_string(s.expert_precision));
  l.gpu_memory_gib = memory_gib(meas_setup.memory.gpu_bytes);
  l.offload_limit = meas_setup.offload_limit;
  l.resident_per_layer = meas_setup.memory.initial_resident_per_layer;
  l.measured_backend = measured.backend;
  l.measured_simulated = measured_is_simulated;
  l.measured_cost_model = measured.cost_model;
  l.simulated_cost_model = simulated.cost_model;
  l.workload = workload.from_trace ? fmt::format("trace {} ({} requests)", s.trace, workload.requests)
                                   : fmt::format("{} requests at {:g} req/s, burstiness {:g}, seed {}",
                                                 workload.requests, s.rate, s.burstiness, s.seed);
  if (OutputFile* o = output_for(outs, "--json")) o->write(validation_json(c, l));
  if (OutputFile* o = output_for(outs, "--csv-measured")) o->write(timeline_csv(meas));
  if (OutputFile* o = output_for(outs, "--csv-simulated")) o->write(timeline_csv(sim));
  std::cout << validation_text(c, l);
  return 0;
}

int cmd_rank(const std::string& record_path, const std::optional<std::string>& out) {
  std::vector<OutputFile> outs = prepare_outputs({{"--out", out}}, {{"record", record_path}});
  const RoutingRecord r = read_routing_record(record_path);
  const std::string stats = expert_stats_json(r, record_path);
  if (OutputFile* o = output_for(outs, "--out")) {
    o->write(stats);
    std::cerr << fmt::format("ranked {} MoE layers x {} experts from {} steps ({}) -> {}\n",
                             r.header.moe_layers, r.header.experts, r.steps.size(),
                             r.counts.empty() ? "steps routed to" : "tokens routed", *out);
  } else {
    std::cout << stats;
  }
  return 0;
}

std::vector<std::int32_t> token_ids(const std::string& text, const char* flag) {
  std::vector<std::int32_t> ids;
  for (const std::string& t : split_commas(text))
    ids.push_back(static_cast<std::int32_t>(
        parse_count(flag, t, CountRange{0, std::uint64_t(std::numeric_limits<std::int32_t>::max())})));
  return ids;
}

int cmd_generate(const std::string& backend, const std::string& weights, const std::string& prompt_text,
                 const std::optional<std::string>& new_tokens_text, const std::string& teacher_text,
                 const std::optional<std::string>& json_path) {
  if (backend != "reference" && backend != "cuda")
    throw ConfigError("--backend", backend,
                      "unknown generation backend (known: reference, the host reference; cuda, the GPU)");
  const auto new_tokens = static_cast<std::uint32_t>(
      new_tokens_text ? parse_count("--new-tokens", *new_tokens_text, CountRange{1, 4096}) : 32);
  std::vector<OutputFile> outs = prepare_outputs({{"--json", json_path}}, {});
  const std::vector<std::int32_t> prompt = token_ids(prompt_text, "--prompt");
  const std::vector<std::int32_t> teacher =
      teacher_text.empty() ? std::vector<std::int32_t>{} : token_ids(teacher_text, "--teacher-tokens");
  const Checkpoint ck = open_checkpoint(weights);
  std::vector<GeneratedToken> steps;
  if (backend == "cuda") {
    steps = generate_on_cuda(ck, prompt, new_tokens, teacher);
  } else {
    DecoderReference ref(ck);
    for (auto& st : teacher.empty() ? ref.generate(prompt, new_tokens) : ref.generate_forced(prompt, teacher))
      steps.push_back(GeneratedToken{st.token, std::move(st.logits)});
  }
  nlohmann::ordered_json j;
  j["backend"] = backend;
  j["weights"] = weights;
  j["architecture"] = ck.config.architecture;
  j["prompt"] = prompt;
  if (!teacher.empty()) j["teacher_tokens"] = teacher;
  std::vector<std::int32_t> tokens;
  nlohmann::json logits = nlohmann::json::array();
  for (const auto& s : steps) {
    tokens.push_back(s.token);
    logits.push_back(s.logits);
  }
  j["tokens"] = tokens;
  j["logits"] = std::move(logits);
  if (OutputFile* o = output_for(outs, "--json")) o->write(j.dump() + "\n");
  std::cout << fmt::format("{} ({}): {}\n", ck.config.architecture, backend, fmt::join(tokens, ","));
  return 0;
}

struct GenerateFlags {
  std::optional<std::string> rate, burstiness, requests, seed, out;
};

int cmd_trace_generate(const GenerateFlags& f) {
  ShareGptLikeParams p;
  if (f.rate) p.rate = parse_real("--rate", *f.rate, ranges::kRate);
  if (f.burstiness) p.burstiness = parse_real("--burstiness", *f.burstiness, ranges::kBurstiness);
  if (f.requests) p.requests = parse_count("--requests", *f.requests, ranges::kRequests);
  if (f.seed) p.seed = parse_count("--seed", *f.seed, ranges::kSeed);
  const bool to_stdout = !f.out || *f.out == "-";
  std::vector<OutputFile> outs;
  if (!to_stdout) outs = prepare_outputs({{"--out", f.out}}, {});
  // The trace and its text (~24 + ~70 B per request) stay within a run's per-request estimate.
  check_host_memory("--requests", std::to_string(p.requests), p.requests, 0);
  const std::string text = trace_to_jsonl(generate_sharegpt_like(p));
  if (to_stdout)
    std::cout << text;
  else
    outs.front().write(text);
  return 0;
}

int cmd_trace_inspect(const std::string& path, const std::optional<std::string>& max_len_flag) {
  std::uint32_t max_len = SchedulerConfig{}.max_model_len;
  if (max_len_flag)
    max_len = static_cast<std::uint32_t>(parse_count("--max-model-len", *max_len_flag, ranges::kMaxModelLen));
  if (path.empty()) throw ConfigError("file", "\"\"", "must name a file (an empty path names none)");
  const std::vector<Request> t = read_trace(path, TraceLimits{max_len}, "trace inspect FILE");
  const TraceSummary s = summarize(t);
  std::cout << fmt::format(
      "{}: {} requests over {:.1f} s ({:.2f} req/s)\nprompt tokens: mean {:.1f}, median {}, max {}\noutput "
      "tokens: "
      "mean {:.1f}, median {}, max {}\n",
      path, s.requests, s.duration_s, s.rate, s.mean_prompt, s.p50_prompt, s.max_prompt, s.mean_output,
      s.p50_output, s.max_output);
  return 0;
}

int cmd_models() {
  std::cout << fmt::format("{:<20} {:>7} {:>7} {:>6} {:>4} {:>6} {:>11} {:>9} {:>9} {:>9} {:>10}\n", "model",
                           "params", "experts", "layers", "k", "shared", "expert page", "KV page", "KV pad",
                           "KV/token", "non-expert");
  for (const ModelSpec& m : model_catalog()) {
    const PageGeometry g = page_geometry(m);
    std::cout << fmt::format("{:<20} {:>6.1f}B {:>7} {:>6} {:>4} {:>6} {:>11} {:>9} {:>9} {:>8}K {:>9.2f}G\n",
                             m.name, double(m.total_params()) / 1e9, m.num_experts, m.moe_layers(), m.top_k,
                             m.num_shared_experts, g.expert_page_bytes, g.kv_page_bytes, g.kv_padding_bytes(),
                             m.kv_bytes_per_token() / 1024, 2.0 * double(m.non_expert_params()) / 1e9);
    if (m.is_hybrid())
      std::cout << fmt::format(
          "{:<20} hybrid: {} full-attention + {} linear-attention layers; SSM page {} B, conv "
          "page {} B ({} B padding)\n",
          "", m.attention_layers(), m.linear_layers(), g.ssm_page_bytes, g.conv_page_bytes,
          g.conv_padding_bytes());
  }
  std::cout
      << "\nexpert page = F x H x 2 B; KV page = 16 tokens x K,V x kv_heads x head_dim x 2 B per layer (MLA: "
         "the 576-value latent), rounded up to a divisor of the expert page where needed.\n";
  return 0;
}

int cmd_gpus() {
  for (const GpuProfile& g : gpu_catalog()) {
    std::cout << fmt::format(
        "{}: {}\n  memory {:.1f} GiB, HBM {:.0f} GB/s, bf16 {:.1f} TFLOP/s, H2D {:.1f} GB/s + "
        "{:.1f} us per copy\n",
        g.name, g.description, double(g.memory_bytes) / double(1ull << 30), g.hbm_bandwidth / 1e9,
        g.bf16_flops / 1e12, g.h2d_bandwidth / 1e9, g.h2d_copy_latency_s * 1e6);
    if (g.gpus > 1)
      std::cout << fmt::format(
          "  {} GPUs, tensor parallel (numbers above per GPU); all-reduce {:.0f} us + 2(N-1)/N x bytes / "
          "{:.1f} "
          "GB/s: {}\n",
          g.gpus, g.allreduce_latency_s * 1e6, g.allreduce_bus_bandwidth / 1e9, g.interconnect);
    for (const auto& [field, src] : g.sources) std::cout << "    " << field << ": " << src << "\n";
  }
  std::cout << "All engine runs simulate these GPUs; use --memory-cap-gib to model a smaller card.\n";
  return 0;
}

// "amoeba: error: FIELD = VALUE: RULE", each part bounded and with control bytes escaped: a value can come
// from a hostile file or argument.
int report_error(const ConfigError& e) {
  std::cerr << "amoeba: error: " << quote_text(e.field(), 200) << " = " << quote_text(e.value(), 200) << ": "
            << quote_text(e.rule(), 1000) << "\n";
  return 2;
}

// Names an unknown subcommand of `parent` (CLI11 only says that one is required), listing the ones it has.
std::optional<std::string> unknown_subcommand(const char* arg, const CLI::App& parent) {
  const std::string_view a(arg);
  if (a.empty() || a.front() == '-') return std::nullopt;
  std::string list;
  for (const CLI::App* sub : parent.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == a) return std::nullopt;
    list += (list.empty() ? "" : ", ") + sub->get_name();
  }
  return list;
}

// stdout is an output like any other: a full disk or a closed pipe must not end in status 0.
int finish(int status) {
  std::cout.flush();
  if (status == 0 && !std::cout) {
    std::cerr << "amoeba: error: stdout = (standard output): write failed: " << std::strerror(errno) << "\n";
    return 2;
  }
  return status;
}

int cmd_scenarios() {
  for (const NamedScenario& n : scenario_catalog()) {
    std::cout << n.name << ": " << n.description << "\n";
    if (!n.paper.empty()) std::cout << "    paper: " << n.paper << "\n";
    if (!n.choices.empty()) std::cout << "    choices: " << n.choices << "\n";
  }
  std::cout << "Run one with `amoeba ablate --scenario NAME` (simulated GPU); flags override its settings.\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "amoeba reference engine (simulated GPU, or a real one with --backend cuda): ablations of expert/KV "
      "memory policies"};
  app.require_subcommand(1);

  ScenarioFlags ab_flags, run_flags;
  std::optional<std::string> ab_policies, ab_json, ab_csv;
  bool ab_quiet = false;
  CLI::App* ablate = app.add_subcommand("ablate", "run several policies on one trace and print one table");
  ab_flags.add_to(*ablate);
  ablate->add_option("--policies", ab_policies,
                     fmt::format("comma-separated policies of {} (default: all)", policy_names()));
  ablate->add_option("--json", ab_json, "write the results as JSON");
  ablate->add_option("--csv", ab_csv, "write the results as CSV");
  ablate->add_flag("--quiet", ab_quiet, "no progress indicator");

  std::string run_policy_name = "elastic";
  std::optional<std::string> run_json, run_csv;
  bool run_quiet = false;
  CLI::App* run = app.add_subcommand("run", "one policy, with a per-step timeline");
  run_flags.add_to(*run);
  run->add_flag("--quiet", run_quiet, "no progress indicator");
  run->add_option("--policy", run_policy_name,
                  fmt::format("policy name: {} (default elastic)", policy_names()));
  run->add_option("--json", run_json, "write the result as JSON");
  run->add_option("--csv", run_csv, "write the per-step timeline as CSV");
  std::optional<std::string> run_record;
  run->add_option("--record-routing", run_record,
                  "write the experts every MoE layer routed to at every step (JSONL, docs/engine.md)");

  std::string gen_backend = "reference", gen_weights, gen_prompt;
  std::optional<std::string> gen_json;
  std::optional<std::string> gen_new;
  CLI::App* generate = app.add_subcommand(
      "generate",
      "greedy generation from a Hugging Face checkpoint (Qwen2-MoE, Qwen3-MoE), tokens in and out");
  generate->add_option("--weights", gen_weights, "checkpoint directory (config.json + *.safetensors)")
      ->required();
  generate->add_option("--prompt", gen_prompt, "comma-separated token ids")->required();
  generate->add_option("--new-tokens", gen_new, "tokens to generate, in [1, 4096] (default 32)");
  generate->add_option(
      "--backend", gen_backend,
      "reference (the host reference decoder; default) or cuda (the GPU backend, every expert "
      "resident)");
  generate->add_option("--json", gen_json, "write prompt, tokens and every step's logits as JSON");
  std::string gen_teacher;
  generate->add_option(
      "--teacher-tokens", gen_teacher,
      "feed these tokens after each step instead of the argmax (teacher forcing; one step each)");

  std::string rank_in;
  std::optional<std::string> rank_out;
  CLI::App* rank = app.add_subcommand("rank", "turn a routing record into expert statistics for --ranking");
  rank->add_option("record", rank_in, "routing record (from `amoeba run --record-routing`)")->required();
  rank->add_option("--out,-o", rank_out, "output file (default: stdout)");

  CLI::App* trace = app.add_subcommand("trace", "generate or inspect JSONL traces");
  trace->require_subcommand(1);
  GenerateFlags gen_flags;
  CLI::App* gen = trace->add_subcommand("generate", "write a ShareGPT-like trace");
  gen->add_option("--rate", gen_flags.rate, "requests per second, in [1e-6, 1e6] (default 10)");
  gen->add_option("--burstiness", gen_flags.burstiness, "gamma shape (1 = Poisson), in [1e-3, 1e3]");
  gen->add_option("--requests", gen_flags.requests, "number of requests, in [1, 10^7] (default 1000)");
  gen->add_option("--seed", gen_flags.seed, "random seed, in [0, 2^64 - 1]");
  gen->add_option("--out,-o", gen_flags.out, "output file (default or -: stdout)");
  std::string in_path;
  std::optional<std::string> in_max_len;
  CLI::App* inspect = trace->add_subcommand("inspect", "validate a trace and summarise it");
  inspect->add_option("file", in_path, "JSONL trace")->required();
  inspect->add_option("--max-model-len", in_max_len,
                      "limit on prompt + output tokens, in [16, 2^20] (default 2048)");

  ScenarioFlags cal_flags;
  std::optional<std::string> cal_out, cal_measured, cal_name;
  std::string cal_policy = "static";
  bool cal_quiet = false;
  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "measure chosen step shapes on a backend and fit the simulator's cost model to them");
  cal_flags.add_calibration_to(*calibrate);
  calibrate->add_option("--out,-o", cal_out, "the fitted cost model (JSON, the cost-model file format)");
  calibrate->add_option(
      "--measured-cost-model", cal_measured,
      "with --backend sim: the cost model the simulated GPU measures with (default: default)");
  calibrate->add_option("--policy", cal_policy,
                        "the policy the shapes run under (default static: every expert resident, no copies)");
  calibrate->add_option("--name", cal_name, "the fitted model's name (default: the --out file's stem)");
  calibrate->add_flag("--quiet", cal_quiet, "no progress on stderr");

  ScenarioFlags val_flags;
  std::optional<std::string> val_measured, val_json, val_csv_measured, val_csv_simulated;
  std::string val_policy = "elastic";
  bool val_quiet = false;
  CLI::App* validate = app.add_subcommand(
      "validate", "one trace on a measured backend and on the simulator, compared step by step");
  val_flags.add_to(*validate);
  validate->get_option("--backend")
      ->description(
          "the measured side: cuda (an NVIDIA GPU, the default; needs a build with the CUDA backend) "
          "or sim (the simulator against itself, with --measured-cost-model)");
  validate->get_option("--cost-model")
      ->description(fmt::format("the simulated side's cost model: {}, or a .json file", cost_model_names()));
  validate->get_option("--routing")
      ->description("synthetic (the default) or a routing record: both sides route to the same experts");
  validate->add_option("--policy", val_policy,
                       fmt::format("policy name: {} (default elastic)", policy_names()));
  validate->add_option("--measured-cost-model", val_measured,
                       "with --backend sim: the cost model of the simulated GPU standing in for the measured "
                       "one (default: default)");
  validate->add_option("--json", val_json, "write the comparison as JSON");
  validate->add_option("--csv-measured", val_csv_measured,
                       "write the measured run's per-step timeline as CSV");
  validate->add_option("--csv-simulated", val_csv_simulated,
                       "write the simulated run's per-step timeline as CSV (the same columns)");
  validate->add_flag("--quiet", val_quiet, "no progress indicator");

  CLI::App* models = app.add_subcommand("models", "list the model catalog");
  CLI::App* gpus = app.add_subcommand("gpus", "list the GPU profiles");
  CLI::App* scenarios = app.add_subcommand("scenarios", "list the named scenarios (the paper's settings)");

  // Command-line errors are bad input like any other: status 2 with the documented prefix, not CLI11's codes.
  if (argc > 1) {
    if (auto known = unknown_subcommand(argv[1], app))
      return report_error(
          ConfigError("subcommand", quote_text(argv[1]), "is not known (known: " + *known + ")"));
    if (std::string_view(argv[1]) == "trace" && argc > 2)
      if (auto known = unknown_subcommand(argv[2], *trace))
        return report_error(
            ConfigError("trace subcommand", quote_text(argv[2]), "is not known (known: " + *known + ")"));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "amoeba: error: " << quote_text(e.what(), 1000) << " (see amoeba --help)\n";
    return 2;
  }
  try {
    if (ablate->parsed()) return finish(cmd_ablate(ab_flags, ab_policies, ab_json, ab_csv, ab_quiet));
    if (run->parsed())
      return finish(cmd_run(run_flags, run_policy_name, run_json, run_csv, run_record, run_quiet));
    if (rank->parsed()) return finish(cmd_rank(rank_in, rank_out));
    if (calibrate->parsed())
      return finish(cmd_calibrate(cal_flags, cal_out, cal_measured, cal_policy, cal_name, cal_quiet));
    if (validate->parsed())
      return finish(cmd_validate(val_flags, val_policy, val_measured, val_json, val_csv_measured,
                                 val_csv_simulated, val_quiet));
    if (generate->parsed())
      return finish(cmd_generate(gen_backend, gen_weights, gen_prompt, gen_new, gen_teacher, gen_json));
    if (gen->parsed()) return finish(cmd_trace_generate(gen_flags));
    if (inspect->parsed()) return finish(cmd_trace_inspect(in_path, in_max_len));
    if (models->parsed()) return finish(cmd_models());
    if (gpus->parsed()) return finish(cmd_gpus());
    if (scenarios->parsed()) return finish(cmd_scenarios());
  } catch (const ConfigError& e) {
    return report_error(e);
  } catch (const std::bad_alloc&) {
    std::cerr << "amoeba: error: host memory ran out (the estimate checked before the run was too low)\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "amoeba: internal error: " << quote_text(e.what(), 1000) << "\n";
    return 3;
  }
  return 1;
}
