// The elementwise and per-row operations of the Qwen MoE decoders as transformers computes them in bf16,
// written once on the host: the host reference decoder (decoder_reference.hpp) is built from them, and the
// GPU kernels of the same operations (kernels/model/decoder_ops.cuh) are tested against them. Inputs and
// outputs are bf16 values held in floats; each function rounds where the bf16 module returns.
#pragma once

#include <cmath>
#include <cstdint>

#include "amoeba/core/bf16.hpp"

namespace amoeba::engine::ops {

// A bf16 module's output: rounded to bf16 (nearest even), widened back.
inline float round_bf16(double x) {
  return bf16::from_float(static_cast<float>(x)).to_float();
}

// RMSNorm of one row: float32 mean of squares, x * rsqrt(var + eps) rounded, times the weight, rounded.
inline void rms_norm_row(const float* x, std::uint32_t dim, const bf16* weight, double eps, float* out) {
  float var = 0;
  for (std::uint32_t d = 0; d < dim; ++d) var += x[d] * x[d];
  var /= float(dim);
  const float inv = 1.0f / std::sqrt(var + float(eps));
  for (std::uint32_t d = 0; d < dim; ++d)
    out[d] = round_bf16(double(weight[d].to_float()) * round_bf16(double(x[d]) * inv));
}

// RoPE's inverse frequency j of a head of `head_dim` (float32, as transformers computes it).
inline float rope_inv_freq(double theta, std::uint32_t j, std::uint32_t head_dim) {
  return 1.0f / std::pow(float(theta), float(2 * j) / float(head_dim));
}

// Rotate-half RoPE of one head at `position`, given the head's inverse frequencies (rope_inv_freq for j <
// head_dim / 2, computed once per model): cos/sin of the float32 angle rounded to bf16, each product and the
// sum rounded.
inline void rope_head(const float* src, std::uint32_t head_dim, std::uint32_t position, const float* inv_freq,
                      float* dst) {
  for (std::uint32_t d = 0; d < head_dim; ++d) {
    const float angle = float(position) * inv_freq[d % (head_dim / 2)];
    const float c = round_bf16(std::cos(angle)), s = round_bf16(std::sin(angle));
    const float rot = d < head_dim / 2 ? -src[d + head_dim / 2] : src[d - head_dim / 2];
    dst[d] = round_bf16(double(round_bf16(double(src[d]) * c)) + double(round_bf16(double(rot) * s)));
  }
}

// SiLU(gate) * up, each rounded.
inline float silu_mul(float gate, float up) {
  return round_bf16(double(round_bf16(gate / (1.0f + std::exp(-gate)))) * up);
}

// A residual add in bf16.
inline float add(float a, float b) {
  return round_bf16(double(a) + double(b));
}

}  // namespace amoeba::engine::ops
