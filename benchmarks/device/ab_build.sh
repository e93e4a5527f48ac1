#!/usr/bin/env bash
# Builds the CUDA backend (`amoeba`) and paged_moe_bench of two revisions side by side, for an A/B in one
# device call (e.g. a decode-table change served by benchmarks/device/engine_decode.sh under each): a git
# worktree per revision under build/ab/<rev>, configured with the ci preset, and the two binaries with
# libfmt.so.9 copied into $DEST/a and $DEST/b (carry $DEST; BIN=$DEST/a, BIN=$DEST/b). Run here, where nvcc
# is; ~5 minutes per revision on 2 cores.
#   [DEST=.gpu/ab] bash benchmarks/device/ab_build.sh REV_A REV_B
set -euo pipefail
[[ $# == 2 ]] || { echo "usage: [DEST=.gpu/ab] $0 REV_A REV_B" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cd "$root"
source cmake/install_deps.sh
dest=${DEST:-.gpu/ab}
fmt=$(ldconfig -p | awk '/libfmt\.so\.9 / {print $NF; exit}')
[[ -n $fmt ]] || { echo "libfmt.so.9 not found (cmake/install_deps.sh installs it)" >&2; exit 1; }
for side in a b; do
  rev=$([[ $side == a ]] && echo "$1" || echo "$2")
  sha=$(git rev-parse --short "$rev^{commit}")
  tree=build/ab/$sha
  [[ -d $tree ]] || git worktree add --detach "$tree" "$sha" >/dev/null
  (cd "$tree" && cmake --preset ci >/dev/null && cmake --build --preset ci -j"$(nproc)" --target amoeba paged_moe_bench)
  mkdir -p "$dest/$side"
  cp "$tree/build/ci/reference_engine/amoeba" "$tree/build/ci/benchmarks/device/paged_moe_bench" "$dest/$side/"
  cp -L "$fmt" "$dest/$side/libfmt.so.9"
  echo "$side = $rev ($sha): $dest/$side"
done
