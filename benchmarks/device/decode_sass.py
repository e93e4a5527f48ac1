#!/usr/bin/env python3
"""Instructions per main-loop iteration of the decode GEMV and quantized grouped-GEMM kernels, from their SASS
(no GPU needed): compiles the instantiations below for sm_90a, disassembles them with nvdisasm, and prints per
kernel its largest loop's instruction count (one k-step of the decode tiles; the quantized TMA grouped GEMM's
largest loop, which may be its producer's or its consumers') and how many of them are LOP3, PRMT, HADD2 (the
int4 conversion), HMMA / HGMMA, the registers ptxas reports, and where the loop's global loads sit: how many
there are and how many ptxas placed after the loop's first MMA (next to their use, mid-step).

  python3 benchmarks/device/decode_sass.py [--nvcc /usr/local/cuda/bin/nvcc] [--nvdisasm PATH]
                                          [--registers-only]

--registers-only: ptxas's registers per kernel alone, without nvdisasm (nothing downloaded).

nvdisasm: --nvdisasm, else on the PATH or beside nvcc, else the pinned PyPI wheel nvidia-cuda-nvdisasm 13.5.37
(sha256 checked), downloaded once into ~/.cache/amoeba/nvdisasm.
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WHEEL = "nvidia-cuda-nvdisasm==13.5.37"
WHEEL_SHA256 = "d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca"
SOURCE = r"""
#include "moe/addressing.cuh"
#include "moe/decode_gemv.cuh"
#include "moe/grouped_gemm_tma_quant.cuh"
using namespace amoeba::kernels;
template <class T, class P>
void* both() {
  static void* k[] = {(void*)&decode::gemv_kernel<Contiguous, decode::Stage::kGateUp, T, P>,
                      (void*)&decode::gemv_kernel<Contiguous, decode::Stage::kDown, T, P>};
  return k;
}
void* kernels_[] = {
    both<decode::Tile<1, 4, 2>, Bf16>(),         both<decode::Tile<1, 8, 2>, Bf16>(),
    both<decode::Tile<4, 4, 1>, Bf16>(),         both<decode::Tile<1, 4, 1>, Int8>(),
    both<decode::Tile<1, 4, 1, 128, 3>, Int8>(), both<decode::Tile<1, 4, 1>, Int4>(),
    both<decode::Tile<2, 4, 1>, Int4>(),         both<decode::Tile<1, 4, 1, 128, 2>, Int4>(),
    both<decode::Tile<1, 2, 1>, Int4>(),
};
template <class P>
void* tma_gate_up() {  // the quantized TMA grouped GEMM's gate/up stage (consumers dequantise in registers)
  static void* k[] = {(void*)&grouped::gemm_tma_quant_kernel<Contiguous, grouped::Stage::kGateUp, P>};
  return k;
}
void* grouped_[] = {tma_gate_up<Int8>(), tma_gate_up<Int4>()};
"""


def find_nvdisasm(args):
    if args.nvdisasm:
        return args.nvdisasm
    for c in (shutil.which("nvdisasm"), os.path.join(os.path.dirname(args.nvcc), "nvdisasm")):
        if c and os.path.exists(c):
            return c
    cache = os.path.expanduser("~/.cache/amoeba/nvdisasm")
    exe = os.path.join(cache, "nvidia", "cu13", "bin", "nvdisasm")
    if not os.path.exists(exe):
        os.makedirs(cache, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", cache, WHEEL], check=True,
                       stdout=subprocess.DEVNULL)
        wheel = [f for f in os.listdir(cache) if f.endswith(".whl")][0]
        data = open(os.path.join(cache, wheel), "rb").read()
        if hashlib.sha256(data).hexdigest() != WHEEL_SHA256:
            sys.exit(f"{wheel}: sha256 differs from the pinned {WHEEL_SHA256}")
        zipfile.ZipFile(os.path.join(cache, wheel)).extractall(cache)
        os.chmod(exe, 0o755)
    return exe


def sass_functions(sass):
    """nvdisasm's text per function: {mangled name: {"ins": [(address, instruction)], "labels": {label: address}}}."""
    funcs, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line) or re.match(r"^(_Z\S+):", line)
        if m:
            name = m.group(1)
            funcs[name] = {"ins": [], "labels": {}, "pending": []}
            continue
        if name is None:
            continue
        f = funcs[name]
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            f["pending"].append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            for label in f["pending"]:
                f["labels"][label] = addr
            f["pending"] = []
            f["ins"].append((addr, m.group(2).strip()))
    for f in funcs.values():
        del f["pending"]
    return funcs


def demangled(name):
    out = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    out = out.replace("amoeba::kernels::", "").replace("void decode::gemv_kernel<Contiguous, ", "")
    out = out.replace("void grouped::gemm_tma_quant_kernel<Contiguous, (grouped::Stage)0", "TMA grouped, gate/up")
    out = re.sub(r"\((MoeParams|grouped::TmaParams).*", "", out)
    out = out.replace("(decode::Stage)0", "gate/up").replace("(decode::Stage)1", "down")
    out = out.replace("Quantized<(quant::Bits)8>", "int8").replace("Quantized<(quant::Bits)4>", "int4")
    return out.rstrip(">").replace(", false", "").strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--registers-only", action="store_true")
    args = ap.parse_args()
    nvdisasm = None if args.registers_only else find_nvdisasm(args)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
        open(src, "w").write(SOURCE)
        inc = [f"-I{os.path.join(ROOT, d)}" for d in ("kernels", "include", "policies")]
        build = subprocess.run([args.nvcc, *inc, "-O3", "-DNDEBUG", "-std=c++20", "--expt-relaxed-constexpr",
                                "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-Xptxas", "-v", src,
                                "-o", cubin], capture_output=True, text=True)
        if build.returncode != 0:
            sys.exit(build.stderr)
        ptxas = build.stderr
        regs, current = {}, None
        for line in ptxas.splitlines():
            m = re.search(r"Compiling entry function '([^']+)'", line)
            if m:
                current = m.group(1)
            m = re.search(r"Used (\d+) registers", line)
            if m and current:
                regs[current] = int(m.group(1))
        if args.registers_only:
            print("| kernel | registers |\n|---|---:|")
            for name in sorted(regs, key=demangled):
                if "permute_k" not in name:
                    print(f"| {demangled(name)} | {regs[name]} |")
            return
        sass = subprocess.run([nvdisasm, cubin], capture_output=True, text=True, check=True).stdout
    funcs = sass_functions(sass)
    print("| kernel | registers | largest loop: instructions | LOP3 | PRMT | HADD2 | HMMA/HGMMA "
          "| global loads (after the first MMA) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in sorted(funcs, key=demangled):
        if name not in regs or "permute_k" in name:
            continue  # helpers the headers define, not the kernels listed above
        f = funcs[name]
        best = None
        for addr, text in f["ins"]:
            m = re.search(r"BRA `?\(?(\.L_x_\d+)", text)
            if m and m.group(1) in f["labels"] and f["labels"][m.group(1)] < addr:
                body = [t for a, t in f["ins"] if f["labels"][m.group(1)] <= a <= addr]
                if best is None or len(body) > len(best):
                    best = body
        best = best or []
        is_op = lambda t, p: re.match(rf"(@!?U?P\w+\s+)?{p}\b", t) is not None  # a predicate, then p
        op = lambda p: sum(1 for t in best if is_op(t, p))
        mma = next((i for i, t in enumerate(best) if is_op(t, "HMMA") or is_op(t, "HGMMA")), len(best))
        loads = [i for i, t in enumerate(best) if is_op(t, "LDG") or is_op(t, r"LD\.E")]
        late = sum(1 for i in loads if i > mma)
        print(f"| {demangled(name)} | {regs.get(name, '?')} | {len(best)} | {op('LOP3')} | {op('PRMT')} | "
              f"{op('HADD2')} | {op('HMMA') + op('HGMMA')} | {len(loads)} ({late}) |")


if __name__ == "__main__":
    main()
