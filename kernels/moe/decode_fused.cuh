// One-token decode in one launch after routing (bf16 experts, MoeConfig::decode_fused): the gate/up stage,
// the down stage and the combine of a single token, so that the layer is routing plus one kernel instead of
// routing, gate/up, down and combine (docs/kernel.md, "Decode at 1 token").
//
// A block per kFusedRows (16) rows of H, all resident at once (one per SM: PagedMoe checks that the grid
// fits). Each block
//  1. reads routing's tiles (one per expert of the token) and keeps, per slot j, its row of the
//     expert-sorted order and its expert's W2;
//  2. copies its 16 W2 rows of the first `preloaded` slots into shared memory (cp.async), slot by slot,
//     without waiting (every slot where they fit: PagedMoe::fused_preloads);
//  3. runs gate/up units meanwhile on its kFusedGroups warp groups (each a decode tile's warps): unit
//     u = tile · F/16 + feature block, claimed one at a time from a counter (the next claim in flight while
//     the group runs its unit), each exactly the gate/up kernel's block (decode::gemv_kernel<kGateUp>: the
//     same loads, k order, MMAs, K-split reduction and rounding); after each unit its group adds 1 to a
//     second counter with release semantics;
//  4. waits until the counter reaches the number of units (acquire: every unit's activations are visible),
//     copies the slots' activations into shared memory, then computes each slot's 16 rows (the slots dealt
//     over its groups, the streamed ones first; the preloading down block's arithmetic on the copied rows,
//     the streaming down block's on rows read from global memory for slots past `preloaded`: the same values
//     in the same order, each rounded to bf16 as the down kernel stores y) and sums the slots in slot order,
//     fp32, with their weights (combine_kernel's sum), writing the token's 16 output values.
// So the outputs equal the four-kernel layer's bit for bit, paged or contiguous.
//
// A block waits only once no unit is left to claim, and every claimed unit belongs to a group that is
// running, so the wait ends however many blocks are resident (another kernel may hold SMs); the grid fits
// one block per SM (PagedMoe::decode_fuses) so that every block's copy streams during gate/up. The counters
// are MoeParams::unit_counters[0] (units done) and [1] (units claimed), zeroed by the routing kernel of the
// same call, which completes before this kernel reads them (programmatic dependent launch:
// griddepcontrol.wait).
#pragma once

#include "moe/decode_gemv.cuh"
#include "moe/tma.cuh"

namespace amoeba::kernels::decode {

inline constexpr int kFusedRows = 16;      // output rows (of H) per block
inline constexpr int kFusedMaxSlots = 16;  // slots of the token (k + m) at most
inline constexpr int kFusedGroups = 3;     // warp groups per block, each a decode tile's warps

// Dynamic shared memory of a fused block on decode tile T: the 16 W2 rows of each of the `preloaded` slots
// at preload_pitch(F), each of the `slots` slots' activations (F values), each group's K-split reduction
// buffer, then each slot's 16 rounded outputs (fp32).
constexpr std::int64_t fused_w2_bytes(int preloaded, int F) {
  return static_cast<std::int64_t>(preloaded) * kFusedRows * preload_pitch(F);
}
constexpr std::int64_t fused_act_bytes(int slots, int F) {
  return static_cast<std::int64_t>(slots) * F * 2;
}
template <class T>
constexpr std::int64_t fused_smem_bytes(int preloaded, int slots, int F) {
  return fused_w2_bytes(preloaded, F) + fused_act_bytes(slots, F) + kFusedGroups * reduction_bytes<T>() +
         static_cast<std::int64_t>(kFusedMaxSlots) * kFusedRows * sizeof(float);
}

// kBulk (MoeConfig::decode_fused_tma): the W2 rows are copied by the TMA unit, one cp.async.bulk per row
// issued by the block's first warp and completing on an mbarrier, instead of every thread's 16-byte cp.async
// chunks (which queue ahead of the gate/up loads in the SM's load pipeline).
template <class Addressing, class T, bool kBulk = false>
__global__ void __launch_bounds__(kFusedGroups* T::kThreads, 1)
    fused_kernel(const __grid_constant__ MoeParams<Addressing> p, int preloaded) {
  static_assert(T::kTokTiles == 1, "one token: 8-token tiles");
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int slot_row[kFusedMaxSlots];  // -1: a slot routed outside [0, E)
  __shared__ const bf16* slot_w2[kFusedMaxSlots];
  __shared__ int claimed[kFusedGroups];  // each group's next unit
  __shared__ std::uint64_t w2_landed;    // kBulk: the W2 rows' copies complete on it
  const int S = p.slots_per_token, F = p.intermediate, H = p.hidden;
  const int group = threadIdx.x / T::kThreads, warp = (threadIdx.x % T::kThreads) / 32,
            lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int barrier = 1 + group;  // the group's named barrier
  auto group_sync = [barrier] { tma::named_sync<T::kThreads>(barrier); };
  const std::int64_t pitch = preload_pitch(F);
  bf16* act = reinterpret_cast<bf16*>(smem + fused_w2_bytes(preloaded, F));
  unsigned char* after_act = smem + fused_w2_bytes(preloaded, F) + fused_act_bytes(S, F);
  float* red = reinterpret_cast<float*>(after_act) + group * (reduction_bytes<T>() / 4);
  float* ys = reinterpret_cast<float*>(after_act + kFusedGroups * reduction_bytes<T>());
  const int h0 = blockIdx.x * kFusedRows;

  const bool leader = threadIdx.x % T::kThreads == 0;  // the group's claimer
  ptx::grid_dependency_wait();                         // routing: tiles, sorted_slot and the zeroed counters
  if (leader) claimed[group] = atomicAdd(p.unit_counters + 1, 1);  // the group's first unit
  // 1. Each slot's expert-sorted row and W2 (one token: the tiles' rows are its slots).
  if (threadIdx.x < kFusedMaxSlots) slot_row[threadIdx.x] = -1;
  if (kBulk && threadIdx.x == 0) {
    tma::mbarrier_init(&w2_landed, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  int u = claimed[group];
  const int num_tiles = __ldcg(p.num_tiles);
  if (static_cast<int>(threadIdx.x) < num_tiles) {
    const WorkTile t = load_tile_l2(p.tiles + threadIdx.x);
    for (int c = 0; c < t.count; ++c) {
      const int j = __ldcg(p.sorted_slot + t.row_start + c);
      slot_row[j] = t.row_start + c;
      slot_w2[j] = t.matrix[2];
    }
  }
  __syncthreads();

  // 2. The block's 16 W2 rows of every used preloaded slot into shared memory: one bulk copy per row
  // (kBulk), else 16-byte chunks, row by row.
  if constexpr (kBulk) {
    if (threadIdx.x < 32) {
      int used = 0;
      for (int j = 0; j < preloaded; ++j) used += slot_row[j] >= 0;
      if (lane == 0) tma::arrive_expect_tx(&w2_landed, static_cast<unsigned>(used * kFusedRows * 2 * F));
      __syncwarp();
      for (int c = lane; c < preloaded * kFusedRows; c += 32) {
        const int j = c / kFusedRows, r = c % kFusedRows;
        if (slot_row[j] >= 0)
          tma::load_1d(ptx::smem_u32(smem) + static_cast<std::uint32_t>((j * kFusedRows + r) * pitch),
                       slot_w2[j] + static_cast<std::int64_t>(h0 + r) * F, static_cast<unsigned>(2 * F),
                       &w2_landed);
      }
    }
  } else {
    for (int j = 0; j < preloaded; ++j)
      if (slot_row[j] >= 0)
        copy_rows_async<T::kPrefetch>(
            ptx::smem_u32(smem) + static_cast<std::uint32_t>(j * kFusedRows * pitch),
            slot_w2[j] + static_cast<std::int64_t>(h0) * F, kFusedRows, F, threadIdx.x, blockDim.x);
    ptx::cp_async_commit();
  }

  // 3. Gate/up units, claimed one at a time.
  const int feature_blocks = F / kGateUpRows, units = num_tiles * feature_blocks;
  while (u < units) {
    int next = 0;
    if (leader) next = atomicAdd(p.unit_counters + 1, 1);  // used after the main loop
    const int fb = u % feature_blocks;
    const WorkTile tile = load_tile_l2(p.tiles + u / feature_blocks);
    const bf16* tok[1];
    {
      const int c = g < tile.count ? g : 0;  // rows past the count reuse row 0; their results are dropped
      const int slot = p.sorted_slot[tile.row_start + c];
      tok[0] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * H;
    }
    const KRange range = warp_k_range(H, T::kWarps, warp);
    const int k0 = range.begin, steps = (range.end - range.begin) / kKStep;
    tok[0] += k0;
    const std::int64_t n0 = static_cast<std::int64_t>(fb) * kGateUpRows;
    const bf16* lo[kRowTiles];
    const bf16* hi[kRowTiles];
    const std::uint32_t none[kRowTiles] = {};
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      lo[r] = tile.matrix[r] + (n0 + g) * H + k0;
      hi[r] = tile.matrix[r] + (n0 + g + 8) * H + k0;
    }
    float acc[kRowTiles][1][4] = {};
    bf16_mainloop<T, kRowTiles, false>(lo, hi, none, none, tok, steps, q, acc);
    if (leader) claimed[group] = next;
    group_sync();        // the group's previous unit has read `red`; `claimed` holds the next unit
    u = claimed[group];  // read before the reduction's barrier, after which the leader may write again
    if (reduce_k_split<T>(acc, red, warp, lane, group_sync)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 2 * q + (i % 2);
        if (c < tile.count)
          store_act(p, tile.row_start + c, fb * kGateUpRows + g + 8 * (i / 2), acc[0][0][i], acc[1][0][i]);
      }
      __syncwarp();
      if (lane == 0) ptx::red_release_add(p.unit_counters, 1);
    }
  }

  // 4. Every unit's activations, then the block's rows of each slot and their weighted sum.
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (ptx::ld_acquire(p.unit_counters) < units) {
      __nanosleep(32);
      // A wait past any layer's time (2^34 cycles, about ten seconds, room for a sanitizer's slowdown) means
      // the counters were not zeroed before this kernel (routing did not run first): fail the launch rather
      // than hang.
      if (clock64() - start > (1LL << 34)) __trap();
    }
  }
  __syncthreads();
  ptx::launch_dependents();  // the next layer's routing may take an SM and wait
  {
    // Each used slot's activations into shared memory (from the L2: written by other blocks in this kernel).
    const int chunks = F / 8;
    for (int c = threadIdx.x; c < S * chunks; c += blockDim.x) {
      const int j = c / chunks, x = c - j * chunks;
      if (slot_row[j] >= 0)
        ptx::cp_async_16(ptx::smem_u32(act + static_cast<std::int64_t>(j) * F + 8 * x),
                         p.act + static_cast<std::int64_t>(slot_row[j]) * F + 8 * x, 16);
    }
    ptx::cp_async_commit();
  }
  ptx::cp_async_wait<0>();
  if constexpr (kBulk) tma::wait(&w2_landed, 0);
  __syncthreads();  // every thread's W2 and activation chunks landed
  const KRange range = warp_k_range(F, T::kWarps, warp);
  const int k0 = range.begin, steps = (range.end - range.begin) / kKStep;
  const int streamed = S - preloaded;
  for (int i = group; i < S; i += kFusedGroups) {
    // The streamed slots first (their rows come from global memory: the longest), then the preloaded ones.
    const int j = i < streamed ? preloaded + i : i - streamed;
    if (slot_row[j] < 0) continue;
    const bf16* tok[1] = {act + static_cast<std::int64_t>(j) * F + k0};
    float acc[1][1][4] = {};
    if (j < preloaded) {
      const std::uint32_t base =
          ptx::smem_u32(smem) + static_cast<std::uint32_t>(j * kFusedRows * pitch + 2 * k0);
      const std::uint32_t s_lo[1] = {base + static_cast<std::uint32_t>(g * pitch)};
      const std::uint32_t s_hi[1] = {base + static_cast<std::uint32_t>((g + 8) * pitch)};
      const bf16* const unused[1] = {nullptr};
      bf16_mainloop<T, 1, true, true>(unused, unused, s_lo, s_hi, tok, steps, q, acc);
    } else {
      const bf16* rows = slot_w2[j] + static_cast<std::int64_t>(h0) * F + k0;
      const bf16* const lo[1] = {rows + static_cast<std::int64_t>(g) * F};
      const bf16* const hi[1] = {rows + static_cast<std::int64_t>(g + 8) * F};
      const std::uint32_t none[1] = {};
      bf16_mainloop<T, 1, false, true>(lo, hi, none, none, tok, steps, q, acc);
    }
    group_sync();  // the group's previous slot has read `red`
    // Accumulator i: row g + 8·(i/2), token 2q + i % 2: the token is column 0 (q = 0, i even).
    if (reduce_k_split<T>(acc, red, warp, lane, group_sync) && q == 0) {
      ys[j * kFusedRows + g] = __bfloat162float(__float2bfloat16_rn(acc[0][0][0]));
      ys[j * kFusedRows + g + 8] = __bfloat162float(__float2bfloat16_rn(acc[0][0][2]));
    }
  }
  __syncthreads();
  if (threadIdx.x < kFusedRows) {
    float sum = 0.f;
    for (int j = 0; j < S; ++j)
      if (slot_row[j] >= 0) sum += slot_weight(p, 0, j) * ys[j * kFusedRows + threadIdx.x];
    p.output[h0 + threadIdx.x] = __float2bfloat16_rn(sum);
  }
}

}  // namespace amoeba::kernels::decode
