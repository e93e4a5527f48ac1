// Where the TMA grouped GEMMs (grouped::gemm_tma_kernel, gemm_tma_quant_kernel) find an expert matrix in
// their tensor maps. Host and device, no CUDA header, so the CPU tests check it.
//
// A region of expert matrices (the page pool, a load buffer, one contiguous array) is read as a 2-D tensor of
// rows of one weight row each (the pitch: 2K bytes for bf16, K or K / 2 for int8 / int4 packed rows,
// moe/quant_layout.hpp), one tensor map per region and stage. A matrix at byte address `matrix` lies in the
// region with the highest base at or below it (at most two regions: an addressing policy's tma_regions()),
// and its weight row 0 is tensor row (matrix − base) / pitch of that region's map. That is exact when every
// matrix starts a whole number of rows from its region's base: the regions hold whole matrices, so it
// suffices that the matrix stride (pool page, a third of a load-buffer slot, one contiguous matrix) is a
// multiple of the gate/up pitch (K = H) and of the down pitch (K = F).
#pragma once

#include <cstdint>

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::tensor_rows {

struct Location {
  int map;        // 0: the first region's map, 1: the second's
  long long row;  // tensor row of the matrix's weight row 0
};

// region1 == 0: no second region. pitch: bytes per tensor row.
AMOEBA_HOST_DEVICE constexpr Location locate(std::uintptr_t matrix, std::uintptr_t region0,
                                             std::uintptr_t region1, long long pitch) {
  const bool second = region1 != 0 && matrix >= region1 && (region1 > region0 || matrix < region0);
  const std::uintptr_t base = second ? region1 : region0;
  return {second ? 1 : 0, static_cast<long long>((matrix - base) / static_cast<std::uintptr_t>(pitch))};
}

// Whether matrices `stride_bytes` apart all start on a tensor row of both stages' maps (pitches in bytes:
// 2H and 2F for bf16 experts).
AMOEBA_HOST_DEVICE constexpr bool on_rows(long long stride_bytes, long long gate_up_pitch,
                                          long long down_pitch) {
  return gate_up_pitch > 0 && down_pitch > 0 && stride_bytes > 0 && stride_bytes % gate_up_pitch == 0 &&
         stride_bytes % down_pitch == 0;
}

}  // namespace amoeba::kernels::tensor_rows
