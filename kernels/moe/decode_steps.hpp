// Which weight bytes and token values a decode GEMV thread reads at each of its warp's k-steps
// (moe/decode_gemv.cuh). Host and device, no CUDA header, so the CPU tests check that every warp's steps
// cover K exactly once and that each 128-byte line is asked for by one instruction.
//
// A thread is (warp, q): q = lane % 4 reads 16 bytes of each of its rows per step. A 128-byte line of a row
// is four 32-byte sectors; "whole lines" means a pair of steps reads one line, thread q its sector q (the
// pair's first step touches all four sectors, its second finds them in L1), so the L2 sees one request per
// line.
//
// bf16 (32 values = 64 bytes per step): the warps split K at lines, warp_k_range(); within its range a
// thread's step s reads 8 values at bf16_k(), pairs of steps reading whole lines (an unpaired last step, K an
// odd multiple of 32, reads 8 values at 32·s + 8·q as the 4 threads read half a line).
//
// Quantized (a k-step of 64 bytes: 64 int8 or 128 int4 values, one scale group's worth or less), by `lines`
// (decode::Tile's kLines): 0, the k-steps are dealt to the warps round robin (warp w: k-steps w, w + W, ...),
// thread q reading bytes 64·s + 16·q; 1 and 2, the pairs of k-steps are (warp w: pairs w, w + W, ...), a
// lone last k-step going to its pair's warp. 1 (sectors): in a pair thread q reads bytes 128·p + 32·q + 16·u
// at its half u. An int8 pair is one scale group, so each half is a step's operand as it lies; an int4 pair
// is two groups with sector q in group 2p + q / 2, so threads q and q ^ 2 swap one half each (int4_holder())
// for each step to lie in one group. 2 (touch): the first step of a pair prefetches the line into L1, thread
// q its sector q (one instruction for the whole line), and each step then reads its half as with 0.
#pragma once

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::decode {

// bf16: warp `warp` of `warps` takes [begin, end) of K: whole 64-value lines, as even a share as the lines
// allow; a trailing half line (K an odd multiple of 32) is the last warp's.
struct KRange {
  int begin, end;
};
AMOEBA_HOST_DEVICE constexpr KRange warp_k_range(int K, int warps, int warp) {
  const int lines = K / 64;
  return {64 * (warp * lines / warps), warp == warps - 1 ? K : 64 * ((warp + 1) * lines / warps)};
}
// bf16: thread q's first value at step s of a warp range of `steps` 32-value steps, relative to its begin.
AMOEBA_HOST_DEVICE constexpr int bf16_k(int s, int steps, int q) {
  return (s | 1) < steps ? (s & ~1) * 32 + 16 * q + 8 * (s & 1) : s * 32 + 8 * q;
}

// Quantized: how many of the `steps` k-steps warp `warp` of `warps` takes.
AMOEBA_HOST_DEVICE constexpr int quant_warp_steps(int steps, int warps, int warp, int lines) {
  if (lines == 0) return steps > warp ? (steps - warp + warps - 1) / warps : 0;
  const int pairs = (steps + 1) / 2;
  const int my_pairs = pairs > warp ? (pairs - warp + warps - 1) / warps : 0;
  const bool lone = steps % 2 == 1 && my_pairs > 0 && (pairs - 1) % warps == warp;
  return 2 * my_pairs - (lone ? 1 : 0);
}

// Quantized: step i of warp `warp`: its k-step s, the byte of each row thread q loads (16 bytes), the first
// of the values the thread holds for the step's MMAs (`values_per_byte`: 1 int8, 2 int4; an int4 pair's
// values with lines = 1 are those after the swap), and with lines = 2 the byte of the line thread q
// prefetches into L1 before the step's loads (the first step of a whole pair; else -1).
struct QuantStep {
  int s;
  long long byte;
  int k;
  long long touch = -1;
  // The scale group of the step's values (128 values a group: k-step s · 64 bytes · values_per_byte / 128).
  AMOEBA_HOST_DEVICE constexpr int group(int values_per_byte) const { return s * values_per_byte / 2; }
};
AMOEBA_HOST_DEVICE constexpr QuantStep quant_step(int i, int steps, int warps, int warp, int q, int lines,
                                                  int values_per_byte) {
  if (lines == 2) {
    const int pair = warp + warps * (i / 2), s = 2 * pair + i % 2;
    const bool opens = i % 2 == 0 && 2 * pair + 1 < steps;
    return {s, 64LL * s + 16 * q, 64 * values_per_byte * s + 16 * values_per_byte * q,
            opens ? 128LL * pair + 32 * q : -1};
  }
  if (lines == 1) {
    const int pair = warp + warps * (i / 2), u = i % 2, s = 2 * pair + u;
    if (2 * pair + 1 < steps) {
      const long long byte = 128LL * pair + 32 * q + 16 * u;
      if (values_per_byte ==
          2)  // after the swap: group 2p + u, values 256·p + 128·u + 64·(q % 2) + 32·(q / 2)
        return {s, byte, 256 * pair + 128 * u + 64 * (q % 2) + 32 * (q / 2)};
      return {s, byte, 128 * pair + 32 * q + 16 * u};
    }
    return {s, 64LL * s + 16 * q, 64 * values_per_byte * s + 16 * values_per_byte * q};
  }
  const int s = warp + warps * i;
  return {s, 64LL * s + 16 * q, 64 * values_per_byte * s + 16 * values_per_byte * q};
}

// int4 whole lines: after the swap, the 16 bytes thread q holds for half u of a pair are those thread
// `thread` loaded at its half `half`: threads 0, 1 keep their first halves and take their partner's first;
// threads 2, 3 take their partner's second halves and keep their own.
struct Holder {
  int thread, half;
};
AMOEBA_HOST_DEVICE constexpr Holder int4_holder(int q, int u) {
  if (q < 2) return u == 0 ? Holder{q, 0} : Holder{q ^ 2, 0};
  return u == 0 ? Holder{q ^ 2, 1} : Holder{q, 1};
}

}  // namespace amoeba::kernels::decode
