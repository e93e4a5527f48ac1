// Routing preparation (CUB): from top-k ids per token, the rows of every expert in expert-sorted order
// (`sorted_slot`), the per-expert offsets and the list of GEMM work tiles (the shared chunks' first, then the
// routed experts' in order: write_tiles), each carrying its expert's three base pointers as resolved by the
// addressing policy (once per expert per layer). Two paths with the same outputs:
//  - small (S <= kSmallSlots): one block, shared-memory atomics for ranks and cub::BlockScan for offsets;
//  - large: the same counting sort over blocks of kCountSlots slots, in two kernels. count_kernel ranks each
//    block's slots within their expert and writes the block's counts; place_kernel (a block per count block)
//    sums the counts into each expert's total and the block's start inside it, scans the totals
//    (cub::BlockScan) and writes its slots into sorted_slot; its block 0 writes the offsets and the tiles.
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
// Large path: count_kernel blocks of kCountThreads threads, kCountPerThread slots each (place_kernel's
// blocks: the same slots on kThreads threads).
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
  // keys[num_slots]: each slot's expert · kCountSlots + its rank within the expert in its block (-1:
  // dropped); vals[count_blocks][total_experts]: each block's count per expert.
  int* keys;
  int* vals;
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
// and writes its per-expert counts into vals[b][·]; keys[s] = expert · kCountSlots + rank (-1: dropped). The
// experts are read before any atomic so that a thread's eight loads are in flight together.
template <class Addressing>
__global__ void __launch_bounds__(kCountThreads)
    count_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
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
    if (s < r.moe.num_slots)
      r.keys[s] = expert[i] >= 0 ? expert[i] * kCountSlots + atomicAdd(&counts[expert[i]], 1) : -1;
  }
  __syncthreads();
  int* block_counts = r.vals + static_cast<std::int64_t>(blockIdx.x) * r.total_experts;
  for (int e = threadIdx.x; e < r.total_experts; e += kCountThreads) block_counts[e] = counts[e];
}

// Pass 2, one block per count block, a thread per expert: every block sums the counts of all blocks (the
// expert's total) and of the blocks before it (its slots' first rank within the expert), scans the totals
// into offsets (cub::BlockScan), and places its own slots: slot s goes to offset[e] + first[e] + its rank.
// Block 0 also writes the offsets and the tiles (write_tiles). Each block reads every block's counts from the
// L2 (blocks · E ints); that took less time than a one-block launch computing them once before a scatter
// launch (docs/results/paged_moe_h200.md, "Two kernels instead of three"). The reads grow as blocks² · E, but
// PagedMoe::can_implement's tile limit (S/8 + E + m + 1 <= 65535) keeps S under 2^19: at most 256 blocks.
template <class Addressing>
__global__ void __launch_bounds__(kThreads)
    place_kernel(const __grid_constant__ RoutingParams<Addressing> r, int blocks) {
  // The gate/up kernel's blocks may take their SMs and set up now; they wait for this grid to finish.
  ptx::launch_dependents();
  constexpr int kBatch = 16;  // blocks' counts loaded at a time
  static_assert(kCountSlots == 2 * kThreads, "two slots per thread");
  __shared__ int start[kMaxExperts];
  const int e = threadIdx.x, me = blockIdx.x;
  int total = 0, before = 0;
  if (e < r.total_experts) {
    const int* column = r.vals + e;
    for (int b0 = 0; b0 < blocks; b0 += kBatch) {
      int n[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        n[i] = b0 + i < blocks ? column[static_cast<std::int64_t>(b0 + i) * r.total_experts] : 0;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        total += n[i];
        before += b0 + i < me ? n[i] : 0;
      }
    }
  }
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  int offset = 0;
  Scan(scan).ExclusiveSum(total, offset);
  start[e] = offset + before;
  if (me == 0) write_tiles(r, offset, total);  // uniform in the block: write_tiles' scan takes all threads
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int s = me * kCountSlots + i * kThreads + threadIdx.x;
    if (s >= r.moe.num_slots) break;
    const int key = r.keys[s];
    if (key >= 0) r.sorted_slot[start[key / kCountSlots] + key % kCountSlots] = s;
  }
}

// The large path's launches on `stream` (num_slots > kSmallSlots), plain launches (count_kernel must not
// start before the previous layer's combine has read this workspace); the first launch error, or cudaSuccess.
template <class Addressing>
cudaError_t launch_large(const RoutingParams<Addressing>& r, cudaStream_t stream) {
  const int blocks = count_blocks(r.moe.num_slots);
  count_kernel<Addressing><<<blocks, kCountThreads, 0, stream>>>(r);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  place_kernel<Addressing><<<blocks, kThreads, 0, stream>>>(r, blocks);
  return cudaGetLastError();
}

}  // namespace amoeba::kernels::routing
