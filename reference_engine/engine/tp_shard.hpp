// Tensor parallelism on several GPUs (Megatron-style), the host side: which slice of every weight one rank
// (one GPU) holds, the shapes its forward sees, its bytes, and a digest of the adjuster's decision that the
// ranks compare. CUDA-free; the NCCL part lives in the GPU backend (docs/engine.md, "Tensor parallelism on
// GPUs (in progress)").
//
// Rank r of tp, H = hidden_size, d = head_dim, nh = num_heads, nkv = num_kv_heads:
//   q heads            [r nh/tp, (r+1) nh/tp): q_proj rows (weight and bias) of those heads; o_proj columns
//                      of those heads (row-parallel: the ranks' outputs are summed by an all-reduce);
//   kv heads           tp <= nkv: [r nkv/tp, (r+1) nkv/tp); tp > nkv (tp a multiple of nkv): the one head
//                      r nkv / tp, replicated on tp / nkv ranks as vLLM does; each rank's q heads are exactly
//                      the ones that read its kv heads, so attention needs no communication; k_proj and
//                      v_proj rows (weight and bias) of those heads; q_norm and k_norm (per head_dim) whole;
//   routed experts     every rank holds 1/tp of every expert: W1, W3 rows [r F/tp, (r+1) F/tp) and W2
//                      columns of the same range, read_expert's [W1 | W3 | W2] as [F/tp, H], [F/tp, H],
//                      [H, F/tp]; the expert's output is the sum over ranks (row-parallel W2, all-reduce);
//   shared expert      rank r's slice is the intermediate range [r Fs/tp, (r+1) Fs/tp), cut like the
//                      unsharded one into Fs/F chunks of the routed size F/tp: chunk c of rank r covers the
//                      full shared expert's intermediate range [r Fs/tp + c F/tp, r Fs/tp + (c+1) F/tp).
//                      Over all ranks and chunks each index of [0, Fs) appears once, so the sum of every
//                      chunk's output is the shared expert's output;
//   dense MLP layers   gate_proj, up_proj rows [r I/tp, (r+1) I/tp), down_proj columns of that range;
//   replicated         embedding, LM head, every RMSNorm, the router (mlp.gate), shared_expert_gate: each
//                      rank holds them whole. The embedding needs no communication then; every rank computes
//                      the whole vocabulary's logits (vocab-parallel LM head, an all-gather of logits or a
//                      distributed argmax, is a later step). This costs (V - V/tp) x H x 2 B per matrix on
//                      each rank against shard_model's vocab-parallel plan (TpRankBytes says how much).
// The router and the shared expert's gate see the all-reduced hidden state, the same bits on every rank, so
// every rank picks the same experts with the same weights; a rank's partial MoE output is the top-k weighted
// sum of its expert slices plus sigmoid(gate) x its shared chunks, and one all-reduce sums them.
//
// These are shard_model's rules (engine/model.hpp) except the vocabulary, which shard_model splits: the
// per-rank ModelSpec (tp_rank_model) agrees with shard_model on every other size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "amoeba/adjust/change_list.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/model_weights.hpp"

namespace amoeba::engine {

// One GPU of a tensor-parallel group: `tp` GPUs, this one numbered `rank` (0-based).
struct TpShard {
  std::uint32_t tp = 1, rank = 0;
};

// Throws ConfigError unless tp >= 1, rank < tp and `c` splits over tp GPUs: num_attention_heads,
// moe_intermediate_size, shared_expert_intermediate_size and (when a dense layer reads it) intermediate_size
// multiples of tp; num_key_value_heads a multiple or a divisor of tp; and whatever else shard_model refuses
// (an expert page that is not a multiple of 16 bytes). A size error names `field` (the flag that set tp),
// the value of tp and the config field with its value.
void validate_tp_shard(const HfMoeConfig& c, TpShard s, const std::string& field = "--tp");

// The heads rank s.rank computes (see the header comment).
struct TpHeads {
  std::uint32_t q_first = 0, q_count = 0;    // query heads
  std::uint32_t kv_first = 0, kv_count = 0;  // KV heads (kv_count = 1 when replicated)
};
TpHeads tp_heads(const HfMoeConfig& c, TpShard s);

// The shapes rank s.rank's forward sees: num_heads / tp, its KV heads, moe_intermediate_size / tp,
// shared_expert_intermediate_size / tp, intermediate_size / tp (kept as is when no dense layer reads it);
// hidden_size, head_dim, vocab_size, num_experts, top_k and everything else unchanged. tp = 1 returns `c`.
// Validates first (validate_tp_shard).
HfMoeConfig shard_config(const HfMoeConfig& c, TpShard s, const std::string& field = "--tp");

// The catalog's view of one rank (what the memory plan takes): shard_config(c, s).to_model_spec(name) with
// tensor_parallel = tp. Equal to shard_model(c.to_model_spec(name), tp, bf16) in every size but the
// vocabulary, which stays whole (replicated embedding and LM head).
ModelSpec tp_rank_model(const HfMoeConfig& c, TpShard s, const std::string& name,
                        const std::string& field = "--tp");

// One rank's bytes (bf16 weights, bf16 KV), the same on every rank.
struct TpRankBytes {
  std::uint64_t expert_transfer_bytes = 0;  // one routed expert's slice over PCIe: 3 x F/tp x H x 2
  std::uint64_t expert_page_bytes = 0;      // one matrix of that slice: F/tp x H x 2
  std::uint64_t non_expert_bytes = 0;  // everything but routed experts (ModelSpec::non_expert_params x 2)
  std::uint64_t replicated_vocab_bytes = 0;  // of non_expert_bytes, what the whole embedding and LM head add
                                             // to shard_model's 1/tp of them: (V - ceil(V/tp)) x H x 2 each
  std::uint64_t kv_bytes_per_token_layer = 0;  // K and V of this rank's KV heads, one token, one layer
  std::uint64_t kv_bytes_per_token = 0;        // the same over every attention layer
};
TpRankBytes tp_rank_bytes(const HfMoeConfig& c, TpShard s, const std::string& field = "--tp");

// Rank s.rank's view of `full` (the whole model's weights, shared by every rank's view): config() is
// shard_config(full->config(), s); tensors() are the rank's shapes under the Hugging Face names; read(),
// read_expert() and read_shared_chunk() return the rank's slices (header comment) in the layouts
// ModelWeights documents, so a backend built for one GPU reads them unchanged. read_expert reads the whole
// expert from `full` and copies the slice out (tp x the host reads of one GPU: a first version); the other
// tensors read only their slice where `full` can (ModelWeights::read_block). Thread-safe as `full` is.
// tp = 1 gives the same bytes as `full`. Validates `s` against full's config.
std::unique_ptr<ModelWeights> sharded_weights(std::shared_ptr<const ModelWeights> full, TpShard s,
                                              const std::string& field = "--tp");

// A digest of what a ChangeList does, for ranks to check that they apply one decision: the number of
// evictions and restores, then each eviction (layer, expert, cause, its three pages' index and kind) and each
// restore (layer, expert, three pages), in order, through splitmix64's finaliser. The signal and the
// capacity decision (the adjuster's inputs) are left out. The same on every machine and build; equal lists
// give equal digests, and a change of order, of one field or of one page gives another (up to 2^-64).
std::uint64_t change_list_digest(const ChangeList& c) noexcept;

}  // namespace amoeba::engine
