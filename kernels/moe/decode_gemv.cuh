// Decode path (few tokens per expert, memory-bound): each block streams a 32-row slice of one expert matrix
// pair and multiplies it by the tile's <= 8·kTokTiles tokens on tensor cores ("swap AB": weight rows are the
// MMA's M = 16, tokens its N = 8).
//
// Why it is fast: the weight bytes are the whole cost. Every thread streams its 16-byte pieces with cp.async
// into a private slice of a shared-memory ring, kDepth k-steps (64 KB per block) in flight whatever the
// register allocator does, and the grid spreads each expert's rows over all SMs (one block per 16 output
// features of W1/W3, per 32 rows of W2). K is split across the block's 4 warps and reduced through shared
// memory. (A register-only version reached 54% of HBM bandwidth on Qwen1.5-MoE at 1 token: ptxas interleaved
// its loads with the MMAs and kept only ~5 of 16 in flight; see docs/kernel.md.)
//
// Fragment trick: the reduction over K may visit k in any order as long as A and B agree. A thread that
// copies 8 consecutive k (one 16-byte piece) of weight rows g and g+8 and of token g uses them as its
// {2q,2q+1,2q+8,2q+9} elements of two successive m16n8k16 MMAs; the token operand uses the same mapping, so
// the dot products are exact and every operand is one coalesced 16-byte piece, read back by the thread that
// copied it (no ldmatrix, no barrier).
#pragma once

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::decode {

enum class Stage { kGateUp, kDown };

inline constexpr int kWarps = 4;  // K split
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRowTiles = 2;  // m16 tiles per block: (W1, W3) at the same features, or 2×16 W2 rows
inline constexpr int kGateUpRows = 16;  // output features per W13 block
inline constexpr int kDownRows = 32;    // output rows of W2 per block
inline constexpr int kKStep = 32;       // k per (two-MMA) step

template <int kTokTiles>
struct Traits {
  static constexpr int kTileTokens = 8 * kTokTiles;
  // 16-byte pieces a thread copies per k-step: weight rows g and g+8 of each row tile, and one per token
  // tile.
  static constexpr int kPieces = 2 * kRowTiles + kTokTiles;
  // k-steps in flight per warp: as many as fit a 64 KB ring per block (6, 5 and 4 for 1, 2 and 4 token
  // tiles).
  static constexpr int kDepth = (64 * 1024) / (kPieces * 16 * kThreads);
  static constexpr int kSmemBytes = kDepth * kPieces * 16 * kThreads;
};

__device__ __forceinline__ float silu(float v) {
  return v / (1.0f + __expf(-v));
}

template <class Addressing, Stage kStage, int kTokTiles>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  using T = Traits<kTokTiles>;
  ptx::grid_dependency_wait();  // tiles, act: written by the previous kernels of this layer
  ptx::launch_dependents();
  if (static_cast<int>(blockIdx.y) >= *p.num_tiles) return;
  const WorkTile tile = p.tiles[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const int K = kGateUp ? p.hidden : p.intermediate;
  // Base pointers of the block's 2 row tiles, from the tile's resolved expert matrices.
  const bf16* rows[kRowTiles];
  if constexpr (kGateUp) {
    const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kGateUpRows;
    rows[0] = tile.matrix[0] + n0 * K;
    rows[1] = tile.matrix[1] + n0 * K;
  } else {
    const std::int64_t h0 = static_cast<std::int64_t>(blockIdx.x) * kDownRows;
    const bf16* base = tile.matrix[2];
    rows[0] = base + h0 * K;
    rows[1] = base + (h0 + 16) * K;
  }
  const int k_per_warp = K / kWarps;
  const int steps = k_per_warp / kKStep;
  const int k0 = warp * k_per_warp + 8 * q;
  // Token operand rows: token c = nt·8 + g of the tile (rows past `count` reuse row 0; their results are
  // dropped).
  const bf16* tok[kTokTiles];
#pragma unroll
  for (int nt = 0; nt < kTokTiles; ++nt) {
    const int c = nt * 8 + g < tile.count ? nt * 8 + g : 0;
    if constexpr (kGateUp) {
      const int slot = p.sorted_slot[tile.row_start + c];
      tok[nt] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K + k0;
    } else {
      tok[nt] = p.act + static_cast<std::int64_t>(tile.row_start + c) * K + k0;
    }
  }
  const bf16* a_lo[kRowTiles];
  const bf16* a_hi[kRowTiles];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
    a_lo[r] = rows[r] + static_cast<std::int64_t>(g) * K + k0;
    a_hi[r] = rows[r] + static_cast<std::int64_t>(g + 8) * K + k0;
  }

  float acc[kRowTiles][kTokTiles][4] = {};
  // Each thread streams its own 16-byte pieces through a private slice of a shared-memory ring with cp.async:
  // kDepth k-steps stay in flight whatever the register allocator does, and since a thread only reads back
  // what it copied itself, cp.async.wait_group alone orders the reads (no block barrier in the loop).
  constexpr int kDepth = T::kDepth, kPieces = T::kPieces;
  extern __shared__ uint4 ring[];  // [kDepth][kPieces][kThreads]
  auto issue = [&](int step) {
    if (step < steps) {
      const int k = step * kKStep;
      uint4* slot = ring + (step % kDepth) * kPieces * kThreads + threadIdx.x;
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        ptx::cp_async_16(ptx::smem_u32(slot + (2 * r) * kThreads), a_lo[r] + k, 16);
        ptx::cp_async_16(ptx::smem_u32(slot + (2 * r + 1) * kThreads), a_hi[r] + k, 16);
      }
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
        ptx::cp_async_16(ptx::smem_u32(slot + (2 * kRowTiles + nt) * kThreads), tok[nt] + k, 16);
    }
    ptx::cp_async_commit();  // one group per step, empty past the end, so wait counts stay uniform
  };
#pragma unroll
  for (int i = 0; i < kDepth - 1; ++i) issue(i);
  for (int s = 0; s < steps; ++s) {
    issue(s + kDepth - 1);
    ptx::cp_async_wait<kDepth - 1>();  // step s has landed
    const uint4* slot = ring + (s % kDepth) * kPieces * kThreads + threadIdx.x;
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      const uint4 alo = slot[(2 * r) * kThreads], ahi = slot[(2 * r + 1) * kThreads];
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt) {
        const uint4 b = slot[(2 * kRowTiles + nt) * kThreads];
        ptx::mma_bf16_16816(acc[r][nt], alo.x, ahi.x, alo.y, ahi.y, b.x, b.y);
        ptx::mma_bf16_16816(acc[r][nt], alo.z, ahi.z, alo.w, ahi.w, b.z, b.w);
      }
    }
  }
  ptx::cp_async_wait<0>();

  // Reduce the K split: warps 1..3 hand their partial sums to warp 0 through shared memory.
  __shared__ float red[kWarps - 1][kRowTiles][kTokTiles][4][32];
  if (warp > 0) {
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp - 1][r][nt][i][lane] = acc[r][nt][i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][nt][i] += red[w][r][nt][i][lane];

          // Accumulator (r, nt, i): weight row g + 8·(i/2) of row tile r, token nt·8 + 2q + (i % 2).
#pragma unroll
  for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = nt * 8 + 2 * q + (i % 2);
      if (c >= tile.count) continue;
      const int row = g + 8 * (i / 2);
      if constexpr (kGateUp) {
        const int n = blockIdx.x * kGateUpRows + row;
        p.act[static_cast<std::int64_t>(tile.row_start + c) * p.intermediate + n] =
            __float2bfloat16_rn(silu(acc[0][nt][i]) * acc[1][nt][i]);
      } else {
        const int slot = p.sorted_slot[tile.row_start + c];
        bf16* yrow = p.y + static_cast<std::int64_t>(slot) * p.hidden + blockIdx.x * kDownRows;
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) yrow[16 * r + row] = __float2bfloat16_rn(acc[r][nt][i]);
      }
    }
}

}  // namespace amoeba::kernels::decode
