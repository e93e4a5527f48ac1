#!/usr/bin/env bash
# PagedMoe against vLLM's fused_moe on one lease, in one device call: for each seed a paged_moe_bench process
# then a vllm_peer.py process (the same models and token counts), then peer_compare.py over the pairs whose
# two files exist (a vLLM process that runs out of its time, e.g. Triton's first compilations, drops its
# pair). Needs .peer/ (benchmarks/device/vllm_peer_fetch.sh, run where PyPI is reachable; carry it with the
# binaries: `carry: [".gpu/…", ".peer"]`) and torch + triton on the device machine.
#   BIN=.gpu/… OUT=$OUT [SEEDS=3] [MODELS=qwen15,qwen3,mixtral] [TOKENS=1,16,64,1024,4096,16384]
#   [PEER_ARGS="--config-device NVIDIA_H200"] [PEER_TIMEOUT=90] bash benchmarks/device/peer_run.sh
# Writes $OUT/peer.md (peer_compare.py's table) and $OUT/peer.tgz (every bench and vLLM JSON and log, and
# peer.json).
set -uo pipefail
: "${BIN:?BIN must name the folder holding paged_moe_bench}"
: "${OUT:?OUT must name an output folder}"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
models=${MODELS:-qwen15,qwen3,mixtral}
tokens=${TOKENS:-1,16,64,1024,4096,16384}
status=0
ours=()
peer=()
for seed in $(seq 1 "${SEEDS:-3}"); do
  timeout 120 "$BIN/paged_moe_bench" --models "$models" --tokens "$tokens" --placement shuffled --seed "$seed" \
    --seconds 0.1 --json "$OUT/bench_$seed.json" >"$OUT/bench_$seed.log" 2>&1
  rc_ours=$?
  # shellcheck disable=SC2086  # PEER_ARGS is a list of arguments
  timeout "${PEER_TIMEOUT:-90}" python3 "$here/vllm_peer.py" --models "$models" --tokens "$tokens" \
    ${PEER_ARGS:-} --json "$OUT/vllm_$seed.json" >"$OUT/vllm_$seed.log" 2>&1
  rc_peer=$?
  echo "seed $seed: paged_moe_bench rc=$rc_ours, vllm_peer.py rc=$rc_peer"
  if [[ $rc_ours -eq 0 && $rc_peer -eq 0 && -s $OUT/bench_$seed.json && -s $OUT/vllm_$seed.json ]]; then
    ours+=("$OUT/bench_$seed.json")
    peer+=("$OUT/vllm_$seed.json")
  else
    status=1
  fi
done
if [[ ${#ours[@]} -gt 0 ]]; then
  python3 "$here/peer_compare.py" --ours "${ours[@]}" --peer "${peer[@]}" --json "$OUT/peer.json" | tee "$OUT/peer.md" ||
    status=1
else
  echo "no seed gave both files" | tee "$OUT/peer.md"
  status=1
fi
# Few files come back from a device call: everything but the table travels as one archive.
(cd "$OUT" && tar czf peer.tgz --exclude=peer.tgz --exclude=peer.md ./* &&
  find . -maxdepth 1 -type f ! -name peer.tgz ! -name peer.md -delete)
exit $status
