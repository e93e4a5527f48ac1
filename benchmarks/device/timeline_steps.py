#!/usr/bin/env python3
"""Per-step views of `amoeba validate` timelines (--csv-measured / --csv-simulated), the numbers behind the
diagnoses in docs/results/calibration_h200.md.

    python3 benchmarks/device/timeline_steps.py kinds MEASURED.csv [--simulated SIMULATED.csv]
    python3 benchmarks/device/timeline_steps.py pairs MEASURED.csv SIMULATED.csv
    python3 benchmarks/device/timeline_steps.py priced MEASURED.csv [--max-batch 16]

kinds: forward steps grouped by kind (decode: every sequence adds one token; with-prefill: the rest) and by
whether the step's token count appeared before in the run (a new size), with the count of steps, the medians
of step, attention, MoE and host-forward milliseconds, and the steps whose forward host time reached 400 ms
(with AMOEBA_GATE_FORWARD=1: the gate's timeout); with --simulated, the simulated attention and step medians
of the first simulated step of the same (running, tokens) shape.
pairs: measured and simulated steps paired in order by (running, tokens), each simulated step used once; the
relative difference of their H2D bytes, |sim / meas - 1| over pairs where the measured step copied: median and
p90, over all pairs and over pairs of at most 4 sequences (what makes a paired step error more than the cost
model's).
priced: the decode steps by batch size (every sequence adds one token), with the count of steps, the median
of priced_ms / step_ms - 1 (the simulator pricing the measured step itself) and the medians of the step's
measured milliseconds: attention phases, MoE phases, the LM head (dense_ms on a model without dense layers),
the rest of the step outside them (step - attention - MoE - dense: the router GEMM and top-k between a
layer's attention and MoE phases, the embedding, host gaps) and the step; batches above --max-batch in groups
of 8.
"""
import argparse
import csv
import statistics as st
from collections import defaultdict


def forward_rows(path):
    return [r for r in csv.DictReader(open(path)) if int(r["batch_tokens"]) > 0]


def key(r):
    return int(r["running"]), int(r["batch_tokens"])


def is_decode(r):
    if r.get("decode_seqs") not in (None, ""):
        return int(r["decode_seqs"]) == int(r["running"])
    return int(r["batch_tokens"]) == int(r["running"])


def p90(v):
    v = sorted(v)
    return v[int(0.9 * (len(v) - 1))]


def kinds(args):
    m = forward_rows(args.measured)
    sim = defaultdict(list)
    if args.simulated:
        for r in forward_rows(args.simulated):
            sim[key(r)].append(r)
    groups = defaultdict(list)
    seen = set()
    for r in m:
        t = int(r["batch_tokens"])
        groups[("decode" if is_decode(r) else "with-prefill", "seen" if t in seen else "new")].append(r)
        seen.add(t)
    cols = ["step_ms", "attention_ms", "moe_ms", "forward_host_ms"]
    print(f"{'kind':<13} {'size':<5} {'steps':>6} " + " ".join(f"{c:>15}" for c in cols) +
          f" {'host>=400ms':>11}" + (f" {'sim attention':>13} {'sim step':>9}" if args.simulated else ""))
    for (kind, size), rows in sorted(groups.items()):
        line = f"{kind:<13} {size:<5} {len(rows):>6} " + " ".join(
            f"{st.median(float(r[c]) for r in rows):>15.2f}" for c in cols)
        line += f" {sum(float(r['forward_host_ms']) >= 400 for r in rows):>11}"
        if args.simulated:
            s = [sim[key(r)][0] for r in rows if sim[key(r)]]
            line += (f" {st.median(float(x['attention_ms']) for x in s):>13.2f}"
                     f" {st.median(float(x['step_ms']) for x in s):>9.2f}") if s else f" {'-':>13} {'-':>9}"
        print(line)


def pairs(args):
    sim = defaultdict(list)
    for r in forward_rows(args.simulated):
        sim[key(r)].append(r)
    used = defaultdict(int)
    diff, small = [], []
    for r in forward_rows(args.measured):
        k = key(r)
        if used[k] >= len(sim[k]):
            continue
        s = sim[k][used[k]]
        used[k] += 1
        a, b = float(r["h2d_bytes"]), float(s["h2d_bytes"])
        if a <= 0:
            continue
        d = abs(b / a - 1)
        diff.append(d)
        if int(r["running"]) <= 4:
            small.append(d)
    for name, v in (("all pairs", diff), ("<= 4 sequences", small)):
        if v:
            print(f"{name:<15} {len(v):>6} pairs: |H2D bytes sim / meas - 1| median {100 * st.median(v):.1f}%, "
                  f"p90 {100 * p90(v):.1f}%")


def priced(args):
    groups = defaultdict(list)
    for r in forward_rows(args.measured):
        if not is_decode(r):
            continue
        b = int(r["batch_tokens"])
        groups[b if b <= args.max_batch else b // 8 * 8].append(r)
    cols = ["attention_ms", "moe_ms", "dense_ms"]
    print(f"{'batch':>5} {'steps':>6} {'priced err':>10} {'attn ms':>8} {'MoE ms':>7} {'head ms':>8} "
          f"{'rest ms':>8} {'step ms':>8}")
    for b, rows in sorted(groups.items()):
        err = st.median(float(r["priced_ms"]) / float(r["step_ms"]) - 1 for r in rows)
        rest = st.median(float(r["step_ms"]) - sum(float(r[c]) for c in cols) for r in rows)
        print(f"{b:>5} {len(rows):>6} {100 * err:>+9.1f}% " +
              " ".join(f"{st.median(float(r[c]) for r in rows):>{w}.2f}" for c, w in zip(cols, (8, 7, 8))) +
              f" {rest:>8.2f} {st.median(float(r['step_ms']) for r in rows):>8.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kinds")
    k.add_argument("measured")
    k.add_argument("--simulated")
    p = sub.add_parser("pairs")
    p.add_argument("measured")
    p.add_argument("simulated")
    q = sub.add_parser("priced")
    q.add_argument("measured")
    q.add_argument("--max-batch", type=int, default=16)
    args = ap.parse_args()
    {"kinds": kinds, "pairs": pairs, "priced": priced}[args.cmd](args)


if __name__ == "__main__":
    main()
