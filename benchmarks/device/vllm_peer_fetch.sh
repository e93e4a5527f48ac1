#!/usr/bin/env bash
# Fetches the peer for benchmarks/device/vllm_peer.py: vLLM's Triton fused-MoE source and its tuned H200 configs,
# taken from ONE pinned vLLM wheel on PyPI (Apache-2.0) into the git-ignored folder .peer/ at the repo root.
# Nothing of vLLM is vendored into the repository; the device call carries .peer/ (`carry: [".peer"]`).
#
#   benchmarks/device/vllm_peer_fetch.sh [VERSION]      (default 0.26.0; run where PyPI is reachable)
#
# 0.26.0 is the last vLLM release pinned to torch 2.11 (triton 3.6), the stack on the lent H200; its
# fused_moe.py holds the Triton fused_moe_kernel that vLLM picks for bf16 MoE on Hopper (oracle/unquantized.py
# moves the FlashInfer backends behind TRITON on SM90).
# .peer/ afterwards: fused_moe.py, configs/E=<E>,N=<F>,device_name=NVIDIA_H200.json (those that exist for our
# shapes), LICENSE (vLLM's, from the wheel) and VERSION (version, wheel name, wheel sha256).
set -euo pipefail

VERSION="${1:-0.26.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEER="$ROOT/.peer"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT  # the ~240 MB wheel never outlives the script

python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$TMP" "vllm==$VERSION"

WHEEL="$(ls "$TMP"/vllm-"$VERSION"-*.whl)"
rm -rf "$PEER"
mkdir -p "$PEER/configs"

python3 - "$WHEEL" "$PEER" "$VERSION" <<'EOF'
import hashlib, os, sys, zipfile

wheel, peer, version = sys.argv[1:]
base = "vllm/model_executor/layers/fused_moe/"
# (E, F) of our shapes: qwen1.5-moe-a2.7b, qwen3-30b-a3b, mixtral-8x7b. vLLM names the bf16 config file
# E=<experts>,N=<w2.shape[2] = intermediate size>,device_name=<GPU>.json (get_config_file_name).
shapes = [(60, 1408), (128, 768), (8, 14336)]
sha = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    extracted = []

    def take(member, dest):
        with open(os.path.join(peer, dest), "wb") as f:
            f.write(z.read(member))
        extracted.append(dest)

    take(base + "fused_moe.py", "fused_moe.py")
    for e, n in shapes:
        cfg = f"E={e},N={n},device_name=NVIDIA_H200.json"
        if base + "configs/" + cfg in names:
            take(base + "configs/" + cfg, "configs/" + cfg)
        else:
            others = sorted(m.rsplit("/", 1)[1] for m in names if m.startswith(f"{base}configs/E={e},N={n},"))
            print(f"no {cfg} in the wheel (vLLM then uses get_default_config); others for this shape: {others}")
    lic = [m for m in names if m.endswith(".dist-info/licenses/LICENSE") or m.endswith(".dist-info/LICENSE")]
    if lic:
        take(lic[0], "LICENSE")
with open(os.path.join(peer, "VERSION"), "w") as f:
    f.write(f"version={version}\nwheel={os.path.basename(wheel)}\nsha256={sha}\n")
extracted.append("VERSION")
print(f"vLLM {version}: {os.path.basename(wheel)} sha256 {sha}")
for name in extracted:
    print(f"  .peer/{name}  {os.path.getsize(os.path.join(peer, name))} bytes")
EOF
du -sh "$PEER"
