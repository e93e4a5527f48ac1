// Configurations of PagedMoe on quantized experts shared by the device tests (quant_moe_test.cu) and
// benchmarks/device/paged_moe_bench.cu: the default table held to one path at every token count. Host-only
// (moe/moe_config.hpp).
#pragma once

#include "moe/moe_config.hpp"

namespace amoeba::testing {

// DefaultMoeConfig's quantized choice held to kPath (kDecode: its decode tiles; kGrouped: the grouped GEMM)
// whatever the shape; select() (bf16) is the default table's.
template <kernels::MoePath kPath>
struct QuantPathConfig : kernels::DefaultMoeConfig {
  static constexpr kernels::MoeConfig select_quantized(const kernels::MoeShape& s, kernels::MoePath) {
    return kernels::DefaultMoeConfig::select_quantized(s, kPath);
  }
};
using QuantGroupedConfig = QuantPathConfig<kernels::MoePath::kGrouped>;

}  // namespace amoeba::testing
