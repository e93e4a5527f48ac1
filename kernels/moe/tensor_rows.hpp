// Where the TMA grouped GEMM (grouped::gemm_tma_kernel) finds an expert matrix in its tensor maps. Host and
// device, no CUDA header, so the CPU tests check it.
//
// A region of expert matrices (the page pool, a load buffer, one contiguous array) is read as a 2-D tensor of
// rows of K bf16 values (row pitch 2K bytes), one tensor map per region and stage. A matrix at byte address
// `matrix` lies in the region with the highest base at or below it (at most two regions: an addressing
// policy's tma_regions()), and its weight row 0 is tensor row (matrix − base) / 2K of that region's map. That
// is exact when every matrix starts a whole number of rows from its region's base: the regions hold whole
// matrices, so it suffices that the matrix stride (pool page, a third of a load-buffer slot, one contiguous
// matrix) is a multiple of 2H bytes (gate/up maps, K = H) and of 2F bytes (down maps, K = F).
#pragma once

#include <cstdint>

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::tensor_rows {

struct Location {
  int map;        // 0: the first region's map, 1: the second's
  long long row;  // tensor row of the matrix's weight row 0
};

// region1 == 0: no second region.
AMOEBA_HOST_DEVICE constexpr Location locate(std::uintptr_t matrix, std::uintptr_t region0,
                                             std::uintptr_t region1, int k) {
  const bool second = region1 != 0 && matrix >= region1 && (region1 > region0 || matrix < region0);
  const std::uintptr_t base = second ? region1 : region0;
  return {second ? 1 : 0, static_cast<long long>((matrix - base) / (2 * static_cast<std::uintptr_t>(k)))};
}

// Whether matrices `stride_bytes` apart all start on a tensor row of both stages' maps.
AMOEBA_HOST_DEVICE constexpr bool on_rows(long long stride_bytes, int hidden, int intermediate) {
  return hidden > 0 && intermediate > 0 && stride_bytes > 0 && stride_bytes % (2LL * hidden) == 0 &&
         stride_bytes % (2LL * intermediate) == 0;
}

}  // namespace amoeba::kernels::tensor_rows
