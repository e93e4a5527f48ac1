#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those missing (checked with dpkg -s). Sourced by the
# README's two commands (tests/run.sh, reference_engine/ablate.sh); messages go to stderr.
amoeba_pkgs=(cmake ninja-build g++ catch2 librange-v3-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev)
amoeba_missing=()
for p in "${amoeba_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || amoeba_missing+=("$p"); done
if ((${#amoeba_missing[@]})); then
  amoeba_sudo=()
  [[ $(id -u) -ne 0 ]] && amoeba_sudo=(sudo)
  echo "installing: ${amoeba_missing[*]}" >&2
  "${amoeba_sudo[@]}" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${amoeba_sudo[@]}" apt-get install -y -qq "${amoeba_missing[@]}" >&2
fi
