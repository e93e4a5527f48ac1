// Routing preparation (CUB): from top-k ids per token, the rows of every expert in expert-sorted order
// (`sorted_slot`), the per-expert offsets and the list of GEMM work tiles (the shared chunks' first, then the
// routed experts' in order: write_tiles), each carrying its expert's three base pointers as resolved by the
// addressing policy (once per expert per layer). Two paths with the same outputs:
//  - small (S <= kSmallSlots): one block, shared-memory atomics for ranks and cub::BlockScan for offsets;
//  - large: a key/value expand kernel, cub::DeviceRadixSort (stable) and one finalize block (binary search +
//    cub::BlockScan).
// The order of rows inside one expert does not change any result: each row's arithmetic is independent of its
// position, and the combine sums each token's slots in slot order.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::routing {

inline constexpr int kThreads = 1024;
inline constexpr int kMaxExperts = kThreads;  // one expert per thread in the scans
inline constexpr int kSmallSlots = 8192;      // ranks kept in 32 KB of shared memory

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
  int* keys;
  int* vals;
  int* sorted_keys;
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

// keys[s] = expert of slot s (total_experts for invalid ids, so they sort last), vals[s] = s.
template <class Addressing>
__global__ void expand_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= r.moe.num_slots) return;
  const int e = slot_expert(r.moe, s);
  r.keys[s] = e >= 0 ? e : r.total_experts;
  r.vals[s] = s;
}

__device__ __forceinline__ int lower_bound(const int* a, int n, int v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

template <class Addressing>
__global__ void __launch_bounds__(kThreads)
    finalize_kernel(const __grid_constant__ RoutingParams<Addressing> r) {
  ptx::launch_dependents();
  const int e = threadIdx.x;
  int offset = 0, count = 0;
  if (e < r.total_experts) {
    offset = lower_bound(r.sorted_keys, r.moe.num_slots, e);
    count = lower_bound(r.sorted_keys, r.moe.num_slots, e + 1) - offset;
  }
  write_tiles(r, offset, count);
}

// Bits of the radix sort key: values 0..total_experts.
inline int key_bits(int total_experts) {
  int bits = 1;
  while ((1 << bits) <= total_experts) ++bits;
  return bits;
}

inline std::size_t sort_temp_bytes(int num_slots, int total_experts) {
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int*>(nullptr),
                                  static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                  static_cast<int*>(nullptr), num_slots, 0, key_bits(total_experts));
  return bytes;
}

}  // namespace amoeba::kernels::routing
