// Quantized experts on the CPU (engine/quantize.hpp over kernels/moe/quant_layout.hpp): the packed layout's
// sizes agree with the simulator's pages for every catalog model; hand-made matrices pack to exact bytes
// (nibble order, signs, scale rounding, ties, a zero group, a partial last group, clamping); random matrices
// round-trip within half a scale of a double-precision reference; the quantization error of Qwen-shaped
// experts is measured and bounded; packed experts come from random and checkpoint weights; bad input is
// refused with the field, value and rule, leaving dst untouched.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/bf16.hpp"
#include "amoeba/core/errors.hpp"
#include "checkpoint_files.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/model_weights.hpp"
#include "engine/quantize.hpp"
#include "moe/quant_layout.hpp"
#include "reference/moe_reference.hpp"

using namespace amoeba;
using namespace amoeba::engine;
namespace quant = amoeba::kernels::quant;

namespace {

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  for (float x : v) out.push_back(bf16::from_float(x));
  return out;
}

std::vector<std::byte> pack(const std::vector<bf16>& w, const quant::MatrixLayout& l) {
  std::vector<std::byte> b(l.total_bytes(), std::byte{0xAB});
  quantize_matrix(w, l, b);
  return b;
}

std::uint8_t u8(const std::vector<std::byte>& b, std::uint64_t i) {
  return static_cast<std::uint8_t>(b.at(i));
}
std::uint16_t scale_bits(const std::vector<std::byte>& b, const quant::MatrixLayout& l, std::uint64_t n,
                         std::uint64_t k) {
  std::uint16_t v;
  std::memcpy(&v, b.data() + l.scale_byte(n, k), 2);
  return v;
}
float scale_of(const std::vector<std::byte>& b, const quant::MatrixLayout& l, std::uint64_t n,
               std::uint64_t k) {
  return bf16{scale_bits(b, l, n, k)}.to_float();
}
int q_of(const std::vector<std::byte>& b, const quant::MatrixLayout& l, std::uint64_t n, std::uint64_t k) {
  return l.q_at(reinterpret_cast<const std::uint8_t*>(b.data()), n, k);
}

// The closed form the simulator's sizes were first written with: F x H x bits / 8 bytes of weights plus the
// larger matrix's scales, rounded up to 16 bytes.
std::uint64_t closed_form_payload(const ModelSpec& m) {
  const std::uint64_t f = m.moe_intermediate_size, h = m.hidden_size;
  const std::uint64_t bits = m.expert_precision == ExpertPrecision::kInt8 ? 8 : 4;
  const std::uint64_t scales = 2 * std::max(f * ((h + 127) / 128), h * ((f + 127) / 128));
  return (f * h * bits / 8 + scales + 15) / 16 * 16;
}

template <class F>
void check_untouched_on_error(std::vector<std::byte>& dst, F call, const std::string& field,
                              const std::string& rule) {
  std::fill(dst.begin(), dst.end(), std::byte{0x5A});
  try {
    call();
    FAIL("no ConfigError for " << field);
  } catch (const ConfigError& e) {
    INFO(e.what());
    CHECK(e.field() == field);
    CHECK_THAT(e.rule(), Catch::Contains(rule));
  }
  CHECK(std::all_of(dst.begin(), dst.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
}

}  // namespace

TEST_CASE("quant layout: offsets and sizes of each part", "[quantize][layout]") {
  for (quant::Bits bits : {quant::Bits::kInt8, quant::Bits::kInt4})
    for (std::uint64_t rows : {1, 3, 16})
      for (std::uint64_t k : {1, 2, 31, 127, 128, 129, 256, 300, 2048}) {
        const quant::MatrixLayout l{rows, k, bits};
        INFO(rows << " x " << k << " int" << quant::bit_count(bits));
        const std::uint64_t row = bits == quant::Bits::kInt8 ? k : (k + 1) / 2;
        const std::uint64_t groups = (k + 127) / 128;
        CHECK(l.row_bytes() == row);
        CHECK(l.groups_per_row() == groups);
        CHECK(l.weight_offset() == 0);
        CHECK(l.weight_bytes() == rows * row);
        CHECK(l.scale_offset() % 16 == 0);
        CHECK(l.scale_offset() >= rows * row);
        CHECK(l.scale_offset() < rows * row + 16);
        CHECK(l.scale_bytes() == 2 * rows * groups);
        CHECK(l.total_bytes() % 16 == 0);
        CHECK(l.total_bytes() >= l.scale_offset() + l.scale_bytes());
        CHECK(l.total_bytes() < l.scale_offset() + l.scale_bytes() + 16);
        CHECK(l.weight_byte(rows - 1, k - 1) == l.weight_bytes() - 1);
        CHECK(l.scale_byte(rows - 1, k - 1) == l.scale_offset() + l.scale_bytes() - 2);
        CHECK(l.vector_loadable() == (row % 16 == 0));
      }
}

TEST_CASE("quant layout: the larger matrix fills the simulator's expert page for every catalog model",
          "[quantize][layout]") {
  for (const ModelSpec& base : model_catalog())
    for (std::uint32_t tp : {1u, 2u, 4u, 8u})
      for (ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
        ModelSpec m;
        try {
          m = shard_model(base, tp, p, "tp");
        } catch (const ConfigError&) {
          continue;  // a dimension that does not split over tp GPUs
        }
        INFO(base.name << " tp " << tp << " " << to_string(p));
        const quant::ExpertLayout l = expert_quant_layout(m.moe_intermediate_size, m.hidden_size, p, "p");
        CHECK(l.w13.rows == m.moe_intermediate_size);
        CHECK(l.w13.k == m.hidden_size);
        CHECK(l.w2.rows == m.hidden_size);
        CHECK(l.w2.k == m.moe_intermediate_size);
        CHECK(l.w13.total_bytes() <= m.expert_page_payload_bytes());
        CHECK(l.w2.total_bytes() <= m.expert_page_payload_bytes());
        CHECK(std::max(l.w13.total_bytes(), l.w2.total_bytes()) == m.expert_page_payload_bytes());
        CHECK(l.matrix_bytes() == m.expert_page_payload_bytes());
        CHECK(std::max(l.w13.scale_bytes(), l.w2.scale_bytes()) == m.expert_scale_bytes());
        CHECK(m.expert_page_bytes() >= m.expert_page_payload_bytes());
        CHECK(m.expert_page_bytes() % 16 == 0);
        // No catalog shape needs the layout's alignment padding: the sizes are those of the closed form.
        CHECK(m.expert_page_payload_bytes() == closed_form_payload(m));
        if (tp == 1) {  // every unsharded catalog model's rows can be read with 16-byte loads only
          CHECK(l.w13.vector_loadable());
          CHECK(l.w2.vector_loadable());
        }
      }
  // The worked numbers of docs/engine.md.
  const ModelSpec q4 = shard_model(find_model("qwen1.5-moe-a2.7b"), 1, ExpertPrecision::kInt4, "p");
  CHECK(q4.expert_page_payload_bytes() == 1'486'848);
  const ModelSpec q3 = shard_model(find_model("qwen3-30b-a3b"), 1, ExpertPrecision::kInt8, "p");
  CHECK(q3.expert_page_payload_bytes() == 768 * 2048 + 2 * std::max(768 * 16, 2048 * 6));
  const ModelSpec mx = shard_model(find_model("mixtral-8x7b"), 1, ExpertPrecision::kInt4, "p");
  CHECK(mx.expert_page_payload_bytes() == 14336ull * 4096 / 2 + 2 * std::max(14336 * 32, 4096 * 112));
}

TEST_CASE("quantize int8: one signed byte per value, scale max|w| / 127", "[quantize]") {
  // Row 0: max 127 -> scale exactly 1. Row 1: max 1 -> 1/127 = 2^-7 x 1.00787 -> bf16 2^-7 x (1 + 1/128).
  const quant::MatrixLayout l{2, 4, quant::Bits::kInt8};
  const std::vector<bf16> w = to_bf16({127, -127, 5, -3, 1, -0.5f, 0.25f, 0});
  const auto b = pack(w, l);
  REQUIRE(b.size() == 16 + 16);
  CHECK(u8(b, 0) == 0x7F);
  CHECK(u8(b, 1) == 0x81);  // -127: never -128
  CHECK(u8(b, 2) == 0x05);
  CHECK(u8(b, 3) == 0xFD);
  CHECK(scale_bits(b, l, 0, 0) == bf16::from_float(1.0f).bits);
  CHECK(scale_bits(b, l, 1, 0) == 0x3C01);
  const float s1 = std::ldexp(1.0f + 1.0f / 128, -7);
  CHECK(scale_of(b, l, 1, 0) == s1);
  CHECK(q_of(b, l, 1, 0) == 127);  // 1 / s1 = 127.008
  CHECK(q_of(b, l, 1, 1) == -64);  // -0.5 / s1 = -63.504
  CHECK(q_of(b, l, 1, 2) == 32);   // 0.25 / s1 = 31.75
  CHECK(q_of(b, l, 1, 3) == 0);
  for (std::uint64_t i = 8; i < 16; ++i) CHECK(u8(b, i) == 0);   // padding after the weights
  for (std::uint64_t i = 20; i < 32; ++i) CHECK(u8(b, i) == 0);  // padding after the scales
}

TEST_CASE(
    "quantize int4: a row shorter than a word keeps even k in the low nibble, two's complement, scale "
    "max|w| / 7",
    "[quantize]") {
  // Max 7 -> scale 1: q = w. K = 6: each row is one partial word, so its values stay in order (int4_slot).
  const quant::MatrixLayout l{2, 6, quant::Bits::kInt4};
  const std::vector<bf16> w = to_bf16({7, -1, 2, -7, 0, 3, -7, 6, -4, 1, 5, -2});
  const auto b = pack(w, l);
  REQUIRE(l.row_bytes() == 3);
  CHECK(u8(b, 0) == 0xF7);  // k0 = 7 (low), k1 = -1 (high)
  CHECK(u8(b, 1) == 0x92);  // k2 = 2, k3 = -7 = 0b1001
  CHECK(u8(b, 2) == 0x30);  // k4 = 0, k5 = 3
  CHECK(u8(b, 3) == 0x69);  // row 1: k0 = -7, k1 = 6
  CHECK(u8(b, 4) == 0x1C);  // -4 = 0b1100, 1
  CHECK(u8(b, 5) == 0xE5);  // 5, -2 = 0b1110
  for (std::uint64_t n = 0; n < 2; ++n)
    for (std::uint64_t k = 0; k < 6; ++k)
      CHECK(q_of(b, l, n, k) == static_cast<int>(w[n * 6 + k].to_float()));
  CHECK(l.scale_offset() == 16);
  CHECK(scale_bits(b, l, 0, 0) == bf16::from_float(1.0f).bits);
  CHECK(scale_bits(b, l, 1, 0) == bf16::from_float(1.0f).bits);
  std::vector<float> back(12);
  dequantize_matrix(b, l, back);
  for (std::size_t i = 0; i < 12; ++i) CHECK(back[i] == w[i].to_float());
}

TEST_CASE(
    "quantize int4: a whole word of 8 values interleaved (value 2j in nibble j, 2j + 1 in nibble j + 4), a "
    "partial last word in order",
    "[quantize]") {
  // Max 7 -> scale 1: q = w. Row 0: two whole words (K = 16); row 1 of another matrix: one whole word and
  // a partial one (K = 12).
  const quant::MatrixLayout l{1, 16, quant::Bits::kInt4};
  const std::vector<bf16> w = to_bf16({1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, 0, 1});
  const auto b = pack(w, l);
  // Word 0: nibbles (low first) v0 v2 v4 v6 | v1 v3 v5 v7 = 1 3 5 7 | 2 4 6 -1.
  CHECK(u8(b, 0) == 0x31);
  CHECK(u8(b, 1) == 0x75);
  CHECK(u8(b, 2) == 0x42);
  CHECK(u8(b, 3) == 0xF6);
  // Word 1: v8 v10 v12 v14 | v9 v11 v13 v15 = -2 -4 -6 0 | -3 -5 -7 1.
  CHECK(u8(b, 4) == 0xCE);
  CHECK(u8(b, 5) == 0x0A);
  CHECK(u8(b, 6) == 0xBD);
  CHECK(u8(b, 7) == 0x19);
  // (word >> 4j) & 0x000F000F: values 2j and 2j + 1 in the two 16-bit halves (what the kernels convert).
  const std::uint32_t word0 = u8(b, 0) | (u8(b, 1) << 8) | (u8(b, 2) << 16) | (std::uint32_t{u8(b, 3)} << 24);
  for (int j = 0; j < 4; ++j) {
    const std::uint32_t pair = (word0 >> (4 * j)) & 0x000F000Fu;
    CHECK(quant::int4_at(static_cast<std::uint8_t>(pair & 0xF), false) ==
          static_cast<int>(w[2 * j].to_float()));
    CHECK(quant::int4_at(static_cast<std::uint8_t>(pair >> 16), false) ==
          static_cast<int>(w[2 * j + 1].to_float()));
  }
  for (std::uint64_t k = 0; k < 16; ++k) CHECK(q_of(b, l, 0, k) == static_cast<int>(w[k].to_float()));
  std::vector<float> back(16);
  dequantize_matrix(b, l, back);
  for (std::size_t i = 0; i < 16; ++i) CHECK(back[i] == w[i].to_float());

  const quant::MatrixLayout p{1, 12, quant::Bits::kInt4};
  const auto c = pack(to_bf16({1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5}), p);
  REQUIRE(p.row_bytes() == 6);
  CHECK(u8(c, 0) == 0x31);  // the whole word as above
  CHECK(u8(c, 4) == 0xDE);  // the partial word in order: k8 = -2 (low), k9 = -3
  CHECK(u8(c, 5) == 0xBC);  // k10 = -4, k11 = -5
}

TEST_CASE("quantize: the scale is rounded to nearest bf16 and q to nearest even with it", "[quantize]") {
  const quant::MatrixLayout l{1, 8, quant::Bits::kInt4};
  SECTION("scale rounded up: 5 / 7 = 2^-1 x 1.4286 -> 2^-1 x (1 + 55/128)") {
    const auto b = pack(to_bf16({5, 0, 0, 0, 0, 0, 0, 0}), l);
    CHECK(scale_bits(b, l, 0, 0) == 0x3F37);  // truncation would give 54/128 (0x3F36)
    CHECK(q_of(b, l, 0, 0) == 7);             // 5 / 0.71484375 = 6.9945
  }
  SECTION("scale rounded down, and ties to even with the stored scale") {
    // 1 / 7 = 2^-3 x 1.142857 -> s = 2^-3 x (1 + 18/128) = 146 x 2^-10 (0x3E12).
    const float s = 146.0f / 1024;
    const std::vector<float> v = {1, 73.0f / 1024, 219.0f / 1024, -73.0f / 1024, -219.0f / 1024, 0.5f, 0, 0};
    const auto b = pack(to_bf16(v), l);
    CHECK(scale_bits(b, l, 0, 0) == 0x3E12);
    CHECK(scale_of(b, l, 0, 0) == s);
    CHECK(q_of(b, l, 0, 0) == 7);   // 1 / s = 7.014
    CHECK(q_of(b, l, 0, 1) == 0);   // exactly 0.5 s: to even 0 (away from zero would give 1)
    CHECK(q_of(b, l, 0, 2) == 2);   // exactly 1.5 s: to even 2
    CHECK(q_of(b, l, 0, 3) == 0);   // -0.5 s
    CHECK(q_of(b, l, 0, 4) == -2);  // -1.5 s
    CHECK(q_of(b, l, 0, 5) == 4);   // 0.5 / s = 3.507
  }
}

TEST_CASE("quantize: a zero group, a partial last group, and the clamp of a subnormal scale", "[quantize]") {
  SECTION("int8, K = 300: groups of 128, 128 and 44 values; the middle one all zero (and -0)") {
    const quant::MatrixLayout l{1, 300, quant::Bits::kInt8};
    std::vector<float> v(300, 0.0f);
    for (int k = 0; k < 128; ++k) v[k] = static_cast<float>(k - 64);  // max |w| 64 -> scale 64/127
    v[130] = -0.0f;
    v[256] = 2.0f;  // the partial group: max 4 -> 4/127 = 2^-5 x 1.00787 -> 2^-5 x (1 + 1/128)
    v[299] = -4.0f;
    const auto b = pack(to_bf16(v), l);
    REQUIRE(l.groups_per_row() == 3);
    CHECK(scale_of(b, l, 0, 0) == bf16::from_float(64.0f / 127).to_float());
    CHECK(scale_bits(b, l, 0, 128) == 0);  // zero group: scale +0, every q 0
    for (int k = 128; k < 256; ++k) CHECK(q_of(b, l, 0, k) == 0);
    CHECK(scale_bits(b, l, 0, 256) == 0x3D01);
    CHECK(q_of(b, l, 0, 256) == 64);  // 2 / 0.031494 = 63.504
    CHECK(q_of(b, l, 0, 299) == -127);
    CHECK(q_of(b, l, 0, 0) == -127);  // -64 / (64/127 rounded) = -127.0
    CHECK(l.total_bytes() == 304 + 16);
    std::vector<float> back(300);
    dequantize_matrix(b, l, back);
    for (int k = 128; k < 256; ++k) CHECK(back[k] == 0.0f);
  }
  SECTION("int4, K = 129: the last group is one value") {
    const quant::MatrixLayout l{1, 129, quant::Bits::kInt4};
    std::vector<float> v(129, 0.25f);
    v[128] = -3.0f;  // alone in its group: scale 3/7 -> 2^-2 x (1 + 91/128), q = -7
    const auto b = pack(to_bf16(v), l);
    CHECK(l.row_bytes() == 65);
    CHECK(scale_bits(b, l, 0, 128) == bf16::from_float(3.0f / 7).bits);
    CHECK(q_of(b, l, 0, 128) == -7);
    CHECK((u8(b, 64) & 0xF0) == 0);  // the unused high nibble of the last byte stays zero
  }
  SECTION("int8: a subnormal scale rounds down so far that the clamp binds") {
    // w = 189 x 2^-133 (a normal bf16); w / 127 = 1.488 x 2^-133 rounds to the bf16 subnormal 2^-133.
    const quant::MatrixLayout l{1, 2, quant::Bits::kInt8};
    const float w = std::ldexp(189.0f, -133);
    REQUIRE(bf16::from_float(w).to_float() == w);
    const auto b = pack(to_bf16({w, -w}), l);
    CHECK(scale_of(b, l, 0, 0) == std::ldexp(1.0f, -133));
    CHECK(q_of(b, l, 0, 0) == 127);   // 189 clamped
    CHECK(q_of(b, l, 0, 1) == -127);  // symmetric: never -128
  }
  SECTION("a scale that underflows bf16 to zero quantizes its group to zero") {
    const quant::MatrixLayout l{1, 2, quant::Bits::kInt4};
    const float w = std::ldexp(1.0f, -133);  // the smallest bf16 subnormal; w / 7 rounds to 0
    const auto b = pack(to_bf16({w, -w}), l);
    CHECK(scale_bits(b, l, 0, 0) == 0);
    CHECK(u8(b, 0) == 0);
  }
}

TEST_CASE("quantize: random matrices round-trip within half a scale of a double-precision reference",
          "[quantize]") {
  std::mt19937 rng(15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 8);
  int exact_ties = 0;
  for (quant::Bits bits : {quant::Bits::kInt8, quant::Bits::kInt4})
    for (auto [rows, k] : {std::pair<std::uint64_t, std::uint64_t>{7, 300}, {5, 1}, {16, 512}, {3, 200}}) {
      const quant::MatrixLayout l{rows, k, bits};
      const int qmax = quant::qmax(bits);
      INFO(rows << " x " << k << " int" << quant::bit_count(bits));
      // Each row has its own magnitude, so the scales cover many binades; a few exact zeros.
      std::vector<bf16> w(rows * k);
      for (std::uint64_t n = 0; n < rows; ++n) {
        const float mag = std::ldexp(1.0f, exponent(rng));
        for (std::uint64_t i = 0; i < k; ++i)
          w[n * k + i] = bf16::from_float(i % 37 == 5 ? 0.0f : normal(rng) * mag);
      }
      const auto b = pack(w, l);
      std::vector<float> back(rows * k);
      std::vector<bf16> back16(rows * k);
      dequantize_matrix(b, l, back);
      dequantize_matrix(b, l, back16);
      int near_ties = 0;
      for (std::uint64_t n = 0; n < rows; ++n)
        for (std::uint64_t g = 0; g < l.groups_per_row(); ++g) {
          const std::uint64_t k0 = g * 128, k1 = std::min<std::uint64_t>(k, k0 + 128);
          double m = 0;
          for (std::uint64_t i = k0; i < k1; ++i) m = std::max(m, std::fabs(double(w[n * k + i].to_float())));
          // The stored scale is the bf16 nearest to m / qmax (checked against both bf16 neighbours).
          const double exact = m / qmax;
          const std::uint16_t sb = scale_bits(b, l, n, k0);
          const double s = bf16{sb}.to_float();
          CHECK(std::fabs(s - exact) <= std::fabs(double(bf16{std::uint16_t(sb + 1)}.to_float()) - exact));
          if (sb > 0)
            CHECK(std::fabs(s - exact) <= std::fabs(double(bf16{std::uint16_t(sb - 1)}.to_float()) - exact));
          for (std::uint64_t i = k0; i < k1; ++i) {
            const double x = w[n * k + i].to_float();
            const int q = q_of(b, l, n, i);
            const double r = x / s;
            const double q_ref = std::clamp(std::nearbyint(r), double(-qmax), double(qmax));
            const double frac = std::fabs(r - std::trunc(r));
            exact_ties += frac == 0.5;  // exact in float too: must go to the even neighbour
            if (frac != 0.5 && std::fabs(frac - 0.5) < 1e-6) {
              ++near_ties;  // the float quotient may round onto either side of the tie
              CHECK(std::fabs(q - q_ref) <= 1);
            } else {
              CHECK(q == q_ref);
            }
            CHECK(std::abs(q) <= qmax);
            // w' = q x scale is exact in float, within half a scale (plus the quotient's rounding) of w,
            // and its bf16 rounding adds at most a relative 2^-8.
            CHECK(double(back[n * k + i]) == q * s);
            CHECK(std::fabs(x - q * s) <= s / 2 + std::fabs(x) * 0x1p-24);
            CHECK(back16[n * k + i].bits == bf16::from_float(back[n * k + i]).bits);
            CHECK(std::fabs(x - double(back16[n * k + i].to_float())) <=
                  s / 2 + std::fabs(x) * 0x1p-24 + std::fabs(q * s) * 0x1p-8);
          }
        }
      CHECK(near_ties < 8);
    }
  CHECK(exact_ties > 10);  // bf16 weights over bf16 scales fall exactly on .5 often enough to test ties
}

TEST_CASE("quantize: relative L2 error of Qwen-shaped random experts", "[quantize][error]") {
  // Random weights (std 0.02, Irwin-Hall) of expert 0 of MoE layer 0, W1 and W2 of each model. RTN with a
  // max-scaled group of 128 leaves an error of std ~ scale / sqrt(12), scale = max / qmax; the measured
  // errors (0.59% int8 and 10.7% int4 with exact w', 2026-12-02) put the mean group max at ~2.6 std. Rounding
  // w' to bf16 adds a relative ~0.2% rms of its own: int8's 0.59% becomes 0.62%, int4's stays 10.7%.
  for (const char* name : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    const HfMoeConfig c = hf_config_for(find_model(name));
    const auto weights = random_weights(c, 7);
    const std::uint64_t f = c.moe_intermediate_size, h = c.hidden_size, values = f * h;
    std::vector<std::byte> expert(3 * values * 2);
    weights->read_expert(0, 0, expert);
    for (ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
      const quant::ExpertLayout layout = expert_quant_layout(c.moe_intermediate_size, c.hidden_size, p, "p");
      for (int j : {0, 2}) {
        std::vector<bf16> w(values);
        std::memcpy(w.data(), expert.data() + j * values * 2, values * 2);
        const auto b = pack(w, layout.matrix(j));
        std::vector<float> exact(values);
        std::vector<bf16> rounded(values);
        dequantize_matrix(b, layout.matrix(j), exact);
        dequantize_matrix(b, layout.matrix(j), rounded);
        double err = 0, err16 = 0, ref = 0;
        for (std::uint64_t i = 0; i < values; ++i) {
          const double x = w[i].to_float();
          err += (x - exact[i]) * (x - exact[i]);
          err16 += (x - rounded[i].to_float()) * (x - rounded[i].to_float());
          ref += x * x;
        }
        const double rel = std::sqrt(err / ref), rel16 = std::sqrt(err16 / ref);
        WARN(name << " " << (j == 0 ? "W1" : "W2") << " " << to_string(p) << ": relative L2 error "
                  << rel * 100 << "% (w' exact), " << rel16 * 100 << "% (w' in bf16)");
        if (p == ExpertPrecision::kInt8) {
          CHECK(rel > 0.005);
          CHECK(rel < 0.007);
          CHECK(rel16 < 0.008);
        } else {
          CHECK(rel > 0.09);
          CHECK(rel < 0.12);
          CHECK(rel16 < 0.12);
        }
        CHECK(rel16 >= rel * 0.99);
      }
    }
  }
}

TEST_CASE("quantize: relative L2 error of the MoE layer's output against bf16 experts, Qwen shapes",
          "[quantize][error]") {
  // One MoE layer (layer 0, random weights of std 0.02, the shared expert's chunks included) on 4 tokens of
  // unit-scale activations routed to k random experts, through the double CPU reference (what the GPU kernel
  // matches to 1.7e-3, docs/results/quantized_h200.md) with the bf16 experts and with the same experts
  // quantized and dequantized (w' rounded to bf16: the reference reads bf16). Measured (2026-12-01):
  // Qwen1.5-MoE-A2.7B int8 1.09%, int4 19.2%; Qwen3-30B-A3B int8 1.08%, int4 18.7%: the weights' own error
  // (0.6%, 10.7%) in W1 and W3 compounds in SiLU(gate)·up (~sqrt 2 x) and adds W2's (sqrt(2 + 1) x in all).
  for (const char* name : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    const HfMoeConfig c = hf_config_for(find_model(name));
    const auto weights = random_weights(c, 7);
    const std::uint32_t F = c.moe_intermediate_size, H = c.hidden_size, E = c.num_experts, K = c.top_k;
    const std::uint32_t chunks = weights->shared_chunks(), T = 4;
    const std::uint64_t fh = std::uint64_t(F) * H;
    const kernels::MoeShape shape{int(T), int(H), int(F), int(E), int(K), int(chunks)};
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> unit(-1.7f, 1.7f), positive(0.05f, 1.0f);
    std::vector<std::uint16_t> x(std::size_t(T) * H);
    for (auto& v : x) v = bf16::from_float(unit(rng)).bits;
    std::vector<std::int32_t> ids(std::size_t(T) * K);
    std::vector<float> wts(ids.size()), shared_w(T);
    std::vector<std::uint32_t> perm(E);
    for (std::uint32_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0u);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (std::uint32_t j = 0; j < K; ++j) {
        ids[t * K + j] = std::int32_t(perm[j]);
        wts[t * K + j] = positive(rng) / float(K);
      }
      shared_w[t] = positive(rng);
    }
    // [W1 | W3 | W2] bf16 bits of every expert the tokens use (routed, then the shared chunks), as read.
    std::vector<std::vector<std::uint16_t>> bf(E + chunks);
    std::vector<std::byte> bytes(3 * fh * 2);
    auto read = [&](std::uint32_t e) {
      if (e < E)
        weights->read_expert(0, e, bytes);
      else
        weights->read_shared_chunk(0, e - E, bytes);
      bf[e].resize(3 * fh);
      std::memcpy(bf[e].data(), bytes.data(), bytes.size());
    };
    for (std::int32_t e : ids)
      if (bf[std::size_t(e)].empty()) read(std::uint32_t(e));
    for (std::uint32_t e = E; e < E + chunks; ++e) read(e);
    auto layer = [&](const std::vector<std::vector<std::uint16_t>>& experts) {
      std::vector<reference::ExpertMatrices> m(E + chunks);
      static const std::uint16_t dummy[1] = {0};
      for (std::size_t e = 0; e < m.size(); ++e)
        m[e] = experts[e].empty() ? reference::ExpertMatrices{dummy, dummy, dummy}
                                  : reference::ExpertMatrices{experts[e].data(), experts[e].data() + fh,
                                                              experts[e].data() + 2 * fh};
      const reference::MoeReferenceInputs in{shape, x, ids, wts, shared_w, m};
      REQUIRE(reference::check(in).ok);
      std::vector<double> out(std::size_t(T) * H);
      reference::moe_reference(in, out);
      return out;
    };
    const std::vector<double> ref = layer(bf);
    for (ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
      const quant::ExpertLayout L = expert_quant_layout(F, H, p, "p");
      std::vector<std::vector<std::uint16_t>> dq(E + chunks);
      std::vector<std::byte> packed(3 * L.matrix_bytes());
      for (std::size_t e = 0; e < bf.size(); ++e) {
        if (bf[e].empty()) continue;
        quantize_expert(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bf[e].data()), 6 * fh),
                        F, H, p, packed);
        std::vector<bf16> out(3 * fh);
        for (int j = 0; j < 3; ++j)
          dequantize_matrix(
              std::span<const std::byte>(packed).subspan(j * L.matrix_bytes(), L.matrix(j).total_bytes()),
              L.matrix(j), std::span<bf16>(out).subspan(j * fh, fh));
        dq[e].resize(3 * fh);
        for (std::size_t i = 0; i < out.size(); ++i) dq[e][i] = out[i].bits;
      }
      const double rel = reference::relative_l2_error(layer(dq), ref);
      WARN(name << " " << to_string(p) << ": relative L2 error of the layer output " << rel * 100 << "%");
      if (p == ExpertPrecision::kInt8) {
        CHECK(rel > 0.008);
        CHECK(rel < 0.014);
      } else {
        CHECK(rel > 0.15);
        CHECK(rel < 0.23);
      }
    }
  }
}

TEST_CASE("read_expert_packed: [W1 | W3 | W2] packed one per page, from random and checkpoint weights",
          "[quantize][weights]") {
  // H = 64, F = 32 (K = 64 for W1/W3: one partial group; K = 32 for W2).
  const char* kQwen2 = R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
    "intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64, "mlp_only_layers": [], "norm_topk_prob": false})";
  const Checkpoint ck = open_checkpoint(checkpoint_files::write_checkpoint("quant_q2", kQwen2).string());
  const auto from_ck = checkpoint_weights(ck);
  const auto from_seed = random_weights(ck.config, 3);
  const auto qwen = random_weights(hf_config_for(find_model("qwen1.5-moe-a2.7b")), 3);
  for (const ModelWeights* weights : {from_ck.get(), from_seed.get(), qwen.get()})
    for (ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
      const HfMoeConfig& c = weights->config();
      INFO(c.hidden_size << " x " << c.moe_intermediate_size << " " << to_string(p));
      const std::uint32_t f = c.moe_intermediate_size, h = c.hidden_size;
      const std::uint64_t values = std::uint64_t(f) * h;
      const quant::ExpertLayout layout = expert_quant_layout(f, h, p, "p");
      ModelSpec spec = c.to_model_spec("m");
      spec.expert_precision = p;
      REQUIRE(spec.expert_page_payload_bytes() == layout.matrix_bytes());
      std::vector<std::byte> bf(3 * values * 2);
      weights->read_expert(1, 2, bf);
      // The tightest pages and the pool's (padded to nest KV pages) pages both work.
      for (std::uint64_t page : {spec.expert_page_payload_bytes(), spec.expert_page_bytes(),
                                 spec.expert_page_payload_bytes() + 32}) {
        std::vector<std::byte> dst(3 * page, std::byte{0xCD});
        read_expert_packed(*weights, 1, 2, p, dst);
        std::vector<std::byte> again(3 * page);
        quantize_expert(bf, f, h, p, again);
        CHECK(dst == again);
        for (int j = 0; j < 3; ++j) {
          const quant::MatrixLayout& l = layout.matrix(j);
          std::vector<bf16> w(values);
          std::memcpy(w.data(), bf.data() + j * values * 2, values * 2);
          const auto one = pack(w, l);
          CHECK(std::equal(one.begin(), one.end(), dst.begin() + std::ptrdiff_t(j * page)));
          CHECK(std::all_of(dst.begin() + std::ptrdiff_t(j * page + l.total_bytes()),
                            dst.begin() + std::ptrdiff_t((j + 1) * page),
                            [](std::byte x) { return x == std::byte{0}; }));
        }
      }
      // Another expert gives other bytes.
      std::vector<std::byte> a(3 * layout.matrix_bytes()), b(3 * layout.matrix_bytes());
      read_expert_packed(*weights, 1, 2, p, a);
      read_expert_packed(*weights, 0, 3, p, b);
      CHECK(a != b);
    }
}

TEST_CASE("quantize: bad input names the field, the value and the rule, and leaves dst untouched",
          "[quantize][errors]") {
  const HfMoeConfig c = hf_config_for(find_model("qwen3-30b-a3b"));
  const auto weights = random_weights(c, 1);
  const quant::ExpertLayout layout = expert_quant_layout(768, 2048, ExpertPrecision::kInt4, "p");
  std::vector<std::byte> dst(3 * layout.matrix_bytes());
  check_untouched_on_error(
      dst, [&] { read_expert_packed(*weights, 0, 0, ExpertPrecision::kBf16, dst); },
      "weights.read_expert_packed.precision", "must be int8 or int4");
  try {
    read_expert_packed(*weights, 0, 0, ExpertPrecision::kBf16, dst);
  } catch (const ConfigError& e) {
    CHECK(e.value() == "bf16");
  }
  std::vector<std::byte> small(3 * layout.matrix_bytes() - 48);
  check_untouched_on_error(
      small, [&] { read_expert_packed(*weights, 0, 0, ExpertPrecision::kInt4, small); },
      "weights.read_expert_packed.dst",
      "at least the packed matrix of a 768 x 2048 int4 expert (811008 bytes");
  std::vector<std::byte> odd(3 * layout.matrix_bytes() + 1);
  check_untouched_on_error(
      odd, [&] { read_expert_packed(*weights, 0, 0, ExpertPrecision::kInt4, odd); },
      "weights.read_expert_packed.dst", "must be 3 pages");
  std::vector<std::byte> unaligned(3 * (layout.matrix_bytes() + 8));
  check_untouched_on_error(
      unaligned, [&] { read_expert_packed(*weights, 0, 0, ExpertPrecision::kInt4, unaligned); },
      "weights.read_expert_packed.dst", "a multiple of 16 bytes");
  check_untouched_on_error(
      dst, [&] { read_expert_packed(*weights, c.moe_layers(), 0, ExpertPrecision::kInt4, dst); },
      "weights.read_expert", "needs a MoE layer < 48");
  check_untouched_on_error(
      dst, [&] { read_expert_packed(*weights, 0, c.num_experts, ExpertPrecision::kInt4, dst); },
      "weights.read_expert", "an expert < 128");

  // One matrix.
  const quant::MatrixLayout l{2, 130, quant::Bits::kInt8};
  std::vector<bf16> w(2 * 130, bf16::from_float(0.5f));
  std::vector<std::byte> out(l.total_bytes());
  std::vector<std::byte> short_out(l.total_bytes() - 16);
  check_untouched_on_error(
      short_out, [&] { quantize_matrix(w, l, short_out); }, "quantize_matrix.dst",
      "must be the packed size of a 2 x 130 int8 matrix, 288 bytes");
  check_untouched_on_error(
      out, [&] { quantize_matrix(std::span(w).first(259), l, out); }, "quantize_matrix.w",
      "must be the 2 x 130 int8 matrix's 260 values");
  check_untouched_on_error(
      out,
      [&] {
        quantize_matrix(w, quant::MatrixLayout{0, 130, quant::Bits::kInt8}, out);
      },
      "quantize_matrix.layout", "rows and K must both be > 0");
  w[201] = bf16::from_float(INFINITY);  // row 1, k 71: the error comes from pass 1, before any write
  check_untouched_on_error(
      out, [&] { quantize_matrix(w, l, out, "W2"); }, "W2[1][71]", "weights must be finite");
  w[201] = bf16::from_float(NAN);
  check_untouched_on_error(
      out, [&] { quantize_matrix(w, l, out, "W2"); }, "W2[1][71]", "weights must be finite");

  // A non-finite weight in the last matrix of an expert: the first two were quantized, dst is still
  // untouched.
  const std::uint32_t f = 32, h = 64;
  std::vector<bf16> expert(3 * f * h, bf16::from_float(0.01f));
  expert[2 * f * h + 5] = bf16::from_float(-INFINITY);
  const quant::ExpertLayout el = expert_quant_layout(f, h, ExpertPrecision::kInt8, "p");
  std::vector<std::byte> edst(3 * el.matrix_bytes());
  check_untouched_on_error(
      edst,
      [&] { quantize_expert(std::as_bytes(std::span(expert)), f, h, ExpertPrecision::kInt8, edst, "x"); },
      "x.W2[0][5]", "weights must be finite");
  check_untouched_on_error(
      edst,
      [&] { quantize_expert(std::as_bytes(std::span(expert)), f, h, ExpertPrecision::kBf16, edst, "x"); },
      "x.precision", "must be int8 or int4");

  // The dequantizer checks its sizes too.
  std::vector<float> back(2 * 130, 1.5f);
  CHECK_THROWS_WITH(dequantize_matrix(std::span<const std::byte>(out).first(100), l, std::span(back)),
                    Catch::Contains("dequantize_matrix.packed = 100 bytes"));
  CHECK_THROWS_WITH(dequantize_matrix(out, l, std::span(back).first(10)),
                    Catch::Contains("dequantize_matrix.dst = 10 values"));
  CHECK(std::all_of(back.begin(), back.end(), [](float x) { return x == 1.5f; }));
}
