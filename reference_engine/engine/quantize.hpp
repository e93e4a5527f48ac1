// Quantized routed experts (the host side): bf16 weights turned into int8 or int4 values with bf16
// scales per group of 128 values along K, packed in the layout the kernels read
// (kernels/moe/quant_layout.hpp: weights [N][K x bits / 8], then scales [N][ceil(K / 128)]), and the
// reference dequantizer the GPU kernel is checked against. Quantization happens once, when experts are loaded
// into the host store. CUDA-free; a target that includes this header puts kernels/ on its include path
// (moe/quant_layout.hpp).
//
// The arithmetic, for each row n and each group of 128 consecutive k (the last group of a row has K mod 128
// values when K is not a multiple of 128), qmax = 127 (int8) or 7 (int4), rne = round to nearest, ties to
// even:
//   m      = max |w| over the group, in float (exact: every bf16 is a float);
//   scale  = bf16 of the float quotient m / qmax, rounded to nearest even (bf16::from_float);
//   q      = clamp(rne(w / scale), -qmax, qmax), the float quotient with the stored (bf16) scale;
//            q = 0 for the whole group when scale is 0 (an all-zero group, or |w| so small that m / qmax
//            rounds to 0 in bf16);
//   w'     = float(q) x float(scale): exact in float (|q| has at most 7 significant bits, a bf16 scale 8);
//   bf16 w' = rne of w' to bf16: the weight a kernel that dequantizes into bf16 tensor-core operands uses.
// Bounds: |w - w'| <= scale / 2 + |w| x 2^-24 (the float quotient's rounding). A normal bf16 scale is within
// a relative 2^-8 of m / qmax, so |w / scale| <= qmax / (1 - 2^-8) < qmax + 0.5 and the clamp changes nothing
// unless the scale is a bf16 subnormal (m < qmax x 2^-126); q is never -128 (int8) or -8 (int4): the scheme
// is symmetric.
// Non-finite weights are refused (ConfigError), since they have no scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "amoeba/core/bf16.hpp"
#include "engine/model.hpp"
#include "moe/quant_layout.hpp"

namespace amoeba::engine {

class ModelWeights;

// The packed width of a quantized precision. Throws ConfigError(field, "bf16", rule) for kBf16.
kernels::quant::Bits quant_bits(ExpertPrecision p, const std::string& field);

// The layouts of W1/W3 (F rows of K = H) and W2 (H rows of K = F) of an F x H expert in `p` (int8 or int4;
// ConfigError naming `field` for bf16). matrix_bytes() equals ModelSpec::expert_page_payload_bytes() for the
// same F, H and precision.
kernels::quant::ExpertLayout expert_quant_layout(std::uint32_t f, std::uint32_t h, ExpertPrecision p,
                                                 const std::string& field);

// Quantizes the row-major bf16 matrix `w` (layout.rows x layout.k values) into `dst`
// (layout.total_bytes() bytes; the padding is zeroed). `w_name` names w in errors. Throws ConfigError naming
// the field, the value and the rule for an empty shape, a size that does not match, or a non-finite weight;
// dst is then unchanged.
void quantize_matrix(std::span<const bf16> w, const kernels::quant::MatrixLayout& layout,
                     std::span<std::byte> dst, const std::string& w_name = "quantize_matrix.w");

// The reference dequantizer: value (n, k) of the packed matrix as float(q) x float(scale) (exact), or that
// product rounded to bf16. packed.size() must be layout.total_bytes() and dst.size() rows x k
// (ConfigError otherwise, dst unchanged).
void dequantize_matrix(std::span<const std::byte> packed, const kernels::quant::MatrixLayout& layout,
                       std::span<float> dst);
void dequantize_matrix(std::span<const std::byte> packed, const kernels::quant::MatrixLayout& layout,
                       std::span<bf16> dst);

// One expert as the pool holds it: matrix j of [W1 | W3 | W2] packed at byte j x page of `dst`, where
// page = dst.size() / 3, and the rest of each page zero. `expert_bf16` is read_expert's bytes (3 x F x H
// bf16). dst.size() must be 3 pages, a page at least expert_quant_layout(f, h, p).matrix_bytes() bytes and a
// multiple of 16: ModelSpec::expert_page_bytes() gives the pool's pages, expert_page_payload_bytes() the
// tightest store. `what` prefixes the names in errors; dst is unchanged on an error.
void quantize_expert(std::span<const std::byte> expert_bf16, std::uint32_t f, std::uint32_t h,
                     ExpertPrecision p, std::span<std::byte> dst,
                     const std::string& what = "quantize_expert");

// [W1 | W3 | W2] of routed expert `expert` of MoE layer `moe_layer` of `weights` (random or checkpoint; the
// same bf16 bytes as ModelWeights::read_expert), quantized to `p` into pages of dst.size() / 3 bytes as
// quantize_expert says. Throws ConfigError naming weights.read_expert_packed.precision for bf16, .dst for a
// size that breaks the page rule, and read_expert's errors for a layer or expert out of range; dst is then
// unchanged. Thread-safe.
void read_expert_packed(const ModelWeights& weights, std::uint32_t moe_layer, std::uint32_t expert,
                        ExpertPrecision p, std::span<std::byte> dst);

}  // namespace amoeba::engine
