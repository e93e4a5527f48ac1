// The one trivially copyable parameter block every kernel of a MoE layer receives (as __grid_constant__),
// plus the slot helpers shared by routing and combine, and the activation every gate/up epilogue applies. A
// "slot" is (token t, j) with j < k for routed experts and k <= j < k+m for the shared chunks; slot index s =
// t·(k+m) + j.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "moe/addressing.cuh"

namespace amoeba::kernels {

// SiLU, v · sigmoid(v) = v / (1 + e^-v), with the fast division (__fdividef: within 2 ulp of fp32, before the
// one rounding to bf16). The IEEE division leaves its fast path when the denominator passes 2^126 (v <
// -87.3), for a per-thread subroutine: a layer's speed then depended on its data (random int8 weights of
// large magnitude spent 9% of the quantized gate/up kernel's warp samples there, docs/kernel.md). Here v <
// -87.3 gives -0 where the exact value's magnitude is below 1e-36.
__device__ __forceinline__ float silu(float v) {
  return __fdividef(v, 1.0f + __expf(-v));
}

// One unit of GEMM work: `count` consecutive rows of the expert-sorted order starting at `row_start`, all
// routed to `expert`. Built by the routing kernel, `count` <= the path's token tile.
// `matrix` holds the expert's W1, W3, W2 base pointers, resolved by the addressing policy in the routing
// kernel. `first_tile` and `expert_tiles` locate all tiles of the same expert (consecutive in the list, whose
// order is the shared chunks', then the routed experts'), so a GEMM can order its work expert by expert.
struct alignas(16) WorkTile {
  const bf16* matrix[3];
  int expert;
  int row_start;
  int count;
  int first_tile;
  int expert_tiles;
};

// Routing's outputs read from the L2 (past L1) before a kernel's dependency wait: routing's kernel completed
// before the gate/up kernel let a down-stage kernel start (programmatic dependent launch: gate/up's blocks
// trigger it only after their own wait), but this SM's L1 may hold a previous layer call's copy. The work
// tile (whole, in 16-byte loads) and one int of it or of the tile count.
__device__ __forceinline__ WorkTile load_tile_l2(const WorkTile* t) {
  static_assert(sizeof(WorkTile) % 16 == 0);
  WorkTile tile;
  const uint4* src = reinterpret_cast<const uint4*>(t);
  uint4* dst = reinterpret_cast<uint4*>(&tile);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(WorkTile) / 16); ++i) dst[i] = __ldcg(src + i);
  return tile;
}
// `x` read through L1 (kL2 = false: after the dependency wait, as every kernel reads it) or from the L2.
template <bool kL2>
__device__ __forceinline__ int routed_int(const int& x) {
  if constexpr (kL2)
    return __ldcg(&x);
  else
    return x;
}

template <expert_addressing Addressing>
struct MoeParams {
  typename Addressing::Params addr;
  const bf16* input;             // [T, H]
  bf16* output;                  // [T, H]
  const std::int32_t* topk_ids;  // [T, k]
  const float* topk_weights;     // [T, k]
  const float* shared_weights;   // [T] or null (weight 1)
  int num_tokens, hidden, intermediate, num_experts, top_k, slots_per_token;
  int num_slots;
  int chunk_spread;  // MoeConfig::chunk_spread: the grouped GEMMs' order of the shared chunks' units
  // Workspace, written by routing and the GEMM stages.
  const int* sorted_slot;  // [S] slot index of each row of the expert-sorted order
  const WorkTile* tiles;   // [max_tiles]
  const int* num_tiles;    // [1]
  int* unit_counters;      // [2] the TMA grouped GEMM's next unit (gate/up, down), zeroed by routing
  bf16* act;               // [S, F] SiLU(gate)·up, expert-sorted rows
  bf16* y;                 // [S, H] down-projection output per slot (unweighted), slot order
};

// The routed id of slot j of token t (topk_ids[t · top_k + j]); 0, without a load, for a shared chunk's slot.
template <class P>
__device__ __forceinline__ int slot_id(const P& p, int t, int j) {
  return j < p.top_k ? p.topk_ids[static_cast<std::int64_t>(t) * p.top_k + j] : 0;
}

// Expert of slot j (j < slots_per_token) whose slot_id is `id`, or -1 when a routed id is outside [0, E)
// (such slots contribute nothing).
template <class P>
__device__ __forceinline__ int slot_expert_of(const P& p, int j, int id) {
  if (j < p.top_k) return (id >= 0 && id < p.num_experts) ? id : -1;
  return p.num_experts + (j - p.top_k);
}

// Expert of slot s, or -1 when the routed id is outside [0, E).
template <class P>
__device__ __forceinline__ int slot_expert(const P& p, int s) {
  const int t = s / p.slots_per_token, j = s - t * p.slots_per_token;
  return slot_expert_of(p, j, slot_id(p, t, j));
}

template <class P>
__device__ __forceinline__ float slot_weight(const P& p, int t, int j) {
  if (j < p.top_k) return p.topk_weights[static_cast<std::int64_t>(t) * p.top_k + j];
  return p.shared_weights != nullptr ? p.shared_weights[t] : 1.0f;
}

}  // namespace amoeba::kernels
