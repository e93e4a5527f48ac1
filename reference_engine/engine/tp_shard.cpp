// One rank's share of a tensor-parallel model; see tp_shard.hpp.
#include "engine/tp_shard.hpp"

#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {

bool has_dense_layer(const HfMoeConfig& c) noexcept {
  for (std::uint32_t l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l)) return true;
  return false;
}

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // splitmix64's increment

// splitmix64's finaliser (as in model_weights.cpp): a bijection of 64-bit words.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Folds one word into the digest: order-sensitive (mix64 between words), and a word is mixed before it
// meets the state, so small neighbouring values (page 3 then 4 vs 4 then 3) do not cancel.
constexpr std::uint64_t absorb(std::uint64_t h, std::uint64_t word) noexcept {
  return mix64(h ^ mix64(word + kGolden));
}

std::uint64_t absorb_pages(std::uint64_t h, const ExpertPages& p) noexcept {
  for (const PageHandle& page : p.pages) h = absorb(h, (std::uint64_t{page.kind} << 32) | page.index);
  return h;
}

}  // namespace

void validate_tp_shard(const HfMoeConfig& c, TpShard s, const std::string& field) {
  if (s.tp == 0) throw ConfigError(field, "0", "must be at least 1 (the GPUs of the tensor-parallel group)");
  if (s.rank >= s.tp)
    throw ConfigError(field + " rank", std::to_string(s.rank),
                      fmt::format("must be below {} = {} (ranks are numbered from 0)", field, s.tp));
  if (s.tp == 1) return;
  auto split = [&](std::uint64_t v, const char* name, const char* why) {
    if (v % s.tp != 0)
      throw ConfigError(field, std::to_string(s.tp),
                        fmt::format("config.{} = {} must be a multiple of {} ({})", name, v, field, why));
  };
  split(c.num_heads, "num_attention_heads", "each GPU computes num_attention_heads / tp query heads");
  if (c.num_kv_heads == 0 || (c.num_kv_heads % s.tp != 0 && s.tp % c.num_kv_heads != 0))
    throw ConfigError(field, std::to_string(s.tp),
                      fmt::format("config.num_key_value_heads = {} must be a multiple of {} (each GPU "
                                  "holds num_key_value_heads / tp KV heads) or a divisor of it (each KV "
                                  "head replicated on tp / num_key_value_heads GPUs)",
                                  c.num_kv_heads, field));
  split(c.moe_intermediate_size, "moe_intermediate_size",
        "each GPU holds moe_intermediate_size / tp rows of every expert's gate and up projections");
  split(c.shared_expert_intermediate_size, "shared_expert_intermediate_size",
        "each GPU holds shared_expert_intermediate_size / tp rows of the shared expert");
  if (has_dense_layer(c))
    split(c.intermediate_size, "intermediate_size",
          "each GPU holds intermediate_size / tp rows of every dense MLP layer");
  // shard_model's remaining rules (an expert page a multiple of 16 bytes, pages that nest), so the simulator
  // and the GPU accept the same tp.
  (void)shard_model(c.to_model_spec("config"), s.tp, ExpertPrecision::kBf16, field);
}

TpHeads tp_heads(const HfMoeConfig& c, TpShard s) {
  TpHeads h;
  if (s.tp == 0 || c.num_kv_heads == 0) return h;
  h.q_count = c.num_heads / s.tp;
  h.q_first = s.rank * h.q_count;
  if (s.tp <= c.num_kv_heads) {
    h.kv_count = c.num_kv_heads / s.tp;
    h.kv_first = s.rank * h.kv_count;
  } else {  // tp / kv ranks share each KV head: rank r's q heads all read head r kv / tp
    h.kv_count = 1;
    h.kv_first = static_cast<std::uint32_t>(std::uint64_t{s.rank} * c.num_kv_heads / s.tp);
  }
  return h;
}

HfMoeConfig shard_config(const HfMoeConfig& c, TpShard s, const std::string& field) {
  validate_tp_shard(c, s, field);
  HfMoeConfig r = c;
  if (s.tp == 1) return r;
  r.num_heads = c.num_heads / s.tp;
  r.num_kv_heads = tp_heads(c, s).kv_count;
  r.moe_intermediate_size = c.moe_intermediate_size / s.tp;
  r.shared_expert_intermediate_size = c.shared_expert_intermediate_size / s.tp;
  if (has_dense_layer(c)) r.intermediate_size = c.intermediate_size / s.tp;
  return r;
}

ModelSpec tp_rank_model(const HfMoeConfig& c, TpShard s, const std::string& name, const std::string& field) {
  ModelSpec m = shard_config(c, s, field).to_model_spec(name);
  m.tensor_parallel = s.tp;
  return m;
}

TpRankBytes tp_rank_bytes(const HfMoeConfig& c, TpShard s, const std::string& field) {
  const ModelSpec m = tp_rank_model(c, s, "tp rank", field);
  TpRankBytes b;
  b.expert_transfer_bytes = m.expert_transfer_bytes();
  b.expert_page_bytes = m.expert_page_bytes();
  b.non_expert_bytes = 2 * m.non_expert_params();
  const std::uint64_t vocab_share = (std::uint64_t{c.vocab_size} + s.tp - 1) / s.tp;  // shard_model's
  b.replicated_vocab_bytes =
      (c.vocab_size - vocab_share) * c.hidden_size * 2 * (c.tie_word_embeddings ? 1 : 2);
  b.kv_bytes_per_token_layer = m.kv_bytes_per_token_layer();
  b.kv_bytes_per_token = m.kv_bytes_per_token();
  return b;
}

// ---- sharded weights

class TpShardedWeights final : public ModelWeights {
 public:
  TpShardedWeights(std::shared_ptr<const ModelWeights> full, TpShard s, const std::string& field)
      : full_(std::move(full)), shard_(s), config_(shard_config(full_->config(), s, field)) {
    init(config_);
    const HfMoeConfig& c = full_->config();
    const TpHeads heads = tp_heads(c, s);
    const std::uint64_t d = c.head_dim;
    const std::uint64_t q0 = heads.q_first * d, kv0 = heads.kv_first * d;
    const std::uint64_t fs0 = std::uint64_t{s.rank} * config_.shared_expert_intermediate_size;
    const std::uint64_t i0 = std::uint64_t{s.rank} * config_.intermediate_size;
    for (const auto& [name, mine] : readable_) {
      const std::string_view n = name;
      auto is = [&](std::initializer_list<std::string_view> suffixes) {
        for (std::string_view x : suffixes)
          if (n.ends_with(x)) return true;
        return false;
      };
      Cut k;
      if (is({".self_attn.q_proj.weight", ".self_attn.q_proj.bias"})) {
        k = Cut{Dim::kRows, q0};
      } else if (is({".self_attn.k_proj.weight", ".self_attn.k_proj.bias", ".self_attn.v_proj.weight",
                     ".self_attn.v_proj.bias"})) {
        k = Cut{Dim::kRows, kv0};
      } else if (is({".self_attn.o_proj.weight"})) {
        k = Cut{Dim::kCols, q0};
      } else if (is({".mlp.shared_expert.gate_proj.weight", ".mlp.shared_expert.up_proj.weight"})) {
        k = Cut{Dim::kRows, fs0};
      } else if (is({".mlp.shared_expert.down_proj.weight"})) {
        k = Cut{Dim::kCols, fs0};
      } else if (is({".mlp.gate_proj.weight", ".mlp.up_proj.weight"})) {
        k = Cut{Dim::kRows, i0};
      } else if (is({".mlp.down_proj.weight"})) {
        k = Cut{Dim::kCols, i0};
      }
      // Embedding, LM head, norms, router, shared_expert_gate: whole on every rank.
      const WeightTensor& whole = full_->readable(name, "weights");
      const auto [full_rows, full_row_len] = matrix_shape(whole);
      const auto [rows, row_len] = matrix_shape(mine);
      k.full_row_len = full_row_len;
      k.rows = rows;
      k.row_len = row_len;
      const bool fits = k.dim == Dim::kRows   ? row_len == full_row_len && k.offset + rows <= full_rows
                        : k.dim == Dim::kCols ? rows == full_rows && k.offset + row_len <= full_row_len
                                              : rows == full_rows && row_len == full_row_len;
      if (!fits)  // shard_config and this table disagree: a bug, not an input error
        throw std::logic_error(fmt::format("TpShardedWeights: {} [{} x {}] is no slice of [{} x {}] at {}",
                                           name, rows, row_len, full_rows, full_row_len, k.offset));
      cuts_.emplace(name, k);
    }
  }

  const HfMoeConfig& config() const noexcept override { return config_; }

  void read(const std::string& name, std::span<bf16> dst) const override {
    const WeightTensor& t = readable(name, "weights.read");
    if (dst.size() != t.elements())
      throw ConfigError("weights.read: " + name, fmt::format("{} elements", t.elements()),
                        fmt::format("do not fit the {}-element destination", dst.size()));
    const Cut& k = cuts_.at(name);
    read_block(name, Block{k.row_len, 0, k.rows, 0, k.row_len}, std::as_writable_bytes(dst));
  }

  void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const override {
    const std::uint64_t h = config_.hidden_size, f = config_.moe_intermediate_size;
    const std::uint64_t m = f * h * 2;  // one matrix of the rank's slice
    if (moe_layer >= config_.moe_layers() || expert >= config_.num_experts || dst.size() != 3 * m)
      throw ConfigError("weights.read_expert",
                        fmt::format("({}, {}) into {} bytes", moe_layer, expert, dst.size()),
                        fmt::format("needs a MoE layer < {}, an expert < {} and {} bytes (one rank's slice "
                                    "of {} GPUs)",
                                    config_.moe_layers(), config_.num_experts, 3 * m, shard_.tp));
    if (shard_.tp == 1) {
      full_->read_expert(moe_layer, expert, dst);
      return;
    }
    const std::uint64_t full_f = full_->config().moe_intermediate_size, full_m = full_f * h * 2;
    const std::uint64_t f0 = std::uint64_t{shard_.rank} * f;
    std::vector<std::byte> all(3 * full_m);
    full_->read_expert(moe_layer, expert, all);
    // W1 and W3 [F, H]: rows [f0, f0 + f), contiguous. W2 [H, F]: columns [f0, f0 + f) of each row.
    std::memcpy(dst.data(), all.data() + f0 * h * 2, m);
    std::memcpy(dst.data() + m, all.data() + full_m + f0 * h * 2, m);
    for (std::uint64_t r = 0; r < h; ++r)
      std::memcpy(dst.data() + 2 * m + r * f * 2, all.data() + 2 * full_m + (r * full_f + f0) * 2, f * 2);
  }

 protected:
  // `b` addresses the rank's tensor; the same elements of the whole tensor are b moved by the rank's offset
  // along the split dimension.
  void read_block(const std::string& name, const Block& b, std::span<std::byte> dst) const override {
    const auto it = cuts_.find(name);
    if (it == cuts_.end()) {
      (void)readable(name, "weights.read_block");  // throws, naming the tensor
      throw std::logic_error("TpShardedWeights: no cut for readable tensor " + name);
    }
    const Cut& k = it->second;
    if (b.row_len != k.row_len || b.row0 + b.rows > k.rows || b.col0 + b.cols > k.row_len ||
        dst.size() != b.rows * b.cols * 2)
      throw ConfigError(
          "weights.read_block: " + name,
          fmt::format("rows [{}, {}) x columns [{}, {}) of a {}-column matrix into {} bytes", b.row0,
                      b.row0 + b.rows, b.col0, b.col0 + b.cols, b.row_len, dst.size()),
          fmt::format("must lie inside this rank's [{} x {}] and fill the destination", k.rows, k.row_len));
    if (b.rows == 0 || b.cols == 0) return;
    Block whole{k.full_row_len, b.row0, b.rows, b.col0, b.cols};
    if (k.dim == Dim::kRows) whole.row0 += k.offset;
    if (k.dim == Dim::kCols) whole.col0 += k.offset;
    full_->read_block(name, whole, dst);
  }

 private:
  enum class Dim : std::uint8_t { kWhole, kRows, kCols };  // which dimension of the whole tensor is split
  struct Cut {
    Dim dim = Dim::kWhole;
    std::uint64_t offset = 0;        // the rank's first row (kRows) or column (kCols) in the whole tensor
    std::uint64_t full_row_len = 0;  // the whole tensor's columns
    std::uint64_t rows = 0, row_len = 0;  // the rank's tensor
  };
  // A tensor as a row-major matrix: [a, b] is a rows of b; a vector [n] is n rows of 1 (a bias splits by
  // rows).
  static std::pair<std::uint64_t, std::uint64_t> matrix_shape(const WeightTensor& t) {
    if (t.shape.size() == 1) return {t.shape[0], 1};
    if (t.shape.size() == 2) return {t.shape[0], t.shape[1]};
    throw std::logic_error("TpShardedWeights: " + t.name + " is not a matrix or a vector");
  }

  std::shared_ptr<const ModelWeights> full_;
  TpShard shard_;
  HfMoeConfig config_;
  std::map<std::string, Cut> cuts_;
};

std::unique_ptr<ModelWeights> sharded_weights(std::shared_ptr<const ModelWeights> full, TpShard s,
                                              const std::string& field) {
  if (!full) throw ConfigError("sharded_weights", "null", "needs the whole model's weights");
  return std::make_unique<TpShardedWeights>(std::move(full), s, field);
}

// ---- rank agreement

std::uint64_t change_list_digest(const ChangeList& c) noexcept {
  std::uint64_t h = mix64(0x6368616e67657321ull);  // "changes!"
  h = absorb(h, c.evictions.size());
  h = absorb(h, c.restores.size());
  for (const Eviction& e : c.evictions) {
    h = absorb(h, (std::uint64_t{e.expert.layer} << 32) | e.expert.expert);
    h = absorb(h, static_cast<std::uint64_t>(e.cause));
    h = absorb_pages(h, e.pages);
  }
  for (const Restore& r : c.restores) {
    h = absorb(h, (std::uint64_t{r.expert.layer} << 32) | r.expert.expert);
    h = absorb_pages(h, r.pages);
  }
  return h;
}

}  // namespace amoeba::engine
