// The tensor-parallel collectives where this build has no CUDA backend: both groups are refused, naming --tp
// (as CudaBackend's stub names --backend).
#include "amoeba/core/errors.hpp"
#include "engine/tp_collective.hpp"

namespace amoeba::engine {

namespace {
[[noreturn]] void refuse(std::size_t tp) {
  throw ConfigError(
      "--tp", std::to_string(tp),
      "tensor parallelism needs the CUDA backend: configure with the gpu preset (cmake --preset "
      "gpu) on a machine with nvcc and GPUs");
}
}  // namespace

std::vector<std::shared_ptr<TpCollective>> nccl_group(const std::vector<int>& devices) {
  refuse(devices.size());
}

std::vector<std::shared_ptr<TpCollective>> host_sum_group(std::uint32_t tp) {
  refuse(tp);
}

}  // namespace amoeba::engine
