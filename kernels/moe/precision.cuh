// The experts' precision as a policy of PagedMoe and of the decode GEMV (moe/decode_gemv.cuh): `Bf16` (the
// weights are bf16 matrices of F·H values) or `Quantized<Bits>` (int8 or int4 values with a bf16 scale per
// group of 128 along K, packed as moe/quant_layout.hpp says). Activations stay bf16 either way.
//
// Addressing is unchanged: the addressing policies step from matrix to matrix in bf16 elements
// (page p at pool_base + p · matrix_elems), so a quantized layer passes matrix_elems = its matrix stride in
// bytes / 2 (the page size: at least the packed matrix's bytes, a multiple of 16) and the kernel reads the
// matrix base as bytes.
//
// The quantized decode GEMV multiplies the integer values themselves (exact as bf16: |q| <= 127) with the
// bf16 tokens on tensor cores, one k-step inside one scale group, and scales each step's float partial sums
// by the group's scale: sum over groups of scale · (sum of q · x), the reference's value up to float
// rounding, with no bf16 rounding of q · scale.
#pragma once

#include <cuda_bf16.h>

#include <concepts>
#include <cstdint>

#include "moe/quant_layout.hpp"

namespace amoeba::kernels {

struct Bf16 {
  static constexpr bool kQuantized = false;
  // Bytes of one expert matrix (F·H values), the tightest matrix stride.
  static constexpr long long matrix_bytes(long long f, long long h) { return 2 * f * h; }
};

template <quant::Bits kBitsT>
struct Quantized {
  static constexpr bool kQuantized = true;
  static constexpr quant::Bits kBits = kBitsT;
  // Values of one row a thread reads per k-step with one 16-byte load (16 int8, 32 int4), and the k-step of
  // a warp (4 threads side by side along K): 64 or 128 values, inside one scale group.
  static constexpr int kValuesPerLoad = static_cast<int>(quant::values_per_load(kBitsT));
  static constexpr int kKStep = 4 * kValuesPerLoad;
  static_assert(quant::kGroup % kKStep == 0, "a k-step must lie inside one scale group");
  static constexpr quant::MatrixLayout w13(long long f, long long h) {
    return {static_cast<std::uint64_t>(f), static_cast<std::uint64_t>(h), kBitsT};
  }
  static constexpr quant::MatrixLayout w2(long long f, long long h) {
    return {static_cast<std::uint64_t>(h), static_cast<std::uint64_t>(f), kBitsT};
  }
  // Bytes of one packed matrix (the larger of W1/W3 and W2), the tightest matrix stride.
  static constexpr long long matrix_bytes(long long f, long long h) {
    return static_cast<long long>(quant::expert_layout(f, h, kBitsT).matrix_bytes());
  }
};
using Int8 = Quantized<quant::Bits::kInt8>;
using Int4 = Quantized<quant::Bits::kInt4>;

template <class P>
concept expert_precision = requires {
  { P::kQuantized } -> std::convertible_to<bool>;
  { P::matrix_bytes(1, 1) } -> std::convertible_to<long long>;
};
static_assert(expert_precision<Bf16> && expert_precision<Int8> && expert_precision<Int4>);

namespace dequant {

// 2^23 + v as a float has v in its low mantissa bits: the classic exact small-integer-to-float trick.
inline constexpr float kMagic = 8388608.0f;  // 2^23

// 2^23 + byte b of `u` as a float (one prmt: byte b, then 0, 0, 0x4B, the bits of 2^23).
__device__ __forceinline__ float magic_byte(std::uint32_t u, int b) {
  return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540 | b));
}

// Four unsigned bytes of `u` (each v + bias, v the value) -> two bf16x2 words of the values, low k first.
// Exact: the values are integers of at most 8 bits, so the float's upper 16 bits are the bf16.
__device__ __forceinline__ void bytes_to_bf16x2(std::uint32_t u, float bias, std::uint32_t& lo,
                                                std::uint32_t& hi) {
  float f[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) f[b] = magic_byte(u, b) - (kMagic + bias);
  lo = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
  hi = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
}

// 4 int8 values (value k in byte k) -> bf16 pairs {v0,v1}, {v2,v3}.
__device__ __forceinline__ void int8x4(std::uint32_t w, std::uint32_t (&out)[2]) {
  bytes_to_bf16x2(w ^ 0x80808080u, 128.0f, out[0], out[1]);  // two's complement -> v + 128
}

// int8x4's pairs times a group scale s, each product rounded to bf16 (bf16(q · s), what scaled_chunk's
// HMUL2 gives), in one fma per value: fma(2^23 + q + 128, s, c) with c = int8_fma_offset(s) is exactly
// q · s (c = −(2^23 + 2^7) · s is exact: s has 8 significant bits, so c spans 24; q · s spans 16), then one
// round to bf16 per value. For every normal s below 2^100 (c overflows past 2^104); a zero s gives +0 where
// the HMUL2 gives −0 for negative q.
__device__ __forceinline__ float int8_fma_offset(float s) {
  return -(kMagic + 128.0f) * s;
}
__device__ __forceinline__ void int8x4_scaled(std::uint32_t w, float s, float c, std::uint32_t& lo,
                                              std::uint32_t& hi) {
  const std::uint32_t u = w ^ 0x80808080u;  // two's complement -> q + 128
  float f[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) f[b] = __fmaf_rn(magic_byte(u, b), s, c);
  const __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]), z = __floats2bfloat162_rn(f[2], f[3]);
  lo = *reinterpret_cast<const std::uint32_t*>(&a);
  hi = *reinterpret_cast<const std::uint32_t*>(&z);
}

// (a & kAnd) ^ kXor in one lop3. Written as C++ (`&` then `^`), ptxas emits two LOP3 instructions, because a
// LOP3 takes at most one immediate operand; the explicit lop3 makes it hold one of the constants in a
// register (set once, outside the loops) and use one instruction per word.
template <std::uint32_t kAnd, std::uint32_t kXor>
__device__ __forceinline__ void lop3_and_xor(std::uint32_t a, std::uint32_t& out) {
  // 0x6A: the truth table of (a & b) ^ c for a = 0xF0, b = 0xCC, c = 0xAA.
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(out) : "r"(a), "n"(kAnd), "n"(kXor));
}

// 8 int4 values of one word of the int4 layout (kernels/moe/quant_layout.hpp: values 2k and 2k + 1 in nibbles
// k and k + 4) -> bf16 pairs {v0,v1}, {v2,v3}, {v4,v5}, {v6,v7}, straight in bf16: pair k is (w >> 4k) with
// one lop3 making each 16-bit half 0x4300 | (nibble ^ 8), the bf16 of 128 + v + 8 (0x4300 is 128.0, whose ulp
// is 1: exact for 0..127), and one bf16x2 subtract of 136 leaves v, exactly. 11 instructions for 8 values
// (the 2^23 float route of int8x4 takes ~26). Before the nibbles were interleaved (value k in nibble k) a
// prmt per pair gathered its two nibbles: 13, and until the lop3 was explicit (lop3_and_xor) 17, two LOP3 per
// word (benchmarks/device/decode_sass.py).
__device__ __forceinline__ void int4x8(std::uint32_t w, std::uint32_t (&out)[4]) {
  const std::uint32_t bias_bits = 0x43084308u;  // {136.0, 136.0} in bf16
  const __nv_bfloat162 bias = *reinterpret_cast<const __nv_bfloat162*>(&bias_bits);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    std::uint32_t h;  // one lop3: 0x43 | (nibble ^ 8) per half (see lop3_and_xor)
    lop3_and_xor<0x000F000Fu, 0x43084308u>(w >> (4 * k), h);
    const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&h), bias);
    out[k] = *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

// Eight consecutive values (chunk c of a thread's 16-byte load) as the four bf16x2 words of one 8-value
// operand chunk, the layout an 8-bf16 load has (x = {v0,v1}, y = {v2,v3}, z = {v4,v5}, w = {v6,v7}).
template <quant::Bits kBits>
__device__ __forceinline__ uint4 chunk(const uint4& raw, int c) {
  const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint4 out;
  if constexpr (kBits == quant::Bits::kInt8) {  // 16 values: chunk c is words 2c, 2c + 1
    std::uint32_t a[2], b[2];
    int8x4(words[2 * c], a);
    int8x4(words[2 * c + 1], b);
    out = make_uint4(a[0], a[1], b[0], b[1]);
  } else {  // 32 values: chunk c is word c
    std::uint32_t a[4];
    int4x8(words[c], a);
    out = make_uint4(a[0], a[1], a[2], a[3]);
  }
  return out;
}

// chunk() times the values' group scale, each product rounded to bf16 (w = bf16(q · scale)): the weights the
// quantized grouped GEMMs and the bf16 copy (moe/dequant_experts.cuh) multiply.
template <quant::Bits kBits>
__device__ __forceinline__ uint4 scaled_chunk(const uint4& raw, int c, __nv_bfloat162 scale) {
  const uint4 v = chunk<kBits>(raw, c);
  const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
  std::uint32_t out[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const __nv_bfloat162 x = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&words[p]), scale);
    out[p] = *reinterpret_cast<const std::uint32_t*>(&x);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace dequant

}  // namespace amoeba::kernels
