#!/usr/bin/python3
"""The per-step timeline of one run (`amoeba run --csv FILE`, either backend) as one figure:
  top     each step's time split into its phases (attention, MoE, dense/LM head, copy stall) and what is left of
          the step (host work the GPU did not hide, or the modelled per-step overhead), per forward step;
  middle  running and waiting requests, and the batch's tokens;
  bottom  resident experts and free KV pages (% of their most), and expert bytes over PCIe per step.
The title says SIMULATED or MEASURED: a measured timeline (`--backend cuda`) has host times (host_ms or
forward_host_ms) above zero, a simulated one has none.
    python3 reference_engine/scripts/plot_timeline.py TIMELINE.csv --out PNG [--title TEXT] [--last N]
(needs matplotlib: pip install matplotlib)
"""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--last", type=int, default=0, help="plot only the last N steps")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if a.last:
        rows = rows[-a.last:]
    f = lambda k: [float(r.get(k) or 0) for r in rows]  # noqa: E731
    measured = any(float(r.get("host_ms") or 0) > 0 or float(r.get("forward_host_ms") or 0) > 0 for r in rows)
    t = f("time_s")
    att, moe, dense, stall, step = f("attention_ms"), f("moe_ms"), f("dense_ms"), f("stall_ms"), f("step_ms")
    rest = [max(0.0, s - a_ - m - d - st) for s, a_, m, d, st in zip(step, att, moe, dense, stall)]
    fig, ax = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax[0].stackplot(t, att, moe, dense, stall, rest,
                    labels=["attention", "MoE", "dense / LM head", "copy stall",
                            "rest (unhidden host work)" if measured else "rest (step overhead)"])
    ax[0].set_ylabel("ms per step")
    ax[0].legend(loc="upper left", fontsize=8)
    ax[1].plot(t, f("running"), label="running")
    ax[1].plot(t, f("waiting"), label="waiting")
    ax[1].set_ylabel("requests")
    tw = ax[1].twinx()
    tw.plot(t, f("batch_tokens"), color="grey", alpha=0.4, label="batch tokens")
    tw.set_ylabel("tokens in the step")
    ax[1].legend(loc="upper left", fontsize=8)
    res, kv = f("resident_experts"), f("free_kv_pages")
    pct = lambda v: [100 * x / max(max(v), 1) for x in v]  # noqa: E731
    ax[2].plot(t, pct(res), label=f"resident experts (% of {max(res):.0f})")
    ax[2].plot(t, pct(kv), label=f"free KV pages (% of {max(kv):.0f})")
    ax[2].set_ylabel("% of most")
    ax[2].set_xlabel("time (s)")
    tw2 = ax[2].twinx()
    tw2.plot(t, [b / 1e6 for b in f("h2d_bytes")], color="red", alpha=0.4, label="expert MB over PCIe")
    tw2.set_ylabel("MB over PCIe per step")
    ax[2].legend(loc="upper left", fontsize=8)
    kind = "MEASURED on a GPU" if measured else "SIMULATED (cost model, no GPU)"
    fig.suptitle(f"{kind}: {a.title}" if a.title else kind)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
