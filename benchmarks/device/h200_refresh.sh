#!/usr/bin/env bash
# The H200 measurements behind docs/results/paged_moe_h200.md and quantized_h200.md, in two device calls of
# a few minutes each (2026-12-06, 0eba8eb: part 1 took 3 min, part 2 about 6), so that a lease that comes
# by chance yields the whole set. Each part checks the card first and, unless ANY_GPU=1, runs nothing on
# another one (it prints the card and exits 0: an H100 lease costs only its start).
#   PART=1: the split-K device tests, run.sh's bf16 table with shuffled views (3 processes, sustained matmul
#           rate), the split-K decode at one token against the decode tiles and, for bf16 and int4, against
#           their former form of 64 features on 4 warps (sk-q64, int4-sk-q64; int8 interleaved; 3
#           processes), bf16's pairs with two W1 / W3 steps in flight (sk-p128s2) against the default,
#           quant_run.sh's bf16 / int8 / int4 table (3 processes, no sweep).
#   PART=2: run.sh's table again with adjacent views (3 processes), precision_alone.sh (2 seeds), and, where
#           .peer/ exists (benchmarks/device/vllm_peer_fetch.sh), peer_run.sh (vLLM on the same lease).
#   PART=0: the decode sizes alone, for a lease that comes with little device time left (a few minutes with the
#           machine's start): quant_run.sh's bf16 / int8 / int4 table at 1–64 tokens (3 processes), the
#           routed-only Qwen1.5 added to its models (bf16's one-token target names it), into $OUT/q
#           (quant_report.py reads it as part 1's).
#   ADJACENT=1 on part 1 runs part 2's adjacent views at its end (on an H100 at 539995a part 1 took 170 s and
#   the adjacent views 74 s of command time), so that one call yields the whole bf16 table and the quantized
#   one; ADJACENT=0 on part 2 then leaves them out. Machine starts fail often: one call that holds both tables
#   is worth more than two.
#   BIN=.gpu/… OUT=$OUT PART=0|1|2 [ADJACENT=0|1] [COMMIT=…] [ANY_GPU=0] bash benchmarks/device/h200_refresh.sh
# BIN holds paged_moe_bench and paged_moe_device_test (e.g. gzip'd by the caller and
# unpacked first). Then, here: report.py over part 1's t/bench_*.json and the adj/bench_*.json of part 2 (of
# part 1 with ADJACENT=1), with part 1's torch.json and matmul_sustained.json, for the table; compare.py
# --floor on splitk/s_*.json (part 1 prints it); quant_report.py on the quant_p*.json in q/quant.tgz;
# alone/alone.txt (precision_alone.py's tables) and peer/peer.md (part 2 prints it).
set -uo pipefail
: "${BIN:?BIN must name the folder holding the binaries}"
: "${OUT:?OUT must name an output folder}"
: "${PART:?PART must be 0, 1 or 2}"
cd "$(dirname "$0")/../.." || exit 1
here=benchmarks/device
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$card"
if [[ $card != *H200* && ${ANY_GPU:-0} != 1 ]]; then
  echo "not an H200: nothing run (ANY_GPU=1 runs anyway)"
  exit 0
fi
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
status=0
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# run.sh's table with adjacent views into $OUT/adj (part 2's first step, or part 1's last with ADJACENT=1).
adjacent_views() {
  OUT=$OUT/adj BIN=$BIN COMMIT=$commit SKIP_TESTS=1 SKIP_SANITIZER=1 SUSTAINED=0 PLACEMENTS=adjacent \
    timeout 200 bash $here/run.sh | tail -4 || status=1
  stamp "bf16 table (adjacent views)"
}
if [[ $PART == 0 ]]; then
  mkdir -p "$OUT/q"
  BIN=$BIN OUT=$OUT/q SWEEP=0 PROCESSES=3 TOKENS=1,3,16,33,64 MODELS=qwen15,qwen15_shared,qwen3,mixtral \
    timeout 170 bash $here/quant_run.sh >"$OUT/quant_run.log" 2>&1 || status=1
  stamp "quantized decode table: $(tr '\n' ' ' <"$OUT/quant_run.log")"
elif [[ $PART == 1 ]]; then
  timeout 120 "$BIN/paged_moe_device_test" "split-K*" >"$OUT/splitk_tests.txt" 2>&1 || status=1
  stamp "split-K tests: $(grep -E 'All tests passed|test cases' "$OUT/splitk_tests.txt" | tail -1)"
  grep -E "clusters at once" "$OUT/splitk_tests.txt"
  OUT=$OUT/t BIN=$BIN COMMIT=$commit SKIP_TESTS=1 SKIP_SANITIZER=1 PLACEMENTS=shuffled \
    timeout 300 bash $here/run.sh | tail -6 || status=1
  stamp "bf16 table (shuffled views)"
  mkdir -p "$OUT/splitk"
  for i in 1 2 3; do
    timeout 60 "$BIN/paged_moe_bench" --models qwen3,qwen15,qwen15_shared,qwen3_next,mixtral,chain_qwen3 --tokens 1 \
      --config default,nosplitk,sk-q64,sk-p128s2,int8,int8-nosplitk,int4,int4-nosplitk,int4-sk-q64 --seed "$i" \
      --placement shuffled --seconds 0.1 --json "$OUT/splitk/s_$i.json" >"$OUT/splitk/s_$i.log" 2>&1 || status=1
  done
  for pair in "nosplitk default" "sk-q64 default" "default sk-p128s2" "int8-nosplitk int8" "int4-nosplitk int4" \
    "int4-sk-q64 int4"; do
    # shellcheck disable=SC2086  # two configuration names
    python3 $here/compare.py --floor $pair "$OUT"/splitk/s_*.json
  done | tee "$OUT/splitk/splitk.md"
  stamp "split-K at one token"
  mkdir -p "$OUT/q"
  BIN=$BIN OUT=$OUT/q SWEEP=0 PROCESSES=3 timeout 300 bash $here/quant_run.sh >"$OUT/quant_run.log" 2>&1 || status=1
  stamp "quantized table: $(tr '\n' ' ' <"$OUT/quant_run.log")"
  if [[ ${ADJACENT:-0} == 1 ]]; then
    adjacent_views
  fi
elif [[ $PART == 2 ]]; then
  if [[ ${ADJACENT:-1} == 1 ]]; then
    adjacent_views
  fi
  BIN=$BIN OUT=$OUT/alone SEEDS=2 RUN_SECONDS=1.0 timeout 240 bash $here/precision_alone.sh >"$OUT/alone.log" 2>&1 ||
    status=1
  stamp "precisions alone"
  if [[ -f .peer/fused_moe.py ]]; then
    BIN=$BIN OUT=$OUT/peer SEEDS=3 PEER_TIMEOUT=75 timeout 240 bash $here/peer_run.sh | tail -25 || status=1
    stamp "vLLM on the same lease"
  else
    echo "no .peer/: vLLM skipped (benchmarks/device/vllm_peer_fetch.sh, then carry .peer)"
  fi
else
  echo "PART must be 0, 1 or 2, not $PART"
  exit 2
fi
# Few files come back from a device call: one archive per part, nothing else left under $OUT.
(cd "$OUT" && tar czf "h200_part$PART.tgz" --exclude="./h200_part$PART.tgz" ./* 2>/dev/null &&
  find . -mindepth 1 -maxdepth 1 ! -name "h200_part$PART.tgz" -exec rm -rf {} +)
exit $status
