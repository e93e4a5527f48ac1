// Output of runs: the ablation table (stdout), JSON and CSV files, the per-step timeline CSV. Files are
// written to a temporary file next to the target and renamed over it, so a failed run never leaves a
// half-written file. Every output says the GPU is simulated.
#pragma once

#include <string>
#include <vector>

#include "engine/metrics.hpp"
#include "engine/scenario.hpp"

namespace amoeba::engine {

std::string ablation_table(const Scenario& s, const std::vector<RunResult>& results);
std::string ablation_json(const Scenario& s, const std::vector<RunResult>& results);
std::string ablation_csv(const Scenario& s, const std::vector<RunResult>& results);
std::string timeline_csv(const RunResult& r);

// Checks before a run that `path` can be written (its directory exists, it is not a directory), so a run
// that would fail only at the end is refused up front. Throws ConfigError naming the flag.
void check_output_path(const std::string& path, const std::string& flag);
// Writes `text` to `path` atomically (temp file + rename). Throws ConfigError naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& text, const std::string& flag);

}  // namespace amoeba::engine
