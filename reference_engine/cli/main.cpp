// amoeba: the command-line front end of the reference engine. Every GPU here is simulated (SimBackend).
//
//   amoeba ablate   run several policy stacks on one trace, print one table (the main job)
//   amoeba run      one policy; per-step timeline CSV (running requests, free pages, resident experts)
//   amoeba trace    generate a ShareGPT-like JSONL trace, or inspect one
//   amoeba models   the model catalog with page sizes and weight split
//   amoeba gpus     the GPU profiles with the source of each number
//   amoeba scenarios  the named scenarios (--scenario NAME): the paper's settings, as data
//
// Settings come from built-in defaults, then --scenario NAME, then --config FILE (JSON, see
// engine/scenario.hpp), then flags.
// Bad input exits with status 2 and a message naming the field, the value and the rule; no output file is
// left half-written.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/gpu.hpp"
#include "engine/json_fields.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/report.hpp"
#include "engine/scenario.hpp"
#include "engine/workload.hpp"

namespace {

using namespace amoeba;
using namespace amoeba::engine;

// Flags shared by ablate and run; unset ones leave the config/defaults alone.
struct ScenarioFlags {
  std::string config;
  std::optional<std::string> scenario, backend, model, gpu, trace, cost_model, predictor, expert_precision,
      moe_kernel;
  std::optional<double> rate, burstiness, memory_cap_gib, usable_fraction, drift, predictor_accuracy, skew;
  std::optional<std::uint64_t> requests, seed;
  std::optional<std::uint32_t> offload_limit, fixed_offload, max_num_seqs, max_batched_tokens;

  void add_to(CLI::App& app) {
    app.add_option("--scenario", scenario, "named scenario from `amoeba scenarios` (default: motivating)");
    app.add_option("--config", config, "JSON config file (see docs/engine.md)");
    app.add_option("--backend", backend, "what runs the forward passes: sim (simulated GPU, the default)");
    app.add_option("--model", model, "model name from `amoeba models`, or a model .json file");
    app.add_option("--gpu", gpu, "GPU profile from `amoeba gpus`, or a profile .json file");
    app.add_option("--rate", rate, "request rate (req/s) of the generated trace");
    app.add_option("--burstiness", burstiness, "gamma shape of inter-arrival times (1 = Poisson)");
    app.add_option("--requests", requests, "number of generated requests");
    app.add_option("--seed", seed, "random seed");
    app.add_option("--trace", trace, "JSONL trace file instead of generated requests");
    app.add_option("--memory-cap-gib", memory_cap_gib, "use at most this much GPU memory (GiB)");
    app.add_option("--usable-fraction", usable_fraction, "fraction of GPU memory the engine may use");
    app.add_option("--expert-offload-limit", offload_limit, "elastic: most experts offloaded per layer");
    app.add_option("--fixed-offload", fixed_offload, "fixed/lru/lfu: experts offloaded per layer");
    app.add_option("--max-num-seqs", max_num_seqs, "cap on running sequences");
    app.add_option("--max-num-batched-tokens", max_batched_tokens, "token budget per step");
    app.add_option("--drift", drift, "fraction of live routing ranks reshuffled vs the offline sample");
    app.add_option("--skew", skew, "routing popularity skew (Zipf exponent)");
    app.add_option("--predictor", predictor, "prefetch predictor: none, cross-layer, oracle");
    app.add_option("--predictor-accuracy", predictor_accuracy, "cross-layer predictor accuracy");
    app.add_option("--cost-model", cost_model, "cost-model profile: default, or a .json file");
    app.add_option("--expert-precision", expert_precision,
                   "routed experts on the host, over PCIe and in pages: bf16, int8, int4 (group 128)");
    app.add_option("--moe-kernel", moe_kernel,
                   "paged (reads pages in place) or gather (copies to contiguous)");
  }

  Scenario resolve() const {
    Scenario s;
    if (scenario) s = apply_named_scenario(find_scenario(*scenario), s);
    if (!config.empty()) s = parse_scenario(read_text_file(config, "--config"), config, s);
    if (backend) s.backend = *backend;
    if (model) s.model = *model;
    if (gpu) s.gpu = *gpu;
    if (trace) s.trace = *trace;
    if (cost_model) s.cost_model = *cost_model;
    if (rate) s.rate = *rate;
    if (burstiness) s.burstiness = *burstiness;
    if (requests) s.requests = *requests;
    if (seed) s.seed = *seed;
    if (memory_cap_gib) {
      if (!(*memory_cap_gib > 0) || *memory_cap_gib > 1e6)
        throw_config_error("--memory-cap-gib", *memory_cap_gib, "must be in (0, 1e6]");
      s.memory.memory_cap_bytes = static_cast<std::uint64_t>(*memory_cap_gib * double(1ull << 30));
    }
    if (usable_fraction) s.memory.usable_fraction = *usable_fraction;
    if (offload_limit) s.expert_offload_limit = *offload_limit;
    if (fixed_offload) s.fixed_offload = *fixed_offload;
    if (max_num_seqs) {
      if (*max_num_seqs == 0) throw_config_error("--max-num-seqs", 0, "must be at least 1");
      s.scheduler.max_num_seqs = *max_num_seqs;
    }
    if (max_batched_tokens) {
      if (*max_batched_tokens < 16)
        throw_config_error("--max-num-batched-tokens", *max_batched_tokens, "must be >= 16");
      s.scheduler.max_num_batched_tokens = *max_batched_tokens;
    }
    if (drift) {
      if (!(*drift >= 0 && *drift <= 1)) throw_config_error("--drift", *drift, "must be in [0, 1]");
      s.routing.drift = *drift;
    }
    if (skew) {
      if (!(*skew >= 0 && *skew <= 8)) throw_config_error("--skew", *skew, "must be in [0, 8]");
      s.routing.skew = *skew;
    }
    if (predictor) {
      try {
        s.predictor.kind = predictor_from_string(*predictor);
      } catch (const ConfigError& e) {
        throw ConfigError("--predictor", *predictor, e.rule());
      }
    }
    if (predictor_accuracy) {
      if (!(*predictor_accuracy >= 0 && *predictor_accuracy <= 1))
        throw_config_error("--predictor-accuracy", *predictor_accuracy, "must be in [0, 1]");
      s.predictor.accuracy = *predictor_accuracy;
    }
    if (expert_precision)
      s.expert_precision = expert_precision_from_string(*expert_precision, "--expert-precision");
    if (moe_kernel) s.moe_kernel = moe_kernel_from_string(*moe_kernel, "--moe-kernel");
    return s;
  }
};

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

int cmd_ablate(const ScenarioFlags& flags, const std::optional<std::string>& policies_flag,
               const std::string& json_path, const std::string& csv_path, bool quiet) {
  Scenario s = flags.resolve();
  if (policies_flag) {
    s.policies = split_commas(*policies_flag);
    s.runs.clear();  // --policies replaces a scenario's labelled runs
    for (const std::string& p : s.policies)
      if (p.empty())
        throw ConfigError("--policies", *policies_flag, "must be a comma-separated list of names");
  }
  if (s.policies.empty() && s.runs.empty()) s.policies = all_policy_names();
  for (const std::string& p : s.policies) {
    try {
      (void)find_policy(p);
    } catch (const ConfigError& e) {
      throw ConfigError("--policies", p, e.rule());
    }
  }
  validate_scenario(s);
  if (!json_path.empty()) check_output_path(json_path, "--json");
  if (!csv_path.empty()) check_output_path(csv_path, "--csv");
  const std::vector<Request> trace = scenario_requests(s);
  // Every policy is planned before any runs: a configuration that cannot fit is refused up front.
  std::vector<RunSetup> setups;
  for (const RunVariant& v : scenario_runs(s)) setups.push_back(prepare_run(s, v, trace, RunOptions{}));
  const bool progress = !quiet && isatty(STDERR_FILENO);
  std::vector<RunResult> results;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < setups.size(); ++i) {
    if (progress)
      std::fprintf(stderr, "\r[%zu/%zu] simulating %-12s (%.1f s)", i + 1, setups.size(),
                   setups[i].label.c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    results.push_back(run_policy(setups[i]));
  }
  if (progress)
    std::fprintf(stderr, "\r%-60s\r",
                 fmt::format("done in {:.1f} s",
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())
                     .c_str());
  if (!json_path.empty()) write_file_atomic(json_path, ablation_json(s, results), "--json");
  if (!csv_path.empty()) write_file_atomic(csv_path, ablation_csv(s, results), "--csv");
  std::cout << ablation_table(s, results);
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
  if (first.gpu.gpus > 1 || s.expert_precision != ExpertPrecision::kBf16) {
    const GpuProfile& gp = first.gpu;
    std::cout << "deployment (simulated): ";
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
  std::cout << "memory per policy (simulated " << s.gpu << (first.gpu.gpus > 1 ? ", per GPU" : "") << "):\n";
  for (const RunSetup& r : setups)
    std::cout << "  " << fmt::format("{:<12}", r.label) << (r.label.size() >= 12 ? " " : "")
              << r.memory.describe() << "\n";
  return 0;
}

int cmd_run(const ScenarioFlags& flags, const std::string& policy, const std::string& json_path,
            const std::string& csv_path) {
  Scenario s = flags.resolve();
  s.policies = {policy};
  s.runs.clear();  // one policy, with the scenario's MoE kernel
  validate_scenario(s);
  if (!json_path.empty()) check_output_path(json_path, "--json");
  if (!csv_path.empty()) check_output_path(csv_path, "--csv");
  const std::vector<Request> trace = scenario_requests(s);
  RunOptions opt;
  opt.record_timeline = true;
  const RunSetup setup = prepare_run(s, policy, trace, opt);
  const RunResult r = run_policy(setup);
  if (!json_path.empty()) write_file_atomic(json_path, ablation_json(s, {r}), "--json");
  if (!csv_path.empty()) write_file_atomic(csv_path, timeline_csv(r), "--csv");
  std::cout << ablation_table(s, {r});
  std::cout << "\nmemory" << (setup.gpu.gpus > 1 ? " per GPU (simulated, tensor parallel)" : "") << ": "
            << setup.memory.describe() << "\n";
  std::cout << fmt::format(
      "preemptions {}, evictions {}, restores {}, resident experts min {} max {}, copy stall {:.2f} s\n",
      r.preemptions, r.evictions, r.restores, r.min_resident_experts, r.max_resident_experts, r.copy_stall_s);
  if (csv_path.empty()) std::cout << "(per-step timeline: add --csv FILE)\n";
  return 0;
}

int cmd_trace_generate(double rate, double burstiness, std::uint64_t requests, std::uint64_t seed,
                       const std::string& out) {
  if (!(rate > 0)) throw_config_error("--rate", rate, "must be > 0");
  if (!(burstiness > 0)) throw_config_error("--burstiness", burstiness, "must be > 0");
  if (requests == 0) throw_config_error("--requests", requests, "must be at least 1");
  ShareGptLikeParams p;
  p.rate = rate;
  p.burstiness = burstiness;
  p.requests = requests;
  p.seed = seed;
  const std::string text = trace_to_jsonl(generate_sharegpt_like(p));
  if (out.empty() || out == "-")
    std::cout << text;
  else
    write_file_atomic(out, text, "--out");
  return 0;
}

int cmd_trace_inspect(const std::string& path, std::uint32_t max_model_len) {
  const std::vector<Request> t = read_trace(path, TraceLimits{max_model_len});
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
  CLI::App app{"amoeba reference engine (simulated GPU): ablations of expert/KV memory policies"};
  app.require_subcommand(1);

  ScenarioFlags ab_flags, run_flags;
  std::optional<std::string> ab_policies;
  std::string ab_json, ab_csv;
  bool ab_quiet = false;
  CLI::App* ablate = app.add_subcommand("ablate", "run several policies on one trace and print one table");
  ab_flags.add_to(*ablate);
  ablate->add_option("--policies", ab_policies, "comma-separated policies (default: all)");
  ablate->add_option("--json", ab_json, "write the results as JSON");
  ablate->add_option("--csv", ab_csv, "write the results as CSV");
  ablate->add_flag("--quiet", ab_quiet, "no progress indicator");

  std::string run_policy_name = "elastic", run_json, run_csv;
  CLI::App* run = app.add_subcommand("run", "one policy, with a per-step timeline");
  run_flags.add_to(*run);
  run->add_option("--policy", run_policy_name, "policy name (see `amoeba ablate --help`)");
  run->add_option("--json", run_json, "write the result as JSON");
  run->add_option("--csv", run_csv, "write the per-step timeline as CSV");

  CLI::App* trace = app.add_subcommand("trace", "generate or inspect JSONL traces");
  trace->require_subcommand(1);
  double tr_rate = 10, tr_burst = 1;
  std::uint64_t tr_requests = 1000, tr_seed = 0;
  std::string tr_out;
  CLI::App* gen = trace->add_subcommand("generate", "write a ShareGPT-like trace");
  gen->add_option("--rate", tr_rate, "requests per second");
  gen->add_option("--burstiness", tr_burst, "gamma shape (1 = Poisson)");
  gen->add_option("--requests", tr_requests, "number of requests");
  gen->add_option("--seed", tr_seed, "random seed");
  gen->add_option("--out,-o", tr_out, "output file (default: stdout)");
  std::string in_path;
  std::uint32_t in_max_len = 2048;
  CLI::App* inspect = trace->add_subcommand("inspect", "validate a trace and summarise it");
  inspect->add_option("file", in_path, "JSONL trace")->required();
  inspect->add_option("--max-model-len", in_max_len, "limit on prompt + output tokens");

  CLI::App* models = app.add_subcommand("models", "list the model catalog");
  CLI::App* gpus = app.add_subcommand("gpus", "list the GPU profiles");
  CLI::App* scenarios = app.add_subcommand("scenarios", "list the named scenarios (the paper's settings)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (ablate->parsed()) return cmd_ablate(ab_flags, ab_policies, ab_json, ab_csv, ab_quiet);
    if (run->parsed()) return cmd_run(run_flags, run_policy_name, run_json, run_csv);
    if (gen->parsed()) return cmd_trace_generate(tr_rate, tr_burst, tr_requests, tr_seed, tr_out);
    if (inspect->parsed()) return cmd_trace_inspect(in_path, in_max_len);
    if (models->parsed()) return cmd_models();
    if (gpus->parsed()) return cmd_gpus();
    if (scenarios->parsed()) return cmd_scenarios();
  } catch (const ConfigError& e) {
    std::cerr << "amoeba: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "amoeba: internal error: " << e.what() << "\n";
    return 3;
  }
  return 1;
}
