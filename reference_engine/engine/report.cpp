// Reports; see report.hpp.
#include "engine/report.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/sim_backend.hpp"

namespace amoeba::engine {

WorkloadReport describe_workload(const Scenario& s, const std::vector<Request>& requests) {
  WorkloadReport w;
  w.from_trace = !s.trace.empty();
  w.requests = requests.size();
  const double span = requests.empty() ? 0.0 : requests.back().arrival_s - requests.front().arrival_s;
  w.duration_s = span;
  if (!w.from_trace)
    w.rate = s.rate;
  else if (span > 0)
    w.rate = double(w.requests - 1) / span;
  return w;
}

namespace {
// Whether the scenario's backend simulates the GPU (its table entry says so).
bool simulated(const Scenario& s) {
  return find_backend(s.backend).simulated;
}

// A CSV cell: quoted when the text holds a comma, a quote or a line break (a checkpoint path may).
std::string csv_cell(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string q = "\"";
  for (char c : text) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// A percentile cell, or "-" where the metric is undefined (TPOT when every output is a single token).
std::string cell(const Percentiles& p, double v, const char* spec) {
  return p.count == 0 ? std::string("-") : fmt::format(fmt::runtime(spec), v);
}

std::string workload_line(const Scenario& s, const WorkloadReport& w) {
  if (!w.from_trace)
    return fmt::format("{} requests, {} req/s, seed {}, ShareGPT-like", w.requests, s.rate, s.seed);
  std::string rate = "rate unknown";
  if (w.rate)
    rate = fmt::format("{:.3f} req/s over {:.1f} s", *w.rate, w.duration_s.value_or(0));
  else if (w.duration_s)
    rate = "all arriving at once";
  return fmt::format("{} requests, {}, seed {}, trace {}", w.requests, rate, s.seed, s.trace);
}
}  // namespace

std::string precision_cost_note(const Scenario& s) {
  if (!simulated(s) || s.expert_precision == ExpertPrecision::kBf16) return "";
  const CostModelParams p = find_cost_model(s.cost_model);
  const CostModelParams::PrecisionScale& scale = moe_precision_scale(p, s.expert_precision);
  if (!scale.token_scale.empty()) return "";
  const std::string_view precision = to_string(s.expert_precision);
  return fmt::format(
      "cost model {} has no {} fit (no {}_moe_token_scale: not calibrated on the quantized kernel): {} "
      "experts "
      "are priced with prior factors on its bf16 MoE efficiencies (memory x {:.2f}, compute x {:.2f})",
      p.name, precision, precision, precision, scale.memory, scale.compute);
}

std::string ablation_table(const Scenario& s, const WorkloadReport& w,
                           const std::vector<RunResult>& results) {
  const std::string cost_note = precision_cost_note(s);
  std::string out =
      simulated(s)
          ? fmt::format(
                "SIMULATED GPU: no GPU was used; times come from the cost model "
                "(reference_engine/engine/sim_backend.hpp).\n"
                "model {} on {} (simulated), {}\n\n",
                model_label(s), s.gpu, workload_line(s, w)) +
                (cost_note.empty() ? "" : "note: " + cost_note + "\n\n")
          : fmt::format(
                "MEASURED on a GPU (backend {}): forward times measured, plus the engine's host time; "
                "idle gaps skipped.\n"
                "model {}, memory planned for {}, {}\n\n",
                s.backend, model_label(s), s.gpu, workload_line(s, w));
  out += fmt::format("{:<12} {:>6} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>10} {:>7}\n", "policy", "peak",
                     "steps", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "expert GB", "hit %");
  out += fmt::format("{:<12} {:>6} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>10} {:>7}\n", "", "conc.",
                     "forward", "", "ms", "ms", "ms", "ms", "H2D", "");
  for (const RunResult& r : results)
    out += fmt::format("{:<12} {:>6} {:>8} {:>10.1f} {:>9} {:>9} {:>8} {:>8} {:>10.1f} {:>7.1f}\n", r.policy,
                       r.peak_concurrency, r.forward_steps, r.throughput_tok_s,
                       cell(r.ttft_ms, r.ttft_ms.p50, "{:.0f}"), cell(r.ttft_ms, r.ttft_ms.p99, "{:.0f}"),
                       cell(r.tpot_ms, r.tpot_ms.p50, "{:.1f}"), cell(r.tpot_ms, r.tpot_ms.p99, "{:.1f}"),
                       double(r.expert_bytes_h2d) / 1e9, 100.0 * r.expert_hit_rate);
  return out;
}

namespace {
// null where the metric is undefined: a reader must not mistake "no sample" for 0 ms.
nlohmann::ordered_json pct(const Percentiles& p) {
  if (p.count == 0) return nullptr;
  nlohmann::ordered_json j;
  j["p50"] = p.p50;
  j["p90"] = p.p90;
  j["p99"] = p.p99;
  j["mean"] = p.mean;
  return j;
}
}  // namespace

std::string ablation_json(const Scenario& s, const WorkloadReport& w, const std::vector<RunResult>& results) {
  nlohmann::ordered_json j;
  const bool sim = simulated(s);
  j["simulated"] = sim;
  j["note"] = sim ? "GPU simulated by the reference engine's cost model; no GPU was used"
                  : "measured on a GPU (backend " + s.backend +
                        "): each forward's wall time plus the engine's host time (host_s); idle gaps skipped";
  if (const std::string cost_note = precision_cost_note(s); !cost_note.empty())
    j["cost_model_note"] = cost_note;
  j["scenario"] = nlohmann::ordered_json::parse(scenario_to_json(s, -1));
  if (w.from_trace) {
    nlohmann::ordered_json t;
    t["path"] = s.trace;
    t["requests"] = w.requests;
    t["duration_s"] = w.duration_s ? nlohmann::ordered_json(*w.duration_s) : nlohmann::ordered_json(nullptr);
    t["rate_req_s"] = w.rate ? nlohmann::ordered_json(*w.rate) : nlohmann::ordered_json(nullptr);
    j["trace"] = t;
  }
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
    if (!sim) {
      x["host_s"] = r.host_s;  // measured runs: the engine's own time, on the clock
      x["device_free_bytes"] = {{"before", r.device_free_before},
                                {"after_setup", r.device_free_after_setup},
                                {"end", r.device_free_end}};
    }
    arr.push_back(x);
  }
  j["results"] = arr;
  return j.dump(2) + "\n";
}

std::string ablation_json(const Scenario& s, const std::vector<RunResult>& results) {
  WorkloadReport w;
  w.from_trace = !s.trace.empty();
  w.requests = results.empty() ? (w.from_trace ? 0 : s.requests) : results.front().total_requests;
  if (!w.from_trace) w.rate = s.rate;  // a trace's arrivals are not known here: no rate, no duration
  return ablation_json(s, w, results);
}

std::string ablation_csv(const Scenario& s, const WorkloadReport& w, const std::vector<RunResult>& results) {
  std::string out =
      "simulated,model,gpu,rate,requests,seed,expert_offload_limit,policy,peak_concurrency,forward_steps,"
      "completed_requests,throughput_tok_s,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,tpot_p50_ms,tpot_p90_ms,"
      "tpot_p99_ms,expert_bytes_h2d,expert_hit_rate,preemptions,evictions,restores,resident_experts_min,"
      "makespan_s\n";
  // Undefined values are empty cells.
  const std::string rate = w.rate ? fmt::format("{}", *w.rate) : std::string();
  auto ms = [](const Percentiles& p, double v) {
    return p.count == 0 ? std::string() : fmt::format("{:.3f}", v);
  };
  const std::string sim = simulated(s) ? "true" : "false";
  for (const RunResult& r : results)
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{:.3f},{},{},{},{},{},{},{},{:.5f},"
        "{},{},{},{},{:.3f}\n",
        sim, csv_cell(model_label(s)), csv_cell(s.gpu), rate, r.total_requests, s.seed,
        s.expert_offload_limit, r.policy, r.peak_concurrency, r.forward_steps, r.completed_requests,
        r.throughput_tok_s, ms(r.ttft_ms, r.ttft_ms.p50), ms(r.ttft_ms, r.ttft_ms.p90),
        ms(r.ttft_ms, r.ttft_ms.p99), ms(r.tpot_ms, r.tpot_ms.p50), ms(r.tpot_ms, r.tpot_ms.p90),
        ms(r.tpot_ms, r.tpot_ms.p99), r.expert_bytes_h2d, r.expert_hit_rate, r.preemptions, r.evictions,
        r.restores, r.min_resident_experts, r.makespan_s);
  return out;
}

std::string timeline_csv(const RunResult& r) {
  std::string out =
      "step,time_s,step_ms,running,waiting,batch_tokens,free_kv_pages,free_expert_pages,resident_experts,"
      "shortfall_pages,evictions,restores,h2d_bytes,copy_calls,attention_ms,moe_ms,dense_ms,copy_ms,stall_"
      "ms,host_ms,compute_ms,forward_host_ms,priced_ms,decode_seqs,allreduce_ms\n";
  for (const TimelineRow& t : r.timeline)
    out += fmt::format(
        "{},{:.6f},{:.3f},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{"
        ":.3f},{},{},{:.3f}\n",
        t.step, t.time_s, t.step_ms, t.running, t.waiting, t.batch_tokens, t.free_kv_pages,
        t.free_expert_pages, t.resident_experts, t.shortfall_pages, t.evictions, t.restores, t.h2d_bytes,
        t.copy_calls, t.attention_ms, t.moe_ms, t.dense_ms, t.copy_ms, t.stall_ms, t.host_ms, t.compute_ms,
        t.forward_host_ms, t.priced_ms < 0 ? std::string() : fmt::format("{:.3f}", t.priced_ms),
        t.decode_seqs, t.allreduce_ms);
  return out;
}

namespace {

namespace fs = std::filesystem;

std::string reason() {
  return std::strerror(errno);
}

// A fresh file next to `target` (hidden, unique: a user's "FILE.tmp" is never overwritten). Returns its fd,
// or -1 with errno set.
int make_temp(const fs::path& target, std::string& tmp_path) {
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string name = target.filename().string().substr(0, 200);  // "." + name + ".XXXXXX" within NAME_MAX
  tmp_path = (dir / ("." + name + ".XXXXXX")).string();
  return ::mkostemp(tmp_path.data(), O_CLOEXEC);
}

// Writes everything or returns false with errno set. A reader that closed its end of a FIFO gives EPIPE here,
// not a SIGPIPE that would end the process without a message.
bool write_all(int fd, std::string_view text) {
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old);
  bool ok = true;
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      ok = false;
      break;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  const int saved = errno;
  ::sigaction(SIGPIPE, &old, nullptr);
  errno = saved;
  return ok;
}

}  // namespace

OutputFile::OutputFile(std::string path, std::string flag) : path_(std::move(path)), flag_(std::move(flag)) {
  if (path_.empty()) throw ConfigError(flag_, "\"\"", "must name a file (an empty path names none)");
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw ConfigError(flag_, path_, "is a directory, not a file");
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      // Non-blocking open: a FIFO nobody reads fails at once (ENXIO) instead of hanging the run.
      fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) {
        if (errno == ENXIO) throw ConfigError(flag_, path_, "is a FIFO that no process is reading");
        throw ConfigError(flag_, path_, "cannot be opened for writing: " + reason());
      }
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
      return;
    }
    if (!S_ISREG(st.st_mode))
      throw ConfigError(
          flag_, path_,
          "is neither a regular file, a character device nor a FIFO (a block device or socket is "
          "never written)");
    if (::access(path_.c_str(), W_OK) != 0) throw ConfigError(flag_, path_, "is not writable: " + reason());
    std::error_code ec;
    target_ = fs::canonical(path_, ec).string();  // a link keeps pointing at the new file
    if (ec) throw ConfigError(flag_, path_, "cannot be resolved: " + ec.message());
  } else {
    if (errno != ENOENT) throw ConfigError(flag_, path_, "cannot be examined: " + reason());
    struct stat lst {};
    if (::lstat(path_.c_str(), &lst) == 0)
      throw ConfigError(flag_, path_, "is a symbolic link to a missing file (write to its target instead)");
    target_ = path_;
  }
  const fs::path t(target_);
  const fs::path dir = t.has_parent_path() ? t.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError(flag_, path_, "its directory does not exist");
  std::string probe;
  const int fd = make_temp(t, probe);
  if (fd < 0)
    throw ConfigError(flag_, path_,
                      "cannot be written (no new file can be made beside it: " + reason() + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : path_(std::move(o.path_)), flag_(std::move(o.flag_)), target_(std::move(o.target_)), fd_(o.fd_) {
  o.fd_ = -1;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(std::string_view text) {
  if (fd_ >= 0) {
    const bool ok = write_all(fd_, text);
    const int saved = errno;
    const int fd = fd_;
    fd_ = -1;
    const bool closed = ::close(fd) == 0;
    errno = ok ? errno : saved;
    if (!ok || !closed) throw ConfigError(flag_, path_, "write failed: " + reason());
    return;
  }
  // The mode of the file being replaced, else what a new file gets under the umask.
  mode_t mode = 0;
  struct stat st {};
  if (::stat(target_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  std::string tmp;
  const int fd = make_temp(fs::path(target_), tmp);
  if (fd < 0)
    throw ConfigError(flag_, path_,
                      "cannot be written (no new file can be made beside it: " + reason() + ")");
  // Synced before the rename: after a crash the target is the old file or the whole new one, never empty.
  bool ok = ::fchmod(fd, mode) == 0 && write_all(fd, text) && ::fsync(fd) == 0;
  const int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(tmp.c_str(), target_.c_str()) == 0) return;
  const std::string why = std::strerror(ok ? errno : saved);
  ::unlink(tmp.c_str());
  throw ConfigError(flag_, path_, "write failed, the file is unchanged: " + why);
}

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct Id {
    bool stream = false, exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    std::string name;
  };
  auto identify = [](const std::string& p) {
    Id id;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      id.exists = true;
      id.stream = S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode);
      id.dev = st.st_dev;
      id.ino = st.st_ino;
    }
    std::error_code ec;
    id.name = fs::weakly_canonical(fs::absolute(p, ec), ec).string();
    return id;
  };
  auto same = [](const Id& a, const Id& b) {
    if (a.stream || b.stream) return false;
    if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
    return a.name == b.name;
  };
  std::vector<Id> out_ids;
  for (const auto& [flag, path] : outputs) {
    out_ids.push_back(identify(path));
    for (std::size_t i = 0; i + 1 < out_ids.size(); ++i)
      if (!path.empty() && same(out_ids[i], out_ids.back()))
        throw ConfigError(flag, path,
                          "names the same file as " + outputs[i].first + " (" + outputs[i].second +
                              "): each output needs its own file");
  }
  for (const auto& [in_flag, in_path] : inputs) {
    if (in_path.empty()) continue;
    const Id in = identify(in_path);
    if (!in.exists) continue;  // reading it fails with its own message
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (!outputs[i].second.empty() && same(out_ids[i], in))
        throw ConfigError(
            outputs[i].first, outputs[i].second,
            "names the input " + in_flag + " (" + in_path + "): writing it would replace the input");
  }
}

}  // namespace amoeba::engine
