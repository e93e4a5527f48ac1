// Decode path (few tokens per expert, memory-bound): each block streams a 32-row slice of one expert matrix
// pair straight from global memory into tensor-core fragments and multiplies it by the tile's <= 8·kTokTiles
// tokens ("swap AB": weight rows are the MMA's M = 16, tokens its N = 8).
//
// Why it is fast: the weight bytes are the whole cost, so every block reads them with 16-byte loads, kUnroll
// k-steps × 4 loads per thread issued before the first MMA, and the grid spreads each expert's rows over all
// SMs (one block per 16 output features of W1/W3, per 32 rows of W2). The K dimension is split across the
// block's kWarps warps at 128-byte lines and reduced through shared memory.
//
// Whole lines (bf16): a pair of k-steps reads one 128-byte line of each of its rows, thread q the 32-byte
// sector q (8 values in each step), so the pair's first step touches all four sectors and its second finds
// them in L1 (the weights go through L1, evict-first): the L2 sees one request per line. Reading the line as
// two 64-byte halves in successive steps, past L1, made the L2 fetch up to 1.6x the weights' bytes from DRAM
// whenever it held other data as the kernel started (as it does in an engine, whose attention reads tens of
// MB between two MoE layers) and cost the CUDA backend's MoE layers 7–27% of their time at batch 2–8
// (docs/results/paged_moe_h200.md, "Whole lines").
//
// Preloaded down weights (bf16, 8-token tiles, MoeConfig::decode_preload): the down kernel's blocks start
// while gate/up still runs (programmatic dependent launch) and copy their 32 W2 rows into shared memory
// before they wait for it, so at 1 token the down stage's weights stream during gate/up's instead of after
// it; the main loop reads the same steps from the copy. PagedMoe uses it only where every down block's rows
// fit the device's shared memory at once (docs/results/paged_moe_h200.md, "Down weights preloaded during
// gate/up").
//
// Fragment trick: the reduction over K may visit k in any order as long as A and B agree. A thread that loads
// 8 consecutive k (one 16-byte load) of weight rows g and g+8 and of token g uses them as its
// {2q,2q+1,2q+8,2q+9} elements of two successive m16n8k16 MMAs; the token operand uses the same mapping, so
// the dot products are exact and both operands come from single coalesced 16-byte loads with no shared-memory
// staging.
//
// Quantized experts (the Precision policy, moe/precision.cuh): the same blocks, rows and fragments; a
// thread's 16-byte load holds 16 int8 or 32 int4 values of one row, turned into 2 or 4 of the 8-value chunks
// above (exact integers as bf16) right before their MMAs, with the token operand loaded to match. K is cut
// into k-steps of 64 (int8) or 128 (int4) values, each inside one scale group, dealt to the warps round robin
// (K need only be a multiple of the k-step); each step's MMAs go to fresh float partial sums, which are then
// scaled by the two rows' group scales and added to the accumulators. A staged tile (Tile's kStages) moves
// each thread's own operands of its next k-steps into shared memory with cp.async: the dequantising loop
// holds one step in registers while several are in flight (the register loop's second step in flight costs
// it occupancy). The same steps in the same order either way: bit-identical outputs.
#pragma once

#include "moe/decode_steps.hpp"
#include "moe/moe_params.cuh"
#include "moe/precision.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::decode {

enum class Stage { kGateUp, kDown };

inline constexpr int kRowTiles = 2;  // m16 tiles per block: (W1, W3) at the same features, or 2×16 W2 rows
inline constexpr int kGateUpRows = 16;  // output features per W13 block
inline constexpr int kDownRows = 32;    // output rows of W2 per block
inline constexpr int kKStep = 32;       // k per (two-MMA) step

// Compile-time shape of one decode launch: kTokTiles 8-token MMA tiles per work tile, K split over kWarps
// warps, kUnroll k-steps of loads in flight per thread, an L2 prefetch hint of kPrefetch bytes on the
// weights.
// kStages (quantized experts only, kUnroll = 1; 0: off): each thread copies its own operands of its next
// kStages k-steps into shared memory with cp.async (weights, tokens) and reads the current one back right
// before its MMAs, so kStages steps are in flight per warp at one step's registers.
template <int kTokTilesT, int kWarpsT, int kUnrollT, int kPrefetchT = 128, int kStagesT = 0>
struct Tile {
  static constexpr int kStages = kStagesT;
  static_assert(kStagesT == 0 || (kStagesT >= 2 && kUnrollT == 1),
                "a staged tile keeps kStages >= 2 steps in shared memory, one in registers");
  static constexpr int kPrefetch = kPrefetchT;
  static constexpr int kTokTiles = kTokTilesT;
  static constexpr int kTileTokens = 8 * kTokTiles;
  static constexpr int kWarps = kWarpsT;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kUnroll = kUnrollT;
  static constexpr int kKMultiple = kWarps * kKStep;  // K must be a multiple of this
};

// A staged tile's shared memory on quantized experts P: kStages slots of every thread's 16-byte operands of
// one k-step (the two row tiles' low and high rows, the token chunks), [slot][operand][thread], then the
// block's rows' group scales ([row tile][16 rows][groups], bf16). K: the stage's reduction length.
template <class P, class T>
constexpr int staged_operands() {
  return 2 * kRowTiles + T::kTokTiles * (P::kValuesPerLoad / 8);
}
template <class P, class T>
constexpr std::int64_t staged_smem_bytes(int K) {
  const std::int64_t groups = (K + quant::kGroup - 1) / quant::kGroup;
  return static_cast<std::int64_t>(T::kStages) * staged_operands<P, T>() * T::kThreads * 16 +
         kRowTiles * 16 * groups * 2;
}

// The K split's reduction buffer (static shared memory of every decode tile): warps 1.. hand warp 0 their
// partial sums.
template <class T>
constexpr std::int64_t reduction_bytes() {
  return static_cast<std::int64_t>(T::kWarps - 1) * kRowTiles * T::kTokTiles * 4 * 32 * sizeof(float);
}

// The quantized main loop: fills acc (as the bf16 one does) for the block's two row tiles. `rows[r]`: the
// first byte of row tile r's first row; `scales[r]`: its first row's first scale; `tok[nt]`: token row
// (nt·8 + g)'s element 0 (the activations, bf16); `smem`: a staged tile's shared memory (staged_smem_bytes).
// `wait` (the early down stage, else nothing): called once by every thread, after its first steps' weight
// and scale loads are issued and before any token load.
template <class P, class T, bool kEarly = false, class Wait>
__device__ __forceinline__ void quantized_mainloop(const unsigned char* const (&rows)[kRowTiles],
                                                   const bf16* const (&scales)[kRowTiles],
                                                   const bf16* const (&tok)[T::kTokTiles], int K,
                                                   std::int64_t row_bytes, int groups, int warp, int g, int q,
                                                   float (&acc)[kRowTiles][T::kTokTiles][4],
                                                   unsigned char* smem, Wait wait) {
  constexpr int kTokTiles = T::kTokTiles, kWarps = T::kWarps, kUnroll = T::kUnroll;
  constexpr int kStep = P::kKStep, kValues = P::kValuesPerLoad, kChunks = kValues / 8;
  constexpr int kBytesPerStep = kStep * static_cast<int>(quant::bit_count(P::kBits)) / 8;
  constexpr int kValuesPerByte = 8 / static_cast<int>(quant::bit_count(P::kBits));
  static_assert(kBytesPerStep == 64, "a k-step is half a 128-byte line of a row (moe/decode_steps.hpp)");
  static_assert(quant::kGroup == 128, "QuantStep::group counts 128-value groups (moe/decode_steps.hpp)");
  const int steps = K / kStep;
  // The warp's steps (moe/decode_steps.hpp): k-steps round robin.
  const int my_steps = quant_warp_steps(steps, kWarps, warp);
  auto where = [&](int i) { return quant_step(i, kWarps, warp, q, kValuesPerByte); };
  // One k-step's operands: the two row tiles' low and high rows, their group scales, the token chunks.
  struct Step {
    uint4 wlo[kRowTiles], whi[kRowTiles], b[kTokTiles][kChunks];
    float slo[kRowTiles], shi[kRowTiles];
  };
  // The thread's weight rows: g (low) and g + 8 (high) of each row tile.
  const unsigned char* lo_row[kRowTiles];
  const unsigned char* hi_row[kRowTiles];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
    lo_row[r] = rows[r] + g * row_bytes;
    hi_row[r] = rows[r] + (g + 8) * row_bytes;
  }
  auto load_weights = [&](Step& st, int i) {  // the warp's step i (< my_steps): rows and scales
    const QuantStep w = where(i);
    const int group = w.group(kValuesPerByte);
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      st.wlo[r] = ptx::ld_stream_16<T::kPrefetch>(lo_row[r] + w.byte);
      st.whi[r] = ptx::ld_stream_16<T::kPrefetch>(hi_row[r] + w.byte);
      st.slo[r] = __bfloat162float(scales[r][static_cast<std::int64_t>(g) * groups + group]);
      st.shi[r] = __bfloat162float(scales[r][static_cast<std::int64_t>(g + 8) * groups + group]);
    }
  };
  auto load_tokens = [&](Step& st, int i) {
    const QuantStep w = where(i);
#pragma unroll
    for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) st.b[nt][c] = ptx::ld_cached_16(tok[nt] + w.k + 8 * c);
  };
  auto load = [&](Step& st, int i) {
    load_weights(st, i);
    load_tokens(st, i);
  };
  // The step's MMAs into fresh partial sums, then scaled into acc: element e of a fragment is row
  // g + 8·(e/2), the low or the high row's scale.
  auto compute = [&](const Step& st) {
    float part[kRowTiles][kTokTiles][4] = {};
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        const uint4 lo = dequant::chunk<P::kBits>(st.wlo[r], c), hi = dequant::chunk<P::kBits>(st.whi[r], c);
#pragma unroll
        for (int nt = 0; nt < kTokTiles; ++nt) {
          ptx::mma_bf16_16816(part[r][nt], lo.x, hi.x, lo.y, hi.y, st.b[nt][c].x, st.b[nt][c].y);
          ptx::mma_bf16_16816(part[r][nt], lo.z, hi.z, lo.w, hi.w, st.b[nt][c].z, st.b[nt][c].w);
        }
      }
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][nt][e] += part[r][nt][e] * (e < 2 ? st.slo[r] : st.shi[r]);
  };
  if constexpr (T::kStages > 0) {
    // Every thread copies its own operands (no barrier between its copy and its read), kStages steps ahead;
    // the block's scales are copied once, with the first step, and are the only data threads share.
    constexpr int kS = T::kStages, kOps = staged_operands<P, T>(), kThreads = T::kThreads;
    // Step i's operands are in slot i % kS; operand o of a slot is this thread's 16 bytes at slot +
    // o·kOpBytes: o = 2r and 2r + 1 are row tile r's low and high rows, kTokOp + nt·kChunks + c token tile
    // nt's chunk c.
    constexpr int kOpBytes = 16 * kThreads, kTokOp = 2 * kRowTiles;
    const std::uint32_t slots = ptx::smem_u32(smem) + 16 * threadIdx.x;
    const bf16* sc = reinterpret_cast<const bf16*>(smem + static_cast<std::int64_t>(kS) * kOps * kOpBytes);
    {
      const int chunks = 2 * groups;  // a row tile's 16 rows of scales: 32·groups bytes, 16-byte aligned
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r)
        for (int c = threadIdx.x; c < chunks; c += kThreads)
          ptx::cp_async_cached_16(ptx::smem_u32(sc) + 32 * groups * r + 16 * c,
                                  reinterpret_cast<const unsigned char*>(scales[r]) + 16 * c);
    }
    auto issue_weights = [&](int i) {  // the warp's step i (< my_steps) into slot i % kS: rows
      const QuantStep w = where(i);
      const std::uint32_t slot = slots + (i % kS) * (kOps * kOpBytes);  // step i's
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        ptx::cp_async_stream_16<T::kPrefetch>(slot + (2 * r) * kOpBytes, lo_row[r] + w.byte);
        ptx::cp_async_stream_16<T::kPrefetch>(slot + (2 * r + 1) * kOpBytes, hi_row[r] + w.byte);
      }
    };
    auto issue_tokens = [&](int i) {
      const QuantStep w = where(i);
      const std::uint32_t slot = slots + (i % kS) * (kOps * kOpBytes);
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          ptx::cp_async_cached_16(slot + (kTokOp + nt * kChunks + c) * kOpBytes, tok[nt] + w.k + 8 * c);
    };
    auto issue = [&](int i) {
      issue_weights(i);
      issue_tokens(i);
    };
    if constexpr (kEarly) {  // the first kS steps' rows (and the scales) join group 0; then the tokens
#pragma unroll
      for (int i = 0; i < kS; ++i)
        if (i < my_steps) issue_weights(i);
      wait();
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        if (i < my_steps) issue_tokens(i);
        ptx::cp_async_commit();
      }
    } else {
#pragma unroll
      for (int i = 0; i < kS; ++i) {  // group i: step i (group 0 also the scales)
        if (i < my_steps) issue(i);
        ptx::cp_async_commit();
      }
    }
    ptx::cp_async_wait<kS - 1>();
    __syncthreads();  // every thread's scale chunks landed
    // Step i's operands from its slot in shared memory.
    auto read = [&](Step& st, int i) {
      const int group = where(i).group(kValuesPerByte);
      const std::uint32_t slot = slots + (i % kS) * (kOps * kOpBytes);
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        st.wlo[r] = ptx::ld_shared_16(slot + (2 * r) * kOpBytes);
        st.whi[r] = ptx::ld_shared_16(slot + (2 * r + 1) * kOpBytes);
        st.slo[r] = __bfloat162float(sc[(r * 16 + g) * groups + group]);
        st.shi[r] = __bfloat162float(sc[(r * 16 + g + 8) * groups + group]);
      }
#pragma unroll
      for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          st.b[nt][c] = ptx::ld_shared_16(slot + (kTokOp + nt * kChunks + c) * kOpBytes);
    };
    for (int i = 0; i < my_steps; ++i) {
      ptx::cp_async_wait<kS - 1>();  // groups 0..i complete: kS + i committed
      Step st;
      read(st, i);
      compute(st);  // its MMAs consume the slot's values before the slot is refilled below
      if (i + kS < my_steps) issue(i + kS);
      ptx::cp_async_commit();
    }
  } else {
    for (int i = 0; i < my_steps; i += kUnroll) {
      // Every load of kUnroll steps first; steps past the warp's last reload its last one (an L2 hit) with
      // zeroed tokens, so the loads stay unconditional.
      Step st[kUnroll];
      if (kEarly && i == 0) {  // the first steps' weights before the wait, their tokens after it
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load_weights(st[u], min(u, my_steps - 1));
        wait();
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load_tokens(st[u], min(u, my_steps - 1));
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load(st[u], min(i + u, my_steps - 1));
      }
#pragma unroll
      for (int u = 1; u < kUnroll; ++u)
        if (i + u >= my_steps)
#pragma unroll
          for (int nt = 0; nt < kTokTiles; ++nt)
#pragma unroll
            for (int c = 0; c < kChunks; ++c) st[u].b[nt][c] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) compute(st[u]);
    }
    if (kEarly && my_steps == 0) wait();
  }
}

// A preloading down block's shared memory: its 32 W2 rows of K values at preload_pitch
// (moe/decode_steps.hpp).
constexpr std::int64_t preload_smem_bytes(int K) {
  return kDownRows * preload_pitch(K);
}

// kPreload (bf16 down stage only): the block copies its 32 W2 rows into shared memory (cp.async, whole
// 16-byte chunks in row order, so each warp instruction covers 512 contiguous bytes) before it waits for the
// gate/up kernel, so the down weights stream while gate/up still runs (the down blocks start early,
// programmatic dependent launch), and its main loop then reads them from shared memory: the same values in
// the same k order and MMAs as the streaming loop, so the outputs are bit-identical.
// kEarlyWeights (the streaming down stage): the block reads its tile from the L2 and every thread issues its
// first steps' W2 loads (kUnroll steps, or a staged tile's kStages) before it waits for the gate/up kernel,
// its `act` loads after: the down blocks that start on SMs gate/up's last blocks leave free stream their
// first weights under gate/up's tail. The same loads: bit-identical outputs.
template <class Addressing, Stage kStage, class T, class P = Bf16, bool kPreload = false,
          bool kEarlyWeights = false>
__global__ void __launch_bounds__(T::kThreads) gemv_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  constexpr int kTokTiles = T::kTokTiles, kWarps = T::kWarps, kUnroll = T::kUnroll;
  static_assert(!kPreload || (kStage == Stage::kDown && !P::kQuantized),
                "preloading reads the bf16 down stage's W2 rows");
  constexpr bool kEarly = kEarlyWeights && kStage == Stage::kDown && !kPreload;
  // The dependency wait of an early down block, once its first weight loads are in flight.
  const auto wait = [] {
    if constexpr (kEarly) {
      ptx::grid_dependency_wait();  // act: written by the gate/up kernel
      ptx::launch_dependents();
    }
  };
  WorkTile tile;
  if constexpr (kPreload) {
    if (static_cast<int>(blockIdx.y) >= __ldcg(p.num_tiles)) return;
    tile = load_tile_l2(p.tiles + blockIdx.y);
    extern __shared__ __align__(16) unsigned char preload_smem[];
    const int K = p.intermediate, chunks = K / 8;  // 16-byte chunks per row
    const std::int64_t pitch = preload_pitch(K);
    // The block's 32 rows are consecutive rows of W2 (one matrix: contiguous in its page).
    const bf16* src = tile.matrix[2] + static_cast<std::int64_t>(blockIdx.x) * kDownRows * K;
    const std::uint32_t dst = ptx::smem_u32(preload_smem);
    for (int c = threadIdx.x; c < kDownRows * chunks; c += T::kThreads) {
      const int row = c / chunks, x = c - row * chunks;
      ptx::cp_async_stream_16<T::kPrefetch>(dst + static_cast<std::uint32_t>(row * pitch + 16 * x),
                                            src + static_cast<std::int64_t>(row) * K + 8 * x);
    }
    ptx::cp_async_commit();
    ptx::grid_dependency_wait();  // act: written by the gate/up kernel
    ptx::launch_dependents();
    ptx::cp_async_wait<0>();
    __syncthreads();  // every thread's chunks landed
  } else if constexpr (kEarly) {
    if (static_cast<int>(blockIdx.y) >= __ldcg(p.num_tiles)) return;
    tile = load_tile_l2(p.tiles + blockIdx.y);
  } else {
    ptx::grid_dependency_wait();  // tiles, act: written by the previous kernels of this layer
    ptx::launch_dependents();
    if (static_cast<int>(blockIdx.y) >= *p.num_tiles) return;
    tile = p.tiles[blockIdx.y];
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const int K = kGateUp ? p.hidden : p.intermediate;
  // Token operand rows: token c = nt·8 + g of the tile (rows past `count` reuse row 0; their results are
  // dropped), at element 0.
  const bf16* tok[kTokTiles];
#pragma unroll
  for (int nt = 0; nt < kTokTiles; ++nt) {
    const int c = nt * 8 + g < tile.count ? nt * 8 + g : 0;
    if constexpr (kGateUp) {
      const int slot = p.sorted_slot[tile.row_start + c];
      tok[nt] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K;
    } else {
      tok[nt] = p.act + static_cast<std::int64_t>(tile.row_start + c) * K;
    }
  }
  float acc[kRowTiles][kTokTiles][4] = {};
  if constexpr (P::kQuantized) {
    extern __shared__ __align__(16) unsigned char staged_smem[];  // staged tiles only (staged_smem_bytes)
    // The matrix (packed, moe/quant_layout.hpp): N rows of K values, row_bytes each, then the scales.
    const quant::MatrixLayout L =
        kGateUp ? P::w13(p.intermediate, p.hidden) : P::w2(p.intermediate, p.hidden);
    const std::int64_t row_bytes = static_cast<std::int64_t>(L.row_bytes());
    const int groups = static_cast<int>(L.groups_per_row());
    const unsigned char* rows[kRowTiles];
    const bf16* scales[kRowTiles];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      const bf16* m = kGateUp ? tile.matrix[r] : tile.matrix[2];
      const std::int64_t n0 = kGateUp ? static_cast<std::int64_t>(blockIdx.x) * kGateUpRows
                                      : static_cast<std::int64_t>(blockIdx.x) * kDownRows + 16 * r;
      const auto* base = reinterpret_cast<const unsigned char*>(m);
      rows[r] = base + n0 * row_bytes;
      scales[r] = reinterpret_cast<const bf16*>(base + L.scale_offset()) + n0 * groups;
    }
    quantized_mainloop<P, T, kEarly>(rows, scales, tok, K, row_bytes, groups, warp, g, q, acc, staged_smem,
                                     wait);
  } else {
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
    // The warp's range of K: whole 128-byte lines (moe/decode_steps.hpp).
    const KRange range = warp_k_range(K, kWarps, warp);
    const int k0 = range.begin, steps = (range.end - range.begin) / kKStep;
#pragma unroll
    for (int nt = 0; nt < kTokTiles; ++nt) tok[nt] += k0;
    const bf16* a_lo[kRowTiles];
    const bf16* a_hi[kRowTiles];
    std::uint32_t s_lo[kRowTiles] = {}, s_hi[kRowTiles] = {};  // kPreload: the same rows in shared memory
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      a_lo[r] = rows[r] + static_cast<std::int64_t>(g) * K + k0;
      a_hi[r] = rows[r] + static_cast<std::int64_t>(g + 8) * K + k0;
      if constexpr (kPreload) {
        extern __shared__ __align__(16) unsigned char preload_smem[];
        const std::uint32_t base = ptx::smem_u32(preload_smem) + 2 * k0;
        s_lo[r] = base + static_cast<std::uint32_t>((16 * r + g) * preload_pitch(K));
        s_hi[r] = base + static_cast<std::uint32_t>((16 * r + g + 8) * preload_pitch(K));
      }
    }
    for (int s = 0; s < steps; s += kUnroll) {
      uint4 alo[kUnroll][kRowTiles], ahi[kUnroll][kRowTiles], b[kUnroll][kTokTiles];
      // All loads of kUnroll steps are issued before the first MMA. Steps past the end reload the last step
      // (a cache hit) and are zeroed, so the loads stay unconditional and in flight together.
      auto load_weights = [&](int u) {
        const int k =
            bf16_k(min(s + u, steps - 1), steps, q);  // a pair of steps: one line (decode_steps.hpp)
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
          if constexpr (kPreload) {
            alo[u][r] = ptx::ld_shared_16(s_lo[r] + 2 * k);
            ahi[u][r] = ptx::ld_shared_16(s_hi[r] + 2 * k);
          } else {
            alo[u][r] = ptx::ld_stream_16<T::kPrefetch, true>(a_lo[r] + k);
            ahi[u][r] = ptx::ld_stream_16<T::kPrefetch, true>(a_hi[r] + k);
          }
        }
      };
      auto load_tokens = [&](int u) {
        const int k = bf16_k(min(s + u, steps - 1), steps, q);
#pragma unroll
        for (int nt = 0; nt < kTokTiles; ++nt) b[u][nt] = ptx::ld_cached_16(tok[nt] + k);
      };
      if (kEarly && s == 0) {  // the first steps' weights before the wait, their tokens after it
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load_weights(u);
        wait();
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load_tokens(u);
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          load_weights(u);
          load_tokens(u);
        }
      }
#pragma unroll
      for (int u = 1; u < kUnroll; ++u)
        if (s + u >= steps)
#pragma unroll
          for (int nt = 0; nt < kTokTiles; ++nt) b[u][nt] = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
          for (int nt = 0; nt < kTokTiles; ++nt) {
            ptx::mma_bf16_16816(acc[r][nt], alo[u][r].x, ahi[u][r].x, alo[u][r].y, ahi[u][r].y, b[u][nt].x,
                                b[u][nt].y);
            ptx::mma_bf16_16816(acc[r][nt], alo[u][r].z, ahi[u][r].z, alo[u][r].w, ahi[u][r].w, b[u][nt].z,
                                b[u][nt].w);
          }
    }
    if (kEarly && steps == 0) wait();
  }  // bf16

  // Reduce the K split: warps 1.. hand their partial sums to warp 0 through shared memory.
  __shared__ float red[kWarps - 1][kRowTiles][kTokTiles][4][32];  // reduction_bytes<T>()
  static_assert(sizeof(red) == reduction_bytes<T>());
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
