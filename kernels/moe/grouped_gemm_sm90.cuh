// Prefill path on Hopper (sm_90a): grouped GEMMs on warpgroup wgmma (m64nNk16, bf16 → fp32) straight from
// shared memory, on XOR-swizzled [rows][64] cp.async tiles (exactly wgmma's 128-byte-swizzle K-major layout,
// so the descriptors point at them unchanged).
//  - gate/up: B = features of W1 and the same features of W3, interleaved by 16, so each thread holds gate
//  and up
//    of the same (token, feature): SiLU·mul is fused into the epilogue (bf16 `act` rows).
//  - down: B = rows of W2; the epilogue writes bf16 rows of `y` at their slot index.
//
// Work units are (work tile, weight slice) pairs, ordered expert-major by default: an expert's units run
// weight slice by weight slice with its token tiles innermost, so blocks that run at the same time share one
// weight slice across the expert's token tiles (read from DRAM once, then from L2); tile-major order (all
// slices of a token tile, then the next) re-read a Mixtral expert's 235 MB of W1/W3 once per 128-token tile
// (measured: 8–13% slower on Mixtral, neutral on Qwen). The order depends only on the tile list, never on
// where pages sit.
//
// Two kernels (detail::GroupedTuning picks; docs/results/paged_moe_h200_ab.md has the measurements):
//  - gemm_wgmma_grid_kernel, the default: 2-D grid, 128×128×64 block tile, 3 stages, wgmma drained every
//  k-step,
//    2 blocks per SM (the second block covers the drain). Fastest of everything measured.
//  - gemm_wgmma_kernel<Tile>: a 1-D grid of units, optionally persistent with the cp.async pipeline running
//    across unit boundaries, kInFlight wgmma groups left outstanding per k-step (loads kStages-1-kInFlight
//    steps ahead), 128×128 or 128×256 tiles, and warpgroups whose 64 rows are all past the count skip their
//    wgmma. Every configuration measured 4–25% slower than the grid kernel: with cp.async issued by the MMA
//    warps, a single block per SM cannot hide its own load latency, and the 2-block ones lost too (not
//    explained yet). Kept for A/B runs; the next step is a warp-specialized producer (TMA/cp.async warp +
//    mbarriers).
#pragma once

#include "moe/grouped_gemm.cuh"

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
// Keeps the compiler from moving accumulator reads or writes across wgmma issue/wait.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64×128, fp32) += A(64×16, smem) · B(128×16, smem)ᵀ.
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

// D(64×256, fp32) += A(64×16, smem) · B(256×16, smem)ᵀ.
__device__ __forceinline__ void mma_m64n256k16(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

template <int kN>
__device__ __forceinline__ void mma(float (&d)[kN / 2], std::uint64_t desc_a, std::uint64_t desc_b) {
  if constexpr (kN == 128)
    mma_m64n128k16(d, desc_a, desc_b);
  else
    mma_m64n256k16(d, desc_a, desc_b);
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace wgmma

inline constexpr int kWgmmaGridSmemBytes = kSmemBytes + 1024;  // + slack: 1024-byte aligned bases

// Tiling and pipeline of the sm_90 kernel: kN weight rows per block (128 or 256), kStages cp.async stages,
// kInFlight wgmma groups left outstanding per k-step, kBlocks blocks per SM (the register and shared-memory
// budget the launch bounds ask for).
template <int kN, int kStagesT, int kInFlightT, int kBlocksT>
struct Sm90Tile {
  static_assert(kN == 128 || kN == 256, "wgmma tile: 128 or 256 weight rows");
  static constexpr int kBlockN = kN;
  static constexpr int kStages = kStagesT;
  static constexpr int kInFlight = kInFlightT;
  static constexpr int kBlocks = kBlocksT;
  static constexpr int kAhead = kStages - 1 - kInFlight;  // k-steps the loads run ahead of the MMAs
  static_assert(kAhead >= 1 && kAhead <= 2, "loads 1 or 2 k-steps ahead (k_tiles >= 2 >= kAhead)");
  static constexpr int kStageElems = (kBlockM + kN) * kBlockK;
  static constexpr int kSmemBytes = kStages * kStageElems * 2 + 1024;  // + slack: 1024-byte aligned bases
  static constexpr int kGateUpFeatures = kN / 2;
  static constexpr int kBChunks = kN / 32;  // 16-byte B chunks per thread per stage
  static constexpr int kAcc = kN / 2;       // fp32 accumulators per thread
};
// 128×256 tiles, 4 stages, one wgmma group in flight, one block per SM.
using Sm90Wide = Sm90Tile<256, 4, 1, 1>;
// 128×128 tiles, 3 stages, wgmma drained every k-step, two blocks per SM (the blocks hide each other's
// waits).
using Sm90Pair = Sm90Tile<128, 3, 0, 2>;
// As Sm90Pair with one wgmma group in flight (loads one k-step ahead).
using Sm90PairInFlight = Sm90Tile<128, 3, 1, 2>;

// Weight slices of one stage: F / features (gate/up) or H / rows (down).
template <Stage kStage, class Tile, class P>
__host__ __device__ inline int slices(const P& p) {
  return kStage == Stage::kGateUp ? p.intermediate / Tile::kGateUpFeatures : p.hidden / Tile::kBlockN;
}

// One work unit as this thread sees it: where its loader chunks come from and what its epilogue needs.
struct Sm90Unit {
  const bf16* a[4];  // A rows ld_row + 32·i, chunk ld_chunk (row 0 where past count: zero-filled)
  const bf16* b;     // B row ld_row, chunk ld_chunk; row ld_row + 32·i is b + i·b_step
  int a_valid;       // bit i: A row ld_row + 32·i is inside the tile
  int slice, count, row_start;
};

// Unit u → (work tile, slice): expert-major, then slice, then the expert's token tiles.
template <class Addressing, Stage kStage, class Tile>
__device__ __forceinline__ Sm90Unit sm90_unit(const MoeParams<Addressing>& p, int u, int nx, int ld_row,
                                              int ld_chunk) {
  constexpr bool kGateUp = kStage == Stage::kGateUp;
  Sm90Unit r;
  int tile_index;
  if (p.unit_order == 0) {  // expert-major: slice, then the expert's token tiles
    const WorkTile& bucket = p.tiles[u / nx];
    const int first = bucket.first_tile, ny = bucket.expert_tiles;
    const int local = u - first * nx;
    tile_index = first + local % ny;
    r.slice = local / ny;
  } else {  // tile-major: all slices of one work tile, then the next tile
    tile_index = u / nx;
    r.slice = u % nx;
  }
  const WorkTile& tile = p.tiles[tile_index];
  r.count = tile.count;
  r.row_start = tile.row_start;
  r.a_valid = 0;
  const int K = kGateUp ? p.hidden : p.intermediate;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = ld_row + 32 * i;
    const bool valid = m < r.count;
    r.a_valid |= valid ? 1 << i : 0;
    const int mm = valid ? m : 0;
    if constexpr (kGateUp) {
      const int slot = p.sorted_slot[r.row_start + mm];
      r.a[i] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K + ld_chunk * 8;
    } else {
      r.a[i] = p.act + static_cast<std::int64_t>(r.row_start + mm) * K + ld_chunk * 8;
    }
  }
  if constexpr (kGateUp) {
    // B row b = ld_row + 32·i: W1 (ld_row < 16) or W3 at feature slice·kN/2 + 16·i + ld_row % 16.
    const int n = r.slice * Tile::kGateUpFeatures + ld_row % 16;
    r.b = (ld_row < 16 ? tile.matrix[0] : tile.matrix[1]) + static_cast<std::int64_t>(n) * K + ld_chunk * 8;
  } else {
    r.b = tile.matrix[2] + static_cast<std::int64_t>(r.slice * Tile::kBlockN + ld_row) * K + ld_chunk * 8;
  }
  return r;
}

template <class Addressing, Stage kStage, class Tile>
__global__ void __launch_bounds__(kThreads, Tile::kBlocks)
    gemm_wgmma_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  constexpr int kN = Tile::kBlockN;
  constexpr int kS = Tile::kStages;
  constexpr bool kGateUp = kStage == Stage::kGateUp;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int nx = slices<kStage, Tile>(p);
  const int units = *p.num_tiles * nx;
  int u = blockIdx.x;
  if (u >= units) return;
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  const std::uint32_t raw = ptx::smem_u32(smem_dyn);
  bf16* smem = reinterpret_cast<bf16*>(smem_dyn + (((raw + 1023) & ~1023u) - raw));
  // Stage s: A [128][64] then B [kN][64].
  auto stage_a = [&](int s) { return smem + s * Tile::kStageElems; };
  auto stage_b = [&](int s) { return smem + s * Tile::kStageElems + kBlockM * kBlockK; };

  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid % 32, g = lane / 4,
            q = lane % 4;
  const int K = kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;  // >= 2 = kAhead (K % 128 == 0): loads run at most one unit ahead
  const std::int64_t b_step = static_cast<std::int64_t>(kGateUp ? 16 : 32) * K;
  const int ld_row = tid / 8, ld_chunk = tid % 8;
  const int st_off = swizzle(ld_row, ld_chunk);  // rows ld_row + 32·i share (row & 7)

  Sm90Unit cur = sm90_unit<Addressing, kStage, Tile>(p, u, nx, ld_row, ld_chunk);
  Sm90Unit next = cur;
  Sm90Unit lu = cur;  // the unit the loads are for
  int l_kt = 0;
  bool l_live = true;
  bool has_next = false;
  // The loads run kAhead steps ahead of the MMAs; they move on to the block's next unit lazily, at the first
  // load that needs it, which comes after the MMAs have entered the current unit (k_tiles >= kAhead) and so
  // after `next` was fetched for it.
  auto load_step = [&](int step) {
    if (l_kt == k_tiles) {
      l_kt = 0;
      l_live = has_next;
      lu = next;
    }
    if (l_live) {
      const int s = step % kS;
      bf16* sa = stage_a(s);
      bf16* sb = stage_b(s);
      const int k = l_kt * kBlockK;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ptx::cp_async_16(ptx::smem_u32(sa + st_off + 32 * i * kBlockK), lu.a[i] + k,
                         (lu.a_valid >> i) & 1 ? 16 : 0);
#pragma unroll
      for (int i = 0; i < Tile::kBChunks; ++i)
        ptx::cp_async_16(ptx::smem_u32(sb + st_off + 32 * i * kBlockK), lu.b + i * b_step + k, 16);
    }
    ptx::cp_async_commit();
    ++l_kt;
  };

  int step = 0;  // k-steps consumed by this block, over all its units
#pragma unroll
  for (int s = 0; s < Tile::kAhead; ++s) load_step(s);

  float acc[Tile::kAcc];
  while (true) {
    const int u_next = u + static_cast<int>(gridDim.x);
    has_next = u_next < units;
    if (has_next) next = sm90_unit<Addressing, kStage, Tile>(p, u_next, nx, ld_row, ld_chunk);
    const bool active = wg * 64 < cur.count;  // warpgroup-uniform
#pragma unroll
    for (int i = 0; i < Tile::kAcc; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < k_tiles; ++kt, ++step) {
      ptx::cp_async_wait<Tile::kAhead - 1>();
      wgmma::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async
                                   // one
      __syncthreads();  // stage `step` complete for all threads; wgmma of step - 1 - kInFlight all finished
      if (active) {
        const std::uint32_t sa = ptx::smem_u32(stage_a(step % kS) + wg * 64 * kBlockK);
        const std::uint32_t sb = ptx::smem_u32(stage_b(step % kS));
        wgmma::pin(acc);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk)
          wgmma::mma<kN>(acc, wgmma::descriptor(sa + kk * 32), wgmma::descriptor(sb + kk * 32));
        wgmma::commit();
      }
      // Refills the stage of step - 1 - kInFlight (= step + kAhead mod kS), whose wgmma have completed.
      load_step(step + Tile::kAhead);
      if (active) {
        wgmma::wait<Tile::kInFlight>();
        wgmma::pin(acc);
      }
    }
    if (active) {
      wgmma::wait<0>();
      wgmma::pin(acc);
    }

    // Accumulator 4c + i: token row wg·64 + 16·warp + g + 8·(i/2), B row 8c + 2q + (i % 2).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = wg * 64 + 16 * warp_in_wg + g + 8 * half;
      if (m >= cur.count) continue;
      if constexpr (kGateUp) {
        bf16* arow = p.act + static_cast<std::int64_t>(cur.row_start + m) * p.intermediate +
                     cur.slice * Tile::kGateUpFeatures + 2 * q;
#pragma unroll
        for (int grp = 0; grp < kN / 32; ++grp)
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            const int gate = 4 * (4 * grp + c2) + 2 * half,
                      up = gate + 8;  // chunk 4·grp + c2 (W1) and + 2 (W3)
            const float v0 = silu(acc[gate]) * acc[up];
            const float v1 = silu(acc[gate + 1]) * acc[up + 1];
            *reinterpret_cast<std::uint32_t*>(arow + 16 * grp + 8 * c2) = ptx::pack_bf16x2(v0, v1);
          }
      } else {
        const int slot = p.sorted_slot[cur.row_start + m];
        bf16* yrow = p.y + static_cast<std::int64_t>(slot) * p.hidden + cur.slice * kN + 2 * q;
#pragma unroll
        for (int c = 0; c < kN / 8; ++c)
          *reinterpret_cast<std::uint32_t*>(yrow + 8 * c) =
              ptx::pack_bf16x2(acc[4 * c + 2 * half], acc[4 * c + 2 * half + 1]);
      }
    }
    if (!has_next) break;
    u = u_next;
    cur = next;
  }
  ptx::cp_async_wait<0>();
}

// The kernel of commit d41ff97 (the measured best, see GroupedTuning): 2-D grid of one block per (weight
// slice, work tile); 128×128 tiles, 3 stages, wgmma drained every k-step, two blocks per SM. Blocks map to
// units tile-major (as in d41ff97) or expert-major (MoeParams::unit_order).
template <class Addressing, Stage kStage>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_wgmma_grid_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int nx = static_cast<int>(gridDim.x);
  const int u = static_cast<int>(blockIdx.y) * nx + static_cast<int>(blockIdx.x);
  if (u >= *p.num_tiles * nx) return;
  int tile_index = static_cast<int>(blockIdx.y), slice = static_cast<int>(blockIdx.x);  // tile-major
  if (p.unit_order == 0) {  // expert-major: slice, then the expert's token tiles
    const WorkTile& bucket = p.tiles[u / nx];
    const int local = u - bucket.first_tile * nx;
    tile_index = bucket.first_tile + local % bucket.expert_tiles;
    slice = local / bucket.expert_tiles;
  }
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  const std::uint32_t raw = ptx::smem_u32(smem_dyn);
  unsigned char* smem_raw = smem_dyn + (((raw + 1023) & ~1023u) - raw);
  bf16* smem_a = reinterpret_cast<bf16*>(smem_raw);
  bf16* smem_b = smem_a + kStages * kBlockM * kBlockK;

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const WorkTile tile = p.tiles[tile_index];
  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid % 32, g = lane / 4,
            q = lane % 4;
  const int K = kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;

  const int ld_row = tid / 8, ld_chunk = tid % 8;
  const bf16* a_src[4];
  int a_bytes[4];
  const bf16* b_src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = ld_row + 32 * i;
    const bool valid = m < tile.count;
    const int mm = valid ? m : 0;
    a_bytes[i] = valid ? 16 : 0;
    if constexpr (kGateUp) {
      const int slot = p.sorted_slot[tile.row_start + mm];
      a_src[i] = p.input + static_cast<std::int64_t>(slot / p.slots_per_token) * K + ld_chunk * 8;
    } else {
      a_src[i] = p.act + static_cast<std::int64_t>(tile.row_start + mm) * K + ld_chunk * 8;
    }
  }
  if constexpr (kGateUp) {
    const bf16* w1 = tile.matrix[0];
    const bf16* w3 = tile.matrix[1];
    const int n0 = slice * kGateUpFeatures;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int b = ld_row + 32 * i;  // B row b: group b/32, W1 for (b % 32) < 16, else W3
      const int n = n0 + 16 * (b / 32) + (b % 16);
      b_src[i] = ((b % 32) < 16 ? w1 : w3) + static_cast<std::int64_t>(n) * K + ld_chunk * 8;
    }
  } else {
    const int h0 = slice * kBlockN;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      b_src[i] = tile.matrix[2] + static_cast<std::int64_t>(h0 + ld_row + 32 * i) * K + ld_chunk * 8;
  }
  const int st_off = swizzle(ld_row, ld_chunk);
  auto load_stage = [&](int stage, int kt) {
    bf16* sa = smem_a + stage * kBlockM * kBlockK;
    bf16* sb = smem_b + stage * kBlockN * kBlockK;
    const int k = kt * kBlockK;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      ptx::cp_async_16(ptx::smem_u32(sa + st_off + 32 * i * kBlockK), a_src[i] + k, a_bytes[i]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      ptx::cp_async_16(ptx::smem_u32(sb + st_off + 32 * i * kBlockK), b_src[i] + k, 16);
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    ptx::cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();
    wgmma::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async
                                 // one
    __syncthreads();             // stage kt complete for all threads; every wgmma of kt-1 has finished
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    ptx::cp_async_commit();
    const std::uint32_t sa = ptx::smem_u32(smem_a + (kt % kStages) * kBlockM * kBlockK + wg * 64 * kBlockK);
    const std::uint32_t sb = ptx::smem_u32(smem_b + (kt % kStages) * kBlockN * kBlockK);
    wgmma::pin(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk)
      wgmma::mma_m64n128k16(acc, wgmma::descriptor(sa + kk * 32), wgmma::descriptor(sb + kk * 32));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(acc);
  }
  ptx::cp_async_wait<0>();

  // Accumulator 4c + i: token row wg·64 + 16·warp + g + 8·(i/2), B row 8c + 2q + (i % 2).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int m = wg * 64 + 16 * warp_in_wg + g + 8 * half;
    if (m >= tile.count) continue;
    if constexpr (kGateUp) {
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

}  // namespace amoeba::kernels::grouped
