// The CUDA backend's paged attention behind a FlashInfer-free header. PagedAttention
// (kernels/attention/paged_attention.cuh) brings FlashInfer's headers and the CCCL they were built with;
// the MoE kernel brings the CUDA toolkit's CUB. The two CCCL versions cannot share a translation unit, so the
// attention is compiled alone (engine/cuda_attention.cu) and the backend calls it through this class.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "amoeba/engine/kv_page_table.hpp"
#include "attention/pool_kv_cache.cuh"
#include "moe/moe_shape.hpp"

namespace amoeba::engine {

struct AttentionBytes {
  std::size_t device = 0, pinned = 0;
};

// PagedAttention<128> for one model: plan once per step, run once per attention layer.
class PagedAttentionRunner {
 public:
  PagedAttentionRunner();
  ~PagedAttentionRunner();
  PagedAttentionRunner(PagedAttentionRunner&&) noexcept;
  PagedAttentionRunner& operator=(PagedAttentionRunner&&) noexcept;

  // Workspace for any step of at most `sequences` sequences and `tokens` query rows (needs a CUDA device).
  static AttentionBytes workspace_size(const kernels::PoolKvCache& kv, std::uint32_t qo_heads,
                                       std::uint32_t sequences, std::uint32_t tokens);
  // Plans one step: `table` is the device copy of the step's page table, `host` the same table on the host;
  // q [tokens][qo_heads][128] in, o the same shape out.
  kernels::Status plan(const kernels::PoolKvCache& kv, std::uint32_t qo_heads, const KvPageTableView& table,
                       const KvPageTableView& host, void* device_ws, std::size_t device_bytes,
                       void* pinned_ws, std::size_t pinned_bytes, const __nv_bfloat16* q, __nv_bfloat16* o,
                       cudaStream_t stream);
  // Attention of layer `layer` over the planned step.
  kernels::Status run(std::uint32_t layer, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace amoeba::engine
