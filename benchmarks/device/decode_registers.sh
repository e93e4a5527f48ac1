#!/usr/bin/env bash
# Registers per thread of decode GEMV instantiations (ptxas -v, sm_90a), no GPU needed: the bf16 tiles of
# the default table and quantized ones on the register loop and staged (decode::Tile's kStages). Prints one
# line per kernel: stage (0 gate/up, 1 down), tile, precision, registers.
#   [NVCC=/usr/local/cuda/bin/nvcc] bash benchmarks/device/decode_registers.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/regs.cu" <<'CU'
#include "moe/addressing.cuh"
#include "moe/decode_gemv.cuh"
using namespace amoeba::kernels;
template <class T, class P>
void* both() {  // takes both stages' addresses, so that both are compiled
  static void* k[] = {(void*)&decode::gemv_kernel<Contiguous, decode::Stage::kGateUp, T, P>,
                      (void*)&decode::gemv_kernel<Contiguous, decode::Stage::kDown, T, P>};
  return k;
}
void* kernels_[] = {
    both<decode::Tile<1, 4, 2>, Bf16>(),         both<decode::Tile<1, 8, 2>, Bf16>(),
    both<decode::Tile<4, 4, 1>, Bf16>(),         both<decode::Tile<1, 4, 1>, Int8>(),
    both<decode::Tile<1, 4, 1, 128, 3>, Int8>(), both<decode::Tile<1, 4, 1>, Int4>(),
    both<decode::Tile<1, 4, 1, 128, 2>, Int4>(),
};
CU
"$nvcc" -I "$root/kernels" -I "$root/include" -I "$root/policies" -O3 -DNDEBUG -std=c++20 \
  --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -cubin -Xptxas -v "$tmp/regs.cu" \
  -o "$tmp/regs.cubin" 2>&1 |
  grep -E "Compiling entry|Used" |
  sed -E "s/.*entry function '([^']+)'.*/\1/; s/.*(Used [0-9]+ registers).*/\1/" | paste - - | c++filt |
  sed -E 's/amoeba::kernels:://g; s/void decode::gemv_kernel<Contiguous, \(decode::Stage\)//;
          s/\(MoeParams[^\t]*//; s/Quantized<\(quant::Bits\)8> ?>/int8/; s/Quantized<\(quant::Bits\)4> ?>/int4/;
          s/Bf16>/bf16/; s/Used ([0-9]+) registers/\1 registers/' |
  sort
