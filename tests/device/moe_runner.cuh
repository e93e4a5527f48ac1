// One PagedMoe call as the device tests make it (Catch2): arguments from a RoutingSet, can_implement
// required, output and workspace poisoned before the run (nothing may read what the call did not write), the
// output downloaded. Shared by the bf16 and the int8/int4 tests.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "moe/paged_moe.cuh"
#include "moe_device_fixture.cuh"

namespace amoeba::testing {

template <class Addressing, class Config = kernels::DefaultMoeConfig, class Precision = kernels::Bf16>
struct Runner {
  using Moe = kernels::PagedMoe<Addressing, Config, Precision>;
  typename Moe::Arguments args{};
  DeviceBuffer<unsigned char> workspace;
  DeviceBuffer<bf16> out;

  std::vector<std::uint16_t> run(const RoutingSet& r, const MoeShape& shape, typename Addressing::Arguments w,
                                 kernels::MoePath path, bool with_shared_weights, long long stride = 0) {
    out = DeviceBuffer<bf16>(static_cast<std::size_t>(shape.num_tokens) * shape.hidden);
    args = layer_arguments<typename Moe::Arguments>(r, shape, w, out.get(), with_shared_weights);
    args.path = path;
    args.matrix_stride_bytes = stride;
    const kernels::Status ok = Moe::can_implement(args);
    INFO(ok.message);
    REQUIRE(ok.ok);
    const std::size_t bytes = Moe::workspace_size(args);
    workspace = DeviceBuffer<unsigned char>(bytes);
    poison(out.get(), out.size());
    AMOEBA_CUDA_CHECK(cudaMemset(workspace.get(), 0xFF, bytes));
    const kernels::Status st = Moe{}.run(args, workspace.get(), bytes, nullptr);
    INFO(st.message);
    REQUIRE(st.ok);
    AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint16_t> h(out.size());
    AMOEBA_CUDA_CHECK(cudaMemcpy(h.data(), out.get(), h.size() * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace amoeba::testing
