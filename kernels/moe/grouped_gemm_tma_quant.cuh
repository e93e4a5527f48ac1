// The quantized experts' prefill GEMM on Hopper (sm_90a): the persistent warp-specialised TMA kernel of
// grouped_gemm_sm90.cuh (units of 128 tokens × 256 weight rows handed out in order, one producer warpgroup,
// two consumer warpgroups, mbarrier stages) with int8 / int4 weights dequantised in registers.
//
// The producer copies each k-step's 256 packed weight rows (64 or 32 bytes each) with TMA from a byte tensor
// map over the pages (tma::Region, bits 8 / 4) and gathers the 128 token rows by cp.async, as the bf16
// kernel does. The weights are wgmma's A operand, from registers: consumer warpgroup w owns 128 of the 256
// rows as two 64-row m-tiles (gate/up: 64 features of W1 and the same 64 of W3, so each thread holds gate
// and up of one (feature, token); down: 128 rows of W2) against all 128 tokens (n = 128). Each thread reads
// the packed bytes of its 4 rows with one 16-byte (int8) or 8-byte (int4) shared load per row and k-step
// and turns them into bf16 pairs times its row's group scale, w = bf16(q · scale) as in the two-block
// quantized kernel (int4: moe/precision.cuh's exact conversion, then a bf16 multiply; int8: one fma per
// value, dequant::int8x4_scaled). Nothing is written back to shared memory: per k-step the SM reads 16 KiB
// of token rows per warpgroup and 16 (8) KiB of packed weights, where dequantising into a bf16 tile would
// add 32 KiB of writes and 64 KiB of wgmma reads.
// Registers hold the fragments of one half-step (32 k) while the tensor cores work on the other: issue half
// h, wait for half h − 1, dequantise half h + 1.
// The k order: wgmma hands a thread eight scattered k pairs per step; the tokens' K is permuted inside each
// 64-block (moe/k_permutation.hpp) so those are eight consecutive pairs of the packed row. The gate/up stage
// reads a permuted copy of the input (permute_k_kernel, once per layer), its epilogue writes `act` permuted
// through shared memory (coalesced 16-byte rows), and the down stage's output `y` is in natural order.
// Scales: each thread loads its 4 rows' bf16 scale of the next 128-k group one group ahead (two k-steps),
// straight from the page (scale slab after the weights, moe/quant_layout.hpp).
// Small batches (kTokens = kTmaSmallTokens, 32): units of 32 tokens × 256 weight rows, n = 32, eight stages
// of 4 KiB of token rows and 8 / 16 KiB of packed weights. Where an expert's routed batch is a few dozen
// tokens (decode sizes) the 128-token units multiply mostly zero rows: n = 128 costs the tensor cores four
// times the work of n = 32 for the same weights, and every weight is still dequantised once per unit. The
// same k steps per output in the same order as the 128-token units: bit-identical to them.
#pragma once

#include <type_traits>

#include "moe/grouped_gemm_sm90.cuh"
#include "moe/k_permutation.hpp"

namespace amoeba::kernels::grouped {

namespace wgmma {

// D(64×128, fp32) += A(64×16, registers: this thread's four bf16 pairs, mma.m16n8k16's A fragment of its
// warp's 16 rows) · B(128×16, smem)ᵀ.
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " AMOEBA_WGMMA_D64_REGS
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : AMOEBA_WGMMA_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

// D(64×32, fp32) += A(64×16, registers) · B(32×16, smem)ᵀ: the small-batch units' n = 32.
__device__ __forceinline__ void mma_m64n32k16_rs(float (&d)[16], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
      ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  __trap();  // built without sm_90a: PagedMoe never selects this kernel then
#endif
}

// D(64×N) += A(64×16, registers) · B(N×16, smem)ᵀ for the token tiles the kernel instantiates.
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
  static_assert(N == 128 || N == 32, "the quantized TMA kernel's token tiles: 128 or 32");
  if constexpr (N == 128)
    mma_m64n128k16_rs(d, a, desc_b);
  else
    mma_m64n32k16_rs(d, a, desc_b);
}

}  // namespace wgmma

// Token rows of the quantized TMA kernel's small-batch units (MoeConfig::tile_tokens on 256-row blocks).
inline constexpr int kTmaSmallTokens = 32;

// Stored 16-byte chunk c (0..7) of a K-permuted 64-value block from the block's 32 bf16 pairs in logical
// order (moe/k_permutation.hpp): what permute_k_kernel writes and the gate/up epilogue stores.
__device__ __forceinline__ uint4 permuted_chunk(const std::uint32_t* pairs, int c) {
  using k_permutation::logical_pair;
  return make_uint4(pairs[logical_pair(c, 0)], pairs[logical_pair(c, 1)], pairs[logical_pair(c, 2)],
                    pairs[logical_pair(c, 3)]);
}

// Shapes of the quantized TMA kernel for one precision and kTokens token rows per unit.
template <class Precision, int kTokens = kBlockM>
struct TmaQuant {
  static_assert(kTokens == kBlockM || kTokens == kTmaSmallTokens, "128- or 32-token units");
  static constexpr int kStep = kPackedStepBytes<Precision>;  // packed bytes of one row's 64-k step
  static constexpr int kStages = kTokens == kBlockM ? 4 : 8;
  static constexpr int kATile = kTokens * kBlockK;     // bf16 elements: the token rows × 64 k
  static constexpr int kBBytes = 2 * kBlockN * kStep;  // 256 packed rows
  static constexpr int kStagingPitch = kBlockN + 8;    // bf16 per staged token row (+8: no bank conflicts)
  static constexpr int kStagingElems = kTokens * kStagingPitch;  // per consumer warpgroup
  // The down stage keeps each token's destination slot (an int) in its staged row's padding, at this column.
  static constexpr int kSlotColumn = kBlockN;
  static_assert(kSlotColumn % 2 == 0 && kStagingPitch % 2 == 0 && (kStagingPitch - kSlotColumn) * 2 >= 4,
                "a slot needs 4 aligned bytes of a staged row's padding");
  static constexpr int kAcc = kTokens / 2;  // fp32 accumulators per thread and m-tile (m64 × n = kTokens)
  static constexpr int kSmemBytes =
      kStages * (kATile * 2 + kBBytes) + 2 * kStagingElems * 2 + 2 * kStages * 8 + kStages * 4 + 2 * 4 + 1024;
  static_assert(kSmemBytes <= ptx::kMaxBlockSmemBytes, "the quantized TMA block must fit one SM");
  static_assert(kBlockK == k_permutation::kBlock, "a k-step is one permuted block");
};

// One thread's packed bytes of one row and k-step: int8 16 bytes (pairs 8q..8q+7 of the row's step), int4 8.
template <class Precision>
struct PackedRow {
  static constexpr bool kInt8 = Precision::kBits == quant::Bits::kInt8;
  // A row's group scale: int8 takes f and c = int8_fma_offset(f) (dequant::int8x4_scaled: one fma per value,
  // the same bits as the bf16 multiply), int4 multiplies bf16 pairs by `pair`.
  struct Int8Scale {
    float f, c;
  };
  struct Int4Scale {
    __nv_bfloat162 pair;
  };
  using Scale = std::conditional_t<kInt8, Int8Scale, Int4Scale>;
  __device__ __forceinline__ static Scale scale_of(std::uint16_t bits) {
    const __nv_bfloat16 b = __ushort_as_bfloat16(bits);
    if constexpr (kInt8) {
      const float f = __bfloat162float(b);
      return {f, dequant::int8_fma_offset(f)};
    } else {
      return {__bfloat162bfloat162(b)};
    }
  }
  std::uint32_t w[kInt8 ? 4 : 2];
  __device__ __forceinline__ void load(std::uint32_t addr) {
    if constexpr (kInt8) {
      const uint4 v = ptx::ld_shared_16(addr);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
    }
  }
  // Sub-step s (0..3) of the step: bf16 pairs (8q + 2s) and (8q + 2s + 1), scaled.
  __device__ __forceinline__ void pairs(int s, const Scale& scale, std::uint32_t& lo,
                                        std::uint32_t& hi) const {
    if constexpr (kInt8) {
      dequant::int8x4_scaled(w[s], scale.f, scale.c, lo, hi);
    } else {
      std::uint32_t all[4];
      dequant::int4x8(w[s / 2], all);
      const __nv_bfloat162 a =
          __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&all[2 * (s % 2)]), scale.pair);
      const __nv_bfloat162 b =
          __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&all[2 * (s % 2) + 1]), scale.pair);
      lo = *reinterpret_cast<const std::uint32_t*>(&a);
      hi = *reinterpret_cast<const std::uint32_t*>(&b);
    }
  }
  // The A fragment of sub-step s for a warp's 16 rows of an m64 tile (wgmma's register A, mma.m16n8k16's A):
  // rows[0] is the thread's row g, rows[1] row g + 8, each with its own scale; a0/a2 are row g's k pairs 2q
  // and 2q + 8, a1/a3 row g + 8's.
  __device__ __forceinline__ static void fragment(const PackedRow (&rows)[2], int s, const Scale (&scale)[2],
                                                  std::uint32_t (&a)[4]) {
    rows[0].pairs(s, scale[0], a[0], a[2]);
    rows[1].pairs(s, scale[1], a[1], a[3]);
  }
};

template <class Addressing, Stage kStage, class Precision, int kTokens = kBlockM>
__global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_tma_quant_kernel(const __grid_constant__ TmaParams<Addressing> tp) {
  using Q = TmaQuant<Precision, kTokens>;
  const MoeParams<Addressing>& p = tp.moe;
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  bf16* smem_a = reinterpret_cast<bf16*>(aligned_smem(smem_dyn));  // [stages][kTokens][64] token rows
  unsigned char* smem_b =
      reinterpret_cast<unsigned char*>(smem_a + Q::kStages * Q::kATile);      // [stages][256][kStep]
  bf16* staging = reinterpret_cast<bf16*>(smem_b + Q::kStages * Q::kBBytes);  // [2][kTokens][pitch]
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(staging + 2 * Q::kStagingElems);
  std::uint64_t* empty = full + Q::kStages;
  int* stage_unit = reinterpret_cast<int*>(empty + Q::kStages);
  int* next_unit = stage_unit + Q::kStages;
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  start_tma_block<Q::kStages>(tp, full, empty);

  constexpr bool kGateUp = kStage == Stage::kGateUp;
  const quant::MatrixLayout layout =
      kGateUp ? Precision::w13(p.intermediate, p.hidden) : Precision::w2(p.intermediate, p.hidden);
  const int K = kGateUp ? p.hidden : p.intermediate;
  const int k_tiles = K / kBlockK;
  const int pairs = kGateUp ? p.intermediate / (2 * kGateUpFeatures) : p.hidden / (2 * kBlockN);
  const int units = *p.num_tiles * pairs;

  if (wg == 0) {  // producer: the bf16 kernel's, with packed boxes
    produce_units<kStage, Q::kStages, kTokens>(tp, units, pairs, k_tiles,
                                               static_cast<int>(layout.row_bytes()), Q::kStep, Q::kBBytes,
                                               smem_a, smem_b, full, empty, stage_unit, next_unit, t);
    return;
  }

  // Consumers.
  tma::claim_registers<kTmaConsumerRegs>();
  const int cw = wg - 1, warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  bf16* stage_out = staging + cw * Q::kStagingElems;
  // This thread's packed rows in a stage, [m-tile][row g, row g + 8], and their rows in their matrices.
  int srow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      srow[mt][h] = (kGateUp ? kBlockN * mt + 64 * cw : 128 * cw + 64 * mt) + 16 * warp + g + 8 * h;
  const int groups = static_cast<int>(layout.groups_per_row());
  int it = 0;
  for (;;) {
    WorkTile tile;
    int pair;
    if (!take_unit<Q::kStages>(p, full, stage_unit, it, pairs, tile, pair)) break;
    // The 4 rows' scales (row n of matrix j: its G scales contiguous after the weights).
    const std::uint16_t* scales[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = kGateUp ? mt : 2;
        const int n = kGateUp ? pair * 2 * kGateUpFeatures + 64 * cw + 16 * warp + g + 8 * h
                              : pair * 2 * kBlockN + srow[mt][h];
        scales[mt][h] = reinterpret_cast<const std::uint16_t*>(
            reinterpret_cast<const unsigned char*>(tile_matrix(tile, j)) + layout.scale_offset() +
            2 * static_cast<std::int64_t>(n) * groups);
      }
    std::uint16_t next_scale[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) next_scale[mt][h] = __ldg(scales[mt][h]);
    typename PackedRow<Precision>::Scale scale[2][2];

    float acc[2][Q::kAcc];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < Q::kAcc; ++i) acc[mt][i] = 0.f;
    PackedRow<Precision> raw[2][2];
    std::uint32_t frag[2][2][2][4];  // [half][m-tile][sub-step in half][a0..a3]

    // The packed rows of step kt (its stage waited for) into raw; a new group's scales into scale, the next
    // group's loads issued.
    auto read_step = [&](int kt, int s) {
      if (kt % 2 == 0) {  // a 64-k step lies in one 128-k group; even steps start one
        const int group = kt / 2;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            scale[mt][h] = PackedRow<Precision>::scale_of(next_scale[mt][h]);
            if (group + 1 < groups) next_scale[mt][h] = __ldg(scales[mt][h] + group + 1);
          }
      }
      const std::uint32_t base = ptx::smem_u32(smem_b + s * Q::kBBytes) + q * (Q::kStep / 4);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) raw[mt][h].load(base + srow[mt][h] * Q::kStep);
    };
    auto dequant_half = [&](auto half_c) {
      constexpr int kHalf = decltype(half_c)::value;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int ss = 0; ss < 2; ++ss)
          PackedRow<Precision>::fragment(raw[mt], 2 * kHalf + ss, scale[mt], frag[kHalf][mt][ss]);
    };
    auto issue_half = [&](auto half_c, int s) {
      constexpr int kHalf = decltype(half_c)::value;
      const std::uint32_t sb = ptx::smem_u32(smem_a + s * Q::kATile);
      wgmma::pin(acc[0]);
      wgmma::pin(acc[1]);
      wgmma::fence();
#pragma unroll
      for (int ss = 0; ss < 2; ++ss) {
        const std::uint64_t desc = wgmma::descriptor(sb + (2 * kHalf + ss) * 32);
        wgmma::mma_rs<kTokens>(acc[0], frag[kHalf][0][ss], desc);
        wgmma::mma_rs<kTokens>(acc[1], frag[kHalf][1][ss], desc);
      }
      wgmma::commit();
    };
    using H0 = std::integral_constant<int, 0>;
    using H1 = std::integral_constant<int, 1>;

    wgmma::fence_proxy_async();  // the token rows came through cp.async (the generic proxy)
    read_step(0, it % Q::kStages);
    dequant_half(H0{});
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % Q::kStages;
      issue_half(H0{}, s);
      wgmma::wait<1>();  // half 1 of step kt − 1 has finished: its fragments and its stage are free
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) wgmma::pin(frag[1][mt][0]), wgmma::pin(frag[1][mt][1]);
      if (kt > 0) tma::arrive(&empty[(it - 1) % Q::kStages]);
      dequant_half(H1{});
      issue_half(H1{}, s);
      wgmma::wait<1>();  // half 0 of step kt has finished
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) wgmma::pin(frag[0][mt][0]), wgmma::pin(frag[0][mt][1]);
      if (kt + 1 < k_tiles) {
        const int s1 = (it + 1) % Q::kStages;
        tma::wait(&full[s1], ((it + 1) / Q::kStages) & 1);
        wgmma::fence_proxy_async();
        read_step(kt + 1, s1);
        dequant_half(H0{});
      } else {
        // The last step's half 1 inside the loop: waited for after the loop alone, ptxas (CUDA 13.0) moved
        // the 32-token epilogue's accumulator reads above that wait (a race: the layer lost the last half
        // step's sums whenever they landed late).
        wgmma::wait<0>();
        wgmma::pin(acc[0]);
        wgmma::pin(acc[1]);
      }
    }
    wgmma::wait<0>();
    wgmma::pin(acc[0]);
    wgmma::pin(acc[1]);
    tma::arrive(&empty[(it - 1) % Q::kStages]);

    // The down stage's destination slots: thread t loads token t's into its staging row's padding, read back
    // by the store loop (a load of sorted_slot per row inside that loop waited out a round trip to L2 per
    // row, since ptxas cannot move it above a store to y). Held in registers instead, the 128-token units'
    // 16 slots spill (ptxas 13.0: 72 / 28 bytes for int8 / int4, loaded before or after the staging barrier).
    if constexpr (!kGateUp) {
      if (t < kTokens) {
        const int slot = t < tile.count ? __ldg(p.sorted_slot + tile.row_start + t) : 0;
        *reinterpret_cast<int*>(stage_out + t * Q::kStagingPitch + Q::kSlotColumn) = slot;
      }
    }
    // Epilogue through this warpgroup's staging rows ([token][row], bf16) by transposing stores: accumulators
    // 4c + 2h and 4c + 2h + 1 of m-tile mt hold row 16·warp + g + 8·h and tokens 8c + 2q, 8c + 2q + 1, the
    // (g, 2q) pair of an 8×8 matrix whose transpose is tokens 8c .. 8c + 7 × 8 consecutive rows of the
    // staging (16 bytes each; the 272-byte pitch puts a matrix's 8 rows in distinct banks). Instruction c2
    // stores matrices (c, h) = (2·c2, 0), (2·c2, 1), (2·c2 + 1, 0), (2·c2 + 1, 1).
    {
      const std::uint32_t out = ptx::smem_u32(stage_out);
      const int j = lane / 8, token_in = 8 * (j / 2) + lane % 8, row_in = 16 * warp + 8 * (j % 2);
#pragma unroll
      for (int c2 = 0; c2 < kTokens / 16; ++c2)
#pragma unroll
        for (int mt = 0; mt < (kGateUp ? 1 : 2); ++mt) {
          auto value = [&](int c, int h) {
            const int i = 4 * c + 2 * h;
            if constexpr (kGateUp)
              return ptx::pack_bf16x2(silu(acc[0][i]) * acc[1][i], silu(acc[0][i + 1]) * acc[1][i + 1]);
            else
              return ptx::pack_bf16x2(acc[mt][i], acc[mt][i + 1]);
          };
          ptx::stmatrix_x4<true>(out + 2 * ((16 * c2 + token_in) * Q::kStagingPitch + 64 * mt + row_in),
                                 value(2 * c2, 0), value(2 * c2, 1), value(2 * c2 + 1, 0),
                                 value(2 * c2 + 1, 1));
        }
    }
    tma::named_sync<128>(2 + cw);  // this warpgroup's staging rows are written
    if constexpr (kGateUp) {
      // 64 features per token row, stored permuted (moe/k_permutation.hpp).
#pragma unroll
      for (int r = 0; r < kTokens / 16; ++r) {
        const int idx = t + 128 * r, token = idx / 8, c = idx % 8;
        if (token < tile.count) {
          const uint4 v =
              permuted_chunk(reinterpret_cast<const std::uint32_t*>(stage_out + token * Q::kStagingPitch), c);
          *reinterpret_cast<uint4*>(p.act +
                                    static_cast<std::int64_t>(tile.row_start + token) * p.intermediate +
                                    pair * 2 * kGateUpFeatures + 64 * cw + 8 * c) = v;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < kTokens / 8; ++r) {
        const int idx = t + 128 * r, token = idx / 16, c = idx % 16;
        if (token < tile.count) {
          const int slot =
              *reinterpret_cast<const int*>(stage_out + token * Q::kStagingPitch + Q::kSlotColumn);
          *reinterpret_cast<uint4*>(p.y + static_cast<std::int64_t>(slot) * p.hidden + pair * 2 * kBlockN +
                                    128 * cw + 8 * c) =
              *reinterpret_cast<const uint4*>(stage_out + token * Q::kStagingPitch + 8 * c);
        }
      }
    }
    tma::named_sync<128>(2 + cw);  // the staging rows are free for the next unit
  }
}

// What PagedMoe launches on 256-row blocks (the TMA counterpart of Sm90Gemm): each stage's kernel, its
// dynamic shared memory, the bits of a value in its weight tensor maps (tma::Region::bits) and names. bf16
// experts: gemm_tma_kernel; int8 / int4: gemm_tma_quant_kernel, whose gate/up stage reads the input permuted
// by permute_k_kernel.
// kTokens: token rows per unit (128; 32 for quantized experts' small-batch units).
template <class Addressing, class Precision, int kTokens = kBlockM>
struct TmaGemm {
  static_assert(kTokens == kBlockM, "bf16 experts' TMA kernel runs 128-token units");
  template <Stage kStage>
  static constexpr auto kKernel = &gemm_tma_kernel<Addressing, kStage>;
  static constexpr int kSmem = kTmaSmemBytes;
  static constexpr int kBits = 16;
  static constexpr const char* kGateUpName = "grouped::gemm_tma_kernel<kGateUp>";
  static constexpr const char* kDownName = "grouped::gemm_tma_kernel<kDown>";
};
template <class Addressing, quant::Bits kB, int kTokens>
struct TmaGemm<Addressing, Quantized<kB>, kTokens> {
  template <Stage kStage>
  static constexpr auto kKernel = &gemm_tma_quant_kernel<Addressing, kStage, Quantized<kB>, kTokens>;
  static constexpr int kSmem = TmaQuant<Quantized<kB>, kTokens>::kSmemBytes;
  static constexpr int kBits = static_cast<int>(quant::bit_count(kB));
  static constexpr const char* kGateUpName = "grouped::gemm_tma_quant_kernel<kGateUp>";
  static constexpr const char* kDownName = "grouped::gemm_tma_quant_kernel<kDown>";
};
static_assert(TmaGemm<Contiguous, Bf16>::kBits == 16 && TmaGemm<Contiguous, Int8>::kBits == 8 &&
              TmaGemm<Contiguous, Int4>::kBits == 4);

// The layer's input with K permuted inside each 64-block (moe/k_permutation.hpp) for the quantized TMA
// kernel's gate/up stage: one thread per stored 16-byte chunk, its four pairs read as 4-byte loads. A warp's
// load reads four whole 32-byte sectors and its store writes 512 contiguous bytes (one thread per block
// with eight 16-byte loads and stores, each warp instruction touching 32 lines, ran at about a third of the
// copy rate).
__global__ void permute_k_kernel(const bf16* __restrict__ in, bf16* __restrict__ out, long long rows, int k) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  constexpr int kChunks = k_permutation::kBlock / 8;  // 16-byte chunks per block
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * (k / 8)) return;
  const auto* pairs = reinterpret_cast<const std::uint32_t*>(in + (idx / kChunks) * k_permutation::kBlock);
  reinterpret_cast<uint4*>(out)[idx] = permuted_chunk(pairs, static_cast<int>(idx % kChunks));
}

}  // namespace amoeba::kernels::grouped
