// Quantized routed experts: the quantizer, the reference dequantizer and the packed expert; see quantize.hpp.
#include "engine/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "amoeba/core/errors.hpp"
#include "engine/model_weights.hpp"

namespace amoeba::engine {

namespace quant = kernels::quant;

namespace {

// Round half to even without depending on the floating-point environment's rounding mode. x - floor(x) is
// exact for every |x| < 2^23, which covers every quotient that is not clamped anyway.
float round_half_even(float x) {
  const float r = std::floor(x);
  const float d = x - r;
  if (d > 0.5f || (d == 0.5f && std::fmod(r, 2.0f) != 0.0f)) return r + 1.0f;
  return r;
}

std::string shape_text(const quant::MatrixLayout& l) {
  return fmt::format("{} x {} int{}", l.rows, l.k, quant::bit_count(l.bits));
}

void check_shape(const quant::MatrixLayout& l, const std::string& what) {
  if (l.rows == 0 || l.k == 0)
    throw ConfigError(what + ".layout", shape_text(l), "rows and K must both be > 0");
}

std::uint16_t load_u16(const std::byte* p) noexcept {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void check_dequantize(std::span<const std::byte> packed, const quant::MatrixLayout& l, std::size_t dst_size) {
  check_shape(l, "dequantize_matrix");
  if (packed.size() != l.total_bytes())
    throw ConfigError(
        "dequantize_matrix.packed", fmt::format("{} bytes", packed.size()),
        fmt::format("must be the packed size of a {} matrix, {} bytes", shape_text(l), l.total_bytes()));
  if (dst_size != l.rows * l.k)
    throw ConfigError("dequantize_matrix.dst", fmt::format("{} values", dst_size),
                      fmt::format("must hold the {} matrix's {} values", shape_text(l), l.rows * l.k));
}

// float(q) x float(scale) for every value, row-major, handed to `put(index, value)`.
template <class Put>
void dequantize_each(std::span<const std::byte> packed, const quant::MatrixLayout& l, Put put) {
  const std::uint64_t groups = l.groups_per_row();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(packed.data());
  for (std::uint64_t n = 0; n < l.rows; ++n)
    for (std::uint64_t g = 0; g < groups; ++g) {
      const float scale = bf16{load_u16(packed.data() + l.scale_byte(n, g * quant::kGroup))}.to_float();
      const std::uint64_t end = std::min<std::uint64_t>(l.k, (g + 1) * quant::kGroup);
      for (std::uint64_t k = g * quant::kGroup; k < end; ++k)
        put(n * l.k + k, static_cast<float>(l.q_at(bytes, n, k)) * scale);
    }
}

// dst of a packed expert: 3 pages, each a multiple of 16 bytes and large enough for either matrix layout.
void check_pages(std::size_t dst_size, const quant::ExpertLayout& layout, std::uint32_t f, std::uint32_t h,
                 ExpertPrecision p, const std::string& field) {
  const std::uint64_t page = dst_size / 3;
  if (dst_size % 3 != 0 || page % quant::kAlign != 0 || page < layout.matrix_bytes())
    throw ConfigError(
        field, fmt::format("{} bytes", dst_size),
        fmt::format("must be 3 pages, each a multiple of {} bytes and at least the packed matrix "
                    "of a {} x {} {} expert ({} bytes; the pool's page: "
                    "ModelSpec::expert_page_bytes())",
                    quant::kAlign, f, h, to_string(p), layout.matrix_bytes()));
}

}  // namespace

quant::Bits quant_bits(ExpertPrecision p, const std::string& field) {
  switch (p) {
    case ExpertPrecision::kInt8:
      return quant::Bits::kInt8;
    case ExpertPrecision::kInt4:
      return quant::Bits::kInt4;
    case ExpertPrecision::kBf16:
      break;
  }
  throw ConfigError(field, std::string(to_string(p)), "must be int8 or int4 (a quantized precision)");
}

quant::ExpertLayout expert_quant_layout(std::uint32_t f, std::uint32_t h, ExpertPrecision p,
                                        const std::string& field) {
  return quant::expert_layout(f, h, quant_bits(p, field));
}

void quantize_matrix(std::span<const bf16> w, const quant::MatrixLayout& l, std::span<std::byte> dst,
                     const std::string& w_name) {
  check_shape(l, "quantize_matrix");
  if (w.size() != l.rows * l.k)
    throw ConfigError(w_name, fmt::format("{} values", w.size()),
                      fmt::format("must be the {} matrix's {} values", shape_text(l), l.rows * l.k));
  if (dst.size() != l.total_bytes())
    throw ConfigError(
        "quantize_matrix.dst", fmt::format("{} bytes", dst.size()),
        fmt::format("must be the packed size of a {} matrix, {} bytes", shape_text(l), l.total_bytes()));
  const std::uint64_t groups = l.groups_per_row();
  const float qmax = static_cast<float>(quant::qmax(l.bits));

  // Pass 1: the scales, and the check that every weight is finite, before dst is touched.
  std::vector<bf16> scales(l.rows * groups);
  for (std::uint64_t n = 0; n < l.rows; ++n)
    for (std::uint64_t g = 0; g < groups; ++g) {
      const std::uint64_t end = std::min<std::uint64_t>(l.k, (g + 1) * quant::kGroup);
      float m = 0.0f;
      for (std::uint64_t k = g * quant::kGroup; k < end; ++k) {
        const float a = std::fabs(w[n * l.k + k].to_float());
        if (!std::isfinite(a))
          throw ConfigError(fmt::format("{}[{}][{}]", w_name, n, k),
                            fmt::format("{}", w[n * l.k + k].to_float()),
                            "weights must be finite to be quantized");
        m = std::max(m, a);
      }
      scales[n * groups + g] = bf16::from_float(m / qmax);
    }

  // Pass 2: the values, then the scales; the padding after each part stays zero.
  std::fill(dst.begin(), dst.end(), std::byte{0});
  auto* bytes = reinterpret_cast<std::uint8_t*>(dst.data());
  for (std::uint64_t n = 0; n < l.rows; ++n)
    for (std::uint64_t g = 0; g < groups; ++g) {
      const float scale = scales[n * groups + g].to_float();
      const std::uint64_t end = std::min<std::uint64_t>(l.k, (g + 1) * quant::kGroup);
      for (std::uint64_t k = g * quant::kGroup; k < end; ++k) {
        const float q = scale == 0.0f
                            ? 0.0f
                            : std::clamp(round_half_even(w[n * l.k + k].to_float() / scale), -qmax, qmax);
        l.put_q(bytes, n, k, static_cast<int>(q));
      }
    }
  std::memcpy(dst.data() + l.scale_offset(), scales.data(), l.scale_bytes());
}

void dequantize_matrix(std::span<const std::byte> packed, const quant::MatrixLayout& l,
                       std::span<float> dst) {
  check_dequantize(packed, l, dst.size());
  dequantize_each(packed, l, [&](std::uint64_t i, float v) { dst[i] = v; });
}

void dequantize_matrix(std::span<const std::byte> packed, const quant::MatrixLayout& l, std::span<bf16> dst) {
  check_dequantize(packed, l, dst.size());
  dequantize_each(packed, l, [&](std::uint64_t i, float v) { dst[i] = bf16::from_float(v); });
}

void quantize_expert(std::span<const std::byte> expert_bf16, std::uint32_t f, std::uint32_t h,
                     ExpertPrecision p, std::span<std::byte> dst, const std::string& what) {
  const quant::ExpertLayout layout = expert_quant_layout(f, h, p, what + ".precision");
  const std::uint64_t values = std::uint64_t(f) * h;
  if (values == 0) throw ConfigError(what + ".shape", fmt::format("{} x {}", f, h), "F and H must be > 0");
  if (expert_bf16.size() != 3 * values * 2)
    throw ConfigError(
        what + ".expert_bf16", fmt::format("{} bytes", expert_bf16.size()),
        fmt::format("must be [W1 | W3 | W2] of a {} x {} expert in bf16, {} bytes", f, h, 3 * values * 2));
  check_pages(dst.size(), layout, f, h, p, what + ".dst");
  const std::uint64_t page = dst.size() / 3;
  // The bf16 input may sit at any byte offset: copy each matrix out before reading it as bf16.
  std::vector<bf16> w(values);
  static constexpr const char* kNames[3] = {"W1", "W3", "W2"};
  std::vector<std::byte> packed[3];
  for (int j = 0; j < 3; ++j) {
    std::memcpy(w.data(), expert_bf16.data() + j * values * 2, values * 2);
    packed[j].resize(layout.matrix(j).total_bytes());
    quantize_matrix(w, layout.matrix(j), packed[j], what + "." + kNames[j]);
  }
  // Every matrix quantized without an error: only now is dst written.
  std::fill(dst.begin(), dst.end(), std::byte{0});
  for (int j = 0; j < 3; ++j) std::memcpy(dst.data() + j * page, packed[j].data(), packed[j].size());
}

void read_expert_packed(const ModelWeights& weights, std::uint32_t moe_layer, std::uint32_t expert,
                        ExpertPrecision p, std::span<std::byte> dst) {
  const HfMoeConfig& c = weights.config();
  const std::string what = fmt::format("weights.read_expert_packed({}, {})", moe_layer, expert);
  // The rules on the caller's arguments first, so that a bad precision or size is named before any read.
  const quant::ExpertLayout layout =
      expert_quant_layout(c.moe_intermediate_size, c.hidden_size, p, "weights.read_expert_packed.precision");
  check_pages(dst.size(), layout, c.moe_intermediate_size, c.hidden_size, p,
              "weights.read_expert_packed.dst");
  std::vector<std::byte> bf16_expert(3 * std::uint64_t(c.moe_intermediate_size) * c.hidden_size * 2);
  weights.read_expert(moe_layer, expert, bf16_expert);
  quantize_expert(bf16_expert, c.moe_intermediate_size, c.hidden_size, p, dst, what);
}

}  // namespace amoeba::engine
