// The packed layout of one quantized expert matrix (int8 or int4 weights with bf16 group scales), shared by
// the host quantizer (reference_engine/engine/quantize.hpp), the host expert store, the pool's expert pages,
// the loader and the MoE kernels. Host-and-device, constexpr only, no CUDA header.
//
// One matrix has N rows of K values; K is the reduction dimension (W1, W3: N = F, K = H; W2: N = H, K = F).
// Its bytes, from the start of its page:
//
//   weights  [N][row_bytes]  row_bytes = ceil(K x bits / 8)       at 0
//            int8: one signed byte per value, value k at byte k of its row;
//            int4: two values per byte, each a two's-complement nibble (-8..7; the quantizer writes -7..7),
//                  in nibble slots (two per byte, the low nibble first): a row's values in words of 8
//                  (4 bytes), value 8w + 2j in slot 8w + j and value 8w + 2j + 1 in slot 8w + j + 4, so
//                  that (word >> 4j) & 0x000F000F holds values 2j and 2j + 1 of the word in its two 16-bit
//                  halves (dequant::int4x8: one shift and one lop3 per pair); a last word that K leaves
//                  partial (K % 8 != 0) keeps its values in order, value k in slot k (int4_slot);
//   padding  to the next multiple of 16 bytes (zero)
//   scales   [N][G] bf16       G = ceil(K / 128)                   at scale_offset = round_up(N x row_bytes,
//   16)
//            scale (n, g) covers values k in [128 g, min(128 (g + 1), K)) of row n: w ~ q x scale;
//   padding  to total_bytes = round_up(scale_offset + 2 N G, 16) (zero)
//
// Why this layout:
//  - Decode GEMV (moe/decode_gemv.cuh): a thread streams one row with 16-byte loads of consecutive k. A
//  16-byte
//    load holds 16 int8 or 32 int4 values of one row (8 bf16 today), so the weight bytes per load quadruple
//    or double and the load pattern stays the same. A group of 128 k is 128 (int8) or 64 (int4) bytes: one
//    scale covers 8 or 4 whole loads, and no load straddles two groups (128 is a multiple of 16 and 32, and
//    loads start at multiples of their width). A row's G scales are contiguous (32 bytes for K = 2048), so a
//    thread that walks its slice of K reads them with one or two loads.
//  - Grouped GEMM (moe/grouped_gemm*.cuh, 64 k per step): a 64-k step of a row is 64 or 32 contiguous bytes,
//  4
//    or 2 cp.async chunks; a tile of consecutive rows n0..n0+127 has all its scales in one contiguous slab
//    [n0, n0 + 128) x G (4 KiB for K = 2048) that can be staged into shared memory once per tile.
//  - The weights and the scales each start on 16 bytes and the total is a multiple of 16, so matrices placed
//    back to back (the host store, the load buffer) keep every part aligned.
// Row starts are 16-byte aligned only when row_bytes is a multiple of 16 (K a multiple of 16 for int8, 32 for
// int4; vector_loadable()); every catalog model's unsharded shapes are.
//
// The pool's expert page holds one matrix, and one page size serves all three, so a quantized expert page is
// ExpertLayout::matrix_bytes() = max(total of W1/W3, total of W2) (ModelSpec::expert_page_payload_bytes()),
// possibly padded further to nest KV pages (ModelSpec::expert_page_bytes()). The quantization rule
// (symmetric, round to nearest even, bf16 scale = max|w| / qmax) is in reference_engine/engine/quantize.hpp.
#pragma once

#include <cstdint>

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::quant {

inline constexpr std::uint32_t kGroup = 128;  // values along K per scale
inline constexpr std::uint32_t kAlign = 16;   // bytes: one vector load; each part starts on a multiple

// Bits per stored weight.
enum class Bits : std::uint8_t { kInt8 = 8, kInt4 = 4 };

AMOEBA_HOST_DEVICE constexpr std::uint32_t bit_count(Bits b) noexcept {
  return static_cast<std::uint32_t>(b);
}
// The largest |q| the quantizer writes: symmetric, so int8 never holds -128 and int4 never -8.
AMOEBA_HOST_DEVICE constexpr int qmax(Bits b) noexcept {
  return b == Bits::kInt8 ? 127 : 7;
}
// Values of one row in one 16-byte load (16 int8, 32 int4), and such loads per scale group (8, 4).
AMOEBA_HOST_DEVICE constexpr std::uint32_t values_per_load(Bits b) noexcept {
  return kAlign * 8 / bit_count(b);
}
AMOEBA_HOST_DEVICE constexpr std::uint32_t loads_per_group(Bits b) noexcept {
  return kGroup / values_per_load(b);
}

AMOEBA_HOST_DEVICE constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) noexcept {
  return (a + b - 1) / b;
}
AMOEBA_HOST_DEVICE constexpr std::uint64_t round_up(std::uint64_t a, std::uint64_t b) noexcept {
  return ceil_div(a, b) * b;
}

// The nibble slot of int4 value k in a row of K values (the layout above): byte slot / 2, the high nibble for
// an odd slot.
AMOEBA_HOST_DEVICE constexpr std::uint64_t int4_slot(std::uint64_t k, std::uint64_t K) noexcept {
  const std::uint64_t word = k / 8, j = k % 8;
  if (8 * (word + 1) > K) return k;  // a partial last word: in order
  return 8 * word + (j % 2 == 0 ? j / 2 : 4 + j / 2);
}
// The value in the low (high = false) or high nibble of a packed int4 byte, sign-extended.
AMOEBA_HOST_DEVICE constexpr int int4_at(std::uint8_t byte, bool high) noexcept {
  const int v = high ? (byte >> 4) : (byte & 0xF);
  return v >= 8 ? v - 16 : v;
}
// The byte holding int4 values `low` (low nibble) and `high` (high nibble), each in [-8, 7].
AMOEBA_HOST_DEVICE constexpr std::uint8_t int4_pack(int low, int high) noexcept {
  return static_cast<std::uint8_t>((low & 0xF) | ((high & 0xF) << 4));
}

// Offsets and sizes (bytes, from the matrix's first byte) of one N x K matrix.
struct MatrixLayout {
  std::uint64_t rows = 0;  // N
  std::uint64_t k = 0;     // K, values per row (the reduction dimension)
  Bits bits = Bits::kInt8;

  AMOEBA_HOST_DEVICE constexpr std::uint64_t groups_per_row() const noexcept { return ceil_div(k, kGroup); }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t row_bytes() const noexcept {
    return ceil_div(k * bit_count(bits), 8);
  }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t weight_offset() const noexcept { return 0; }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t weight_bytes() const noexcept { return rows * row_bytes(); }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t scale_offset() const noexcept {
    return round_up(weight_bytes(), kAlign);
  }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t scale_bytes() const noexcept {
    return 2 * rows * groups_per_row();
  }
  AMOEBA_HOST_DEVICE constexpr std::uint64_t total_bytes() const noexcept {
    return round_up(scale_offset() + scale_bytes(), kAlign);
  }
  // Where value (n, kk) is stored: its byte (int8 all of it), and for int4 whether it is that byte's high
  // nibble.
  struct Place {
    std::uint64_t byte;
    bool high;
  };
  AMOEBA_HOST_DEVICE constexpr Place place(std::uint64_t n, std::uint64_t kk) const noexcept {
    if (bits == Bits::kInt8) return {n * row_bytes() + kk, false};
    const std::uint64_t slot = int4_slot(kk, k);
    return {n * row_bytes() + slot / 2, slot % 2 == 1};
  }
  // The byte holding value (n, kk).
  AMOEBA_HOST_DEVICE constexpr std::uint64_t weight_byte(std::uint64_t n, std::uint64_t kk) const noexcept {
    return place(n, kk).byte;
  }
  // q of value (n, kk) of the matrix whose first byte is `matrix` (int8 sign-extended, int4 its nibble).
  AMOEBA_HOST_DEVICE constexpr int q_at(const std::uint8_t* matrix, std::uint64_t n,
                                        std::uint64_t kk) const noexcept {
    const Place p = place(n, kk);
    return bits == Bits::kInt8 ? static_cast<std::int8_t>(matrix[p.byte]) : int4_at(matrix[p.byte], p.high);
  }
  // Stores q (in [-128, 127] / [-8, 7]) as value (n, kk); an int4 byte's other nibble is kept.
  AMOEBA_HOST_DEVICE constexpr void put_q(std::uint8_t* matrix, std::uint64_t n, std::uint64_t kk,
                                          int q) const noexcept {
    const Place p = place(n, kk);
    std::uint8_t& byte = matrix[p.byte];
    if (bits == Bits::kInt8)
      byte = static_cast<std::uint8_t>(q);
    else
      byte = p.high ? int4_pack(byte & 0xF, q) : int4_pack(q, byte >> 4);
  }
  // The first byte of the bf16 scale of value (n, kk).
  AMOEBA_HOST_DEVICE constexpr std::uint64_t scale_byte(std::uint64_t n, std::uint64_t kk) const noexcept {
    return scale_offset() + 2 * (n * groups_per_row() + kk / kGroup);
  }
  // Every row starts on 16 bytes, so a kernel can read rows with 16-byte loads only.
  AMOEBA_HOST_DEVICE constexpr bool vector_loadable() const noexcept { return row_bytes() % kAlign == 0; }
};

// The two matrix shapes of one expert of intermediate size F and hidden size H, and the bytes of the page
// that holds any one of its three matrices.
struct ExpertLayout {
  MatrixLayout w13;  // W1 (gate), W3 (up): F rows of K = H
  MatrixLayout w2;   // W2 (down): H rows of K = F
  AMOEBA_HOST_DEVICE constexpr std::uint64_t matrix_bytes() const noexcept {
    return w13.total_bytes() > w2.total_bytes() ? w13.total_bytes() : w2.total_bytes();
  }
  // Matrix j of [W1 | W3 | W2].
  AMOEBA_HOST_DEVICE constexpr const MatrixLayout& matrix(int j) const noexcept { return j == 2 ? w2 : w13; }
};

AMOEBA_HOST_DEVICE constexpr ExpertLayout expert_layout(std::uint64_t f, std::uint64_t h, Bits b) noexcept {
  return {MatrixLayout{f, h, b}, MatrixLayout{h, f, b}};
}

// Worked numbers: Qwen1.5-MoE-A2.7B (F = 1408 = 11 x 128, H = 2048), where W1/W3 and W2 have the same
// scale count (1408 x 16 = 2048 x 11).
static_assert(expert_layout(1408, 2048, Bits::kInt4).w13.scale_offset() == 1'441'792);
static_assert(expert_layout(1408, 2048, Bits::kInt4).w13.total_bytes() == 1'441'792 + 45'056);
static_assert(expert_layout(1408, 2048, Bits::kInt4).w2.total_bytes() == 1'441'792 + 45'056);
static_assert(expert_layout(1408, 2048, Bits::kInt8).matrix_bytes() == 2'883'584 + 45'056);
// A partial group and an odd int4 row: 3 rows of K = 129 -> 65-byte rows, 2 groups; scales at 195 -> 208.
static_assert(MatrixLayout{3, 129, Bits::kInt4}.row_bytes() == 65);
static_assert(MatrixLayout{3, 129, Bits::kInt4}.scale_offset() == 208);
static_assert(MatrixLayout{3, 129, Bits::kInt4}.total_bytes() == 208 + 16);
static_assert(MatrixLayout{3, 129, Bits::kInt4}.scale_byte(2, 128) == 208 + 2 * 5);
static_assert(values_per_load(Bits::kInt8) == 16 && loads_per_group(Bits::kInt8) == 8);
static_assert(values_per_load(Bits::kInt4) == 32 && loads_per_group(Bits::kInt4) == 4);
static_assert(int4_at(int4_pack(-7, 5), false) == -7 && int4_at(int4_pack(-7, 5), true) == 5);
// A whole word: values 0..7 in slots 0, 4, 1, 5, 2, 6, 3, 7; a partial last word in order.
static_assert(int4_slot(0, 16) == 0 && int4_slot(1, 16) == 4 && int4_slot(2, 16) == 1 &&
              int4_slot(7, 16) == 7 && int4_slot(9, 16) == 12 && int4_slot(14, 16) == 11 &&
              int4_slot(9, 12) == 9 && int4_slot(3, 12) == 5);
static_assert(int4_pack(-1, 0) == 0x0F && int4_pack(0, -8) == 0x80);

}  // namespace amoeba::kernels::quant
