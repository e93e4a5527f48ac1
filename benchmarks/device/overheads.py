#!/usr/bin/env python3
"""Overheads of the CUDA backend from two timelines of the same uncapped static run (Qwen1.5-MoE-A2.7B unless
--model says otherwise; benchmarks/device/engine_overheads.sh): `plain` (served as always) and `gated`
(AMOEBA_GATE_FORWARD=1: the GPU held until the forward is enqueued, so its compute span has no launch gaps).

For decode-only steps (batch tokens = running sequences) near batch 1, 8, 32, 64, 128, 256, medians of:
step wall time, GPU time (compute + stall), the forward's host time (planning + launches), the engine's host
time (schedule, adjust, commit, complete), the GPU time without launch gaps (gated run), and the step's HBM
floor: every byte the step must read once at the measured read bandwidth (attention and router weights,
the routed experts a uniform router touches, E x (1 - (1 - k/E)^B) per layer, the shared expert, the LM
head, and the KV cache of the running sequences, from the timeline's used KV pages).
    python3 benchmarks/device/overheads.py PLAIN.csv [GATED.csv] [--targets 1,32,256] [--precision int8]
        [--tp 2] [--model qwen3-30b-a3b] [--json OUT.json]
--precision: the experts' precision of the run (the floor then counts the packed expert and shared-expert
bytes: docs/kernel.md, "Quantized expert pages"; the CUDA backend packs the shared expert's chunks too).
--tp: a tensor-parallel run's timeline (rank 0's): the floor is one GPU's bytes (1/tp of attention, experts,
shared expert and KV; router and LM head whole); the `allred` column is the step's all-reduces (inside attn,
MoE and head).
Without GATED.csv the gated column stays empty (benchmarks/device/engine_decode.sh: fixed batches).
"""
import argparse
import csv
import json
import os
import statistics as st

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "reference_engine", "data", "models")


def packed_matrix_bytes(bits):
    """The larger of W1/W3 (F rows of K = H) and W2 (H rows of K = F) packed: weights, then bf16 scales per 128
    values along K, each part on 16 bytes (kernels/moe/quant_layout.hpp, ExpertLayout::matrix_bytes)."""
    up16 = lambda x: -(-x // 16) * 16
    total = lambda rows, k: up16(up16(rows * -(-k * bits // 8)) + 2 * rows * -(-k // 128))
    return max(total(F, H), total(H, F))


def set_model(name):
    """The floor's sizes from the model catalog (reference_engine/data/models/<name>.json; bf16 weights):
    attention (q, k, v with their biases where the model has them, o), the router (E experts plus the shared
    expert's gate), one expert matrix per precision, the shared expert, the LM head, and a KV page (16 tokens
    of one layer's K and V)."""
    global LAYERS, H, E, K, F, SHARED_F, VOCAB, ATTN_BYTES, ROUTER_BYTES, MATRIX_BYTES, HEAD_BYTES, KV_PAGE
    m = json.load(open(os.path.join(MODELS, name + ".json")))
    att, moe = m["attention"], m["moe"]
    LAYERS, H, VOCAB = m["num_layers"], m["hidden_size"], m["vocab_size"]
    E, K, F = moe["num_experts"], moe["top_k"], moe["moe_intermediate_size"]
    SHARED_F = moe["num_shared_experts"] * moe["shared_expert_intermediate_size"]
    q, kv = att["num_heads"] * att["head_dim"], att["num_kv_heads"] * att["head_dim"]
    bias = (q + 2 * kv) if att.get("qkv_bias") else 0
    ATTN_BYTES = LAYERS * (H * q + 2 * H * kv + q * H + bias) * 2
    ROUTER_BYTES = LAYERS * (E + (1 if SHARED_F else 0)) * H * 2
    # Bytes of one expert matrix as its page holds it (int8: 2,928,640; int4: 1,486,848 for Qwen1.5).
    MATRIX_BYTES = {"bf16": F * H * 2, "int8": packed_matrix_bytes(8), "int4": packed_matrix_bytes(4)}
    HEAD_BYTES = VOCAB * H * 2
    KV_PAGE = 16 * 2 * kv * 2


def set_precision(precision):
    """The experts' bytes the floor counts: one routed expert and all layers' shared experts, per precision."""
    global EXPERT_BYTES, SHARED_BYTES
    EXPERT_BYTES = 3 * MATRIX_BYTES[precision]
    SHARED_BYTES = LAYERS * (SHARED_F // F) * EXPERT_BYTES


# The defaults engine_ab.py and a plain run use: Qwen1.5-MoE-A2.7B in bf16.
set_model("qwen1.5-moe-a2.7b")
set_precision("bf16")
READ_BW = 4.25e12  # bytes/s, measured device copy on the project's H200 (reference_engine/data/gpus/h200.json)


TP = 1  # --tp: one GPU's share (engine/tp_shard.hpp): 1/tp of attention, experts, shared expert and KV; the
# router and the LM head whole on every GPU


def floor_s(batch, kv_pages_used):
    experts = E * (1 - (1 - K / E) ** batch)
    split = (ATTN_BYTES + LAYERS * experts * EXPERT_BYTES + SHARED_BYTES + kv_pages_used * KV_PAGE) / TP
    return (split + ROUTER_BYTES + HEAD_BYTES) / READ_BW


def rows(path):
    r = list(csv.DictReader(open(path)))
    total_kv = max(int(x["free_kv_pages"]) for x in r)
    return r, total_kv


def table(plain, gated, targets=(1, 8, 32, 64, 128, 256), context=None):
    pr, p_kv = rows(plain)
    gr = rows(gated)[0] if gated else []
    out = []
    for target in targets:
        def pick(rs):
            tol = target // 16
            return [x for x in rs if int(x["batch_tokens"]) == int(x["running"])
                    and abs(int(x["running"]) - target) <= tol and float(x["step_ms"]) < 400]
        p, g = pick(pr), pick(gr)
        if not p:
            continue
        med = lambda rs, key: st.median(float(x[key]) for x in rs)
        batch = st.median(int(x["running"]) for x in p)
        kv = st.median(p_kv - int(x["free_kv_pages"]) for x in p)
        if context:  # every running sequence at this context: its pages, rounded up to whole pages
            kv = batch * LAYERS * -(-context // 16)
        row = {"batch": batch, "steps": len(p), "step_ms": med(p, "step_ms"),
               "gpu_ms": med(p, "compute_ms") + med(p, "stall_ms"), "forward_host_ms": med(p, "forward_host_ms"),
               "engine_host_ms": med(p, "host_ms"), "attention_ms": med(p, "attention_ms"),
               "moe_ms": med(p, "moe_ms"), "head_ms": med(p, "dense_ms"),
               "allreduce_ms": med(p, "allreduce_ms") if "allreduce_ms" in p[0] else 0.0,
               "gated_gpu_ms": (med(g, "compute_ms") + med(g, "stall_ms")) if g else None,
               "gated_steps": len(g), "kv_pages_used": kv, "floor_ms": floor_s(batch, kv) * 1e3}
        row["unhidden_host_pct"] = 100 * (row["step_ms"] - row["gpu_ms"] + row["engine_host_ms"]) / row["step_ms"]
        row["step_over_floor"] = row["step_ms"] / row["floor_ms"]
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plain")
    ap.add_argument("gated", nargs="?")
    ap.add_argument("--targets", default="1,8,32,64,128,256", help="batches to report (comma-separated)")
    ap.add_argument("--context", type=int, help="every decode step's context length (fixed-batch runs); "
                    "otherwise the KV read is taken from the timeline's used KV pages")
    ap.add_argument("--precision", default="bf16", choices=sorted(MATRIX_BYTES),
                    help="the experts' precision of the run (the floor's expert and shared-expert bytes)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs of the run (the floor is one GPU's)")
    ap.add_argument("--model", default="qwen1.5-moe-a2.7b",
                    help="the run's model, a name of reference_engine/data/models/ (the floor's sizes)")
    ap.add_argument("--json")
    a = ap.parse_args()
    global TP
    TP = a.tp
    set_model(a.model)
    set_precision(a.precision)
    t = table(a.plain, a.gated, [int(x) for x in a.targets.split(",")], a.context)
    print(f"{'batch':>5} {'steps':>5} {'step ms':>8} {'GPU ms':>7} {'gated GPU':>9} {'fwd host':>8} {'eng host':>8} "
          f"{'unhidden':>8} {'attn':>6} {'MoE':>6} {'head':>5} {'allred':>6} {'floor':>6} {'step/floor':>10}")
    for r in t:
        gg = f"{r['gated_gpu_ms']:9.2f}" if r["gated_gpu_ms"] is not None else f"{'-':>9}"
        print(f"{r['batch']:5.0f} {r['steps']:5d} {r['step_ms']:8.2f} {r['gpu_ms']:7.2f} {gg} "
              f"{r['forward_host_ms']:8.2f} {r['engine_host_ms']:8.3f} {r['unhidden_host_pct']:7.1f}% "
              f"{r['attention_ms']:6.2f} {r['moe_ms']:6.2f} {r['head_ms']:5.2f} {r['allreduce_ms']:6.2f} "
              f"{r['floor_ms']:6.2f} "
              f"{r['step_over_floor']:9.2f}x")
    if a.json:
        json.dump(t, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
