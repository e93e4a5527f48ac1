// Prefill path on Hopper (sm_90a): grouped GEMMs on warpgroup wgmma (m64n128k16, bf16 → fp32) straight from
// shared memory, on XOR-swizzled [rows][64] cp.async tiles (exactly wgmma's 128-byte-swizzle K-major layout,
// so the descriptors point at them unchanged). One block per (weight slice, work tile): 128 tokens × 128
// weight rows × 64 k, 3 stages, wgmma drained every k-step, two blocks per SM (the second covers the drain).
//  - gate/up: B = 64 features of W1 and the same 64 of W3, interleaved by 16, so each thread holds gate and
//    up of the same (token, feature): SiLU·mul is fused into the epilogue (bf16 `act` rows).
//  - down: B = 128 rows of W2; the epilogue writes bf16 rows of `y` at their slot index.
// Blocks walk the work expert-major: an expert's blocks run weight slice by weight slice with its token tiles
// innermost, so the blocks resident at one time share a weight slice and read it from DRAM once (a Mixtral
// expert's W1+W3 is 235 MB: streaming it once per 128-token tile cost 8–13%). The order depends only on the
// tile list (shared chunks first: moe/routing.cuh), never on where pages sit.
// Quantized experts (Precision Int8 / Int4): B is staged packed and dequantised in shared memory, overlapped
// with the tensor cores (see kPackedStepBytes below); everything else is the bf16 kernel. Two bf16 variants
// follow it: the persistent warp-specialised TMA kernel on 128 tokens × 256 weight rows (gemm_tma_kernel,
// every batch past 64 tokens per expert) and 64-token tiles on one warpgroup (gemm_wgmma_small_kernel, small
// batches).
#pragma once

#include <cstdint>
#include <type_traits>

#include "moe/grouped_gemm.cuh"
#include "moe/precision.cuh"
#include "moe/tensor_rows.hpp"
#include "moe/tma.cuh"
#include "moe/unit_order.hpp"

namespace amoeba::kernels::grouped {

namespace wgmma {

// Shared-memory matrix descriptor: 128-byte swizzle, K-major, 8-row groups 1024 bytes apart.
__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t smem_addr) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>(16 >> 4) << 16;    // leading byte offset (unused for swizzled K-major)
  d |= static_cast<std::uint64_t>(1024 >> 4) << 32;  // stride byte offset: next 8-row group
  d |= static_cast<std::uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of wgmma's registers (fp32 accumulators, or a register A
// operand's 32-bit words) across wgmma issue/wait.
template <class T, int N>
__device__ __forceinline__ void pin(T (&d)[N]) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, std::uint32_t>, "fp32 or 32-bit words");
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<T, float>)
      asm volatile("" : "+f"(d[i])::"memory");
    else
      asm volatile("" : "+r"(d[i])::"memory");
  }
}

// The 64 fp32 accumulators of a m64n128 wgmma as inline-asm text (operands %0..%63) and operands; a m64n256
// wgmma's upper 64 are operands %64..%127.
#define AMOEBA_WGMMA_D64_LIST                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define AMOEBA_WGMMA_D64_LIST_HI                                                           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "       \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "       \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "   \
  "%125, %126, %127"
#define AMOEBA_WGMMA_D64_REGS "{" AMOEBA_WGMMA_D64_LIST "}"
#define AMOEBA_WGMMA_D64_OPERANDS(d)                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),            \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
      "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),            \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),            \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),            \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),            \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D(64×128, fp32) += A(64×16, smem) · B(128×16, smem)ᵀ.
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " AMOEBA_WGMMA_D64_REGS
      ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : AMOEBA_WGMMA_D64_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

// [D0 | D1](64×256, fp32) += A(64×16, smem) · B(256×16, smem)ᵀ: D0 takes B's rows 0–127, D1 rows 128–255 (the
// accumulators of columns 0–127 are a m64n256 fragment's first 64 registers, in m64n128's order). One
// instruction reads A once where two m64n128k16 read it twice.
__device__ __forceinline__ void mma_m64n256k16(float (&d0)[64], float (&d1)[64], std::uint64_t desc_a,
                                               std::uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" AMOEBA_WGMMA_D64_LIST
      ", " AMOEBA_WGMMA_D64_LIST_HI
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : AMOEBA_WGMMA_D64_OPERANDS(d0), AMOEBA_WGMMA_D64_OPERANDS(d1)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace wgmma

// Quantized experts (Precision = Int8 / Int4, moe/precision.cuh): B reaches shared memory packed (64 k of a
// row are 64 or 32 bytes; four stages, loaded two iterations ahead like A's three), and the block dequantises
// it into one of two bf16 B tiles in wgmma's swizzled layout while the tensor cores work on the other: w =
// bf16(q · scale) (q exact in bf16, the product rounded once), the group's scale read per row per 64-k step
// (a step lies inside one group of 128). A, the epilogue and the walk are the bf16 kernel's.
inline constexpr int kPackedStages = 4;
// Packed bytes of 64 k of one row (quantized precisions): 64 (int8), 32 (int4).
template <class Precision>
inline constexpr int kPackedStepBytes = static_cast<int>(quant::bit_count(Precision::kBits)) * kBlockK / 8;

// Dynamic shared memory of gemm_wgmma_kernel per precision (+ slack: 1024-byte aligned bases).
template <class Precision>
inline constexpr int wgmma_smem_bytes() {
  if constexpr (Precision::kQuantized)
    return kStages * kBlockM * kBlockK * 2 + 2 * kBlockN * kBlockK * 2 +
           kPackedStages * kBlockN * kPackedStepBytes<Precision> + 1024;
  else
    return kSmemBytes + 1024;
}
// Two blocks per SM: 228 KiB of shared memory, 1 KiB of it reserved per block.
static_assert(2 * (wgmma_smem_bytes<Int8>() + 1024) <= 228 * 1024, "two quantized blocks must fit one SM");

// Unit u of nx slices per work tile (u < tiles · nx) → its work tile and weight slice, expert-major: an
// expert's units run slice by slice, token tiles innermost. kL2: the tile list read from the L2, before the
// kernel's dependency wait (routed_int, load_tile_l2).
template <bool kL2 = false, class Addressing>
__device__ __forceinline__ void unit_at(const MoeParams<Addressing>& p, int u, int nx, WorkTile& tile,
                                        int& slice) {
  const WorkTile& bucket = p.tiles[u / nx];
  const int first = routed_int<kL2>(bucket.first_tile), count = routed_int<kL2>(bucket.expert_tiles);
  const int local = u - first * nx;
  slice = local / count;
  if constexpr (kL2)
    tile = load_tile_l2(p.tiles + first + local % count);
  else
    tile = p.tiles[first + local % count];
}
// The shared chunks' units among a call's `units` (nx slices per tile) where the call spreads them
// (MoeConfig::chunk_spread > 1), else 0: every chunk has the same tiles (all tokens), and tile 0 is chunk 0's
// first. Read once per block: after the grid dependency wait, or from the L2 before it (kL2; routing wrote
// the tiles before gate/up started).
template <bool kL2 = false, class Addressing>
__device__ __forceinline__ long long spread_chunk_units(const MoeParams<Addressing>& p, int units, int nx) {
  const int chunks = p.slots_per_token - p.top_k;
  if (chunks == 0 || p.chunk_spread <= 1 || units == 0) return 0;
  return static_cast<long long>(chunks) * routed_int<kL2>(p.tiles[0].expert_tiles) * nx;
}
// The unit of the tile list that runs `u`-th (moe/unit_order.hpp); u past the work stays as it is.
template <class Addressing>
__device__ __forceinline__ int list_unit(const MoeParams<Addressing>& p, int u, int units,
                                         long long chunk_units) {
  return u >= units ? u : static_cast<int>(unit_order::list_unit(u, units, chunk_units, p.chunk_spread));
}

// Block (x, y) of a grid (slices, max tiles) → its unit; false for blocks past the work (the grid is sized
// for the most tiles). kL2: read from the L2, before the kernel's dependency wait.
template <bool kL2 = false, class Addressing>
__device__ __forceinline__ bool unit_of(const MoeParams<Addressing>& p, WorkTile& tile, int& slice) {
  const int nx = static_cast<int>(gridDim.x);
  const int u = static_cast<int>(blockIdx.y) * nx + static_cast<int>(blockIdx.x);
  const int units = routed_int<kL2>(*p.num_tiles) * nx;
  if (u >= units) return false;
  unit_at<kL2>(p, list_unit(p, u, units, spread_chunk_units<kL2>(p, units, nx)), nx, tile, slice);
  return true;
}

// The start of every grouped-GEMM block: wait for the layer's previous kernels (programmatic dependent
// launch), let the next kernel's blocks launch, and find this block's unit (false: a block past the work).
template <class Addressing>
__device__ __forceinline__ bool begin_unit(const MoeParams<Addressing>& p, WorkTile& tile, int& slice) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  return unit_of(p, tile, slice);
}

// The dynamic shared memory's first 1024-byte-aligned byte (wgmma's 128-byte swizzle needs 1024-byte bases).
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* smem_dyn) {
  const std::uint32_t raw = ptx::smem_u32(smem_dyn);
  return smem_dyn + (((raw + 1023) & ~1023u) - raw);
}

// The quantized B operand of one 64-k step, staged packed ([128 rows][kStep bytes]; int8 rows' 16-byte chunks
// swizzled by row bit 1 — chunk c of row r at c ^ ((r >> 1) & 1) — so the dequantising threads' 16-byte
// reads, rows r..r+3 and both halves per quarter warp, fall on eight different bank groups; int4 reads are
// contiguous already) and dequantised into a swizzled [128][64] bf16 tile by kThreads threads: loads, thread
// t copies chunk t % kChunksPerRow of rows t / kChunksPerRow + kRowsPerPass·i; dequantisation, thread t
// writes k values [32·(t % 2), +32) of rows t / 2 + (kThreads / 2)·i: w = bf16(q · scale), the row's group
// scale read with __ldg (a 64-k step lies inside one group of 128).
template <class Precision, Stage kStage>
struct PackedB {
  static constexpr quant::Bits kBits = Precision::kBits;
  static constexpr int kStep = kPackedStepBytes<Precision>;
  static constexpr int kChunksPerRow = kStep / 16;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kLoadPasses = kBlockN / kRowsPerPass;
  static constexpr int kDequantPasses = kBlockN / (kThreads / 2);
  static constexpr int kStageBytes = kBlockN * kStep;
  static_assert(quant::kGroup % kBlockK == 0, "a 64-k step must lie inside one scale group");
  const unsigned char* src[kLoadPasses];
  const std::uint16_t* scale[kDequantPasses];
  int load_row, load_part, dq_row, dq_half;

  __device__ __forceinline__ static int chunk_at(int row, int chunk) {
    return kChunksPerRow == 4 ? chunk ^ ((row >> 1) & 1) : chunk;
  }

  template <class Addressing>
  __device__ __forceinline__ PackedB(const MoeParams<Addressing>& p, const WorkTile& tile, int slice, int t) {
    const quant::MatrixLayout layout = kStage == Stage::kGateUp ? Precision::w13(p.intermediate, p.hidden)
                                                                : Precision::w2(p.intermediate, p.hidden);
    const std::int64_t row_bytes = static_cast<std::int64_t>(layout.row_bytes());
    load_row = t / kChunksPerRow;
    load_part = t % kChunksPerRow;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      int j, n;
      b_row<kStage>(load_row + kRowsPerPass * i, slice, j, n);
      src[i] = reinterpret_cast<const unsigned char*>(tile_matrix(tile, j)) + n * row_bytes + load_part * 16;
    }
    dq_row = t / 2;
    dq_half = t % 2;
#pragma unroll
    for (int i = 0; i < kDequantPasses; ++i) {
      int j, n;
      b_row<kStage>(dq_row + kThreads / 2 * i, slice, j, n);
      scale[i] = reinterpret_cast<const std::uint16_t*>(
          reinterpret_cast<const unsigned char*>(tile_matrix(tile, j)) + layout.scale_offset() +
          2 * static_cast<std::int64_t>(n) * layout.groups_per_row());
    }
  }
  __device__ __forceinline__ void load(unsigned char* stage, int kt) const {
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int row = load_row + kRowsPerPass * i;
      ptx::cp_async_16(ptx::smem_u32(stage + row * kStep + chunk_at(row, load_part) * 16),
                       src[i] + kt * kStep, 16);
    }
  }
  __device__ __forceinline__ void dequantize(const unsigned char* stage, bf16* b_tile, int kt) const {
    constexpr int kChunksPerWord = static_cast<int>(quant::values_per_load(kBits)) / 8;  // 2 int8, 4 int4
#pragma unroll
    for (int i = 0; i < kDequantPasses; ++i) {
      const int row = dq_row + kThreads / 2 * i;
      const std::uint16_t sbits = __ldg(scale[i] + (kt * kBlockK) / quant::kGroup);
      const std::uint32_t s2 = static_cast<std::uint32_t>(sbits) * 0x10001u;
      const __nv_bfloat162 s = *reinterpret_cast<const __nv_bfloat162*>(&s2);
      const std::uint32_t from = ptx::smem_u32(stage + row * kStep);
      const std::uint32_t to = ptx::smem_u32(b_tile);
      uint4 words[kStep / 32];  // the thread's 32 values: two 16-byte words (int8), one (int4)
#pragma unroll
      for (int w = 0; w < kStep / 32; ++w)
        words[w] = ptx::ld_shared_16(from + 16 * chunk_at(row, dq_half * (kStep / 32) + w));
#pragma unroll
      for (int c = 0; c < 4; ++c)  // 8 values each, the layout of one bf16 chunk of the tile
        ptx::st_shared_16(to + 2 * swizzle(row, 4 * dq_half + c),
                          dequant::scaled_chunk<kBits>(words[c / kChunksPerWord], c % kChunksPerWord, s));
    }
  }
};

// The epilogue of one warpgroup's 64 rows (row_base..row_base+63): accumulator 4c + i holds token row
// row_base + 16·warp + g + 8·(i/2), B row 8c + 2q + (i % 2). Gate/up: SiLU(gate)·up as bf16 `act` rows;
// down: bf16 rows of `y` at their slot index.
template <Stage kStage, class Addressing>
__device__ __forceinline__ void store_tile(const MoeParams<Addressing>& p, const WorkTile& tile, int slice,
                                           const float (&acc)[64], int row_base, int warp_in_wg, int lane) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int m = row_base + 16 * warp_in_wg + g + 8 * half;
    if (m >= tile.count) continue;
    if constexpr (kStage == Stage::kGateUp) {
      bf16* arow = p.act + static_cast<std::int64_t>(tile.row_start + m) * p.intermediate +
                   slice * kGateUpFeatures + 2 * q;
#pragma unroll
      for (int grp = 0; grp < 4; ++grp)
#pragma unroll
        for (int c2 = 0; c2 < 2; ++c2) {
          const int gate = 4 * (4 * grp + c2) + 2 * half,
                    up = gate + 8;  // chunk 4·grp + c2 (W1) and + 2 (W3)
          const float v0 = silu(acc[gate]) * acc[up];
          const float v1 = silu(acc[gate + 1]) * acc[up + 1];
          *reinterpret_cast<std::uint32_t*>(arow + 16 * grp + 8 * c2) = ptx::pack_bf16x2(v0, v1);
        }
    } else {
      const int slot = p.sorted_slot[tile.row_start + m];
      bf16* yrow = p.y + static_cast<std::int64_t>(slot) * p.hidden + slice * kBlockN + 2 * q;
#pragma unroll
      for (int c = 0; c < 16; ++c)
        *reinterpret_cast<std::uint32_t*>(yrow + 8 * c) =
            ptx::pack_bf16x2(acc[4 * c + 2 * half], acc[4 * c + 2 * half + 1]);
    }
  }
}

// D += A(a_rows: this warpgroup's 64 rows) · B(b_tile)ᵀ over one 64-k step: the four wgmma, issued inside
// the caller's fence … commit.
__device__ __forceinline__ void issue_mmas(float (&acc)[64], const bf16* a_rows, const bf16* b_tile) {
  const std::uint32_t sa = ptx::smem_u32(a_rows);
  const std::uint32_t sb = ptx::smem_u32(b_tile);
  wgmma::pin(acc);
#pragma unroll
  for (int kk = 0; kk < kBlockK / 16; ++kk)
    wgmma::mma_m64n128k16(acc, wgmma::descriptor(sa + kk * 32), wgmma::descriptor(sb + kk * 32));
}
// The same over 256 weight rows as four m64n256k16 (acc0: rows 0–127, acc1: rows 128–255), each output in the
// same k order as two issue_mmas calls. `first`: the unit's first step, whose first wgmma overwrites the
// accumulators instead of adding to them (so they need no zero fill: one, done by moves, had made ptxas
// serialise the m64n256 wgmma, C7515).
__device__ __forceinline__ void issue_mmas_wide(float (&acc0)[64], float (&acc1)[64], const bf16* a_rows,
                                                const bf16* b_tile, bool first) {
  const std::uint32_t sa = ptx::smem_u32(a_rows);
  const std::uint32_t sb = ptx::smem_u32(b_tile);
  wgmma::pin(acc0);
  wgmma::pin(acc1);
#pragma unroll
  for (int kk = 0; kk < kBlockK / 16; ++kk)
    wgmma::mma_m64n256k16(acc0, acc1, wgmma::descriptor(sa + kk * 32), wgmma::descriptor(sb + kk * 32),
                          kk > 0 || !first);
}
// The same as one commit group (not waited for).
__device__ __forceinline__ void issue_step(float (&acc)[64], const bf16* a_rows, const bf16* b_tile) {
  wgmma::pin(acc);
  wgmma::fence();
  issue_mmas(acc, a_rows, b_tile);
  wgmma::commit();
}

// One block per (weight slice, work tile) of one stage; grid (slices, max tiles), walked expert-major.
template <class Addressing, Stage kStage, class Precision = Bf16>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_wgmma_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  WorkTile tile;
  int slice;
  if (!begin_unit(p, tile, slice)) return;
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  bf16* smem_a = reinterpret_cast<bf16*>(aligned_smem(smem_dyn));
  bf16* smem_b = smem_a + kStages * kBlockM * kBlockK;

  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid % 32;
  const int K = kStage == Stage::kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  // A warpgroup whose 64 token rows are all past the tile's count (a tile of <= 64 tokens) skips its wgmma:
  // half the tensor work of small batches. It still copies and meets every barrier.
  const bool active = wg * 64 < tile.count;
  auto issue_mma = [&](const bf16* a_stage, const bf16* b_tile) {
    if (active) issue_step(acc, a_stage + wg * 64 * kBlockK, b_tile);
  };

  if constexpr (!Precision::kQuantized) {
    const StageLoader<kStage> loader(p, tile, slice, tid);
    loader.prologue(smem_a, smem_b, k_tiles);
    for (int kt = 0; kt < k_tiles; ++kt) {
      ptx::cp_async_wait<kStages - 2>();
      wgmma::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async
                                   // one
      __syncthreads();             // stage kt complete for all threads; every wgmma of kt-1 has finished
      loader.refill(smem_a, smem_b, kt, k_tiles);
      issue_mma(smem_a + (kt % kStages) * kBlockM * kBlockK, smem_b + (kt % kStages) * kBlockN * kBlockK);
      wgmma::wait<0>();
      wgmma::pin(acc);
    }
    ptx::cp_async_wait<0>();
  } else {
    static_assert(kStages == 3, "A(kt + 2) loads while A(kt) multiplies");
    using B = PackedB<Precision, kStage>;
    bf16* b_tiles = smem_b;  // [2][128][64] bf16, swizzled
    unsigned char* packed = reinterpret_cast<unsigned char*>(b_tiles + 2 * kBlockN * kBlockK);  // [4] stages
    const ALoader<kStage, kThreads> a_loader(p, tile, tid);
    const B b_operand(p, tile, slice, tid);
    auto load_packed = [&](int kt) {
      if (kt < k_tiles) b_operand.load(packed + (kt % kPackedStages) * B::kStageBytes, kt);
    };
    auto load_a_step = [&](int kt) {
      if (kt < k_tiles) a_loader.load(smem_a + (kt % kStages) * kBlockM * kBlockK, kt);
    };
    auto dequantize = [&](int kt) {  // packed B(kt) → B tile kt % 2
      b_operand.dequantize(packed + (kt % kPackedStages) * B::kStageBytes,
                           b_tiles + (kt % 2) * kBlockN * kBlockK, kt);
    };

    // Copy groups: the prologue's {A(0), B(0), B(1)} and {A(1), B(2)}, then iteration kt's {A(kt + 2),
    // B(kt + 3)}, so A(kt + 1) and packed B(kt + 2) share a group: the one iteration kt waits for at its end.
    // Iteration kt: the tensor cores multiply A(kt) by B tile kt % 2 while the block dequantises B(kt + 1)
    // into the other tile; every load has two iterations to land; one barrier per iteration.
    load_a_step(0);
    load_packed(0);
    load_packed(1);
    ptx::cp_async_commit();
    load_a_step(1);
    load_packed(2);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();
    dequantize(0);
    wgmma::fence_proxy_async();  // B tile 0 and A(0), written through the generic proxy
    __syncthreads();
    for (int kt = 0; kt < k_tiles; ++kt) {
      issue_mma(smem_a + (kt % kStages) * kBlockM * kBlockK, b_tiles + (kt % 2) * kBlockN * kBlockK);
      load_a_step(kt + 2);  // into the stage of A(kt - 1), which wgmma(kt - 1) has finished reading
      load_packed(kt + 3);  // into the stage of B(kt - 1), dequantised in iteration kt - 2
      ptx::cp_async_commit();
      if (kt + 1 < k_tiles) dequantize(kt + 1);  // into the tile wgmma(kt - 1) read
      wgmma::wait<0>();
      wgmma::pin(acc);
      ptx::cp_async_wait<1>();     // A(kt + 1) and packed B(kt + 2): this thread's copies
      wgmma::fence_proxy_async();  // ... and the B tile, visible to wgmma's proxy
      __syncthreads();             // ... from every thread
    }
    ptx::cp_async_wait<0>();
  }
  store_tile<kStage>(p, tile, slice, acc, wg * 64, warp_in_wg, lane);
}

// The small-batch variant (bf16 experts; MoeConfig::tile_tokens = 64): one warpgroup per block multiplies a
// work tile of at most 64 tokens by 128 weight rows. A stage is 24 KiB instead of 32 (no A rows that a tile
// of <= 64 tokens would zero-fill), so kStagesT stages fit kMinBlocksT blocks per SM and the weight loads run
// kStagesT − 1 steps ahead instead of 2: more of the weight stream in flight for the memory-bound small
// batches. The k order of every output is the two-block kernel's (the same four wgmma per 64-k step on the
// same 64 token rows), so the results are bit-identical to it.
// Early weights (kEarlyWeightsT, the down stage): the block finds its unit in the tile list (from the L2) and
// issues its prologue's W2 copies before it waits for the gate/up kernel, then its `act` rows' after. The
// down kernel's blocks start on the SMs gate/up's last blocks leave free (programmatic dependent launch), so
// their first weight stages stream while gate/up's tail still runs instead of after it. The same copies
// into the same stages: the results are unchanged.
inline constexpr int kSmallM = 64;
inline constexpr int kSmallThreads = 128;
template <int kStagesT>
inline constexpr int kSmallSmemBytes = kStagesT*(kSmallM + kBlockN) * kBlockK * 2 + 1024;

template <class Addressing, Stage kStage, int kStagesT, int kMinBlocksT, bool kEarlyWeightsT = true>
__global__ void __launch_bounds__(kSmallThreads, kMinBlocksT)
    gemm_wgmma_small_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  static_assert(kStagesT >= 2, "at least one step in flight");
  constexpr bool kEarly = kEarlyWeightsT && kStage == Stage::kDown;
  WorkTile tile;
  int slice;
  if constexpr (kEarly) {
    if (!unit_of<true>(p, tile, slice)) return;
  } else {
    if (!begin_unit(p, tile, slice)) return;
  }
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  using Loader = StageLoader<kStage, kSmallThreads, kSmallM, kStagesT>;
  bf16* smem_a = reinterpret_cast<bf16*>(aligned_smem(smem_dyn));  // [stages][64][64]
  bf16* smem_b = smem_a + kStagesT * Loader::kATile;               // [stages][128][64]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int K = kStage == Stage::kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;
  const Loader loader(p, tile, slice, tid);

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  if constexpr (kEarly)
    loader.prologue_weights_first(smem_a, smem_b, k_tiles, [] {
      ptx::grid_dependency_wait();  // act: written by the gate/up kernel
      ptx::launch_dependents();
    });
  else
    loader.prologue(smem_a, smem_b, k_tiles);
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStagesT - 2>();  // step kt's copies, this thread's
    wgmma::fence_proxy_async();          // ... visible to wgmma's proxy
    __syncthreads();                     // ... from every thread; the wgmma of step kt − 1 has finished
    loader.refill(smem_a, smem_b, kt, k_tiles);  // into the stage of step kt − 1
    const int s = kt % kStagesT;
    issue_step(acc, smem_a + s * Loader::kATile, smem_b + s * Loader::kBTile);
    wgmma::wait<0>();
    wgmma::pin(acc);
  }
  ptx::cp_async_wait<0>();
  store_tile<kStage>(p, tile, slice, acc, 0, warp, lane);
}

// The TMA variant (bf16 experts; MoeConfig::grouped_rows = 256): a persistent, warp-specialised kernel on
// units of 128 tokens × 256 weight rows, one block of three warpgroups per SM. Warpgroup 0 produces: one
// thread copies the step's 256 weight rows with TMA (tma.cuh: one tensor map per region of expert matrices,
// so a box comes straight from any page), the warpgroup's 128 threads gather the 128 token rows with
// cp.async, and both arrive on the stage's `full` mbarrier. Warpgroups 1 and 2 consume: each multiplies its
// 64 token rows by all 256 rows (m64n256k16: two 64-register accumulators, one per 128-row half; it reads A
// once per 16 k where two m64n128k16 read it twice), keeps one step of wgmma in flight, and releases a
// stage on its `empty` mbarrier once that step's wgmma has finished. The producer runs up to kTmaStages steps
// ahead, across units, so the next unit's loads overlap this one's epilogue.
// Units are handed out in order from a counter (the producer takes the next one when it starts a unit and
// passes its index to the consumers with the unit's first stage): the walk is expert-major, so the 2–3
// token tiles of an expert's weight slice start together on whichever blocks are free and read the slice
// from DRAM once. (A fixed stride of the grid let blocks drift apart, and on Qwen3 at 4096 tokens the
// gate/up stage read its weights from DRAM about twice.)
// Gate/up units hold 128 features: W1's rows in the first half of B, W3's same rows in the second, so
// accumulator i of both halves is gate and up of one (token, feature). Every output is the same wgmma steps
// in the same k order as in the two-block kernel: bit-identical to it.
inline constexpr int kTmaStages = 4;
inline constexpr int kTmaThreads = 384;
inline constexpr int kTmaATile = kBlockM * kBlockK;      // elements
inline constexpr int kTmaBTile = 2 * kBlockN * kBlockK;  // elements: 256 weight rows
inline constexpr int kTmaStaging =
    64 * 128;  // elements: a consumer warpgroup's epilogue rows (store_fragment)
inline constexpr int kTmaSmemBytes = kTmaStages * (kTmaATile + kTmaBTile) * 2 + 2 * kTmaStaging * 2 +
                                     2 * kTmaStages * 8 + kTmaStages * 4 + 2 * 4 + 1024;
inline constexpr int kTmaProducerRegs = 56, kTmaConsumerRegs = 224;
static_assert(kTmaSmemBytes <= ptx::kMaxBlockSmemBytes, "the TMA block must fit one SM");
static_assert(kTmaProducerRegs * 128 + kTmaConsumerRegs * 256 <= 65536, "the register file of one SM");

// The kernel's parameters: the layer's, the stage's unit counter (zeroed by routing), and the stage's B
// tensor maps over the (at most two) regions the addressing policy keeps expert matrices in (tma_regions()).
// A matrix lies in the region with the highest base at or below it.
template <class Addressing>
struct TmaParams {
  MoeParams<Addressing> moe;
  CUtensorMap maps[2];
  const unsigned char* regions[2];
  int* unit_counter;
};

// Tensor row of weight row 0 of `matrix` (rows `pitch` bytes apart: 2K for bf16), and which map reads it
// (moe/tensor_rows.hpp).
template <class Addressing>
__device__ __forceinline__ int tma_row(const TmaParams<Addressing>& tp, const bf16* matrix, int pitch,
                                       int& map) {
  const tensor_rows::Location at = tensor_rows::locate(
      reinterpret_cast<std::uintptr_t>(matrix), reinterpret_cast<std::uintptr_t>(tp.regions[0]),
      reinterpret_cast<std::uintptr_t>(tp.regions[1]), pitch);
  map = at.map;
  return static_cast<int>(at.row);
}

// The start of a TMA kernel's block: thread 0 initialises the stages' mbarriers (full: the producer
// warpgroup's 128 cp.async arrivals + the TMA thread's; empty: the 256 consumer threads) and prefetches the
// tensor maps; then programmatic dependent launch (wait for the layer's previous kernels, let the next one's
// blocks launch).
template <int kStages, class Addressing>
__device__ __forceinline__ void start_tma_block(const TmaParams<Addressing>& tp, std::uint64_t* full,
                                                std::uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::mbarrier_init(&full[s], 128 + 1);
      tma::mbarrier_init(&empty[s], 256);
    }
    tma::fence_barrier_init();
    tma::prefetch_map(&tp.maps[0]);
    if (tp.regions[1] != nullptr) tma::prefetch_map(&tp.maps[1]);
  }
  __syncthreads();
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
}

// The producer warpgroup of the TMA kernels (thread t of 128): takes units in order from the stage's
// counter and passes each to the consumers with its first stage (stage_unit; -1 in an empty stage ends
// them); per k-step one thread copies the unit's weight rows by TMA (gate/up: 128 W1 rows, then 128 W3
// rows at half the stage; down: 256 W2 rows) — tensor rows `pitch` bytes apart, box x at kt · step_x, the
// stage's b_bytes announced on its full barrier — and the warpgroup gathers the 128 token rows by cp.async.
// Runs up to kStages steps ahead, across units. kARows: token rows per unit (the A tile's rows; 128, or the
// quantized kernel's small-batch tiles).
template <Stage kStage, int kStages, int kARows = kBlockM, class Addressing>
__device__ __forceinline__ void produce_units(const TmaParams<Addressing>& tp, int units, int pairs,
                                              int k_tiles, int pitch, int step_x, int b_bytes, bf16* smem_a,
                                              unsigned char* smem_b, std::uint64_t* full,
                                              std::uint64_t* empty, int* stage_unit, int* next_unit, int t) {
  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const MoeParams<Addressing>& p = tp.moe;
  tma::release_registers<kTmaProducerRegs>();
  const long long chunk_units = t == 0 ? spread_chunk_units(p, units, pairs) : 0;  // thread 0 takes the units
  int it = 0;
  for (int n = 0;; ++n) {
    if (t == 0) next_unit[n & 1] = list_unit(p, atomicAdd(tp.unit_counter, 1), units, chunk_units);
    tma::named_sync<128>(1);
    const int u = next_unit[n & 1];
    const int s0 = it % kStages;
    if (it >= kStages) tma::wait(&empty[s0], ((it / kStages) - 1) & 1);
    if (u >= units) {  // no unit left: an empty stage tells the consumers
      if (t == 0) {
        stage_unit[s0] = -1;
        tma::arrive(&full[s0]);
      }
      tma::arrive(&full[s0]);
      return;
    }
    WorkTile tile;
    int pair;
    unit_at(p, u, pairs, tile, pair);
    const ALoader<kStage, 128, kARows> a(p, tile, t);  // the warpgroup's 128 threads gather the token rows
    int map0 = 0, map1 = 0, row0 = 0, row1 = 0;
    if (t == 0) {
      if constexpr (kGateUp) {
        row0 = tma_row(tp, tile.matrix[0], pitch, map0) + pair * 2 * kGateUpFeatures;
        row1 = tma_row(tp, tile.matrix[1], pitch, map1) + pair * 2 * kGateUpFeatures;
      } else {
        row0 = tma_row(tp, tile.matrix[2], pitch, map0) + pair * 2 * kBlockN;
      }
      stage_unit[s0] = u;
    }
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      if (kt > 0 && it >= kStages) tma::wait(&empty[s], ((it / kStages) - 1) & 1);
      if (t == 0) {
        unsigned char* b = smem_b + s * b_bytes;
        tma::arrive_expect_tx(&full[s], b_bytes);
        tma::load_2d(b, &tp.maps[map0], &full[s], kt * step_x, row0);
        if constexpr (kGateUp) tma::load_2d(b + b_bytes / 2, &tp.maps[map1], &full[s], kt * step_x, row1);
      }
      a.load(smem_a + s * kARows * kBlockK, kt);
      tma::cp_async_arrive(&full[s]);
    }
  }
}

// A consumer warpgroup's next unit: waits for the stage of step `it` (a unit's first) and reads the unit the
// producer passed with it; false once the producer has run out of units.
template <int kStages, class Addressing>
__device__ __forceinline__ bool take_unit(const MoeParams<Addressing>& p, std::uint64_t* full,
                                          const int* stage_unit, int it, int pairs, WorkTile& tile,
                                          int& pair) {
  tma::wait(&full[it % kStages], (it / kStages) & 1);
  const int u = stage_unit[it % kStages];
  if (u < 0) return false;
  unit_at(p, u, pairs, tile, pair);
  return true;
}

// The TMA kernel's epilogue goes through its warpgroup's staging rows (64 token rows × 128 bf16 values), so
// that global memory sees whole 16-byte stores, a token row's 256 bytes from 16 threads (the fragment's own
// 4-byte stores put 8 rows' 16 bytes in each warp instruction; leaving the epilogue out saved up to a fifth
// of Qwen3's layer at 4096 tokens). The rows' 16-byte chunks are XOR-swizzled (swizzle<128>): the fragment's
// stmatrix writes (8 rows × one chunk per matrix) and the row reads meet no bank conflicts.
// store_fragment: value(i) is the packed bf16 pair of accumulators i, i + 1 (accumulator 4c + i: row
// 16·warp + g + 8·(i / 2), column 8c + 2q + (i % 2)); row(i, r) is where staging row r goes (thread t copies
// chunk t % 16 of rows r = t / 16 + 8i, i < 8), for r < rows. Named barrier `barrier` (the warpgroup's 128
// threads) before the writes (the previous rows are read) and after them (these are written).
template <class Value, class Row>
__device__ __forceinline__ void store_fragment(const bf16* staging, int barrier, int warp_in_wg, int lane,
                                               int t, int rows, const Value& value, const Row& row) {
  const std::uint32_t base = ptx::smem_u32(staging);
  tma::named_sync<128>(barrier);
  {  // stmatrix: matrix j of instruction c2 is chunk 2·c2 + j / 2 of the warp's rows 8·(j % 2) .. + 7
    const int j = lane / 8, r = 16 * warp_in_wg + 8 * (j % 2) + lane % 8;
#pragma unroll
    for (int c2 = 0; c2 < 8; ++c2)
      ptx::stmatrix_x4(base + 2 * swizzle<128>(r, 2 * c2 + j / 2), value(8 * c2), value(8 * c2 + 2),
                       value(8 * c2 + 4), value(8 * c2 + 6));
  }
  tma::named_sync<128>(barrier);
  const int c = t % 16;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = t / 16 + 8 * i;
    if (r < rows)
      *reinterpret_cast<uint4*>(row(i, r) + 8 * c) = ptx::ld_shared_16(base + 2 * swizzle<128>(r, c));
  }
}

template <class Addressing, Stage kStage>
__global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_tma_kernel(const __grid_constant__ TmaParams<Addressing> tp) {
  const MoeParams<Addressing>& p = tp.moe;
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  bf16* smem_a = reinterpret_cast<bf16*>(aligned_smem(smem_dyn));  // [stages][128][64]
  bf16* smem_b = smem_a + kTmaStages * kTmaATile;                  // [stages][256][64]
  bf16* staging = smem_b + kTmaStages * kTmaBTile;                 // [2][64][128]
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(staging + 2 * kTmaStaging);
  std::uint64_t* empty = full + kTmaStages;
  int* stage_unit = reinterpret_cast<int*>(empty + kTmaStages);  // [stages] unit of a unit's first stage
  int* next_unit = stage_unit + kTmaStages;                      // [2] the producer's broadcast
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  start_tma_block<kTmaStages>(tp, full, empty);

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const int K = kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;
  const int pairs = kGateUp ? p.intermediate / (2 * kGateUpFeatures) : p.hidden / (2 * kBlockN);
  const int units = *p.num_tiles * pairs;

  if (wg == 0) {  // producer
    produce_units<kStage, kTmaStages>(tp, units, pairs, k_tiles, 2 * K, kBlockK, kTmaBTile * 2, smem_a,
                                      reinterpret_cast<unsigned char*>(smem_b), full, empty, stage_unit,
                                      next_unit, t);
  } else {  // consumers
    tma::claim_registers<kTmaConsumerRegs>();
    const int cw = wg - 1, warp_in_wg = t / 32, lane = t % 32;
    int it = 0;
    for (;;) {
      WorkTile tile;
      int pair;
      if (!take_unit<kTmaStages>(p, full, stage_unit, it, pairs, tile, pair)) break;
      // As in gemm_wgmma_kernel: a warpgroup past the tile's tokens skips its wgmma (it still releases
      // every stage).
      const bool active = cw * 64 < tile.count;
      float acc0[64], acc1[64];  // set by the unit's first wgmma (no zero fill: see issue_mmas_wide)
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % kTmaStages;
        if (kt > 0) tma::wait(&full[s], (it / kTmaStages) & 1);
        wgmma::fence_proxy_async();  // the token rows came through cp.async (the generic proxy)
        if (active) {
          const bf16* a_rows = smem_a + s * kTmaATile + cw * 64 * kBlockK;
          const bf16* b = smem_b + s * kTmaBTile;
          wgmma::fence();
          issue_mmas_wide(acc0, acc1, a_rows, b, kt == 0);
          wgmma::commit();
          wgmma::wait<1>();  // step it − 1's wgmma has finished
        }
        if (kt > 0) tma::arrive(&empty[(it - 1) % kTmaStages]);
      }
      wgmma::wait<0>();
      wgmma::pin(acc0);
      wgmma::pin(acc1);
      tma::arrive(&empty[(it - 1) % kTmaStages]);
      if (!active) continue;
      const bf16* rows_at = staging + cw * kTmaStaging;
      const int rows = tile.count - cw * 64, first = tile.row_start + cw * 64;
      if constexpr (kGateUp) {  // SiLU(gate)·up of the W1 half (acc0) and the W3 half (acc1): `act` rows
        store_fragment(
            rows_at, 2 + cw, warp_in_wg, lane, t, rows,
            [&](int i) { return ptx::pack_bf16x2(silu(acc0[i]) * acc1[i], silu(acc0[i + 1]) * acc1[i + 1]); },
            [&](int, int r) {
              return p.act + static_cast<std::int64_t>(first + r) * p.intermediate +
                     pair * 2 * kGateUpFeatures;
            });
      } else {  // rows of `y` at their slot index: the columns of acc0, then those of acc1
        int slot[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = t / 16 + 8 * i;
          slot[i] = r < rows ? p.sorted_slot[first + r] : 0;
        }
        auto store_half = [&](const float(&acc)[64], int half) {
          store_fragment(
              rows_at, 2 + cw, warp_in_wg, lane, t, rows,
              [&](int i) { return ptx::pack_bf16x2(acc[i], acc[i + 1]); },
              [&](int i, int) {
                return p.y + static_cast<std::int64_t>(slot[i]) * p.hidden + (2 * pair + half) * kBlockN;
              });
        };
        store_half(acc0, 0);
        store_half(acc1, 1);
      }
    }
  }
}

// What PagedMoe launches on sm_90 besides the TMA kernel (which has its own launcher, run_tma): the two-block
// wgmma kernel (any precision) or the small-batch one (bf16, 64-token tiles) — each stage's kernel, threads
// per block, shared memory and name.
template <class Addressing, class Precision>
struct Sm90Gemm {
  template <Stage kStage>
  static constexpr auto kKernel = &gemm_wgmma_kernel<Addressing, kStage, Precision>;
  static constexpr int kSmem = wgmma_smem_bytes<Precision>();
  static constexpr int kThreads = grouped::kThreads;
  static constexpr const char* kGateUpName = "grouped::gemm_wgmma_kernel<kGateUp>";
  static constexpr const char* kDownName = "grouped::gemm_wgmma_kernel<kDown>";
};
template <class Addressing, int kStagesT, int kMinBlocksT, bool kEarlyWeightsT = true>
struct Sm90SmallGemm {
  static_assert(kMinBlocksT * (kSmallSmemBytes<kStagesT> + 1024) <= 228 * 1024, "the blocks must fit one SM");
  template <Stage kStage>
  static constexpr auto kKernel =
      &gemm_wgmma_small_kernel<Addressing, kStage, kStagesT, kMinBlocksT, kEarlyWeightsT>;
  static constexpr int kSmem = kSmallSmemBytes<kStagesT>;
  static constexpr int kThreads = kSmallThreads;
  static constexpr const char* kGateUpName = "grouped::gemm_wgmma_small_kernel<kGateUp>";
  static constexpr const char* kDownName = "grouped::gemm_wgmma_small_kernel<kDown>";
};

}  // namespace amoeba::kernels::grouped
