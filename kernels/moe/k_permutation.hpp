// The order of K inside each 64-value block of the token operand of the quantized TMA grouped GEMM
// (grouped::gemm_tma_quant_kernel). Host and device, constexpr only, no CUDA header.
//
// That kernel multiplies weights from registers (wgmma's A operand: each thread dequantises the packed
// values its fragment needs) by token rows from shared memory (B). In a 64-k step, wgmma gives thread q
// (= lane % 4) of a row the k pairs {2q, 2q+1} and {2q+8, 2q+9} of each of the four 16-k sub-steps: eight
// pairs spread over the step. For the thread to read its packed values with one load per row instead of
// eight, the kernel feeds it the eight consecutive pairs 8q..8q+7 of the packed row (16 int8 or int4 values
// in 16 or 8 contiguous bytes) and puts the tokens' k in the same order: the token operand's k pair stored
// at position 4c + q (c = 0..7 its 16-byte chunk, q = 0..3 its word in the chunk) is logical pair 8q + c.
// A dot product does not care about the order of K, so the result is the same sum in another order.
//
// The gate/up stage reads the layer's input through a permuted copy (grouped::permute_k_kernel); the gate/up
// epilogue writes `act` in this order directly, and the down stage reads it as it is. Both build a block's
// stored 16-byte chunk c from the 32-bit pairs logical_pair(c, 0..3).
#pragma once

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::k_permutation {

inline constexpr int kBlock = 64;  // values per permuted block (one k-step)

// The logical k pair (0..31) stored as word q (0..3) of 16-byte chunk c (0..7) of a block.
AMOEBA_HOST_DEVICE constexpr int logical_pair(int c, int q) {
  return 8 * q + c;
}

// The logical k whose value is stored at position `stored` (both in [0, 64) or absolute: blocks map to
// themselves).
AMOEBA_HOST_DEVICE constexpr int logical_of(int stored) {
  const int block = stored - stored % kBlock, pair = (stored % kBlock) / 2;
  return block + 2 * logical_pair(pair / 4, pair % 4) + stored % 2;
}
// The inverse: where logical k is stored.
AMOEBA_HOST_DEVICE constexpr int stored_of(int logical) {
  const int block = logical - logical % kBlock, pair = (logical % kBlock) / 2;
  const int q = pair / 8, c = pair % 8;
  return block + 2 * (4 * c + q) + logical % 2;
}

namespace detail {
constexpr bool is_inverse_pair() {
  bool seen[2 * kBlock] = {};
  for (int k = 0; k < 2 * kBlock; ++k) {
    if (stored_of(logical_of(k)) != k || logical_of(stored_of(k)) != k) return false;
    const int l = logical_of(k);
    if (l / kBlock != k / kBlock || seen[l]) return false;
    seen[l] = true;
  }
  return true;
}
}  // namespace detail
static_assert(detail::is_inverse_pair(), "a permutation of each 64-block, and its inverse");
// Worked values: chunk 0 holds logical pairs 0, 8, 16, 24; thread q = 1's pairs 8..15 sit in word 1 of
// chunks 0..7.
static_assert(logical_of(0) == 0 && logical_of(2) == 16 && logical_of(4) == 32 && logical_of(6) == 48);
static_assert(stored_of(16) == 2 && stored_of(18) == 10 && stored_of(30) == 58 &&
              stored_of(64 + 17) == 64 + 3);

}  // namespace amoeba::kernels::k_permutation
