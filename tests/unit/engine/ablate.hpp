// The engine tests' ablation: every run of a scenario (its labelled runs, else one per policy) on its
// requests, as `amoeba ablate` runs them, without the CLI.
#pragma once

#include <vector>

#include "engine/policy_dispatch.hpp"
#include "engine/scenario.hpp"

namespace amoeba::engine::testing {

inline std::vector<RunResult> ablate(const Scenario& s) {
  const auto trace = scenario_requests(s);
  std::vector<RunResult> out;
  for (const RunSetup& r : prepare_runs(s, trace, RunOptions{})) out.push_back(run_policy(r));
  return out;
}

}  // namespace amoeba::engine::testing
