#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the Debian packages it needs, builds everything with the
# `ci` preset (host code with -Werror; CUDA kernels compiled when nvcc is at /usr/local/cuda) and runs every test
# through ctest. GPU tests are registered and reported as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

source cmake/install_deps.sh

cmake --preset ci
cmake --build --preset ci -j "$(nproc)"
ctest --preset ci "$@"
