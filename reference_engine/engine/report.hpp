// Output of runs: the ablation table (stdout), JSON and CSV files, the per-step timeline CSV. Every output
// says whether its times are simulated or measured (the backend's table entry: the table's first line, the
// JSON's "simulated", the CSV's `simulated` column), and reports the workload that ran: a trace file's own
// request count and rate, not the generator's settings.
//
// Output files (OutputFile) are checked before a run, so that a run is never wasted on a path it cannot
// write, and written after it without ever destroying what the path named:
//   - a missing path or a regular file is written to a fresh temporary file in the same directory, synced,
//     and renamed over the target: a reader sees the old file or the whole new one, never half of it;
//   - a character device or a FIFO (/dev/null, /dev/stdout on a terminal or pipe, `>(cmd)`) is written in
//     place: a rename would replace the node itself with a regular file;
//   - anything else (a directory, a block device, a socket, a dangling link) is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/metrics.hpp"
#include "engine/scenario.hpp"
#include "engine/workload.hpp"

namespace amoeba::engine {

// The requests a run was given, as reports describe them.
struct WorkloadReport {
  bool from_trace = false;
  std::uint64_t requests = 0;
  // Generated: the configured rate. Trace: (requests - 1) / duration, none when every request arrives at
  // once.
  std::optional<double> rate;
  std::optional<double> duration_s;  // first to last arrival; none when the arrivals are not known
};
WorkloadReport describe_workload(const Scenario& s, const std::vector<Request>& requests);

std::string ablation_table(const Scenario& s, const WorkloadReport& w, const std::vector<RunResult>& results);
// A simulated run of int8 / int4 experts whose cost model has no fit for that precision (no token-scale
// table of it: it was not calibrated on the quantized kernel) is priced with prior factors: the line that
// says so (in the table's header and the JSON's `cost_model_note`), else "" (bf16, a measured run, or a fit).
std::string precision_cost_note(const Scenario& s);
std::string ablation_json(const Scenario& s, const WorkloadReport& w, const std::vector<RunResult>& results);
std::string ablation_csv(const Scenario& s, const WorkloadReport& w, const std::vector<RunResult>& results);
// For a generated workload (the scenario's own settings); with a trace, the results' request count and no
// rate.
std::string ablation_json(const Scenario& s, const std::vector<RunResult>& results);
std::string timeline_csv(const RunResult& r);

class OutputFile {
 public:
  // Checks `path` now (throws ConfigError naming `flag`): not empty, not a directory, block device, socket or
  // dangling link; a regular file must be writable; a new file must be creatable in its directory (a probe
  // file is made and removed); a FIFO must have a reader (it stays open until write(), so the reader sees one
  // writer).
  OutputFile(std::string path, std::string flag);
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  ~OutputFile();

  // Writes `text` as the header describes. Throws ConfigError naming the flag, the path and the system's
  // reason (a full disk included); a renamed target is then left as it was.
  void write(std::string_view text);

  const std::string& path() const noexcept { return path_; }
  const std::string& flag() const noexcept { return flag_; }
  bool in_place() const noexcept { return fd_ >= 0; }

 private:
  std::string path_, flag_;
  std::string target_;  // what a rename replaces: the final target of a symbolic link
  int fd_ = -1;         // in-place targets only
};

// Refuses one regular (or not yet existing) file named by two outputs, or by an output and an input; each
// pair is (flag, path). Character devices and FIFOs may be shared: they are written in place, nothing is
// replaced.
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs);

}  // namespace amoeba::engine
