// Model catalog parsing and derived sizes; see model.hpp.
#include "engine/model.hpp"

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/embedded_data.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

std::uint32_t ModelSpec::attention_layers() const noexcept {
  if (!linear) return num_layers;
  std::uint32_t n = 0;
  for (std::uint32_t l = 0; l < num_layers; ++l) n += has_full_attention(l);
  return n;
}

std::uint64_t ModelSpec::kv_bytes_per_token_layer() const noexcept {
  if (attention == AttentionKind::kMla) return std::uint64_t(kv_lora_rank + qk_rope_head_dim) * 2;
  return 2ull * num_kv_heads * head_dim * 2;
}

std::uint64_t ModelSpec::ssm_state_bytes() const noexcept {
  if (!linear) return 0;
  return std::uint64_t(linear->num_value_heads) * linear->key_head_dim * linear->value_head_dim *
         linear->state_bytes_per_value;
}
std::uint64_t ModelSpec::conv_state_bytes() const noexcept {
  if (!linear) return 0;
  const std::uint64_t conv_dim = 2ull * linear->num_key_heads * linear->key_head_dim +
                                 std::uint64_t(linear->num_value_heads) * linear->value_head_dim;
  return (linear->conv_kernel_size - 1ull) * conv_dim * 2;
}

std::uint64_t ModelSpec::routed_expert_params() const noexcept {
  return std::uint64_t(moe_layers()) * num_experts * 3 * moe_intermediate_size * hidden_size;
}

std::uint64_t ModelSpec::attention_params(std::uint32_t layer) const noexcept {
  const std::uint64_t h = hidden_size;
  if (!has_full_attention(layer)) {  // Gated DeltaNet (Qwen3-Next): qkvz + ba in, conv, out
    const std::uint64_t kd = std::uint64_t(linear->num_key_heads) * linear->key_head_dim;
    const std::uint64_t vd = std::uint64_t(linear->num_value_heads) * linear->value_head_dim;
    return h * (2 * kd + 2 * vd) + h * 2 * linear->num_value_heads +
           (2 * kd + vd) * linear->conv_kernel_size + vd * h + 2ull * linear->num_value_heads +
           linear->value_head_dim;
  }
  if (attention == AttentionKind::kMla) {  // q_lora_rank = null (DeepSeek-V2-Lite)
    const std::uint64_t nh = num_heads;
    return h * nh * (qk_nope_head_dim + qk_rope_head_dim) + h * (kv_lora_rank + qk_rope_head_dim) +
           kv_lora_rank + std::uint64_t(kv_lora_rank) * nh * (qk_nope_head_dim + v_head_dim) +
           nh * v_head_dim * h;
  }
  const std::uint64_t q = std::uint64_t(num_heads) * head_dim, kv = std::uint64_t(num_kv_heads) * head_dim;
  return h * q * (output_gate ? 2 : 1) + 2 * h * kv + q * h + (qkv_bias ? q + 2 * kv : 0);
}

std::uint64_t ModelSpec::shared_and_router_params() const noexcept {
  const std::uint64_t h = hidden_size;
  return h * num_experts + 3 * h * shared_expert_intermediate_size * num_shared_experts +
         (num_shared_experts > 0 ? h : 0);
}

std::uint64_t ModelSpec::non_expert_params() const noexcept {
  const std::uint64_t h = hidden_size;
  std::uint64_t p = std::uint64_t(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + h;
  for (std::uint32_t l = 0; l < num_layers; ++l) {
    p += 2 * h + attention_params(l);
    p += l < first_dense_layers ? 3 * h * dense_intermediate_size : shared_and_router_params();
  }
  return p;
}

PageGeometry page_geometry(const ModelSpec& m) {
  PageGeometry g;
  g.expert_page_bytes = m.expert_page_bytes();
  g.kv_payload_bytes = PageGeometry::kTokensPerKvPage * m.kv_bytes_per_token_layer();
  g.kv_page_bytes = g.expert_page_bytes % g.kv_payload_bytes == 0
                        ? g.kv_payload_bytes
                        : smallest_divisor_at_least(g.expert_page_bytes, g.kv_payload_bytes);
  if (g.kv_page_bytes == 0)
    throw_config_error("model " + m.name + ".kv_page_bytes", g.kv_payload_bytes,
                       "no divisor of the expert page (" + std::to_string(g.expert_page_bytes) +
                           " bytes) is at least this large");
  if (m.linear) {
    g.ssm_page_bytes = m.ssm_state_bytes();
    g.conv_payload_bytes = m.conv_state_bytes();
    g.conv_page_bytes = g.expert_page_bytes % g.conv_payload_bytes == 0
                            ? g.conv_payload_bytes
                            : smallest_divisor_at_least(g.expert_page_bytes, g.conv_payload_bytes);
    if (g.conv_page_bytes == 0)
      throw_config_error("model " + m.name + ".conv_page_bytes", g.conv_payload_bytes,
                         "no divisor of the expert page is at least this large");
  }
  return g;
}

ModelSpec parse_model(std::string_view json_text, const std::string& what) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  o.reject_unknown({"name", "hf_id", "source", "num_layers", "hidden_size", "vocab_size",
                    "tie_word_embeddings", "attention", "moe", "linear_attention"});
  ModelSpec m;
  constexpr std::uint64_t kBig = 1u << 20;
  m.name = o.get_string("name");
  if (m.name.empty()) throw ConfigError(what + ".name", "\"\"", "must not be empty");
  m.hf_id = o.get_string_or("hf_id", "");
  m.source = o.get_string_or("source", "");
  m.num_layers = static_cast<std::uint32_t>(o.get_uint("num_layers", 1, 1024));
  m.hidden_size = static_cast<std::uint32_t>(o.get_uint("hidden_size", 16, kBig));
  m.vocab_size = static_cast<std::uint32_t>(o.get_uint("vocab_size", 1, 1u << 24));
  m.tie_word_embeddings = o.get_bool_or("tie_word_embeddings", false);

  const JsonObject a = o.get_object("attention");
  a.reject_unknown({"kind", "num_heads", "num_kv_heads", "head_dim", "qkv_bias", "output_gate",
                    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"});
  const std::string kind = a.get_string("kind");
  if (kind == "gqa") {
    m.attention = AttentionKind::kGqa;
  } else if (kind == "mla") {
    m.attention = AttentionKind::kMla;
  } else {
    throw ConfigError(a.path() + ".kind", quote_text(kind), "must be \"gqa\" or \"mla\"");
  }
  m.num_heads = static_cast<std::uint32_t>(a.get_uint("num_heads", 1, 4096));
  m.num_kv_heads = static_cast<std::uint32_t>(a.get_uint("num_kv_heads", 1, m.num_heads));
  m.head_dim = static_cast<std::uint32_t>(a.get_uint("head_dim", 8, 4096));
  m.qkv_bias = a.get_bool_or("qkv_bias", false);
  m.output_gate = a.get_bool_or("output_gate", false);
  if (m.attention == AttentionKind::kMla) {
    m.kv_lora_rank = static_cast<std::uint32_t>(a.get_uint("kv_lora_rank", 1, kBig));
    m.qk_rope_head_dim = static_cast<std::uint32_t>(a.get_uint("qk_rope_head_dim", 1, 4096));
    m.qk_nope_head_dim = static_cast<std::uint32_t>(a.get_uint("qk_nope_head_dim", 1, 4096));
    m.v_head_dim = static_cast<std::uint32_t>(a.get_uint("v_head_dim", 1, 4096));
  }

  const JsonObject e = o.get_object("moe");
  e.reject_unknown({"num_experts", "top_k", "moe_intermediate_size", "num_shared_experts",
                    "shared_expert_intermediate_size", "first_dense_layers", "dense_intermediate_size"});
  m.num_experts = static_cast<std::uint32_t>(e.get_uint("num_experts", 1, 65536));
  m.top_k = static_cast<std::uint32_t>(e.get_uint("top_k", 1, m.num_experts));
  m.moe_intermediate_size = static_cast<std::uint32_t>(e.get_uint("moe_intermediate_size", 8, kBig));
  m.num_shared_experts = static_cast<std::uint32_t>(e.get_uint_or("num_shared_experts", 0, 0, 64));
  m.shared_expert_intermediate_size =
      static_cast<std::uint32_t>(e.get_uint_or("shared_expert_intermediate_size", 0, 0, kBig));
  m.first_dense_layers =
      static_cast<std::uint32_t>(e.get_uint_or("first_dense_layers", 0, 0, m.num_layers - 1u));
  m.dense_intermediate_size =
      static_cast<std::uint32_t>(e.get_uint_or("dense_intermediate_size", 0, 0, kBig));
  if (m.expert_page_bytes() % 16 != 0)
    throw_config_error(what + ".moe.moe_intermediate_size", m.moe_intermediate_size,
                       "expert page (intermediate x hidden x 2 B) must be a multiple of 16 bytes");

  if (!o.is_null("linear_attention")) {
    const JsonObject l = o.get_object("linear_attention");
    l.reject_unknown({"full_attention_interval", "num_key_heads", "num_value_heads", "key_head_dim",
                      "value_head_dim", "conv_kernel_size", "state_bytes_per_value"});
    LinearAttentionSpec s;
    s.full_attention_interval =
        static_cast<std::uint32_t>(l.get_uint("full_attention_interval", 1, m.num_layers));
    s.num_key_heads = static_cast<std::uint32_t>(l.get_uint("num_key_heads", 1, 4096));
    s.num_value_heads = static_cast<std::uint32_t>(l.get_uint("num_value_heads", 1, 4096));
    s.key_head_dim = static_cast<std::uint32_t>(l.get_uint("key_head_dim", 1, 4096));
    s.value_head_dim = static_cast<std::uint32_t>(l.get_uint("value_head_dim", 1, 4096));
    s.conv_kernel_size = static_cast<std::uint32_t>(l.get_uint("conv_kernel_size", 2, 64));
    s.state_bytes_per_value = static_cast<std::uint32_t>(l.get_uint_or("state_bytes_per_value", 2, 1, 8));
    m.linear = s;
    if (m.expert_page_bytes() % m.ssm_state_bytes() != 0 && m.ssm_state_bytes() % m.expert_page_bytes() != 0)
      throw_config_error(what + ".linear_attention", m.ssm_state_bytes(),
                         "SSM state bytes must divide or be a multiple of the expert page (" +
                             std::to_string(m.expert_page_bytes()) + " bytes)");
  }
  (void)page_geometry(m);  // checks that the pages nest
  return m;
}

const std::vector<ModelSpec>& model_catalog() {
  static const std::vector<ModelSpec> catalog = [] {
    std::vector<ModelSpec> v;
    for (const EmbeddedFile& f : embedded_model_files())
      v.push_back(parse_model(f.text, "model file " + std::string(f.name)));
    return v;
  }();
  return catalog;
}

ModelSpec find_model(const std::string& name_or_path) {
  if (name_or_path.size() > 5 && name_or_path.ends_with(".json"))
    return parse_model(read_text_file(name_or_path, "--model", kMaxConfigFileBytes), name_or_path);
  std::string known;
  for (const ModelSpec& m : model_catalog()) {
    if (m.name == name_or_path) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  throw ConfigError("--model", quote_text(name_or_path),
                    "unknown model (known: " + known + ", or a path to a .json file)");
}

}  // namespace amoeba::engine
