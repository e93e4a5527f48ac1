// Hugging Face MoE checkpoints; see checkpoint.hpp.
#include "engine/checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

namespace {

// config.json fields through JsonObject (types, bounded quotes), with transformers' habit of writing null for
// "not set": a null or missing key takes the fallback.
std::uint32_t get_u32(const JsonObject& o, const char* key, std::uint32_t lo, std::uint32_t hi,
                      std::optional<std::uint32_t> fallback = std::nullopt) {
  if (o.is_null(key) && fallback) return *fallback;
  const std::uint64_t v = o.get_uint(key, 0, ~std::uint64_t{0});  // "(missing): is required" when no fallback
  if (v < lo || v > hi)
    throw ConfigError(o.path() + "." + key, std::to_string(v),
                      fmt::format("must be an integer in [{}, {}]", lo, hi));
  return static_cast<std::uint32_t>(v);
}

bool get_bool(const JsonObject& o, const char* key, bool fallback) {
  return o.is_null(key) ? fallback : o.get_bool(key);
}

double get_double(const JsonObject& o, const char* key, double fallback, double lo, double hi) {
  return o.is_null(key) ? fallback : o.get_double(key, lo, hi);
}

std::string shape_text(const std::vector<std::uint64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace

bool HfMoeConfig::is_moe_layer(std::uint32_t layer) const noexcept {
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

std::uint32_t HfMoeConfig::moe_layers() const noexcept {
  std::uint32_t n = 0;
  for (std::uint32_t l = 0; l < num_layers; ++l) n += is_moe_layer(l);
  return n;
}

ModelSpec HfMoeConfig::to_model_spec(const std::string& name) const {
  ModelSpec m;
  m.name = name;
  m.source = "config.json of a " + architecture + " checkpoint";
  m.num_layers = num_layers;
  m.hidden_size = hidden_size;
  m.vocab_size = vocab_size;
  m.tie_word_embeddings = tie_word_embeddings;
  m.attention = AttentionKind::kGqa;
  m.num_heads = num_heads;
  m.num_kv_heads = num_kv_heads;
  m.head_dim = head_dim;
  m.qkv_bias = qkv_bias;
  m.num_experts = num_experts;
  m.top_k = top_k;
  m.moe_intermediate_size = moe_intermediate_size;
  m.num_shared_experts = shared_expert_intermediate_size > 0 ? 1 : 0;
  m.shared_expert_intermediate_size = shared_expert_intermediate_size;
  // The engine's model has its dense layers first (DeepSeek's first_k_dense_replace); Qwen's may sit
  // anywhere.
  std::uint32_t dense = 0;
  while (dense < num_layers && !is_moe_layer(dense)) ++dense;
  for (std::uint32_t l = dense; l < num_layers; ++l)
    if (!is_moe_layer(l))
      throw_config_error(
          "config.mlp_only_layers", l,
          "dense layers after the first MoE layer are not supported (dense layers must come first)");
  m.first_dense_layers = dense;
  m.dense_intermediate_size = dense > 0 ? intermediate_size : 0;
  return m;
}

HfMoeConfig parse_hf_moe_config(std::string_view text, const std::string& what) {
  const nlohmann::json j = parse_json_text(text, what);
  if (!j.is_object()) throw ConfigError(what, j.type_name(), "must be a JSON object");
  const JsonObject o(j, what);
  HfMoeConfig c;
  const auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string())
    throw ConfigError(what + ".architectures", arch == j.end() ? "(missing)" : quote_json(*arch),
                      "must name one architecture: Qwen2MoeForCausalLM or Qwen3MoeForCausalLM");
  c.architecture = (*arch)[0].get<std::string>();
  if (c.architecture == "Qwen2MoeForCausalLM")
    c.arch = MoeArchitecture::kQwen2Moe;
  else if (c.architecture == "Qwen3MoeForCausalLM")
    c.arch = MoeArchitecture::kQwen3Moe;
  else
    throw ConfigError(what + ".architectures", quote_text(c.architecture),
                      "is not served by the GPU backend (known: Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)");
  const bool q2 = c.arch == MoeArchitecture::kQwen2Moe;
  c.hidden_size = get_u32(o, "hidden_size", 1, 1u << 16);
  c.num_layers = get_u32(o, "num_hidden_layers", 1, 1024);
  c.num_heads = get_u32(o, "num_attention_heads", 1, 1024);
  c.num_kv_heads = get_u32(o, "num_key_value_heads", 1, c.num_heads, c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    throw_config_error(what + ".num_key_value_heads", c.num_kv_heads,
                       fmt::format("must divide num_attention_heads ({})", c.num_heads));
  // Qwen2-MoE derives the head size; Qwen3-MoE states it (128 with hidden 2048 and 32 heads).
  if (!o.is_null("head_dim"))
    c.head_dim = get_u32(o, "head_dim", 1, 1024);
  else if (c.hidden_size % c.num_heads == 0)
    c.head_dim = c.hidden_size / c.num_heads;
  else
    throw_config_error(
        what + ".head_dim", "(missing)",
        fmt::format("is required when num_attention_heads ({}) does not divide hidden_size ({})", c.num_heads,
                    c.hidden_size));
  c.vocab_size = get_u32(o, "vocab_size", 1, 1u << 24);
  c.intermediate_size = get_u32(o, "intermediate_size", 1, 1u << 20, 1);
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts.
  c.num_experts = get_u32(o, j.contains("num_experts") ? "num_experts" : "num_local_experts", 1, 1u << 16);
  c.top_k = get_u32(o, "num_experts_per_tok", 1, c.num_experts);
  c.moe_intermediate_size = get_u32(o, "moe_intermediate_size", 1, 1u << 20);
  if (q2) c.shared_expert_intermediate_size = get_u32(o, "shared_expert_intermediate_size", 0, 1u << 20);
  c.decoder_sparse_step = get_u32(o, "decoder_sparse_step", 1, c.num_layers, 1);
  if (const auto m = j.find("mlp_only_layers"); m != j.end() && !m->is_null()) {
    if (!m->is_array()) throw ConfigError(what + ".mlp_only_layers", quote_json(*m), "must be an array");
    for (const auto& v : *m) {
      if (!v.is_number_unsigned() || v.get<std::uint64_t>() >= c.num_layers)
        throw ConfigError(what + ".mlp_only_layers", quote_json(v),
                          fmt::format("entries must be layer indices below {}", c.num_layers));
      c.mlp_only_layers.push_back(static_cast<std::uint32_t>(v.get<std::uint64_t>()));
    }
  }
  c.norm_topk_prob = get_bool(o, "norm_topk_prob", !q2);
  c.tie_word_embeddings = get_bool(o, "tie_word_embeddings", false);
  c.qkv_bias = q2 ? get_bool(o, "qkv_bias", true) : get_bool(o, "attention_bias", false);
  c.qk_norm = !q2;
  c.rms_norm_eps = get_double(o, "rms_norm_eps", 1e-6, 1e-12, 1e-2);
  c.rope_theta = get_double(o, "rope_theta", 10000.0, 1.0, 1e12);
  // transformers 5 writes RoPE settings as an object ("rope_parameters"; older: "rope_scaling"); only the
  // default (unscaled) RoPE is served.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) throw ConfigError(what + "." + key, quote_json(*it), "must be an object");
    std::string type = "default";
    for (const char* name : {"type", "rope_type"})  // rope_type wins when both are given
      if (const auto t = it->find(name); t != it->end()) {
        if (!t->is_string())
          throw ConfigError(what + "." + key + "." + name, quote_json(*t), "must be a string");
        type = t->get<std::string>();
      }
    if (type != "default")
      throw ConfigError(what + "." + key + ".rope_type", quote_text(type),
                        "only the default RoPE is supported");
    if (!j.contains("rope_theta"))
      c.rope_theta = get_double(JsonObject(*it, what + "." + key), "rope_theta", 10000.0, 1.0, 1e12);
  }
  if (c.moe_layers() == 0)
    throw_config_error(what + ".num_experts", c.num_experts, "no layer is a MoE layer");
  return c;
}

std::string expert_tensor_name(std::uint32_t layer, std::uint32_t expert, ExpertMatrix m) {
  const char* proj = m == ExpertMatrix::kW1 ? "gate_proj" : m == ExpertMatrix::kW3 ? "up_proj" : "down_proj";
  return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, proj);
}

std::vector<ExpectedTensor> expected_tensors(const HfMoeConfig& c, ExpertLayout layout) {
  using S = std::vector<std::uint64_t>;
  const std::uint64_t h = c.hidden_size, q = std::uint64_t(c.num_heads) * c.head_dim,
                      kv = std::uint64_t(c.num_kv_heads) * c.head_dim, f = c.moe_intermediate_size;
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", S{c.vocab_size, h}});
  for (std::uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({p + "input_layernorm.weight", S{h}});
    out.push_back({p + "post_attention_layernorm.weight", S{h}});
    out.push_back({p + "self_attn.q_proj.weight", S{q, h}});
    out.push_back({p + "self_attn.k_proj.weight", S{kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", S{kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", S{h, q}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", S{q}});
      out.push_back({p + "self_attn.k_proj.bias", S{kv}});
      out.push_back({p + "self_attn.v_proj.bias", S{kv}});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", S{c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", S{c.head_dim}});
    }
    if (!c.is_moe_layer(l)) {
      out.push_back({p + "mlp.gate_proj.weight", S{c.intermediate_size, h}});
      out.push_back({p + "mlp.up_proj.weight", S{c.intermediate_size, h}});
      out.push_back({p + "mlp.down_proj.weight", S{h, c.intermediate_size}});
      continue;
    }
    out.push_back({p + "mlp.gate.weight", S{c.num_experts, h}});
    if (layout == ExpertLayout::kFused) {
      out.push_back({p + "mlp.experts.gate_up_proj", S{c.num_experts, 2 * f, h}});
      out.push_back({p + "mlp.experts.down_proj", S{c.num_experts, h, f}});
    } else {
      for (std::uint32_t e = 0; e < c.num_experts; ++e) {
        out.push_back({expert_tensor_name(l, e, ExpertMatrix::kW1), S{f, h}});
        out.push_back({expert_tensor_name(l, e, ExpertMatrix::kW3), S{f, h}});
        out.push_back({expert_tensor_name(l, e, ExpertMatrix::kW2), S{h, f}});
      }
    }
    if (c.shared_expert_intermediate_size > 0) {
      const std::uint64_t fs = c.shared_expert_intermediate_size;
      out.push_back({p + "mlp.shared_expert.gate_proj.weight", S{fs, h}});
      out.push_back({p + "mlp.shared_expert.up_proj.weight", S{fs, h}});
      out.push_back({p + "mlp.shared_expert.down_proj.weight", S{h, fs}});
      out.push_back({p + "mlp.shared_expert_gate.weight", S{1, h}});
    }
  }
  out.push_back({"model.norm.weight", S{h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", S{c.vocab_size, h}});
  return out;
}

std::uint32_t Checkpoint::model_layer(std::uint32_t moe_layer) const noexcept {
  std::uint32_t l = 0;
  while (!config.is_moe_layer(l)) ++l;
  return l + moe_layer;
}

void Checkpoint::read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const {
  const std::uint64_t m = std::uint64_t(config.moe_intermediate_size) * config.hidden_size * 2;
  if (moe_layer >= config.moe_layers() || expert >= config.num_experts || dst.size() != 3 * m)
    throw ConfigError("checkpoint.read_expert",
                      fmt::format("({}, {}) into {} bytes", moe_layer, expert, dst.size()),
                      fmt::format("needs a MoE layer < {}, an expert < {} and {} bytes", config.moe_layers(),
                                  config.num_experts, 3 * m));
  const std::uint32_t l = model_layer(moe_layer);
  std::size_t j = 0;
  for (ExpertMatrix x : {ExpertMatrix::kW1, ExpertMatrix::kW3, ExpertMatrix::kW2}) {
    const ExpertSlice s = expert_slice(l, expert, x);
    shard(s.tensor).read_range(s.tensor, s.offset, dst.subspan(j * m, m));
    ++j;
  }
}

const TensorInfo& Checkpoint::tensor(const std::string& name) const {
  return *shard(name).find(name);
}

ExpertSlice Checkpoint::expert_slice(std::uint32_t layer, std::uint32_t expert, ExpertMatrix m) const {
  const std::uint64_t matrix = std::uint64_t(config.moe_intermediate_size) * config.hidden_size * 2;
  if (layout == ExpertLayout::kPerExpert) return {expert_tensor_name(layer, expert, m), 0, matrix};
  const std::string p = fmt::format("model.layers.{}.mlp.experts.", layer);
  if (m == ExpertMatrix::kW2) return {p + "down_proj", expert * matrix, matrix};
  return {p + "gate_up_proj", (2 * std::uint64_t(expert) + (m == ExpertMatrix::kW3 ? 1 : 0)) * matrix,
          matrix};
}

Checkpoint open_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError("--weights", dir, "must be a checkpoint directory");
  Checkpoint ck;
  ck.dir = dir;
  const fs::path root(dir);
  const std::string at = "checkpoint " + dir;
  ck.config = parse_hf_moe_config(read_text_file((root / "config.json").string(), "--weights"),
                                  (root / "config.json").string());
  // Shards: the index's files when there is an index, else every *.safetensors in the directory.
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const nlohmann::json j = parse_json_text(read_text_file(index.string(), "--weights"), index.string());
    const auto wm = j.is_object() ? j.find("weight_map") : j.end();
    if (!j.is_object() || wm == j.end() || !wm->is_object())
      throw_config_error(index.string() + ".weight_map", "(missing)", "must map tensor names to shard files");
    std::set<std::string> seen;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos)
        throw ConfigError(index.string() + ".weight_map." + quote_text(it.key()), quote_json(*it),
                          "must be a shard file name in the checkpoint directory");
      weight_map[it.key()] = it->get<std::string>();
      if (seen.insert(it->get<std::string>()).second) files.push_back(it->get<std::string>());
    }
  } else {
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) throw ConfigError(at, "(no shards)", "holds no *.safetensors file");
  for (const std::string& f : files) {
    ck.shards.push_back(SafetensorsFile::open((root / f).string()));
    const std::size_t i = ck.shards.size() - 1;
    for (const auto& [name, info] : ck.shards.back().tensors()) {
      const auto [it, fresh] = ck.shard_of.emplace(name, i);
      if (!fresh)
        throw ConfigError(at + ": tensor " + quote_text(name), quote_text(f),
                          "is stored twice (also in " + quote_text(files[it->second]) + ")");
    }
  }
  for (const auto& [name, file] : weight_map) {
    const auto it = ck.shard_of.find(name);
    if (it == ck.shard_of.end() || files[it->second] != file)
      throw ConfigError(at + ": tensor " + quote_text(name), quote_text(file),
                        it == ck.shard_of.end()
                            ? "is in the index but in no shard"
                            : "is in the index under another shard than the one holding it");
  }
  // The experts' layout: fused when the first MoE layer has the fused tensor (then every MoE layer must).
  std::uint32_t first_moe = 0;
  while (!ck.config.is_moe_layer(first_moe)) ++first_moe;
  if (ck.shard_of.count(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", first_moe)))
    ck.layout = ExpertLayout::kFused;
  std::set<std::string> needed;
  for (const ExpectedTensor& e : expected_tensors(ck.config, ck.layout)) {
    needed.insert(e.name);
    const auto it = ck.shard_of.find(e.name);
    if (it == ck.shard_of.end())
      throw ConfigError(
          at + ": tensor " + e.name, "(missing)",
          fmt::format("is required by {} (shape {}, BF16)", ck.config.architecture, shape_text(e.shape)));
    const TensorInfo& t = *ck.shards[it->second].find(e.name);
    if (t.dtype != TensorDtype::kBF16)
      throw ConfigError(at + ": tensor " + e.name + ": dtype", to_string(t.dtype), "expected BF16");
    if (t.shape != e.shape)
      throw ConfigError(at + ": tensor " + e.name + ": shape", shape_text(t.shape),
                        "expected " + shape_text(e.shape));
  }
  for (const auto& [name, i] : ck.shard_of)
    if (!needed.count(name)) ck.unused.push_back(name);
  return ck;
}

}  // namespace amoeba::engine
