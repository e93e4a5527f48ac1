// Reports; see report.hpp.
#include "engine/report.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

std::string ablation_table(const Scenario& s, const std::vector<RunResult>& results) {
  std::string out = fmt::format(
      "SIMULATED GPU: no GPU was used; times come from the cost model "
      "(reference_engine/engine/sim_backend.hpp).\n"
      "model {} on {} (simulated), {} requests, {} req/s, seed {}{}\n\n",
      s.model, s.gpu,
      s.trace.empty()   ? s.requests
      : results.empty() ? 0
                        : results.front().total_requests,
      s.rate, s.seed, s.trace.empty() ? ", ShareGPT-like" : ", trace " + s.trace);
  out += fmt::format("{:<12} {:>6} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>10} {:>7}\n", "policy", "peak",
                     "steps", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "expert GB", "hit %");
  out += fmt::format("{:<12} {:>6} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>10} {:>7}\n", "", "conc.",
                     "forward", "", "ms", "ms", "ms", "ms", "H2D", "");
  for (const RunResult& r : results)
    out += fmt::format(
        "{:<12} {:>6} {:>8} {:>10.1f} {:>9.0f} {:>9.0f} {:>8.1f} {:>8.1f} {:>10.1f} {:>7.1f}\n", r.policy,
        r.peak_concurrency, r.forward_steps, r.throughput_tok_s, r.ttft_ms.p50, r.ttft_ms.p99, r.tpot_ms.p50,
        r.tpot_ms.p99, double(r.expert_bytes_h2d) / 1e9, 100.0 * r.expert_hit_rate);
  return out;
}

namespace {
nlohmann::ordered_json pct(const Percentiles& p) {
  nlohmann::ordered_json j;
  j["p50"] = p.p50;
  j["p90"] = p.p90;
  j["p99"] = p.p99;
  j["mean"] = p.mean;
  return j;
}
}  // namespace

std::string ablation_json(const Scenario& s, const std::vector<RunResult>& results) {
  nlohmann::ordered_json j;
  j["simulated"] = true;
  j["note"] = "GPU simulated by the reference engine's cost model; no GPU was used";
  j["scenario"] = nlohmann::ordered_json::parse(scenario_to_json(s, -1));
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const RunResult& r : results) {
    nlohmann::ordered_json x;
    x["policy"] = r.policy;
    x["peak_concurrency"] = r.peak_concurrency;
    x["forward_steps"] = r.forward_steps;
    x["completed_requests"] = r.completed_requests;
    x["throughput_tok_s"] = r.throughput_tok_s;
    x["throughput_req_s"] = r.throughput_req_s;
    x["ttft_ms"] = pct(r.ttft_ms);
    x["tpot_ms"] = pct(r.tpot_ms);
    x["expert_bytes_h2d"] = r.expert_bytes_h2d;
    x["expert_hit_rate"] = r.expert_hit_rate;
    x["expert_prefetch_rate"] = r.expert_prefetch_rate;
    x["wasted_prefetches"] = r.wasted_prefetches;
    x["output_tokens"] = r.output_tokens;
    x["makespan_s"] = r.makespan_s;
    x["preemptions"] = r.preemptions;
    x["evictions"] = r.evictions;
    x["restores"] = r.restores;
    x["resident_experts_min"] = r.min_resident_experts;
    x["resident_experts_max"] = r.max_resident_experts;
    x["copy_stall_s"] = r.copy_stall_s;
    x["pool_bytes"] = r.pool_bytes;
    x["initial_kv_bytes"] = r.initial_kv_bytes;
    x["load_buffer_experts"] = r.load_buffer_experts;
    arr.push_back(x);
  }
  j["results"] = arr;
  return j.dump(2) + "\n";
}

std::string ablation_csv(const Scenario& s, const std::vector<RunResult>& results) {
  std::string out =
      "simulated,model,gpu,rate,requests,seed,expert_offload_limit,policy,peak_concurrency,forward_steps,"
      "completed_requests,throughput_tok_s,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,tpot_p50_ms,tpot_p90_ms,"
      "tpot_p99_ms,expert_bytes_h2d,expert_hit_rate,preemptions,evictions,restores,resident_experts_min,"
      "makespan_s\n";
  for (const RunResult& r : results)
    out += fmt::format(
        "true,{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{},{:.5f},"
        "{},{},{},{},{:.3f}\n",
        s.model, s.gpu, s.rate, r.total_requests, s.seed, s.expert_offload_limit, r.policy,
        r.peak_concurrency, r.forward_steps, r.completed_requests, r.throughput_tok_s, r.ttft_ms.p50,
        r.ttft_ms.p90, r.ttft_ms.p99, r.tpot_ms.p50, r.tpot_ms.p90, r.tpot_ms.p99, r.expert_bytes_h2d,
        r.expert_hit_rate, r.preemptions, r.evictions, r.restores, r.min_resident_experts, r.makespan_s);
  return out;
}

std::string timeline_csv(const RunResult& r) {
  std::string out =
      "step,time_s,step_ms,running,waiting,batch_tokens,free_kv_pages,free_expert_pages,resident_experts,"
      "shortfall_pages,evictions,restores,h2d_bytes,copy_calls,attention_ms,moe_ms,dense_ms,copy_ms,stall_"
      "ms\n";
  for (const TimelineRow& t : r.timeline)
    out +=
        fmt::format("{},{:.6f},{:.3f},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}\n",
                    t.step, t.time_s, t.step_ms, t.running, t.waiting, t.batch_tokens, t.free_kv_pages,
                    t.free_expert_pages, t.resident_experts, t.shortfall_pages, t.evictions, t.restores,
                    t.h2d_bytes, t.copy_calls, t.attention_ms, t.moe_ms, t.dense_ms, t.copy_ms, t.stall_ms);
  return out;
}

void check_output_path(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (path.empty()) throw ConfigError(flag, "\"\"", "must name a file");
  const fs::path target(path);
  if (fs::is_directory(target)) throw ConfigError(flag, path, "is a directory, not a file");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir)) throw ConfigError(flag, path, "its directory does not exist");
}

void write_file_atomic(const std::string& path, const std::string& text, const std::string& flag) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (path.empty()) throw ConfigError(flag, "\"\"", "must name a file");
  if (fs::is_directory(target)) throw ConfigError(flag, path, "is a directory, not a file");
  const fs::path tmp = target.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ConfigError(flag, path, "cannot be written (is the directory there and writable?)");
    out << text;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw ConfigError(flag, path, "write failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw ConfigError(flag, path, "cannot replace the file: " + ec.message());
  }
}

}  // namespace amoeba::engine
