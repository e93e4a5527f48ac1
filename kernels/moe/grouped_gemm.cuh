// Prefill path (many tokens per expert, compute-bound): a grouped GEMM on mma.sync m16n8k16 bf16 tensor
// cores. Each block owns one work tile (<= 128 expert-sorted token rows of one expert) × 128 weight rows, K
// in steps of 64 through a 3-stage cp.async pipeline into XOR-swizzled shared memory (conflict-free
// ldmatrix).
//  - gate/up stage: A = input rows gathered through the permutation while loading; B = 64 features of W1 and
//  the
//    same 64 of W3, interleaved per warp so each thread holds gate and up of the same (token, feature):
//    SiLU(gate)·up is fused into the epilogue, which writes bf16 `act` rows.
//  - down stage: A = `act` rows, B = 128 rows of W2; the epilogue writes fp32 rows of `y` at their slot index
//    (the top-k weighting and sum happen in the combine kernel, in slot order, so results are deterministic).
// The base pointers of a tile's weight rows come from one addressing lookup per matrix per tile; since 64
// divides F, a tile never straddles the W1/W3 border. Blocks are ordered token-tile-major so consecutive
// blocks share the same A rows and the same expert's weights stay in L2 across its token tiles.
#pragma once

#include "moe/moe_params.cuh"
#include "moe/ptx.cuh"

namespace amoeba::kernels::grouped {

enum class Stage { kGateUp, kDown };

inline constexpr int kBlockM = 128;  // token rows per tile
inline constexpr int kBlockN = 128;  // weight rows per tile (gate/up: 64 features of W1 + the same 64 of W3)
inline constexpr int kBlockK = 64;
inline constexpr int kStages = 3;
inline constexpr int kThreads = 256;  // 8 warps: 2 along M (64 rows each) × 4 along N (32 each)
inline constexpr int kGateUpFeatures = kBlockN / 2;
inline constexpr int kSmemBytes = kStages * (kBlockM + kBlockN) * kBlockK * 2;

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][kRowElems] bf16 tile (by default the
// [rows][64] operand tiles), XOR-swizzled by row.
template <int kRowElems = kBlockK>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kRowElems + ((chunk ^ (row & 7)) * 8);
}

// B row b of a tile (0..127) → (matrix j, weight row n). Gate/up: 64 features of W1 and the same 64 of W3,
// interleaved by 16 (rows 32c..32c+15 are W1, 32c+16..32c+31 W3); down: 128 consecutive rows of W2.
template <Stage kStage>
__device__ __forceinline__ void b_row(int b, int slice, int& j, int& n) {
  if constexpr (kStage == Stage::kGateUp) {
    j = (b % 32) < 16 ? 0 : 1;
    n = slice * kGateUpFeatures + 16 * (b / 32) + (b % 16);
  } else {
    j = 2;
    n = slice * kBlockN + b;
  }
}

// Matrix j of a tile by selects, not by a dynamic index (which would put the tile's pointers on the stack).
__device__ __forceinline__ const bf16* tile_matrix(const WorkTile& t, int j) {
  return j == 0 ? t.matrix[0] : j == 1 ? t.matrix[1] : t.matrix[2];
}

// One operand's 64-k step — kRows rows of 64 bf16 — copied by kLoaders threads into a swizzled [kRows][64]
// stage: thread t copies chunk t % 8 of rows t / 8 + (kLoaders / 8)·i, from src[i] (the row's chunk at k = 0)
// with bytes[i] (16, or 0 to zero-fill a row past the tile's tokens). ALoader and BLoader fill src and bytes.
template <int kLoaders, int kRows = 128>
struct RowCopier {
  static constexpr int kRowsPerPass = kLoaders / 8;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kRows % kRowsPerPass == 0, "whole passes");
  static_assert(kRowsPerPass % 8 == 0, "the passes' rows must share (row & 7): one swizzle offset");
  const bf16* src[kPasses];
  int bytes[kPasses];
  int offset;  // the thread's first chunk in a stage (elements)

  __device__ __forceinline__ explicit RowCopier(int t) : offset(swizzle(t / 8, t % 8)) {}
  __device__ __forceinline__ static int row(int t, int i) { return t / 8 + kRowsPerPass * i; }
  __device__ __forceinline__ void load(bf16* stage, int kt) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i)
      ptx::cp_async_16(ptx::smem_u32(stage + offset + kRowsPerPass * i * kBlockK), src[i] + kt * kBlockK,
                       bytes[i]);
  }
};

// The A operand: the tile's kRows token rows (gate/up: input rows gathered through the permutation; down:
// `act` rows), rows past the tile's count zero-filled.
template <Stage kStage, int kLoaders, int kRows = kBlockM>
struct ALoader : RowCopier<kLoaders, kRows> {
  template <class Addressing>
  __device__ __forceinline__ ALoader(const MoeParams<Addressing>& p, const WorkTile& tile, int t)
      : RowCopier<kLoaders, kRows>(t) {
    const int K = kStage == Stage::kGateUp ? p.hidden : p.intermediate;
#pragma unroll
    for (int i = 0; i < this->kPasses; ++i) {
      const int m = this->row(t, i);
      const bool valid = m < tile.count;
      const int mm = valid ? m : 0;
      this->bytes[i] = valid ? 16 : 0;
      if constexpr (kStage == Stage::kGateUp) {
        const int slot = p.sorted_slot[tile.row_start + mm];
        this->src[i] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K + (t % 8) * 8;
      } else {
        this->src[i] = p.act + static_cast<std::int64_t>(tile.row_start + mm) * K + (t % 8) * 8;
      }
    }
  }
};

// The bf16 B operand: the slice's 128 weight rows (b_row).
template <Stage kStage, int kLoaders>
struct BLoader : RowCopier<kLoaders> {
  template <class Addressing>
  __device__ __forceinline__ BLoader(const MoeParams<Addressing>& p, const WorkTile& tile, int slice, int t)
      : RowCopier<kLoaders>(t) {
    const int K = kStage == Stage::kGateUp ? p.hidden : p.intermediate;
#pragma unroll
    for (int i = 0; i < this->kPasses; ++i) {
      int j, n;
      b_row<kStage>(this->row(t, i), slice, j, n);
      this->src[i] = tile_matrix(tile, j) + static_cast<std::int64_t>(n) * K + (t % 8) * 8;
      this->bytes[i] = 16;
    }
  }
};

// A and bf16 B of one (weight slice, work tile) block in two rings, [kStagesN][kARows][64] and
// [kStagesN][128][64], step kt in stage kt % kStagesN, copied by kLoaders threads: the cp.async pipeline of
// the 128-row grouped GEMMs (mma.sync and sm_90 wgmma: 128 token rows, kStages stages, kThreads loaders) and
// of the small-batch wgmma kernel (64 token rows, its own stages, one warpgroup).
template <Stage kStage, int kLoaders = kThreads, int kARows = kBlockM, int kStagesN = kStages>
struct StageLoader {
  static constexpr int kATile = kARows * kBlockK, kBTile = kBlockN * kBlockK;
  ALoader<kStage, kLoaders, kARows> a;
  BLoader<kStage, kLoaders> b;

  template <class Addressing>
  __device__ __forceinline__ StageLoader(const MoeParams<Addressing>& p, const WorkTile& tile, int slice,
                                         int t)
      : a(p, tile, t), b(p, tile, slice, t) {}
  // Step kt's copies into stage `stage` (not committed).
  __device__ __forceinline__ void load(bf16* smem_a, bf16* smem_b, int stage, int kt) const {
    a.load(smem_a + stage * kATile, kt);
    b.load(smem_b + stage * kBTile, kt);
  }
  // The prologue: steps 0 .. kStagesN − 2, one commit group each (empty past the last step).
  __device__ __forceinline__ void prologue(bf16* smem_a, bf16* smem_b, int k_tiles) const {
#pragma unroll
    for (int s = 0; s < kStagesN - 1; ++s) {
      if (s < k_tiles) load(smem_a, smem_b, s, s);
      ptx::cp_async_commit();
    }
  }
  // The prologue's stages with B's copies issued before `wait()` and A's after it, one commit group per step
  // as prologue()'s (B's copies join step 0's group): the down stage's weight rows do not depend on the
  // gate/up kernel, so they can stream before the kernel waits for it; its `act` rows do.
  template <class Wait>
  __device__ __forceinline__ void prologue_weights_first(bf16* smem_a, bf16* smem_b, int k_tiles,
                                                         Wait wait) const {
#pragma unroll
    for (int s = 0; s < kStagesN - 1; ++s)
      if (s < k_tiles) b.load(smem_b + s * kBTile, s);
    wait();
#pragma unroll
    for (int s = 0; s < kStagesN - 1; ++s) {
      if (s < k_tiles) a.load(smem_a + s * kATile, s);
      ptx::cp_async_commit();
    }
  }
  // Iteration kt's refill, once every thread is past step kt − 1: step kt + kStagesN − 1 into step kt − 1's
  // stage, one commit group (empty past the last step).
  __device__ __forceinline__ void refill(bf16* smem_a, bf16* smem_b, int kt, int k_tiles) const {
    const int next = kt + kStagesN - 1;
    if (next < k_tiles) load(smem_a, smem_b, next % kStagesN, next);
    ptx::cp_async_commit();
  }
};

template <class Addressing, Stage kStage>
__global__ void __launch_bounds__(kThreads, 2) gemm_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (static_cast<int>(blockIdx.y) >= *p.num_tiles) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem_a = reinterpret_cast<bf16*>(smem_raw);
  bf16* smem_b = smem_a + kStages * kBlockM * kBlockK;

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const WorkTile tile = p.tiles[blockIdx.y];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int wm = warp % 2, wn = warp / 2;
  const int K = kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;

  // Loaders: thread tid copies chunk tid % 8 of rows tid / 8 + 32·i of both A and B each stage.
  const StageLoader<kStage> loader(p, tile, static_cast<int>(blockIdx.x), tid);

  float acc[4][4][4] = {};
  loader.prologue(smem_a, smem_b, k_tiles);
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();
    loader.refill(smem_a, smem_b, kt, k_tiles);
    const bf16* sa = smem_a + (kt % kStages) * kBlockM * kBlockK;
    const bf16* sb = smem_b + (kt % kStages) * kBlockN * kBlockK;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      std::uint32_t af[4][4], bfr[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int row = wm * 64 + mt * 16 + (lane % 16);
        ptx::ldmatrix_x4(af[mt], ptx::smem_u32(sa + swizzle(row, kk * 2 + lane / 16)));
      }
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int row = wn * 32 + pair * 16 + (lane % 8) + 8 * (lane / 16);
        std::uint32_t r[4];
        ptx::ldmatrix_x4(r, ptx::smem_u32(sb + swizzle(row, kk * 2 + (lane / 8) % 2)));
        bfr[2 * pair][0] = r[0];
        bfr[2 * pair][1] = r[1];
        bfr[2 * pair + 1][0] = r[2];
        bfr[2 * pair + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          ptx::mma_bf16_16816(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bfr[nt][0],
                              bfr[nt][1]);
    }
  }
  ptx::cp_async_wait<0>();

  // Accumulator (mt, nt, i): token row wm·64 + mt·16 + g + 8·(i/2), B row wn·32 + nt·8 + 2q + (i % 2).
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = wm * 64 + mt * 16 + g + 8 * half;
      if (m >= tile.count) continue;
      if constexpr (kGateUp) {
        bf16* arow = p.act + static_cast<std::int64_t>(tile.row_start + m) * p.intermediate +
                     blockIdx.x * kGateUpFeatures + 16 * wn + 2 * q;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float v0 = silu(acc[mt][nt][2 * half]) * acc[mt][nt + 2][2 * half];
          const float v1 = silu(acc[mt][nt][2 * half + 1]) * acc[mt][nt + 2][2 * half + 1];
          *reinterpret_cast<std::uint32_t*>(arow + 8 * nt) = ptx::pack_bf16x2(v0, v1);
        }
      } else {
        const int slot = p.sorted_slot[tile.row_start + m];
        bf16* yrow =
            p.y + static_cast<std::int64_t>(slot) * p.hidden + blockIdx.x * kBlockN + 32 * wn + 2 * q;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          *reinterpret_cast<std::uint32_t*>(yrow + 8 * nt) =
              ptx::pack_bf16x2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
      }
    }
}

}  // namespace amoeba::kernels::grouped
