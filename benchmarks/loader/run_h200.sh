#!/usr/bin/env bash
# One device call for the loader: GPU tests, compute-sanitizer (memcheck, racecheck, synccheck) on a short run,
# then the benchmark, which writes loader_h200.json. Binaries come from a build made elsewhere
# (BIN, default .gpu/loader) or from build/gpu after `cmake --preset gpu && cmake --build --preset gpu`.
#   usage: bash benchmarks/loader/run_h200.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-.}}
bin=${BIN:-.gpu/loader}
[ -x "$bin/device_loader_tests" ] || bin=build/gpu
tests="$bin/device_loader_tests"
[ -x "$tests" ] || tests="$bin/tests/device_loader/device_loader_tests"
bench="$bin/bench_loader"
[ -x "$bench" ] || bench="$bin/benchmarks/loader/bench_loader"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/loader_gpu.txt"
status=0
echo "== device tests"
"$tests" --durations yes 2>&1 | tee "$out/loader_tests.log" | tail -25 || status=1
echo "== compute-sanitizer (30 forwards each; the deliberate-race control case excluded)"
for tool in memcheck racecheck synccheck; do
  AMOEBA_LOADER_FORWARDS=30 compute-sanitizer --tool $tool --error-exitcode 9 "$tests" \
    "~the hash detects a missing wait" > "$out/loader_sanitizer_$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/loader_sanitizer_$tool.log" | tail -1)"
  [ $rc = 0 ] || status=1
done
echo "== benchmark"
"$bench" "$out/loader_h200.json" 2>&1 | tee "$out/loader_bench.log" | tail -30 || status=1
exit $status
