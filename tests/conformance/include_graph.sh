#!/usr/bin/env bash
# The include graph that DESIGN §3.7 fixes, checked on the source tree (ctest `include_graph`):
#   include/        the core: nothing from policies/, kernels/, reference_engine/, no CUDA header;
#   policies/       nothing from kernels/ or reference_engine/;
#   kernels/ and reference_engine/ both reach the step contract in include/amoeba/engine/.
# Prints every offending line; exits 1 if there is one.
set -uo pipefail
root=${1:-$(dirname "$0")/../..}
cd "$root" || exit 2
fail=0
check_none() {  # check_none DIR REGEX WHAT
  local hits
  hits=$(grep -rnE --include='*.hpp' --include='*.h' --include='*.cuh' --include='*.cpp' --include='*.cu' \
    "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($2)" "$1")
  if [[ -n "$hits" ]]; then
    echo "include graph: $1 must not include $3:"
    echo "$hits"
    fail=1
  fi
}
check_some() {  # check_some DIR REGEX WHAT
  if ! grep -rqE --include='*.hpp' --include='*.cuh' --include='*.cpp' --include='*.cu' \
    "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($2)" "$1"; then
    echo "include graph: nothing in $1 includes $3"
    fail=1
  fi
}
check_none include 'amoeba/policies/|engine/|moe/|loader/|cli/|cuda|cub/|thrust/|cute/|cutlass/' \
  'policies/, reference_engine/, kernels/ or CUDA headers'
check_none policies 'engine/|moe/|loader/|cli/|cuda|cub/|thrust/' 'reference_engine/, kernels/ or CUDA headers'
check_some kernels 'amoeba/engine/' 'the step contract (amoeba/engine/)'
check_some reference_engine 'amoeba/engine/' 'the step contract (amoeba/engine/)'
[[ $fail -eq 0 ]] && echo "include graph: ok"
exit $fail
