// Which weight bytes and token values a decode GEMV thread reads at each of its warp's k-steps
// (moe/decode_gemv.cuh). Host and device, no CUDA header, so the CPU tests check that every warp's steps
// cover K exactly once and (bf16) that each 128-byte line is asked for by one instruction.
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
// Quantized (a k-step of 64 bytes: 64 int8 or 128 int4 values, one scale group's worth or less): the k-steps
// are dealt to the warps round robin (warp w: k-steps w, w + W, ...), thread q reading bytes 64·s + 16·q.
// (Whole lines as pairs of k-steps were measured on the H200 and lost: 1.02-1.86x the round-robin time,
// docs/results/quantized_h200.md, "Whole lines on quantized experts".)
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

// bf16, a preloading down block (moe/decode_gemv.cuh, kPreload): each of its W2 rows of K values sits in
// shared memory at this pitch, padded by 16 bytes: with K a multiple of 64 the pitch is 16 modulo 128 bytes,
// so the 8 rows a quarter-warp's 16-byte loads touch (rows g, g + 1 at sectors q) fall on distinct banks.
AMOEBA_HOST_DEVICE constexpr long long preload_pitch(int K) {
  return 2LL * K + 16;
}

// Quantized: how many of the `steps` k-steps warp `warp` of `warps` takes.
AMOEBA_HOST_DEVICE constexpr int quant_warp_steps(int steps, int warps, int warp) {
  return steps > warp ? (steps - warp + warps - 1) / warps : 0;
}

// Quantized: step i of warp `warp`: its k-step s, the byte of each row thread q loads (16 bytes) and the
// first of the values the thread holds for the step's MMAs (`values_per_byte`: 1 int8, 2 int4).
struct QuantStep {
  int s;
  long long byte;
  int k;
  // The scale group of the step's values (128 values a group: k-step s · 64 bytes · values_per_byte / 128).
  AMOEBA_HOST_DEVICE constexpr int group(int values_per_byte) const { return s * values_per_byte / 2; }
};
AMOEBA_HOST_DEVICE constexpr QuantStep quant_step(int i, int warps, int warp, int q, int values_per_byte) {
  const int s = warp + warps * i;
  return {s, 64LL * s + 16 * q, 64 * values_per_byte * s + 16 * values_per_byte * q};
}

}  // namespace amoeba::kernels::decode
