#!/usr/bin/env python3
"""Whether two source trees compile the split-K decode kernels (moe/decode_splitk.cuh) to the same SASS, form
by form (no GPU needed): compiles the instantiations below in each tree for sm_90a, disassembles them with
nvdisasm (found and read as decode_sass.py does) and compares the instruction text per kernel.

  python3 benchmarks/device/splitk_sass_same.py OLD_ROOT [NEW_ROOT] [--old-args ""] [--new-args ", 1"]
                                               [--nvcc /usr/local/cuda/bin/nvcc] [--nvdisasm PATH]

OLD_ROOT / NEW_ROOT: trees holding kernels/ and include/ (NEW_ROOT: this checkout). --old-args / --new-args:
template arguments appended after each form's features (a tree whose kernel takes more parameters, e.g. the
warp-pair form's ", 1"). --all-forms: instead, every form a configuration can name today, with all of the
kernel's parameters (features, warps per feature group, steps, mma.sync), paged and contiguous: both trees must
take them (--old-args / --new-args do not apply). Prints one line per form and exits 1 if any differs.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_sass import ROOT, find_nvdisasm, sass_functions  # noqa: E402

# (addressing, precision, features): the forms both trees instantiate.
FORMS = [("Paged", "Bf16", 64), ("Contiguous", "Bf16", 64), ("Paged", "Int4", 64), ("Paged", "Int8", 128)]
# --all-forms: (precision, features, h_split, steps, mma), each paged and contiguous.
ALL_FORMS = [(a, p, f"{f}, {h}, {st}, {mma}") for a in ("Paged", "Contiguous") for p, f, h, st, mma in [
    ("Bf16", 64, 1, 0, "false"), ("Bf16", 64, 2, 0, "false"), ("Bf16", 128, 1, 0, "false"),
    ("Bf16", 128, 2, 0, "false"), ("Bf16", 128, 2, 2, "false"), ("Int8", 64, 2, 0, "false"),
    ("Int8", 64, 2, 2, "false"), ("Int8", 128, 1, 0, "false"), ("Int8", 128, 2, 0, "false"),
    ("Int8", 128, 1, 0, "true"), ("Int8", 128, 2, 0, "true"), ("Int4", 64, 1, 0, "false"),
    ("Int4", 128, 2, 0, "false"), ("Int4", 128, 2, 0, "true")]]


def instructions(root, extra, args, nvdisasm, tmp, tag):
    src, cubin = os.path.join(tmp, f"{tag}.cu"), os.path.join(tmp, f"{tag}.cubin")
    lines = ['#include "moe/addressing.cuh"', '#include "moe/decode_splitk.cuh"', "using namespace amoeba::kernels;"]
    for a, p, f in ALL_FORMS if args.all_forms else FORMS:
        lines.append(f"template __global__ void splitk::kernel<{a}, {p}, {f}{extra}>("
                     f"const __grid_constant__ splitk::Params<{a}>);")
    open(src, "w").write("\n".join(lines) + "\n")
    inc = [f"-I{os.path.join(root, d)}" for d in ("kernels", "include")]
    subprocess.run([args.nvcc, *inc, "-O3", "-DNDEBUG", "-std=c++20", "--expt-relaxed-constexpr",
                    "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", src, "-o", cubin], check=True)
    text = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    out = {name: [ins for _, ins in f["ins"]] for name, f in sass_functions(text).items()}
    # Name each kernel by its form (the mangled names differ where the template's parameters do).
    named = {}
    for name, code in out.items():
        if args.all_forms:  # the same parameters in both trees: the same mangled names
            named[name] = code
            continue
        for a, p, f in FORMS:
            prec = {"Bf16": "4Bf16", "Int4": "E4EE", "Int8": "E8EE"}[p]
            if a in name and prec in name and f"Li{f}E" in name:
                named[(a, p, f)] = code
    return named


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old_root")
    ap.add_argument("new_root", nargs="?", default=ROOT)
    ap.add_argument("--old-args", default="")
    ap.add_argument("--new-args", default="")
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--all-forms", action="store_true")
    args = ap.parse_args()
    if args.all_forms and (args.old_args or args.new_args):
        ap.error("--all-forms names every template argument: --old-args / --new-args do not apply")
    nvdisasm = find_nvdisasm(args)
    with tempfile.TemporaryDirectory() as tmp:
        old = instructions(args.old_root, args.old_args, args, nvdisasm, tmp, "old")
        new = instructions(args.new_root, args.new_args, args, nvdisasm, tmp, "new")
    same = True
    for form in sorted(set(old) | set(new)) if args.all_forms else FORMS:
        a, b = old.get(form), new.get(form)
        if a is None or b is None:
            print(f"{form}: not found ({'old' if a is None else 'new'})")
            same = False
            continue
        diff = sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
        print(f"{form}: {len(a)} / {len(b)} instructions, " + ("identical" if diff == 0 else f"{diff} differ"))
        same = same and diff == 0
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
