// Routing preparation (CUB): from top-k ids per token, the rows of every expert in expert-sorted order
// (`sorted_slot`), the per-expert offsets and the list of GEMM work tiles (the shared chunks' first, then the
// routed experts' in order: write_tiles), each carrying its expert's three base pointers as resolved by the
// addressing policy (once per expert per layer). Two paths with the same outputs:
//  - small (S <= kSmallSlots): one block, shared-memory atomics for ranks and cub::BlockScan for offsets;
//  - large: the same counting sort over blocks of kCountSlots slots. count_kernel ranks each block's slots
//    within their expert and writes the block's counts; offsets_kernel (one block) turns the counts into each
//    block's start inside its expert, scans the experts' totals (cub::BlockScan) and writes the tiles;
//    scatter_kernel writes sorted_slot.
// The order of rows inside one expert does not change any result: each row's arithmetic is independent of its
// position, and the combine sums each token's slots in slot order. So the ranks may come from atomics.
#pragma once

#include <cub/block/block_scan.cuh>

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::routing {

inline constexpr int kThreads = 1024;
inline constexpr int kMaxExperts = kThreads;  // one expert per thread in the scans
inline constexpr int kSmallSlots = 8192;      // ranks kept in 32 KB of shared memory
// Large path: count_kernel and scatter_kernel blocks of kCountThreads threads, kCountPerThread slots each.
inline constexpr int kCountThreads = 256;
inline constexpr int kCountPerThread = 8;
inline constexpr int kCountSlots = kCountThreads * kCountPerThread;
// Blocks of the large path; its per-block counts ([blocks][total_experts] ints) fit in the `vals` buffer of
// num_slots ints whenever num_slots > kSmallSlots (blocks · E <= (S / 2048 + 1) · 1024 < S).
inline int count_blocks(int num_slots) {
  return (num_slots + kCountSlots - 1) / kCountSlots;
}

template <expert_addressing Addressing>
struct RoutingParams {
  MoeParams<Addressing> moe;
  int total_experts;
  int tile_rows;  // token rows per work tile
  int* sorted_slot;
  int* expert_offset;  // [E+m+1]
  WorkTile* tiles;
  int* num_tiles;
  // large path only
  int* keys;  // [num_slots]: each slot's rank within its expert in its block (-1: dropped)
  int* vals;  // [count_blocks][total_experts]: a block's count, then its first rank within the expert
};

// Per-thread tile counts of the routed experts (x) and of the shared chunks (y), summed in one block scan.
struct SumPair {
  __device__ int2 operator()(const int2& a, const int2& b) const { return make_int2(a.x + b.x, a.y + b.y); }
};

// Writes expert_offset and the tiles of expert `e` (one thread per expert) given its offset and count. The
// tile list runs the shared chunks (experts E..E+m-1) first, then the routed experts in order: the chunks
// take every token, so from ~128 tokens on their tiles read the same weights several times, from the L2;
// started first they overlap the routed experts' DRAM stream instead of forming the layer's tail (Qwen1.5-MoE
// with its 4 chunks at 256 tokens: 0.958–0.968× the time of chunks last in bf16, int8 and int4, neutral
// without chunks; docs/results/paged_moe_h200.md, "Shared chunks first"). A chunk's first tile follows the
// tiles of the chunks before it; a routed expert's, every chunk's tiles and those of the routed experts
// before it.
template <class Addressing>
__device__ void write_tiles(const RoutingParams<Addressing>& r, int offset, int count) {
  using Scan = cub::BlockScan<int2, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int e = threadIdx.x;
  const int n = (count + r.tile_rows - 1) / r.tile_rows;
  const bool chunk = e >= r.moe.num_experts;  // threads past the experts count 0 tiles
  int2 before, sums;
  Scan(scan).ExclusiveScan(make_int2(chunk ? 0 : n, chunk ? n : 0), before, make_int2(0, 0), SumPair{}, sums);
  const int first = chunk ? before.y : sums.y + before.x, total = sums.x + sums.y;
  if (e < r.total_experts) {
    r.expert_offset[e] = offset;
    if (n > 0) {
      // The one place where the addressing policy is consulted: once per expert per layer.
      const bf16* m0 = Addressing::matrix_base(r.moe.addr, e, 0);
      const bf16* m1 = Addressing::matrix_base(r.moe.addr, e, 1);
      const bf16* m2 = Addressing::matrix_base(r.moe.addr, e, 2);
      for (int i = 0; i < n; ++i) {
        const int start = i * r.tile_rows;
        r.tiles[first + i] =
            WorkTile{{m0, m1, m2}, e, offset + start, min(r.tile_rows, count - start), first, n};
      }
    }
  }
  if (e == 0) {
    *r.num_tiles = total;
    r.moe.unit_counters[0] = 0;
    r.moe.unit_counters[1] = 0;
    r.expert_offset[r.total_experts] = r.moe.num_slots;
  }
}

template <class Addressing>
__global__ void __launch_bounds__(kThreads)
    small_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
  // The gate/up kernel's blocks may take their SMs and set up now; they wait for this grid to finish.
  ptx::launch_dependents();
  ptx::grid_dependency_wait();  // the previous kernels (a previous layer's combine) read this workspace
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ int counts[kMaxExperts];
  __shared__ int ranks[kSmallSlots];
  __shared__ typename Scan::TempStorage scan;
  const int tid = threadIdx.x;
  const int num_slots = r.moe.num_slots;
  counts[tid] = 0;
  __syncthreads();
  for (int s = tid; s < num_slots; s += kThreads) {
    const int e = slot_expert(r.moe, s);
    ranks[s] = e >= 0 ? atomicAdd(&counts[e], 1) : -1;
  }
  __syncthreads();
  const int count = tid < r.total_experts ? counts[tid] : 0;
  int offset = 0;
  Scan(scan).ExclusiveSum(count, offset);
  __syncthreads();
  counts[tid] = offset;
  write_tiles(r, offset, count);
  __syncthreads();
  for (int s = tid; s < num_slots; s += kThreads)
    if (ranks[s] >= 0) r.sorted_slot[counts[slot_expert(r.moe, s)] + ranks[s]] = s;
}

// Pass 1 of the large path: block b ranks its kCountSlots slots within their experts (shared-memory atomics)
// into keys and writes its per-expert counts into vals[b][·]. The experts are read before any atomic so that
// a thread's eight loads are in flight together.
template <class Addressing>
__global__ void __launch_bounds__(kCountThreads) count_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
  __shared__ int counts[kMaxExperts];
  for (int e = threadIdx.x; e < r.total_experts; e += kCountThreads) counts[e] = 0;
  __syncthreads();
  const int base = blockIdx.x * kCountSlots + threadIdx.x;
  int expert[kCountPerThread];
#pragma unroll
  for (int i = 0; i < kCountPerThread; ++i) {
    const int s = base + i * kCountThreads;
    expert[i] = s < r.moe.num_slots ? slot_expert(r.moe, s) : -1;
  }
#pragma unroll
  for (int i = 0; i < kCountPerThread; ++i) {
    const int s = base + i * kCountThreads;
    if (s < r.moe.num_slots) r.keys[s] = expert[i] >= 0 ? atomicAdd(&counts[expert[i]], 1) : -1;
  }
  __syncthreads();
  int* block_counts = r.vals + static_cast<std::int64_t>(blockIdx.x) * r.total_experts;
  for (int e = threadIdx.x; e < r.total_experts; e += kCountThreads) block_counts[e] = counts[e];
}

// Pass 2, one block, a thread per expert: each block's count in vals becomes the block's first rank within
// the expert (the counts of the blocks before it), the experts' totals are scanned into offsets, and the tiles
// are written (write_tiles). Sixteen blocks' counts are loaded at a time.
template <class Addressing>
__global__ void __launch_bounds__(kThreads)
    offsets_kernel(const __grid_constant__ RoutingParams<Addressing> r, int blocks) {
  constexpr int kBatch = 16;
  const int e = threadIdx.x;
  int count = 0;
  if (e < r.total_experts) {
    int* column = r.vals + e;
    for (int b0 = 0; b0 < blocks; b0 += kBatch) {
      int n[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        n[i] = b0 + i < blocks ? column[static_cast<std::int64_t>(b0 + i) * r.total_experts] : 0;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (b0 + i < blocks) column[static_cast<std::int64_t>(b0 + i) * r.total_experts] = count;
        count += n[i];
      }
    }
  }
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  int offset = 0;
  Scan(scan).ExclusiveSum(count, offset);
  write_tiles(r, offset, count);
}

// Pass 3: slot s of block b goes to expert_offset[e] + vals[b][e] + keys[s]. The gate/up kernel's blocks may
// take their SMs and set up now; they wait for this grid to finish.
template <class Addressing>
__global__ void __launch_bounds__(kCountThreads)
    scatter_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
  ptx::launch_dependents();
  const int base = blockIdx.x * kCountSlots + threadIdx.x;
  const int* block_start = r.vals + static_cast<std::int64_t>(blockIdx.x) * r.total_experts;
#pragma unroll
  for (int i = 0; i < kCountPerThread; ++i) {
    const int s = base + i * kCountThreads;
    if (s >= r.moe.num_slots) break;
    const int rank = r.keys[s];
    if (rank >= 0) {
      const int e = slot_expert(r.moe, s);
      r.sorted_slot[r.expert_offset[e] + block_start[e] + rank] = s;
    }
  }
}

}  // namespace amoeba::kernels::routing
