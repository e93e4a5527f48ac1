// Decode path (few tokens per expert, memory-bound): a persistent, warp-specialised GEMV on tensor cores.
//
// The weight bytes are the whole cost, so each SM keeps a deep ring of them in flight: one producer warp
// streams a work item's weight rows (and the tile's token rows) into shared memory with bulk copies (the TMA
// engine, `cp.async.bulk`, no tensor map: each row chunk is contiguous), stage by stage, completing on
// mbarriers; kWarps consumer warps multiply each stage as it lands and hand the slot back. One block per SM
// walks the work items of a stage (gate/up or down) in a fixed order, so the copies of the next item start
// while the current one is still being consumed, and an SM that runs out early lets the others draw more
// bandwidth instead of leaving a partial wave. The down stage's weights do not depend on the gate/up output:
// its producer fills the ring with them before waiting for the previous kernel, overlapping that kernel's
// tail.
//
// Work item = kRows weight rows × all of K for one work tile (≤ kTileTokens tokens of one expert):
//  - gate/up: kRows/2 features of W1 and the same of W3. Each 16-row MMA tile holds 8 features of W1 (rows
//    0–7) and the same 8 of W3 (rows 8–15), so a thread's accumulators hold gate and up of the same (feature,
//    token) and SiLU·mul happens in registers;
//  - down: kRows rows of W2.
// Items are walked expert-major (an expert's row groups in turn, its token tiles innermost), so tiles of one
// expert read the same rows at about the same time and the repeats come from L2.
//
// "Swap AB": weight rows are the MMA's M (16 per consumer warp), tokens its N (8 per MMA). The reduction over
// K may visit k in any order as long as A and B agree: a thread reads 8 consecutive k (16 bytes) of rows g
// and g+8 and of token g and uses them as its {2q,2q+1,2q+8,2q+9} elements of two m16n8k16 MMAs. Staged rows
// are padded to a pitch of 64 mod 128 bytes, so rows g and g+1 fall in different bank halves: no bank
// conflicts.
#pragma once

#include <algorithm>

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::decode {

enum class Stage { kGateUp, kDown };

inline constexpr int kSmemLimit = 227 * 1024;  // sm_90 dynamic shared memory per block

// How the producer warp moves a stage: one bulk copy (TMA engine) per row chunk, or cp.async with each warp
// instruction moving 512 contiguous bytes of one row.
enum class Copy { kBulk, kAsync };

// Compile-time shape of one decode launch: kTokTiles 8-token MMA tiles per work tile, kWarps consumer warps.
template <int kTokTilesT, int kWarpsT, Copy kCopyT = Copy::kBulk>
struct Tile {
  static constexpr Copy kCopy = kCopyT;
  static constexpr int kTokTiles = kTokTilesT;
  static constexpr int kTileTokens = 8 * kTokTiles;
  static constexpr int kWarps = kWarpsT;
  static constexpr int kThreads = 32 * (kWarps + 1);  // + the producer warp
  static constexpr int kRows = 16 * kWarps;           // weight rows per work item
  static constexpr int kChunk = 16384 / kRows;        // k per ring stage: 32 KB of weights
  static constexpr int kPitch = 2 * kChunk + 64;      // bytes per staged row (64 mod 128: conflict-free)
  static constexpr int kStageBytes = (kRows + kTileTokens) * kPitch;
  static constexpr int kStages = std::min(8, (kSmemLimit - 256) / kStageBytes);
  static constexpr int kBarrierOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 16 * kStages;
  static_assert(kTileTokens <= 32, "one producer lane per token row");
  static_assert(kRows % 32 == 0 && kChunk % 128 == 0, "chunks are multiples of 128 k (F, H % 128 == 0)");
  static_assert(kStages >= 3, "ring too shallow to hide DRAM latency");
};

// Row groups (work items per work tile) of one stage: features per item for gate/up, rows for down.
template <Stage kStage, class T, class P>
__host__ __device__ inline int row_groups(const P& p) {
  return kStage == Stage::kGateUp ? p.intermediate / (T::kRows / 2) : p.hidden / T::kRows;
}

// Lane `src`'s pointer, as bytes.
__device__ __forceinline__ const char* shfl_ptr(const bf16* p, int src) {
  const auto v = __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), src);
  return reinterpret_cast<const char*>(v);
}

__device__ __forceinline__ float silu(float v) {
  return v / (1.0f + __expf(-v));
}

template <class Addressing, Stage kStage, class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    gemv_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  constexpr bool kGateUp = kStage == Stage::kGateUp;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t ring = ptx::smem_u32(smem);
  const std::uint32_t full = ring + T::kBarrierOffset;  // [kStages] mbarriers: stage landed
  const std::uint32_t empty = full + 8 * T::kStages;    // [kStages] mbarriers: stage consumed
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbarrier_init(full + 8 * s, T::kCopy == Copy::kBulk ? 1 : 32);
      ptx::mbarrier_init(empty + 8 * s, T::kWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // Gate/up needs the routing's tiles first. The down stage reads only the tiles (routing finished before the
  // gate/up kernel let this one start) until its producer copies `act`, where it waits.
  if constexpr (kGateUp) ptx::grid_dependency_wait();
  ptx::launch_dependents();

  const int K = kGateUp ? p.hidden : p.intermediate;
  const int chunks = (K + T::kChunk - 1) / T::kChunk;
  const int groups = row_groups<kStage, T>(p);
  const int units = *p.num_tiles * groups;
  const int stride = static_cast<int>(gridDim.x);
  const int items =
      units > static_cast<int>(blockIdx.x) ? (units - 1 - static_cast<int>(blockIdx.x)) / stride + 1 : 0;

  // Work item i of this block → (work tile, row group), expert-major: the expert's items run row group by
  // row group with its token tiles innermost.
  auto unit_of = [&](int i, int& tile_index, int& group) {
    const int u = static_cast<int>(blockIdx.x) + i * stride;
    const WorkTile& bucket = p.tiles[u / groups];
    const int local = u - bucket.first_tile * groups;
    tile_index = bucket.first_tile + local % bucket.expert_tiles;
    group = local / bucket.expert_tiles;
  };

  if (warp == T::kWarps) {
    // Producer warp. Lane l copies weight rows l + 32·r of the item and, when l < count, token row l.
    constexpr int kRowsPerLane = T::kRows / 32;
    const bf16* wrow[kRowsPerLane];
    const bf16* trow = nullptr;
    int count = 0, item = -1;
    auto resolve = [&](int i) {
      if (i == item) return;
      item = i;
      int tile_index, group;
      unit_of(i, tile_index, group);
      const WorkTile& tile = p.tiles[tile_index];
      count = tile.count;
#pragma unroll
      for (int r = 0; r < kRowsPerLane; ++r) {
        const int row = lane + 32 * r;
        if constexpr (kGateUp) {
          // MMA tile row/16 holds features 8·(row/16) + (row%8) of W1 (row%16 < 8) or of W3.
          const int f = group * (T::kRows / 2) + 8 * (row / 16) + row % 8;
          wrow[r] = tile.matrix[row % 16 < 8 ? 0 : 1] + static_cast<std::int64_t>(f) * K;
        } else {
          wrow[r] = tile.matrix[2] + static_cast<std::int64_t>(group * T::kRows + row) * K;
        }
      }
      if (lane < count) {
        if constexpr (kGateUp) {
          const int slot = p.sorted_slot[tile.row_start + lane];
          trow = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K;
        } else {
          trow = p.act + static_cast<std::int64_t>(tile.row_start + lane) * K;
        }
      }
    };
    // Chunk n of this block: item n / chunks, k-chunk n % chunks, ring stage n % kStages.
    auto issue_weights = [&](int n) {
      resolve(n / chunks);
      const int s = n % T::kStages, c = n % chunks;
      const int len = min(T::kChunk, K - c * T::kChunk);
      const std::uint32_t dst = ring + s * T::kStageBytes;
      if constexpr (T::kCopy == Copy::kBulk) {
        if (lane == 0) ptx::mbarrier_expect_tx(full + 8 * s, T::kRows * len * 2);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < kRowsPerLane; ++r)
          ptx::bulk_copy_g2s(dst + (lane + 32 * r) * T::kPitch, wrow[r] + c * T::kChunk, len * 2,
                             full + 8 * s);
      } else {
        // Row l + 32·rr's chunk, 512 contiguous bytes per warp instruction; its pointer is lane l's.
#pragma unroll
        for (int rr = 0; rr < kRowsPerLane; ++rr)
          for (int l = 0; l < 32; ++l) {
            const char* src = shfl_ptr(wrow[rr], l) + 2 * c * T::kChunk;
            for (int off = 16 * lane; off < len * 2; off += 512)
              ptx::cp_async_16(dst + (l + 32 * rr) * T::kPitch + off, src + off, 16);
          }
      }
    };
    // The arrival comes last, after every byte of the stage is announced, so the phase cannot complete early.
    auto issue_tokens = [&](int n) {
      resolve(n / chunks);
      const int s = n % T::kStages, c = n % chunks;
      const int len = min(T::kChunk, K - c * T::kChunk);
      const std::uint32_t dst = ring + s * T::kStageBytes + T::kRows * T::kPitch;
      if constexpr (T::kCopy == Copy::kBulk) {
        if (lane == 0) ptx::mbarrier_arrive_expect_tx(full + 8 * s, count * len * 2);
        __syncwarp();
        if (lane < count)
          ptx::bulk_copy_g2s(dst + lane * T::kPitch, trow + c * T::kChunk, len * 2, full + 8 * s);
      } else {
        for (int r = 0; r < count; ++r) {
          const char* src = shfl_ptr(trow, r) + 2 * c * T::kChunk;
          for (int off = 16 * lane; off < len * 2; off += 512)
            ptx::cp_async_16(dst + r * T::kPitch + off, reinterpret_cast<const char*>(src) + off, 16);
        }
        ptx::cp_async_mbarrier_arrive(full + 8 * s);
      }
    };
    const int total = items * chunks;
    int n = 0;
    if constexpr (!kGateUp) {
      const int early = min(total, T::kStages);  // ring slots start free
      for (; n < early; ++n) issue_weights(n);
      ptx::grid_dependency_wait();  // act: written by the gate/up kernel
      for (int e = 0; e < early; ++e) issue_tokens(e);
    }
    for (; n < total; ++n) {
      if (lane == 0) ptx::mbarrier_wait(empty + 8 * (n % T::kStages), ((n / T::kStages) & 1) ^ 1);
      __syncwarp();
      issue_weights(n);
      issue_tokens(n);
    }
    return;
  }

  // Consumer warp `warp`: MMA tile rows 16·warp + g and + 8.
  const int g = lane / 4, q = lane % 4;
  const std::uint32_t a_lo = static_cast<std::uint32_t>((16 * warp + g) * T::kPitch + 16 * q);
  const std::uint32_t a_hi = a_lo + 8 * T::kPitch;
  int n = 0;
  for (int i = 0; i < items; ++i) {
    int tile_index, group;
    unit_of(i, tile_index, group);
    const WorkTile& tile = p.tiles[tile_index];
    const int count = tile.count, row_start = tile.row_start;
    // Token operand rows: token nt·8 + g (rows past `count` read token 0; their results are dropped).
    std::uint32_t b_off[T::kTokTiles];
#pragma unroll
    for (int nt = 0; nt < T::kTokTiles; ++nt) {
      const int c = nt * 8 + g < count ? nt * 8 + g : 0;
      b_off[nt] = static_cast<std::uint32_t>((T::kRows + c) * T::kPitch + 16 * q);
    }
    float acc[T::kTokTiles][4] = {};
    for (int c = 0; c < chunks; ++c, ++n) {
      const int s = n % T::kStages;
      ptx::mbarrier_wait(full + 8 * s, (n / T::kStages) & 1);
      const unsigned char* stage = smem + s * T::kStageBytes;
      auto step = [&](int j) {
        const int k = 64 * j;  // bytes: 32 k per step
        const uint4 lo = *reinterpret_cast<const uint4*>(stage + a_lo + k);
        const uint4 hi = *reinterpret_cast<const uint4*>(stage + a_hi + k);
#pragma unroll
        for (int nt = 0; nt < T::kTokTiles; ++nt) {
          const uint4 b = *reinterpret_cast<const uint4*>(stage + b_off[nt] + k);
          ptx::mma_bf16_16816(acc[nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
          ptx::mma_bf16_16816(acc[nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
        }
      };
      const int len = min(T::kChunk, K - c * T::kChunk);
      if (len == T::kChunk) {
#pragma unroll
        for (int j = 0; j < T::kChunk / 32; ++j) step(j);
      } else {
        for (int j = 0; j < len / 32; ++j) step(j);
      }
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(empty + 8 * s);
    }

    // Accumulator (nt, i): MMA row g + 8·(i/2), token nt·8 + 2q + (i % 2).
#pragma unroll
    for (int nt = 0; nt < T::kTokTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = nt * 8 + 2 * q + i;
        if (c >= count) continue;
        if constexpr (kGateUp) {
          const int f = group * (T::kRows / 2) + 8 * warp + g;
          p.act[static_cast<std::int64_t>(row_start + c) * p.intermediate + f] =
              __float2bfloat16_rn(silu(acc[nt][i]) * acc[nt][i + 2]);
        } else {
          const int slot = p.sorted_slot[row_start + c];
          bf16* yrow = p.y + static_cast<std::int64_t>(slot) * p.hidden + group * T::kRows + 16 * warp + g;
          yrow[0] = __float2bfloat16_rn(acc[nt][i]);
          yrow[8] = __float2bfloat16_rn(acc[nt][i + 2]);
        }
      }
  }
}

}  // namespace amoeba::kernels::decode
