// Dequantises a layer's routed int8 / int4 experts into a bf16 copy, for PagedMoe's grouped stages on
// quantized experts with MoeConfig::grouped_dequant: the copy is Contiguous's layout ([E+m][3][F·H], W1/W3
// [F][H], W2 [H][F], row-major, K in its natural order) in the caller's workspace, and the bf16 TMA grouped
// GEMM then runs on it as on bf16 experts. Each weight becomes bf16(q · scale) (q exact in bf16, one bf16
// multiply by its group's scale): the values the quantized grouped GEMMs feed their MMAs. Experts no token
// is routed to are skipped (expert_offset, written by routing).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "moe/addressing.cuh"
#include "moe/precision.cuh"
#include "moe/ptx.cuh"
#include "moe/quant_layout.hpp"

namespace amoeba::kernels::dequant {

inline constexpr int kThreads = 256;
inline constexpr int kLoadsPerThread = 8;  // 16-byte packed loads per thread per block

template <expert_addressing Addressing>
struct ExpertsParams {
  typename Addressing::Params src;  // the packed experts (matrix_base read as bytes)
  const int* expert_offset;         // [E+m+1] expert-sorted row offsets (routing)
  bf16* dst;                        // [E+m][3][F·H]
  int total_experts, hidden, intermediate;
};

// Blocks of the grid: x, a matrix's 16-byte packed loads in chunks of kThreads·kLoadsPerThread (the larger of
// W1/W3 and W2); y, expert e's matrix j as 3e + j.
template <quant::Bits kBits>
inline dim3 experts_grid(int total_experts, int hidden, int intermediate) {
  const quant::ExpertLayout l = quant::expert_layout(static_cast<std::uint64_t>(intermediate),
                                                     static_cast<std::uint64_t>(hidden), kBits);
  const std::uint64_t loads = l.w13.weight_bytes() / quant::kAlign;  // W2 has as many values
  const std::uint64_t per_block = static_cast<std::uint64_t>(kThreads) * kLoadsPerThread;
  return dim3(static_cast<unsigned>((loads + per_block - 1) / per_block),
              static_cast<unsigned>(3 * total_experts));
}

template <expert_addressing Addressing, quant::Bits kBits>
__global__ void __launch_bounds__(kThreads)
    experts_kernel(const __grid_constant__ ExpertsParams<Addressing> d) {
  const int e = static_cast<int>(blockIdx.y) / 3, j = static_cast<int>(blockIdx.y) % 3;
  ptx::grid_dependency_wait();  // expert_offset: written by routing
  if (d.expert_offset[e + 1] == d.expert_offset[e]) return;
  const quant::ExpertLayout layout = quant::expert_layout(static_cast<std::uint64_t>(d.intermediate),
                                                          static_cast<std::uint64_t>(d.hidden), kBits);
  const quant::MatrixLayout& m = layout.matrix(j);
  const auto* src = reinterpret_cast<const unsigned char*>(Addressing::matrix_base(d.src, e, j));
  const auto* scales = reinterpret_cast<const __nv_bfloat16*>(src + m.scale_offset());
  const std::int64_t loads_per_row = static_cast<std::int64_t>(m.row_bytes() / quant::kAlign);
  const std::int64_t loads = static_cast<std::int64_t>(m.rows) * loads_per_row;
  const std::int64_t groups = static_cast<std::int64_t>(m.groups_per_row());
  constexpr int kValues = static_cast<int>(quant::values_per_load(kBits));  // 16 int8, 32 int4
  bf16* out =
      d.dst + (3 * static_cast<std::int64_t>(e) + j) * d.hidden * static_cast<std::int64_t>(d.intermediate);
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kThreads * kLoadsPerThread + threadIdx.x;
  // Every load of the thread first (kLoadsPerThread in flight), then their values.
  uint4 raw[kLoadsPerThread];
  __nv_bfloat16 scale[kLoadsPerThread];
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const std::int64_t load = first + static_cast<std::int64_t>(i) * kThreads;
    if (load < loads) {
      raw[i] = ptx::ld_stream_16(src + load * quant::kAlign);
      const std::int64_t n = load / loads_per_row;
      scale[i] = scales[n * groups + (load - n * loads_per_row) * kValues / quant::kGroup];
    }
  }
  // Packed rows are whole loads (row_bytes a multiple of 16: K a multiple of 128, PagedMoe::can_implement),
  // so load L's values are those at L · kValues of the bf16 matrix too.
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const std::int64_t load = first + static_cast<std::int64_t>(i) * kThreads;
    if (load >= loads) break;
    auto* o = reinterpret_cast<uint4*>(out + load * kValues);
#pragma unroll
    for (int c = 0; c < kValues / 8; ++c)
      o[c] = scaled_chunk<kBits>(raw[i], c, __bfloat162bfloat162(scale[i]));
  }
}

}  // namespace amoeba::kernels::dequant
