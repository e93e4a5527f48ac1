#!/usr/bin/env python3
"""Two builds of the CUDA backend side by side at fixed batches (benchmarks/device/engine_decode.sh run once
per build and round, interleaved): per batch, each side's decode-step medians (overheads.py's table: step and
MoE ms, step / HBM floor) as mean ± sd over its runs, and B / A run by run (the i-th run of A against the
i-th of B) as mean ± sd.
    python3 benchmarks/device/engine_ab.py --a A_r1/decode_b7_cap0_r1.csv ... --b B_r1/decode_b7_cap0_r1.csv ...
        [--context 544] [--precision bf16] [--json OUT.json]
Each CSV is one run's timeline; its batch is read from the file (the decode steps' running sequences).
--context: every decode step's context (engine_decode.sh: the prompt + 32, 544 for batches up to 64).
"""
import argparse
import collections
import json
import statistics as st

import overheads


def runs(paths, context):
    """batch -> [overheads row] in the order given."""
    by_batch = collections.defaultdict(list)
    for path in paths:
        rows, _ = overheads.rows(path)
        batch = st.median(int(x["running"]) for x in rows if int(x["batch_tokens"]) == int(x["running"]))
        by_batch[round(batch)] += overheads.table(path, None, [round(batch)], context)
    return by_batch


def mean_sd(xs):
    return f"{st.mean(xs):.3f} ± {st.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", nargs="+", required=True)
    ap.add_argument("--b", nargs="+", required=True)
    ap.add_argument("--context", type=int, default=544)
    ap.add_argument("--precision", default="bf16", choices=sorted(overheads.MATRIX_BYTES))
    ap.add_argument("--json", help="also write each batch's runs and ratios here")
    args = ap.parse_args()
    overheads.set_precision(args.precision)
    a, b = runs(args.a, args.context), runs(args.b, args.context)
    out = {}
    print("| batch | runs | step ms A | step ms B | step B / A | MoE ms A | MoE ms B | MoE B / A | step / floor A → B |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in sorted(set(a) & set(b)):
        ra, rb = a[batch], b[batch]
        pairs = list(zip(ra, rb))
        col = lambda rs, key: [r[key] for r in rs]
        ratio = lambda key: [y[key] / x[key] for x, y in pairs]  # B / A, run by run
        out[batch] = {"a": ra, "b": rb, "step_ratio": ratio("step_ms"), "moe_ratio": ratio("moe_ms")}
        print(f"| {batch} | {len(pairs)} | {mean_sd(col(ra, 'step_ms'))} | {mean_sd(col(rb, 'step_ms'))} | "
              f"{mean_sd(out[batch]['step_ratio'])} | {mean_sd(col(ra, 'moe_ms'))} | "
              f"{mean_sd(col(rb, 'moe_ms'))} | {mean_sd(out[batch]['moe_ratio'])} | "
              f"{st.mean(col(ra, 'step_over_floor')):.2f} → {st.mean(col(rb, 'step_over_floor')):.2f} |")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
