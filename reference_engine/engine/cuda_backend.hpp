// CudaBackend: the model of the `backend` concept (amoeba/engine/backend.hpp) that runs the forward on a
// GPU: the Qwen MoE decoders (Qwen2-MoE, Qwen3-MoE; engine/checkpoint.hpp) with their experts read from the
// unified pool's pages by PagedMoe, the KV cache in the pool's KV pages (QkvPrologue + PagedAttention), dense
// projections through cuBLASLt, and experts crossing PCIe through the DoubleBufferLoader, which executes the
// LoadPlanner's plan (the same plan SimBackend prices). Every time it reports is measured.
//
// This header is CUDA-free (the host engine and the CLI include it); the implementation is
// engine/cuda_backend.cu, compiled only where the CUDA backend is built (AMOEBA_HAS_CUDA_BACKEND: CUDA and
// FlashInfer). Elsewhere engine/cuda_backend_stub.cpp defines the same class, whose constructor refuses with
// a ConfigError naming --backend.
//
// Device memory: one arena (one cudaMalloc) holds, in this order, the pool (its expert and KV pages; a page
// handle's index x its page bytes is its offset from the arena base), the shared experts' chunks (Qwen2-MoE:
// the shared expert cut into expert-page-sized chunks, three pages each), the other weights, the activations
// of max_batched_tokens tokens, the workspaces (PagedMoe, PagedAttention, cuBLASLt) and the step's page
// table. The loader's two load buffers are its own allocation. Nothing is allocated in the step loop.
//
// Tokens: the step contract carries no token ids, so the backend keeps each request's tokens: a prompt token
// is asked from the TokenSource once, when its position is first computed; a sampled token is appended when a
// sequence samples. A recomputed sequence (after preemption) reads its own history again.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/engine/backend.hpp"
#include "amoeba/engine/step.hpp"
#include "amoeba/expert/residency_table.hpp"
#include "amoeba/pool/page_kinds.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/model_weights.hpp"
#include "engine/tp_collective.hpp"
#include "engine/tp_shard.hpp"

namespace amoeba::engine {

// Prompt token `position` of request `request`.
using TokenSource = std::function<std::int32_t(std::uint64_t request, std::uint32_t position)>;

struct CudaBackendConfig {
  HfMoeConfig model;           // architecture and shapes of the forward
  std::string checkpoint_dir;  // a checked checkpoint (open_checkpoint); empty: random weights from `seed`
  std::uint64_t seed = 0;
  PageGeometry geometry;                  // the pool's page sizes (page_geometry of model.to_model_spec())
  std::uint64_t pool_bytes = 0;           // the memory plan's pool
  std::uint32_t load_buffer_experts = 0;  // slots per load buffer (the offload limit; 0: nothing offloaded)
  std::uint32_t max_batched_tokens = 0;   // the scheduler's token budget per step
  std::uint32_t max_seqs = 0;             // the scheduler's cap on sequences per step
  RoutingKind routing = RoutingKind::kModel;  // kModel: the router; otherwise the routing source's sets
  bool keep_logits = false;  // copy each sampled row's logits to the host (generate, oracle tests)
  bool keep_tokens = false;  // keep finished requests' tokens (release() forgets nothing): tests read them
  // The routed experts' and the shared expert's precision: bf16, or int8 / int4 quantized when the store is
  // filled (engine/quantize.hpp) and read by the paged kernel's decode path (moe/precision.cuh). The pool's
  // expert page (geometry.expert_page_bytes) must hold one packed matrix.
  ExpertPrecision expert_precision = ExpertPrecision::kBf16;
  int device = 0;
  // Tensor parallelism (engine/tp_shard.hpp, docs/engine.md "Tensor parallelism on GPUs"): this backend is
  // rank shard.rank of shard.tp. `model` stays the whole model's config; the backend serves
  // shard_config(model, shard)'s shapes over sharded_weights(the whole weights, shard) (geometry and
  // pool_bytes are the rank's: page_geometry and the memory plan of tp_rank_model), and sums its partial
  // attention output (after o_proj) and MoE / dense MLP output with the other ranks through `collective`
  // (one per rank, its tp() and rank() those of `shard`; required when shard.tp > 1). Each forward first
  // makes `device` current (a TpGroup calls it from the rank's thread). shard.tp = 1: none of this happens.
  TpShard shard{};
  std::shared_ptr<TpCollective> collective;
  // The whole model's weights, shared by a group's ranks (one checkpoint read, one random model); null: from
  // checkpoint_dir or seed as above.
  std::shared_ptr<const ModelWeights> full_weights;
};

// An experiment's on/off switch in the environment: on unless `name` is set to "0".
inline bool switch_on_in_environment(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string_view(v) != "0";
}

// AMOEBA_PHASE_EVENTS=0 in the environment: the backend records no per-layer phase events (an experiment's
// switch; its timelines' attention, MoE and dense times then read 0, which `calibrate` cannot fit).
inline bool phase_events_from_environment() {
  return switch_on_in_environment("AMOEBA_PHASE_EVENTS");
}

// AMOEBA_TUNE_GEMM=0 in the environment: the warm-up keeps cuBLASLt's first heuristic algorithm for every
// dense projection instead of the fastest of its first 8 at decode-sized M (DenseGemm::tune_once; an
// experiment's switch: untuned, the decode steps of 7-10 and 13 sequences took ~0.4 ms more on the H200,
// docs/results/dense_gemm_h200.md).
inline bool gemm_tuning_from_environment() {
  return switch_on_in_environment("AMOEBA_TUNE_GEMM");
}

// What the backend took from the GPU, for reports and the "nothing allocated in the step loop" check.
struct CudaMemoryReport {
  std::uint64_t arena_bytes = 0;  // the one arena
  std::uint64_t pool_bytes = 0;   // of which the pool
  std::uint64_t shared_expert_bytes = 0, weight_bytes = 0, activation_bytes = 0, workspace_bytes = 0;
  std::uint64_t load_buffer_bytes = 0;  // the loader's two buffers
  std::uint64_t pinned_host_bytes = 0;  // the expert store (master copy of every routed expert)
  std::uint64_t device_free_before = 0, device_free_after_setup = 0;  // cudaMemGetInfo
  std::uint64_t device_free_now() const;                              // cudaMemGetInfo now (0 where no GPU)
};

// The pool's owner lookup, type-erased (the ChangeList validation needs only owner_of); built by
// forward<Pool>.
struct PoolOwners {
  const void* pool = nullptr;
  std::optional<OwnerId> (*lookup)(const void* pool, PageHandle h) = nullptr;
  std::optional<OwnerId> owner_of(PageHandle h) const { return lookup(pool, h); }
};

class CudaBackend {
 public:
  // Reads and checks the weights (a bad checkpoint throws ConfigError before any GPU memory is taken),
  // takes the arena and the pinned store, fills the store and uploads the non-expert weights. Throws
  // ConfigError when the arena does not fit the device's free memory (with the plan's numbers).
  CudaBackend(const CudaBackendConfig& config, TokenSource prompts);
  ~CudaBackend();
  CudaBackend(CudaBackend&&) noexcept;
  CudaBackend& operator=(CudaBackend&&) noexcept;

  static constexpr std::string_view name() noexcept { return "cuda"; }
  // Times are measured, not modelled (the engine adds its own host time to the clock; engine.hpp).
  static constexpr bool kMeasured = true;
  // A step without a forward costs no GPU time (the engine measures the host's).
  double idle_step_s() const noexcept { return 0.0; }

  // One forward (the backend concept). Experts resident in the pool before the step must have been written
  // into their pages: populate() after Adjuster::populate, before the first forward.
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    const PoolOwners owners{&in.pool, [](const void* p, PageHandle h) -> std::optional<OwnerId> {
                              return static_cast<const Pool*>(p)->owner_of(h);
                            }};
    return forward_impl(in.batch, in.changes, in.residency, owners, in.routing, out);
  }

  // Copies every expert resident in `residency` from the host store into its pages (the initial placement).
  void populate(const ResidencyTable& residency);

  // The request's tokens so far (prompt positions computed so far, then sampled tokens).
  std::span<const std::int32_t> tokens(std::uint64_t request) const;
  // Forgets a finished request's tokens (the engine calls it; a long run would otherwise keep every token of
  // every request), unless config().keep_tokens.
  void release(std::uint64_t request);
  // Replaces the request's last sampled token (teacher forcing: the next decode step feeds `token`).
  void replace_last_token(std::uint64_t request, std::int32_t token);
  // keep_logits: the logits of each sampling sequence of the last forward, in batch order ([vocab] each).
  const std::vector<std::vector<float>>& last_logits() const;

  const CudaMemoryReport& memory() const;
  const CudaBackendConfig& config() const;

 private:
  std::optional<ChangeError> forward_impl(const StepBatch& batch, const ChangeList& changes,
                                          const ResidencyTable& residency, const PoolOwners& owners,
                                          RoutingSource& routing, StepResult& out);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True where this binary was built with the CUDA backend (false: the stub).
bool cuda_backend_available() noexcept;

}  // namespace amoeba::engine
