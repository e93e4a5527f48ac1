#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the Debian packages it needs, builds everything with the
# `ci` preset (host code with -Werror; CUDA kernels compiled when nvcc is at /usr/local/cuda) and runs every test
# through ctest. GPU tests are registered and reported as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake ninja-build g++ catch2 librange-v3-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

cmake --preset ci
cmake --build --preset ci -j "$(nproc)"
ctest --preset ci "$@"
