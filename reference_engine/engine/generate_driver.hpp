// `amoeba generate --backend cuda`: one prompt, greedy, on a backend with every expert resident (CUDA-free:
// it drives the GPU through the CudaBackend interface, and tests drive it with a fake backend).
//
//   pool      one MoePool over generate_pool_bytes(): every routed expert (3 pages each) plus the KV pages of
//             prompt + generated tokens; the static policy places every expert (Adjuster::populate) and the
//             backend writes them into their pages (populate);
//   per step  one SequenceStep of request 0: the whole prompt first (context 0), then one token per step;
//             KV pages are allocated as the sequence grows, one per (16-token block, attention layer), owned
//             by the request, block-major (page of block b at attention layer a = kv_pages[b x layers + a])
//             as the scheduler does; forward with an empty ChangeList and ModelRouting (the model's router);
//   token     the backend's last token of request 0 (greedy); with a teacher, replace_last_token feeds the
//             teacher's token to the next step instead (teacher forcing), as
//             DecoderReference::generate_forced.
// The steps match DecoderReference::generate / generate_forced, so hf_oracle.py compares both backends'
// JSON the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "amoeba/engine/backend.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/policies/stacks.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/checkpoint.hpp"
#include "engine/cuda_backend.hpp"
#include "engine/model.hpp"
#include "engine/pool_layout.hpp"
#include "engine/routing_source.hpp"

namespace amoeba::engine {

// One generated token and, where the backend kept them, the logits it was chosen from.
struct GeneratedToken {
  std::int32_t token = 0;
  std::vector<float> logits;
};

// The pool of a generation: every routed expert resident plus KV pages for `tokens` tokens (whole 16-token
// blocks, one page per attention layer), in whole expert pages (the carrier KV pages are cut from).
std::uint64_t generate_pool_bytes(const ModelSpec& model, const PageGeometry& geometry, std::uint32_t tokens);

// The CudaBackendConfig of a generation over `config`'s model (a checkpoint's, or random weights), `model`
// its shapes (config's, or one tensor-parallel rank's): geometry page_geometry(model), pool_bytes
// generate_pool_bytes(model, geometry, tokens), every expert resident (no load buffer), the model's router,
// logits kept, at most `max_batched_tokens` tokens and `max_seqs` sequences per step. The caller sets where
// the weights come from (checkpoint_dir, seed or full_weights) and anything else it needs.
CudaBackendConfig generate_backend_config(const HfMoeConfig& config, const ModelSpec& model,
                                          std::uint32_t tokens, std::uint32_t max_batched_tokens,
                                          std::uint32_t max_seqs);

// Steps a generation runs: teacher.size() with a teacher, else new_tokens.
inline std::size_t generate_steps(std::uint32_t new_tokens, std::span<const std::int32_t> teacher) noexcept {
  return teacher.empty() ? new_tokens : teacher.size();
}

// Runs the generation on `backend`, which must have been built for `model`'s shapes with a pool of at least
// generate_pool_bytes(model, geometry, prompt.size() + steps) bytes and must serve request 0's prompt.
// Backend: a model of `backend` over MoePool with tokens(request), replace_last_token(request, token) and
// last_logits() (CudaBackend's); populate(residency) where it has one. Throws ConfigError for an empty
// prompt, std::logic_error when the backend refuses a step.
template <class Backend>
std::vector<GeneratedToken> generate_greedy(Backend& backend, const ModelSpec& model,
                                            const PageGeometry& geometry, std::uint64_t pool_bytes,
                                            std::span<const std::int32_t> prompt, std::uint32_t new_tokens,
                                            std::span<const std::int32_t> teacher = {}) {
  static_assert(amoeba::backend<Backend, MoePool>, "generate_greedy needs a model of `backend` over MoePool");
  if (prompt.empty()) throw ConfigError("--prompt", "\"\"", "must hold at least one token id");
  constexpr std::uint64_t kRequest = 0;
  constexpr std::uint32_t kBlock = PageGeometry::kTokensPerKvPage;
  const std::uint32_t layers = model.moe_layers(), experts = model.num_experts;
  const std::uint32_t attention_layers = model.attention_layers();

  MoePool pool(ArenaSpan{nullptr, pool_bytes}, pool_layout<MoePool>(geometry));
  policies::StaticAdjuster adj(ExpertRanker::uniform(layers, experts), AdjusterConfig{},
                               policies::StaticCapacity{});
  if (auto s = adj.populate(pool))
    throw std::logic_error("generate: the pool of " + std::to_string(pool_bytes) + " bytes is short of " +
                           std::to_string(s->requested_pages - s->available_pages) +
                           " expert pages for every expert");
  if constexpr (populating_backend<Backend>) backend.populate(adj.residency());
  ModelRouting routing(layers, experts);
  const ChangeList no_changes;
  StepResult result;
  std::vector<PageHandle> kv_pages;
  std::uint32_t context = 0;

  const std::size_t steps = generate_steps(new_tokens, teacher);
  std::vector<GeneratedToken> out;
  out.reserve(steps);
  for (std::size_t s = 0; s < steps; ++s) {
    const auto fresh = static_cast<std::uint32_t>(s == 0 ? prompt.size() : 1);
    const std::size_t blocks = (std::size_t(context) + fresh + kBlock - 1) / kBlock;
    const std::size_t want = blocks * attention_layers;
    if (want > kv_pages.size()) {
      const std::optional<PageHandle> near =
          kv_pages.empty() ? std::nullopt : std::optional<PageHandle>(kv_pages.back());
      if (pool.allocate_n<KvPage>(want - kv_pages.size(), kRequest, kv_pages, near).has_value())
        throw std::logic_error("generate: the pool has no KV page for token " +
                               std::to_string(context + fresh) + " (sized for " +
                               std::to_string(prompt.size() + steps) + " tokens)");
    }
    StepBatch batch;
    batch.seqs.push_back(SequenceStep{kRequest, context, fresh, true, kv_pages, {}});
    batch.tokens = fresh;
    batch.sampling_seqs = 1;
    batch.attention_layers = attention_layers;
    batch.tokens_per_kv_page = kBlock;
    routing.begin_step(batch);
    if (auto e =
            backend.forward(StepInput<MoePool>{batch, no_changes, adj.residency(), pool, routing}, result))
      throw std::logic_error("generate: the backend refused step " + std::to_string(s) + ": " + e->message);
    context += fresh;
    GeneratedToken t;
    t.token = backend.tokens(kRequest).back();
    if (!backend.last_logits().empty()) t.logits = backend.last_logits().front();
    out.push_back(std::move(t));
    if (!teacher.empty()) backend.replace_last_token(kRequest, teacher[s]);
  }
  for (PageHandle p : kv_pages) (void)pool.free(p);
  return out;
}

// `amoeba generate --backend cuda`: the checkpoint in `weights` on the GPU (CudaBackend, keep_logits), with
// prompt tokens served from `prompt`. Throws ConfigError (from CudaBackend) where this build has no CUDA
// backend, or when the checkpoint or the GPU's memory refuses.
std::vector<GeneratedToken> generate_on_cuda(const Checkpoint& ck, std::span<const std::int32_t> prompt,
                                             std::uint32_t new_tokens, std::span<const std::int32_t> teacher);

}  // namespace amoeba::engine
