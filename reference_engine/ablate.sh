#!/usr/bin/env bash
# The main job: the simulated ablation of expert/KV memory policies (default: Qwen1.5-MoE-A2.7B on a simulated
# RTX 5090, ShareGPT-like trace at 10 req/s, 1000 requests, seed 0, every policy). Installs what it needs
# (only what is missing), configures the `default` CMake preset (build/default), builds only the CLI, and
# runs `amoeba ablate` with the arguments given, e.g.
#   reference_engine/ablate.sh
#   reference_engine/ablate.sh --policies static,fixed,elastic --json results.json
set -euo pipefail
cd "$(dirname "$0")/.."

source cmake/install_deps.sh

if [[ ! -f build/default/build.ninja ]]; then
  cmake --preset default >&2
fi
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
cmake --build build/default --target amoeba_cli -j "$jobs" >&2
exec build/default/reference_engine/amoeba ablate "$@"
