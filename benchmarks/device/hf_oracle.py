#!/usr/bin/env python3
"""External oracle: Hugging Face transformers against amoeba, on small Qwen2-MoE and Qwen3-MoE models.

For each architecture: build a model from a config with transformers (2 layers, the real head dim 128 and the
real expert counts 60 / 128; smaller hidden, intermediate and vocabulary sizes so the host reference stays
fast; expert sizes multiples of 128, as the paged MoE kernel tiles them), random weights from a seed, bf16,
save it as safetensors; generate 32 greedy tokens after a fixed prompt with transformers on the GPU; run
`amoeba generate --backend B` on the saved checkpoint for each backend B given; compare the tokens and every
step's logits (max |difference| up to the first token that differs, and relative to the largest |logit|).

Runs where torch and transformers are installed (the GPU machine):
    python3 benchmarks/device/hf_oracle.py --amoeba PATH/TO/amoeba --out DIR [--backend reference,cuda]
Writes DIR/hf_oracle.json and prints a table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2MoeConfig, Qwen3MoeConfig

PROMPT = [11, 503, 7, 1999, 42, 1024, 3, 777, 1500, 64, 9, 300]
NEW_TOKENS = 32


def configs():
    common = dict(vocab_size=2048, num_hidden_layers=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, initializer_range=0.05)
    yield "qwen2_moe", Qwen2MoeConfig(
        hidden_size=512, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
        moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=60, num_experts_per_tok=4,
        norm_topk_prob=False, decoder_sparse_step=1, rope_theta=1000000.0, **common)
    yield "qwen3_moe", Qwen3MoeConfig(
        hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        moe_intermediate_size=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, rope_theta=1000000.0, **common)


def hf_generate(model):
    ids = torch.tensor([PROMPT], device="cuda")
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    tokens = out.sequences[0, len(PROMPT):].tolist()
    logits = [step[0].float().cpu().tolist() for step in out.logits]
    return tokens, logits


def same_prefix(a, b):
    """Tokens equal before the first difference."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare_logits(hf_logits, ours_logits):
    """Per step: max |difference|, the largest |logit|, their ratio, and transformers' top-1 margin."""
    steps = []
    for s, (a, b) in enumerate(zip(hf_logits, ours_logits)):
        diff = max(abs(x - y) for x, y in zip(a, b))
        scale = max(abs(x) for x in a)
        top2 = sorted(a, reverse=True)[:2]
        steps.append({"step": s, "max_abs_diff": diff, "max_abs_logit": scale,
                      "rel": diff / scale if scale else 0.0, "hf_top1_margin": top2[0] - top2[1]})
    return steps


def run_amoeba(amoeba, backend, name, cfg, ckpt, out, hf_tokens, hf_logits, t_hf):
    """One backend on one saved model: a free greedy run and a teacher-forced one."""
    ours_json = os.path.join(out, f"{name}_{backend}.json")
    t0 = time.time()
    run = subprocess.run([amoeba, "generate", "--backend", backend, "--weights", ckpt, "--prompt",
                          ",".join(map(str, PROMPT)), "--new-tokens", str(NEW_TOKENS), "--json", ours_json],
                         capture_output=True, text=True)
    t_ours = time.time() - t0
    # Teacher forcing: amoeba is fed transformers' tokens, so logits compare at every step even past a
    # near-tie where the free runs part.
    forced_json = os.path.join(out, f"{name}_{backend}_forced.json")
    forced = subprocess.run([amoeba, "generate", "--backend", backend, "--weights", ckpt, "--prompt",
                             ",".join(map(str, PROMPT)), "--teacher-tokens", ",".join(map(str, hf_tokens)),
                             "--json", forced_json], capture_output=True, text=True)
    entry = {"model": name, "backend": backend, "config": cfg.to_dict(), "hf_tokens": hf_tokens,
             "hf_seconds": t_hf, "amoeba_seconds": t_ours, "amoeba_rc": run.returncode, "amoeba_stderr": run.stderr[-2000:]}
    if run.returncode == 0 and forced.returncode == 0:
        ours = json.load(open(ours_json))
        same = same_prefix(hf_tokens, ours["tokens"])
        f = json.load(open(forced_json))
        steps = [dict(s, amoeba_argmax=f["tokens"][s["step"]], hf_token=hf_tokens[s["step"]])
                 for s in compare_logits(hf_logits, f["logits"])]
        entry.update({"amoeba_tokens": ours["tokens"], "same_tokens": same, "forced_steps": steps,
                      "saved_tensors": sorted(os.listdir(ckpt))})
    else:
        entry["amoeba_rc"] = run.returncode or forced.returncode
        entry["amoeba_stderr"] = (run.stderr + forced.stderr)[-2000:]
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amoeba", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"torch": torch.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name(0), "backends": args.backend.split(","), "prompt": PROMPT,
              "new_tokens": NEW_TOKENS, "models": []}
    for name, cfg in configs():
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).cuda().eval()
        ckpt = os.path.join(args.out, name)
        model.save_pretrained(ckpt, safe_serialization=True)
        t0 = time.time()
        with torch.no_grad():
            hf_tokens, hf_logits = hf_generate(model)
        t_hf = time.time() - t0
        for backend in args.backend.split(","):
            report["models"].append(run_amoeba(args.amoeba, backend, name, cfg, ckpt, args.out, hf_tokens,
                                               hf_logits, t_hf))
        del model
        torch.cuda.empty_cache()
    json.dump(report, open(os.path.join(args.out, "hf_oracle.json"), "w"), indent=1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {report['gpu']}, "
          f"backends {args.backend}")
    print("free run: tokens equal to transformers' before the first difference; teacher-forced: every step's")
    print("logits against transformers', and the steps whose argmax differs with transformers' top-1 margin there")
    print(f"{'model':10} {'backend':9} {'free: same':>11} {'max |dlogit|':>13} {'max rel':>9} {'argmax differs at (margin)':>28}")
    for m in report["models"]:
        if m["amoeba_rc"] != 0:
            print(f"{m['model']:10} {m['backend']:9} amoeba failed: {m['amoeba_stderr'].strip()[-300:]}")
            continue
        st = m["forced_steps"]
        worst = max(s["max_abs_diff"] for s in st)
        rel = max(s["rel"] for s in st)
        differs = [f"{s['step']} ({s['hf_top1_margin']:.3f})" for s in st if s["amoeba_argmax"] != s["hf_token"]]
        print(f"{m['model']:10} {m['backend']:9} {m['same_tokens']:>4} of {NEW_TOKENS:<3} {worst:13.4f} {rel:9.2e} "
              f"{', '.join(differs) or 'none':>28}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
