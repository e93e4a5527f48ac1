#!/usr/bin/python3
"""Plots for docs/reproducing.md from the CSVs reference_engine/scripts/sweeps.sh writes (all SIMULATED).

docs/plots/motivating.png        peak concurrency and forward steps per policy, next to the paper's numbers
docs/plots/rate_sweep.png        throughput and TTFT p50 vs request rate, per policy
docs/plots/offload_limit.png     throughput, TTFT and TPOT vs expert_offload_limit (elastic vs fixed)
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RES = os.path.join(ROOT, "docs", "results")
PLOTS = os.path.join(ROOT, "docs", "plots")
SIM = "SIMULATED (reference engine cost model, no GPU)"


def rows(name):
    with open(os.path.join(RES, name)) as f:
        return list(csv.DictReader(f))


def motivating():
    r = {x["policy"]: x for x in rows("engine_default_ablation.csv")}
    pols = ["static", "fixed", "elastic"]
    paper_peak, paper_steps = [34, 74, 90], [2100, 1300, 1000]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    xs = range(len(pols))
    w = 0.38
    ax[0].bar([x - w / 2 for x in xs], [int(r[p]["peak_concurrency"]) for p in pols], w, label="simulated")
    ax[0].bar([x + w / 2 for x in xs], paper_peak, w, label="paper (RTX 5090)")
    ax[0].set_title("peak concurrent requests")
    ax[1].bar([x - w / 2 for x in xs], [int(r[p]["forward_steps"]) for p in pols], w, label="simulated, 1000 req")
    r250 = {x["policy"]: x for x in rows("engine_default_ablation_250.csv")}
    ax[1].bar([x + w / 2 for x in xs], [int(r250[p]["forward_steps"]) for p in pols], w / 2,
              label="simulated, 250 req")
    ax[1].bar([x + w for x in xs], paper_steps, w / 2, label="paper")
    ax[1].set_title("forward steps to drain the trace")
    for a in ax:
        a.set_xticks(list(xs))
        a.set_xticklabels(["static (vLLM)", "fixed (Fate)", "elastic (Rimuru)"])
        a.legend(fontsize=8)
    fig.suptitle("Qwen1.5-MoE-A2.7B, RTX 5090, ShareGPT-like at 10 req/s -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "motivating.png"), dpi=110)


def rate_sweep():
    data = rows("engine_rate_sweep.csv")
    pols = sorted({x["policy"] for x in data}, key=lambda p: ["static", "fixed", "lru", "lfu", "elastic"].index(p)
                  if p in ["static", "fixed", "lru", "lfu", "elastic"] else 9)
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    for p in pols:
        pts = sorted((float(x["rate"]), x) for x in data if x["policy"] == p)
        rates = [a for a, _ in pts]
        ax[0].plot(rates, [float(x["throughput_tok_s"]) for _, x in pts], marker="o", label=p)
        ax[1].plot(rates, [float(x["ttft_p50_ms"]) / 1e3 for _, x in pts], marker="o", label=p)
        ax[2].plot(rates, [float(x["tpot_p50_ms"]) for _, x in pts], marker="o", label=p)
    ax[0].set_ylabel("output tokens/s")
    ax[1].set_ylabel("TTFT p50 (s)")
    ax[1].set_yscale("log")
    ax[2].set_ylabel("TPOT p50 (ms)")
    for a in ax:
        a.set_xlabel("request rate (req/s)")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle("rate sweep, Qwen1.5-MoE-A2.7B on RTX 5090, 1000 requests -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "rate_sweep.png"), dpi=110)


def offload_limit():
    data = rows("ablation_offload_limit_sweep.csv")
    burst = rows("ablation_offload_limit_burst.csv")
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    for p in ["fixed", "elastic"]:
        pts = sorted((int(x["fixed_offload"]), x) for x in data if x["policy"] == p)
        lim = [a for a, _ in pts]
        lab = p + " (10 req/s, Poisson)"
        ax[0].plot(lim, [float(x["throughput_tok_s"]) for _, x in pts], marker="o", label=lab)
        ax[1].plot(lim, [float(x["ttft_p50_ms"]) / 1e3 for _, x in pts], marker="o", label=lab)
        ax[2].plot(lim, [float(x["tpot_p50_ms"]) for _, x in pts], marker="o", label=lab)
    pts = sorted((int(x["expert_offload_limit"]), x) for x in burst)
    lim = [a for a, _ in pts]
    lab = "elastic (6 req/s, bursty)"
    ax[0].plot(lim, [float(x["throughput_tok_s"]) for _, x in pts], marker="s", ls="--", label=lab)
    ax[1].plot(lim, [float(x["ttft_p50_ms"]) / 1e3 for _, x in pts], marker="s", ls="--", label=lab)
    ax[2].plot(lim, [float(x["tpot_p50_ms"]) for _, x in pts], marker="s", ls="--", label=lab)
    ax[0].set_ylabel("output tokens/s")
    ax[1].set_ylabel("TTFT p50 (s)")
    ax[2].set_ylabel("TPOT p50 (ms)")
    for a in ax:
        a.set_xlabel("expert_offload_limit (per layer)")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle("expert_offload_limit sweep, Qwen1.5-MoE-A2.7B on RTX 5090 -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "offload_limit.png"), dpi=110)


if __name__ == "__main__":
    os.makedirs(PLOTS, exist_ok=True)
    motivating()
    rate_sweep()
    offload_limit()
    print("wrote docs/plots/motivating.png rate_sweep.png offload_limit.png")
