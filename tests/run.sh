#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the Debian packages it needs, builds everything with the
# `ci` preset (host code with -Werror; CUDA kernels compiled when nvcc is at /usr/local/cuda), the CLI once more
# without CUDA (the `host` preset, -Werror too), and runs every test through ctest. GPU tests are registered and
# reported as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

source cmake/install_deps.sh

cmake --preset ci
cmake --build --preset ci -j "$(nproc)"
# The host code builds without CUDA too (a laptop; the main job's default preset has no CUDA backend): the CLI
# in the `host` preset, so a host source that reaches a header only the CUDA targets put on its include path
# fails here, not in reference_engine/ablate.sh.
cmake --preset host -DAMOEBA_WERROR=ON >/dev/null
cmake --build --preset host --target amoeba_cli -j "$(nproc)"
ctest --preset ci "$@"
