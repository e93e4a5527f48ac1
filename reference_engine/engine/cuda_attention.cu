// PagedAttentionRunner: PagedAttention<128> in a translation unit of its own; see cuda_attention.hpp.
#include "engine/cuda_attention.hpp"

#include "attention/paged_attention.cuh"

namespace amoeba::engine {

namespace kn = amoeba::kernels;
using Attention = kn::PagedAttention<128>;

struct PagedAttentionRunner::Impl {
  Attention attention;
  Attention::Arguments args{};
};

PagedAttentionRunner::PagedAttentionRunner() : impl_(std::make_unique<Impl>()) {}
PagedAttentionRunner::~PagedAttentionRunner() = default;
PagedAttentionRunner::PagedAttentionRunner(PagedAttentionRunner&&) noexcept = default;
PagedAttentionRunner& PagedAttentionRunner::operator=(PagedAttentionRunner&&) noexcept = default;

AttentionBytes PagedAttentionRunner::workspace_size(const kn::PoolKvCache& kv, std::uint32_t qo_heads,
                                                    std::uint32_t sequences, std::uint32_t tokens) {
  Attention::Arguments a{};
  a.kv = kv;
  a.qo_heads = qo_heads;
  a.table.sequences = sequences;
  a.table.tokens = tokens;
  const kn::AttentionWorkspaceSize s = Attention::workspace_size(a);
  return {s.device_bytes, s.pinned_bytes};
}

kn::Status PagedAttentionRunner::plan(const kn::PoolKvCache& kv, std::uint32_t qo_heads,
                                      const KvPageTableView& table, const KvPageTableView& host,
                                      void* device_ws, std::size_t device_bytes, void* pinned_ws,
                                      std::size_t pinned_bytes, const __nv_bfloat16* q, __nv_bfloat16* o,
                                      cudaStream_t stream) {
  Attention::Arguments& a = impl_->args;
  a = Attention::Arguments{};
  a.kv = kv;
  a.qo_heads = qo_heads;
  a.q = q;
  a.o = o;
  a.table = table;
  const kn::AttentionWorkspace ws{device_ws, device_bytes, pinned_ws, pinned_bytes};
  return impl_->attention.plan(a, host, ws, stream);
}

kn::Status PagedAttentionRunner::run(std::uint32_t layer, cudaStream_t stream) {
  impl_->args.layer = layer;
  return impl_->attention.run(impl_->args, stream);
}

}  // namespace amoeba::engine
