// The sum over a tensor-parallel group's ranks that the CUDA backend needs after each layer's attention
// (o_proj is row-parallel) and after each MoE or dense MLP layer (W2 / down_proj are row-parallel):
// docs/engine.md, "Tensor parallelism on GPUs". One object per rank; every rank calls it in the same order
// with the same count. CUDA-free header (streams and buffers are passed as void*).
//
// Two groups:
//   nccl_group(devices)   one NCCL communicator per rank (ncclCommInitAll: one process, one thread per rank,
//                         one GPU per rank), ncclAllReduce(sum, bf16) on the rank's stream. NCCL is loaded
//                         with dlopen when a group is made (libnccl.so.2 on the library path or in
//                         /usr/local/cuda/lib64), so a binary that never makes one never loads it: --tp 1 is
//                         today's backend. NVLink SHARP (NVLS) stays off unless NCCL_NVLS_ENABLE is set.
//   host_sum_group(tp)    host-staged: each rank copies its buffer to the host and waits, the ranks meet,
//                         each sums every rank's values in float in rank order 0..tp-1 and copies the bf16
//                         result back. Deterministic, the same bits on every rank, any devices (the same one
//                         included, which NCCL refuses): a test tool that runs tensor parallelism on one GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace amoeba::engine {

class TpCollective {
 public:
  virtual ~TpCollective() = default;
  virtual std::uint32_t tp() const noexcept = 0;
  virtual std::uint32_t rank() const noexcept = 0;
  virtual std::string_view name() const noexcept = 0;  // "nccl", "host-sum"
  // Sums `count` bf16 values at device pointer `buf` over the group's ranks, in place, ordered on `stream`
  // (a cudaStream_t of the rank's device). Throws std::runtime_error naming the collective on failure.
  virtual void all_reduce_sum_bf16(void* buf, std::size_t count, void* stream) = 0;
};

// Rank r of the result runs on devices[r]. Throws ConfigError naming "--tp" when devices is empty or repeats
// a device, when NCCL cannot be loaded, or when ncclCommInitAll fails (with NCCL's message); also where this
// build has no CUDA backend.
std::vector<std::shared_ptr<TpCollective>> nccl_group(const std::vector<int>& devices);

// tp >= 1 ranks (ConfigError naming "--tp" otherwise, or where this build has no CUDA backend).
std::vector<std::shared_ptr<TpCollective>> host_sum_group(std::uint32_t tp);

}  // namespace amoeba::engine
