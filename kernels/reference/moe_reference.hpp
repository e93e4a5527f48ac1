// CPU reference of one MoE layer in double precision over bf16 inputs: what the paged MoE kernel must
// compute. Host-only (never includes a CUDA header), so CPU-only CI tests it and device tests compare against
// it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "moe/moe_shape.hpp"

namespace amoeba::reference {

using kernels::MoeShape;
using kernels::Status;

// bf16 is stored as its 16 bits; these convert exactly (to float) and with round-to-nearest-even (from
// float).
inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// The three matrices of one expert (routed, or one shared chunk), each F·H bf16 values:
// w1 (gate) and w3 (up) are F×H row-major, w2 (down) is H×F row-major.
struct ExpertMatrices {
  const std::uint16_t* w1 = nullptr;
  const std::uint16_t* w3 = nullptr;
  const std::uint16_t* w2 = nullptr;
};

struct MoeReferenceInputs {
  MoeShape shape;
  std::span<const std::uint16_t> input;     // [T, H]
  std::span<const std::int32_t> topk_ids;   // [T, k]; ids outside [0, E) contribute nothing
  std::span<const float> topk_weights;      // [T, k]
  std::span<const float> shared_weights;    // [T], or empty: weight 1 for every shared chunk
  std::span<const ExpertMatrices> experts;  // [E + m]: routed experts then shared chunks
};

inline double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

// Checks sizes against the shape; the message names the span and the size it should have.
inline Status check(const MoeReferenceInputs& in) {
  if (Status s = kernels::validate(in.shape); !s) return s;
  const MoeShape& sh = in.shape;
  const auto t = static_cast<std::size_t>(sh.num_tokens);
  if (in.input.size() != t * static_cast<std::size_t>(sh.hidden))
    return Status::error("input.size", static_cast<long long>(in.input.size()), "must be num_tokens*hidden");
  if (in.topk_ids.size() != t * static_cast<std::size_t>(sh.top_k))
    return Status::error("topk_ids.size", static_cast<long long>(in.topk_ids.size()),
                         "must be num_tokens*top_k");
  if (in.topk_weights.size() != in.topk_ids.size())
    return Status::error("topk_weights.size", static_cast<long long>(in.topk_weights.size()),
                         "must equal topk_ids.size");
  if (!in.shared_weights.empty() && in.shared_weights.size() != t)
    return Status::error("shared_weights.size", static_cast<long long>(in.shared_weights.size()),
                         "must be 0 or num_tokens");
  if (in.experts.size() != static_cast<std::size_t>(sh.total_experts()))
    return Status::error("experts.size", static_cast<long long>(in.experts.size()),
                         "must be num_experts + num_shared_chunks");
  for (const ExpertMatrices& e : in.experts)
    if (e.w1 == nullptr || e.w3 == nullptr || e.w2 == nullptr)
      return Status::error("experts", "every expert needs w1, w3 and w2");
  return Status::success();
}

// out[t][h] = sum over the token's slots of weight · W2·(SiLU(W1·x) ⊙ (W3·x)), all in double.
// `out` has T·H values. Precondition: check(in) is ok.
inline void moe_reference(const MoeReferenceInputs& in, std::span<double> out) {
  const MoeShape& sh = in.shape;
  const int h_dim = sh.hidden, f_dim = sh.intermediate;
  std::vector<double> x(static_cast<std::size_t>(h_dim));
  std::vector<double> act(static_cast<std::size_t>(f_dim));
  for (int t = 0; t < sh.num_tokens; ++t) {
    for (int h = 0; h < h_dim; ++h) x[h] = bf16_to_float(in.input[static_cast<std::size_t>(t) * h_dim + h]);
    double* o = out.data() + static_cast<std::size_t>(t) * h_dim;
    for (int h = 0; h < h_dim; ++h) o[h] = 0.0;
    for (int j = 0; j < sh.slots_per_token(); ++j) {
      int e;
      double w;
      if (j < sh.top_k) {
        e = in.topk_ids[static_cast<std::size_t>(t) * sh.top_k + j];
        w = in.topk_weights[static_cast<std::size_t>(t) * sh.top_k + j];
        if (e < 0 || e >= sh.num_experts) continue;
      } else {
        e = sh.num_experts + (j - sh.top_k);
        w = in.shared_weights.empty() ? 1.0 : in.shared_weights[static_cast<std::size_t>(t)];
      }
      const ExpertMatrices& m = in.experts[static_cast<std::size_t>(e)];
      for (int f = 0; f < f_dim; ++f) {
        const std::uint16_t* r1 = m.w1 + static_cast<std::size_t>(f) * h_dim;
        const std::uint16_t* r3 = m.w3 + static_cast<std::size_t>(f) * h_dim;
        double g = 0.0, u = 0.0;
        for (int h = 0; h < h_dim; ++h) {
          g += bf16_to_float(r1[h]) * x[h];
          u += bf16_to_float(r3[h]) * x[h];
        }
        act[f] = silu(g) * u;
      }
      for (int h = 0; h < h_dim; ++h) {
        const std::uint16_t* r2 = m.w2 + static_cast<std::size_t>(h) * f_dim;
        double d = 0.0;
        for (int f = 0; f < f_dim; ++f) d += bf16_to_float(r2[f]) * act[f];
        o[h] += w * d;
      }
    }
  }
}

// ‖a − b‖ / ‖b‖ over equally sized ranges (0 when both are zero).
template <class A, class B>
double relative_l2_error(const A& a, const B& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace amoeba::reference
