// Model weights from a checkpoint or from a seed; see model_weights.hpp.
#include "engine/model_weights.hpp"

#include <bit>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "amoeba/core/errors.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

namespace {

// The fields of each model's config.json (Hugging Face hub) that parse_hf_moe_config reads; fields the
// engine ignores (token ids, dropout, sliding window, ...) are left out. Qwen2-MoE's q/k/v biases are not a
// config field: the parser's default (true) is the architecture's.
struct BuiltInConfig {
  const char* name;   // catalog name
  const char* hf_id;  // catalog hf_id
  const char* config_json;
};
constexpr BuiltInConfig kBuiltIn[] = {
    {"qwen1.5-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B", R"({"architectures": ["Qwen2MoeForCausalLM"],
      "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
      "vocab_size": 151936, "intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
      "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
      "norm_topk_prob": false, "tie_word_embeddings": false, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0})"},
    {"qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", R"({"architectures": ["Qwen3MoeForCausalLM"],
      "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
      "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144, "num_experts": 128,
      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "norm_topk_prob": true, "attention_bias": false, "tie_word_embeddings": false, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0})"},
};

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // splitmix64's increment

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush for counter inputs.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a over the bytes of `s`: fixed by its definition, unlike std::hash, so keys agree across machines.
constexpr std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t tensor_key(std::uint64_t seed, std::string_view name) noexcept {
  return mix64(fnv1a64(name) ^ mix64(seed ^ 0x5eed5eed5eed5eedull));
}

bool is_norm_weight(std::string_view name) noexcept {
  return name.ends_with("norm.weight");
}

// Elements [first, first + n) of the random tensor keyed `key` as bf16 at `out` (unaligned is fine). The
// four 16-bit fields of one hash are summed two at a time inside the word; every step is exact integer or
// one float multiply, so the bytes do not depend on the machine. Measured: 1.1 GB/s of read_expert on one
// AMD EPYC core (-O3, no -march), so Qwen1.5-MoE's 25 GB of experts take about 1.5 s on 16 cores that scale.
void fill_random(std::uint64_t key, std::uint64_t first, std::uint64_t n, std::byte* out) noexcept {
  // 0.02 x sqrt(3) / 65536: (sum of the fields - 131070) / 65536 = u1 + u2 + u3 + u4 - 2.
  constexpr float kScale = static_cast<float>(0.02 * 1.7320508075688772 / 65536.0);
  std::uint64_t z = key + (first + 1) * kGolden;
  for (std::uint64_t j = 0; j < n; ++j, z += kGolden) {
    const std::uint64_t h = mix64(z);
    const std::uint64_t pairs = (h & 0x0000ffff0000ffffull) + ((h >> 16) & 0x0000ffff0000ffffull);
    const std::int32_t centred = static_cast<std::int32_t>((pairs & 0xffffffffu) + (pairs >> 32)) - 131070;
    // bf16::from_float's rounding without its NaN test (the value is finite): 15% faster.
    std::uint32_t u = std::bit_cast<std::uint32_t>(static_cast<float>(centred) * kScale);
    u += 0x7fffu + ((u >> 16) & 1u);
    const auto bits = static_cast<std::uint16_t>(u >> 16);
    std::memcpy(out + 2 * j, &bits, 2);
  }
}

void fill_ones(std::uint64_t n, std::byte* out) noexcept {
  const std::uint16_t one = bf16::from_float(1.0f).bits;
  for (std::uint64_t j = 0; j < n; ++j) std::memcpy(out + 2 * j, &one, 2);
}

void check_elements(const WeightTensor& t, std::size_t n, const char* field) {
  if (n != t.elements())
    throw ConfigError(std::string(field) + ": " + t.name, fmt::format("{} elements", t.elements()),
                      fmt::format("do not fit the {}-element destination", n));
}

void check_expert(const HfMoeConfig& c, std::uint32_t moe_layer, std::uint32_t expert, std::size_t bytes) {
  const std::uint64_t m = std::uint64_t(c.moe_intermediate_size) * c.hidden_size * 2;
  if (moe_layer >= c.moe_layers() || expert >= c.num_experts || bytes != 3 * m)
    throw ConfigError("weights.read_expert", fmt::format("({}, {}) into {} bytes", moe_layer, expert, bytes),
                      fmt::format("needs a MoE layer < {}, an expert < {} and {} bytes", c.moe_layers(),
                                  c.num_experts, 3 * m));
}

class CheckpointWeights final : public ModelWeights {
 public:
  explicit CheckpointWeights(const Checkpoint& ck) : ck_(ck) { init(ck_.config); }
  const HfMoeConfig& config() const noexcept override { return ck_.config; }
  void read(const std::string& name, std::span<bf16> dst) const override {
    check_elements(readable(name, "weights.read"), dst.size(), "weights.read");
    ck_.shard(name).read(name, std::as_writable_bytes(dst));
  }
  void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const override {
    ck_.read_expert(moe_layer, expert, dst);
  }

 protected:
  void read_block(const std::string& name, const Block& b, std::span<std::byte> dst) const override {
    const SafetensorsFile& file = ck_.shard(name);
    if (b.col0 == 0 && b.cols == b.row_len) {  // whole rows: one contiguous range
      file.read_range(name, b.row0 * b.row_len * 2, dst);
      return;
    }
    // One read of the range from the first row's block to the last's, then the rows' pieces.
    const std::uint64_t first = b.row0 * b.row_len + b.col0;
    std::vector<std::byte> span(((b.rows - 1) * b.row_len + b.cols) * 2);
    file.read_range(name, first * 2, span);
    for (std::uint64_t r = 0; r < b.rows; ++r)
      std::memcpy(dst.data() + r * b.cols * 2, span.data() + r * b.row_len * 2, b.cols * 2);
  }

 private:
  Checkpoint ck_;
};

class RandomWeights final : public ModelWeights {
 public:
  RandomWeights(const HfMoeConfig& c, std::uint64_t seed) : config_(c), seed_(seed) { init(config_); }
  const HfMoeConfig& config() const noexcept override { return config_; }
  void read(const std::string& name, std::span<bf16> dst) const override {
    check_elements(readable(name, "weights.read"), dst.size(), "weights.read");
    fill(name, 0, dst.size(), reinterpret_cast<std::byte*>(dst.data()));
  }
  void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const override {
    check_expert(config_, moe_layer, expert, dst.size());
    const std::uint64_t m = std::uint64_t(config_.moe_intermediate_size) * config_.hidden_size;
    const std::uint32_t layer = model_layer(moe_layer);
    std::uint64_t at = 0;
    for (ExpertMatrix x : {ExpertMatrix::kW1, ExpertMatrix::kW3, ExpertMatrix::kW2}) {
      fill(expert_tensor_name(layer, expert, x), 0, m, dst.data() + at);
      at += 2 * m;
    }
  }

 protected:
  void read_block(const std::string& name, const Block& b, std::span<std::byte> dst) const override {
    for (std::uint64_t r = 0; r < b.rows; ++r)
      fill(name, (b.row0 + r) * b.row_len + b.col0, b.cols, dst.data() + r * b.cols * 2);
  }

 private:
  void fill(const std::string& name, std::uint64_t first, std::uint64_t n, std::byte* out) const noexcept {
    if (is_norm_weight(name))
      fill_ones(n, out);
    else
      fill_random(tensor_key(seed_, name), first, n, out);
  }

  HfMoeConfig config_;
  std::uint64_t seed_;
};

}  // namespace

HfMoeConfig hf_config_for(const ModelSpec& model, const std::string& field) {
  std::string known;
  for (const BuiltInConfig& b : kBuiltIn) known += (known.empty() ? "" : ", ") + std::string(b.name);
  for (const BuiltInConfig& b : kBuiltIn) {
    if (model.hf_id != b.hf_id && model.name != b.name) continue;
    HfMoeConfig c = parse_hf_moe_config(b.config_json, std::string("built-in config.json of ") + b.hf_id);
    // A model file may reuse a catalog name or hf_id with other shapes: random weights would not fit it.
    const ModelSpec s = c.to_model_spec(model.name);
    const std::pair<const char*, std::pair<std::uint64_t, std::uint64_t>> shapes[] = {
        {"num_layers", {model.num_layers, s.num_layers}},
        {"hidden_size", {model.hidden_size, s.hidden_size}},
        {"vocab_size", {model.vocab_size, s.vocab_size}},
        {"tie_word_embeddings", {model.tie_word_embeddings, s.tie_word_embeddings}},
        {"attention.kind", {std::uint64_t(model.attention), std::uint64_t(s.attention)}},
        {"attention.num_heads", {model.num_heads, s.num_heads}},
        {"attention.num_kv_heads", {model.num_kv_heads, s.num_kv_heads}},
        {"attention.head_dim", {model.head_dim, s.head_dim}},
        {"attention.qkv_bias", {model.qkv_bias, s.qkv_bias}},
        {"moe.num_experts", {model.num_experts, s.num_experts}},
        {"moe.top_k", {model.top_k, s.top_k}},
        {"moe.moe_intermediate_size", {model.moe_intermediate_size, s.moe_intermediate_size}},
        {"moe.num_shared_experts", {model.num_shared_experts, s.num_shared_experts}},
        {"moe.shared_expert_intermediate_size",
         {model.shared_expert_intermediate_size, s.shared_expert_intermediate_size}},
        {"moe.first_dense_layers", {model.first_dense_layers, s.first_dense_layers}},
        {"moe.dense_intermediate_size", {model.dense_intermediate_size, s.dense_intermediate_size}},
        {"linear_attention", {model.linear.has_value(), 0}},
        {"tensor_parallel", {model.tensor_parallel, 1}},
    };
    for (const auto& [what, v] : shapes)
      if (v.first != v.second)
        throw ConfigError(field, quote_text(model.name),
                          fmt::format("has {} = {} but {}'s config.json gives {}: random weights exist only "
                                      "for the built-in configs (known: {}); pass --weights DIR for another "
                                      "model",
                                      what, v.first, b.hf_id, v.second, known));
    return c;
  }
  throw ConfigError(field, quote_text(model.name),
                    "random weights exist only for the models whose config.json is built in (known: " +
                        known + "); pass --weights DIR for another model");
}

std::uint64_t WeightTensor::elements() const noexcept {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;
  return n;
}

void ModelWeights::init(const HfMoeConfig& c) {
  if (c.moe_intermediate_size == 0 || c.hidden_size == 0)
    throw_config_error("moe_intermediate_size", c.moe_intermediate_size,
                       "the weights need positive moe_intermediate_size and hidden_size");
  const std::uint64_t f = c.moe_intermediate_size, fs = c.shared_expert_intermediate_size;
  if (fs % f != 0)
    throw_config_error(
        "shared_expert_intermediate_size", fs,
        fmt::format("must be a multiple of moe_intermediate_size ({}): the shared expert is cut "
                    "into chunks of the routed experts' size",
                    f));
  shared_chunks_ = static_cast<std::uint32_t>(fs / f);
  expert_matrix_elements_ = f * c.hidden_size;
  tensors_.clear();
  readable_.clear();
  for (ExpectedTensor& e : expected_tensors(c, ExpertLayout::kPerExpert)) {
    if (e.name.find(".mlp.experts.") != std::string::npos) continue;  // routed: read_expert
    WeightTensor t{std::move(e.name), std::move(e.shape)};
    const bool shared = t.name.find(".mlp.shared_expert.") != std::string::npos;  // not shared_expert_gate
    if (!shared) tensors_.push_back(t);
    readable_.emplace(t.name, std::move(t));
  }
  moe_to_model_layer_.clear();
  for (std::uint32_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l)) moe_to_model_layer_.push_back(l);
}

std::uint64_t ModelWeights::tensor_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const WeightTensor& t : tensors_) n += t.bytes();
  return n;
}

std::uint32_t ModelWeights::model_layer(std::uint32_t moe_layer) const noexcept {
  return moe_layer < moe_to_model_layer_.size() ? moe_to_model_layer_[moe_layer] : ~std::uint32_t{0};
}

const WeightTensor& ModelWeights::readable(const std::string& name, const char* field) const {
  const auto it = readable_.find(name);
  if (it == readable_.end())
    throw ConfigError(field, quote_text(name),
                      "is not a tensor these weights read by name (a tensor of tensors() or a shared "
                      "expert's gate/up/down_proj; routed experts come from read_expert)");
  return it->second;
}

void ModelWeights::read_shared_chunk(std::uint32_t moe_layer, std::uint32_t chunk,
                                     std::span<std::byte> dst) const {
  const HfMoeConfig& c = config();
  const std::uint64_t f = c.moe_intermediate_size, h = c.hidden_size, m = expert_matrix_elements_ * 2;
  if (moe_layer >= moe_to_model_layer_.size() || chunk >= shared_chunks_ || dst.size() != 3 * m)
    throw ConfigError("weights.read_shared_chunk",
                      fmt::format("({}, {}) into {} bytes", moe_layer, chunk, dst.size()),
                      fmt::format("needs a MoE layer < {}, a chunk < {} and {} bytes",
                                  moe_to_model_layer_.size(), shared_chunks_, 3 * m));
  const std::string p = fmt::format("model.layers.{}.mlp.shared_expert.", model_layer(moe_layer));
  // W1 and W3: rows [iF, (i+1)F) of [Fs, H]; W2: columns [iF, (i+1)F) of [H, Fs].
  read_block(p + "gate_proj.weight", Block{h, chunk * f, f, 0, h}, dst.first(m));
  read_block(p + "up_proj.weight", Block{h, chunk * f, f, 0, h}, dst.subspan(m, m));
  read_block(p + "down_proj.weight", Block{c.shared_expert_intermediate_size, 0, h, chunk * f, f},
             dst.subspan(2 * m, m));
}

void ModelWeights::read_block(const std::string& name, const Block& b, std::span<std::byte> dst) const {
  std::vector<bf16> all(readable(name, "weights.read_block").elements());
  read(name, all);
  for (std::uint64_t r = 0; r < b.rows; ++r)
    std::memcpy(dst.data() + r * b.cols * 2, all.data() + (b.row0 + r) * b.row_len + b.col0, b.cols * 2);
}

std::unique_ptr<ModelWeights> checkpoint_weights(const Checkpoint& ck) {
  return std::make_unique<CheckpointWeights>(ck);
}

std::unique_ptr<ModelWeights> random_weights(const HfMoeConfig& config, std::uint64_t seed) {
  return std::make_unique<RandomWeights>(config, seed);
}

std::unique_ptr<ModelWeights> serving_weights(const HfMoeConfig& config, const std::string& checkpoint_dir,
                                              std::uint64_t seed) {
  return checkpoint_dir.empty() ? random_weights(config, seed)
                                : checkpoint_weights(open_checkpoint(checkpoint_dir));
}

std::int32_t synthetic_prompt_token(std::uint64_t seed, std::uint32_t vocab, std::uint64_t request,
                                    std::uint32_t position) noexcept {
  std::uint64_t h = mix64(seed ^ 0x70726f6d70747321ull);  // "prompts!": apart from the weights' keys
  h = mix64(h + (request + 1) * kGolden);
  h = mix64(h ^ (std::uint64_t{position} * 0xd1b54a32d192ed03ull + kGolden));
  // The top 32 bits scaled to [0, vocab): uniform to within vocab / 2^32 (3.5e-5 for a 151936-token vocab).
  return static_cast<std::int32_t>(((h >> 32) * vocab) >> 32);
}

}  // namespace amoeba::engine
