#!/usr/bin/python3
"""Plots for docs/reproducing.md from the CSVs reference_engine/scripts/sweeps.sh writes (all SIMULATED).

docs/plots/motivating.png        peak concurrency and forward steps per policy, next to the paper's numbers
docs/plots/rate_sweep.png        throughput and TTFT p50 vs request rate, per policy
docs/plots/offload_limit.png     throughput, TTFT and TPOT vs expert_offload_limit (elastic vs fixed)
docs/plots/e2e.png               the paper's end-to-end settings: throughput, TTFT, TPOT vs rate per policy
docs/plots/fate_ablation.png     Fate -> + unified pool -> + adjuster -> + paged kernel, next to the paper
docs/plots/offload_limit_122b.png  expert_offload_limit on the 122B end-to-end setting
docs/plots/elastic_rule.png      elastic/static throughput over (model, GPUs, precision, rate) and the rule
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


# The three serving metrics most figures draw side by side: (CSV column, divisor, axis label).
METRICS = [("throughput_tok_s", 1.0, "output tokens/s"), ("ttft_p50_ms", 1e3, "TTFT p50 (s)"),
           ("tpot_p50_ms", 1.0, "TPOT p50 (ms)")]


def plot_metrics(axes, pts, ttft_floor=None, **style):
    """One line per metric on axes[0..2] from pts = sorted [(x, csv row)]; TTFT clipped at ttft_floor (log axes)."""
    xs = [a for a, _ in pts]
    for a, (key, div, _) in zip(axes, METRICS):
        ys = [float(x[key]) / div for _, x in pts]
        if key == "ttft_p50_ms" and ttft_floor is not None:
            ys = [max(y, ttft_floor) for y in ys]
        a.plot(xs, ys, **style)


def finish_metrics(axes, xlabel, log_ttft=True):
    """Axis labels (TTFT on a log scale unless told), x label, legend and grid of a metrics row."""
    for a, (_, _, label) in zip(axes, METRICS):
        a.set_ylabel(label)
    if log_ttft:
        axes[1].set_yscale("log")
    for a in axes:
        a.set_xlabel(xlabel)
        a.legend(fontsize=8)
        a.grid(alpha=0.3)


def rate_sweep():
    data = rows("engine_rate_sweep.csv")
    pols = sorted({x["policy"] for x in data}, key=lambda p: ["static", "fixed", "lru", "lfu", "elastic"].index(p)
                  if p in ["static", "fixed", "lru", "lfu", "elastic"] else 9)
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    for p in pols:
        plot_metrics(ax, sorted((float(x["rate"]), x) for x in data if x["policy"] == p), marker="o", label=p)
    finish_metrics(ax, "request rate (req/s)")
    fig.suptitle("rate sweep, Qwen1.5-MoE-A2.7B on RTX 5090, 1000 requests -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "rate_sweep.png"), dpi=110)


def offload_limit():
    data = rows("ablation_offload_limit_sweep.csv")
    burst = rows("ablation_offload_limit_burst.csv")
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    for p in ["fixed", "elastic"]:
        plot_metrics(ax, sorted((int(x["fixed_offload"]), x) for x in data if x["policy"] == p), marker="o",
                     label=p + " (10 req/s, Poisson)")
    plot_metrics(ax, sorted((int(x["expert_offload_limit"]), x) for x in burst), marker="s", ls="--",
                 label="elastic (6 req/s, bursty)")
    finish_metrics(ax, "expert_offload_limit (per layer)", log_ttft=False)
    fig.suptitle("expert_offload_limit sweep, Qwen1.5-MoE-A2.7B on RTX 5090 -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "offload_limit.png"), dpi=110)


POLICY_STYLE = {"static": ("C0", "o"), "fixed": ("C1", "s"), "elastic": ("C3", "^")}


def e2e():
    data = rows("paper_e2e.csv")
    names = sorted({x["scenario"] for x in data})
    fig, ax = plt.subplots(len(names), 3, figsize=(13, 3.0 * len(names)), squeeze=False)
    for i, n in enumerate(names):
        for p in ["static", "fixed", "elastic"]:
            pts = sorted((float(x["rate"]), x) for x in data if x["scenario"] == n and x["policy"] == p)
            if not pts:
                continue
            c, m = POLICY_STYLE[p]
            plot_metrics(ax[i], pts, ttft_floor=1e-3, marker=m, color=c, label=p)
        ax[i][0].set_ylabel(n.replace("e2e-", "") + "\noutput tok/s", fontsize=8)
        ax[i][1].set_ylabel("TTFT p50 (s)")
        ax[i][1].set_yscale("log")
        ax[i][2].set_ylabel("TPOT p50 (ms)")
        for a in ax[i]:
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
    for a in ax[-1]:
        a.set_xlabel("request rate (req/s)")
    fig.suptitle("the paper's end-to-end settings, static (vLLM-like) / fixed (Fate-like) / elastic -- " + SIM,
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "e2e.png"), dpi=90)


def fate_ablation():
    data = rows("paper_fate_ablation.csv")
    steps = ["fate", "+unified-pool", "+adjuster", "+paged-kernel"]
    rates = sorted({float(x["rate"]) for x in data})
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    w = 0.8 / (len(rates) + 1)
    for k, rate in enumerate(rates):
        base = next(x for x in data if float(x["rate"]) == rate and x["policy"] == "fate")
        thr = [float(next(x for x in data if float(x["rate"]) == rate and x["policy"] == s)["throughput_tok_s"]) /
               float(base["throughput_tok_s"]) for s in steps]
        ttft = [float(next(x for x in data if float(x["rate"]) == rate and x["policy"] == s)["ttft_p50_ms"]) /
                float(base["ttft_p50_ms"]) for s in steps]
        xs = [i + k * w for i in range(len(steps))]
        ax[0].bar(xs, thr, w, label=f"simulated, {rate:g} req/s")
        ax[1].bar(xs, ttft, w, label=f"simulated, {rate:g} req/s")
    xs = [i + len(rates) * w for i in range(len(steps))]
    ax[0].bar(xs, [1.0, 1.0, 3.85, 4.19], w, color="k", alpha=0.6, label="paper (+ unified pool ~ 1)")
    ax[1].bar(xs, [1.0, 1.0, 1 - 0.839, 1 - 0.978], w, color="k", alpha=0.6, label="paper")
    ax[0].set_ylabel("throughput / Fate")
    ax[1].set_ylabel("TTFT p50 / Fate")
    ax[1].set_yscale("log")
    for a in ax:
        a.set_xticks([i + len(rates) * w / 2 for i in range(len(steps))])
        a.set_xticklabels(steps)
        a.axhline(1.0, color="gray", lw=0.8)
        a.legend(fontsize=7)
    fig.suptitle("ablation from Fate, Qwen3-30B-A3B bf16 on 2x RTX 5090 -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "fate_ablation.png"), dpi=100)


def offload_limit_122b():
    data = rows("paper_offload_limit_122b.csv")
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    for p in ["fixed", "elastic"]:
        c, m = POLICY_STYLE[p]
        plot_metrics(ax, sorted((int(x["expert_offload_limit"]), x) for x in data if x["policy"] == p), marker=m,
                     color=c, label=p)
    finish_metrics(ax, "expert_offload_limit (per layer, of 256)")
    fig.suptitle("expert_offload_limit, Qwen3.5-122B-A10B bf16 on 8x RTX 5090 at 20 req/s -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "offload_limit_122b.png"), dpi=100)


def elastic_rule():
    import matplotlib.colors as mcolors
    data = rows("paper_elastic_rule.csv")
    label = lambda x: "{} | {} | {}{}".format(x["model"], x["gpu"], x["precision"],
                                              " (usable 0.95)" if float(x["usable_fraction"]) > 0.92 else "")
    labels = sorted({label(x) for x in data})
    rates = sorted({float(x["rate"]) for x in data})
    grid = [[float("nan")] * len(rates) for _ in labels]
    fig, ax = plt.subplots(1, 2, figsize=(15, 0.36 * len(labels) + 2.2), gridspec_kw={"width_ratios": [1.5, 1]})
    norm = mcolors.TwoSlopeNorm(vmin=0.6, vcenter=1.0, vmax=1.4)
    for x in data:
        i, j = labels.index(label(x)), rates.index(float(x["rate"]))
        if x["static_fits"] != "True":
            ax[0].text(j, i, "static does\nnot fit", ha="center", va="center", fontsize=5, color="gray")
            continue
        grid[i][j] = float(x["ratio"])
        mark = ("pays" if x["rule_says_pays"] == "True" else "loses") if x["kv_bound"] == "True" else "not KV-bound"
        ax[0].text(j, i, "{:.2f}\n{}".format(float(x["ratio"]), mark), ha="center", va="center", fontsize=5.5)
    im = ax[0].imshow(grid, cmap="RdBu", norm=norm, aspect="auto")
    ax[0].set_xticks(range(len(rates)))
    ax[0].set_xticklabels([f"{r:g} req/s" for r in rates])
    ax[0].set_yticks(range(len(labels)))
    ax[0].set_yticklabels(labels, fontsize=7)
    ax[0].set_title("elastic / static throughput (cell: simulated ratio; below it the rule's verdict)", fontsize=8)
    fig.colorbar(im, ax=ax[0], fraction=0.03)
    bound = [x for x in data if x["static_fits"] == "True" and x["kv_bound"] == "True"]
    for x in bound:
        rule = float(x["rule"])
        ax[1].scatter(rule, float(x["ratio"]), color="C3" if "122b" in x["model"] else ("C0" if "1.5" in x["model"] else "C2"))
        ax[1].annotate("{} {} {} @{:g}".format(x["model"].split("-")[0], x["gpu"], x["precision"], float(x["rate"])),
                       (rule, float(x["ratio"])), fontsize=5.5)
    ax[1].axvline(1.0, color="k", lw=1, ls="--", label="rule's boundary: f c kv / BW = T0 / B_s")
    ax[1].axhline(1.0, color="gray", lw=0.8)
    ax[1].set_xlabel("f c kv / BW  divided by  T0 / B_s   (PCIe time a held request costs per step / "
                     "shared static step time per request)", fontsize=7)
    ax[1].set_ylabel("elastic / static throughput")
    ax[1].set_title("KV-bound cells (static peak < max_num_seqs, TTFT p99 > 1 s)", fontsize=8)
    ax[1].legend(fontsize=7)
    ax[1].grid(alpha=0.3)
    fig.suptitle("when elastic pays -- " + SIM, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "elastic_rule.png"), dpi=100)


if __name__ == "__main__":
    os.makedirs(PLOTS, exist_ok=True)
    motivating()
    rate_sweep()
    offload_limit()
    e2e()
    fate_ablation()
    offload_limit_122b()
    elastic_rule()
    print("wrote docs/plots/motivating.png rate_sweep.png offload_limit.png e2e.png fate_ablation.png "
          "offload_limit_122b.png elastic_rule.png")
