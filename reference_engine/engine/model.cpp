// Model catalog parsing and derived sizes; see model.hpp.
#include "engine/model.hpp"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/embedded_data.hpp"
#include "engine/json_fields.hpp"
#include "moe/quant_layout.hpp"

namespace amoeba::engine {

std::string_view to_string(ExpertPrecision p) noexcept {
  switch (p) {
    case ExpertPrecision::kBf16:
      return "bf16";
    case ExpertPrecision::kInt8:
      return "int8";
    case ExpertPrecision::kInt4:
      return "int4";
  }
  return "?";
}

ExpertPrecision expert_precision_from_string(const std::string& s, const std::string& field) {
  for (ExpertPrecision p : {ExpertPrecision::kBf16, ExpertPrecision::kInt8, ExpertPrecision::kInt4})
    if (s == to_string(p)) return p;
  throw ConfigError(field, s, "must be bf16, int8 or int4");
}

namespace {
std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}
std::uint64_t round_up(std::uint64_t a, std::uint64_t b) {
  return ceil_div(a, b) * b;
}

// The quantized sizes are those of the packed layout the kernels read (moe/quant_layout.hpp).
static_assert(ModelSpec::kQuantGroup == kernels::quant::kGroup);
kernels::quant::ExpertLayout quant_layout(const ModelSpec& m) {
  return kernels::quant::expert_layout(m.moe_intermediate_size, m.hidden_size,
                                       m.expert_precision == ExpertPrecision::kInt8
                                           ? kernels::quant::Bits::kInt8
                                           : kernels::quant::Bits::kInt4);
}
}  // namespace

std::uint64_t ModelSpec::expert_scale_bytes() const noexcept {
  if (expert_precision == ExpertPrecision::kBf16) return 0;
  // W1, W3: F rows of K = H; W2: H rows of K = F. One bf16 scale per kQuantGroup values along K.
  const kernels::quant::ExpertLayout l = quant_layout(*this);
  return std::max(l.w13.scale_bytes(), l.w2.scale_bytes());
}

std::uint64_t ModelSpec::expert_page_payload_bytes() const noexcept {
  if (expert_precision == ExpertPrecision::kBf16)
    return std::uint64_t(moe_intermediate_size) * hidden_size * 2;
  return quant_layout(*this).matrix_bytes();
}

std::uint64_t ModelSpec::expert_page_bytes() const noexcept {
  const std::uint64_t p = expert_page_payload_bytes();
  if (expert_precision == ExpertPrecision::kBf16) return p;
  // A quantized payload is rarely a power of two times a small factor, so a KV page that divides it may need
  // much padding (DESIGN §3.1's rule for MLA). Padding the expert page to a multiple of the KV page instead
  // costs (page - payload) per expert page; take whichever wastes the smaller fraction.
  const std::uint64_t kv = 16 * kv_bytes_per_token_layer();
  const std::uint64_t kv_page = p % kv == 0 ? kv : smallest_divisor_at_least(p, kv);
  const std::uint64_t padded = round_up(p, kv);
  if (kv_page == 0) return padded;
  const double kv_waste = double(kv_page - kv) / double(kv_page);
  const double expert_waste = double(padded - p) / double(padded);
  return expert_waste < kv_waste ? padded : p;
}

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
  g.expert_payload_bytes = m.expert_page_payload_bytes();
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
    // The large page is lcm(expert page, SSM page) (DESIGN §3.1); a bf16 catalog model has one dividing the
    // other. A quantized or sharded expert page may not: keep the large page a modest multiple of both.
    const std::uint64_t large = std::lcm(g.expert_page_bytes, g.ssm_page_bytes);
    if (large > PageGeometry::kMaxLargePageBytes)
      throw_config_error("model " + m.name + ".large_page_bytes", large,
                         "lcm of the expert page (" + std::to_string(g.expert_page_bytes) +
                             " B) and the SSM page (" + std::to_string(g.ssm_page_bytes) +
                             " B) must be at most " + std::to_string(PageGeometry::kMaxLargePageBytes) +
                             " B");
  }
  return g;
}

ModelSpec shard_model(const ModelSpec& m, std::uint32_t tp, ExpertPrecision precision,
                      const std::string& field) {
  if (tp == 0) throw ConfigError(field, "0", "must be at least 1");
  ModelSpec s = m;
  s.expert_precision = precision;
  if (tp == 1) {
    (void)page_geometry(s);
    return s;
  }
  const std::string what = "model " + m.name;
  auto split = [&](std::uint32_t v, const char* name) {
    if (v % tp != 0)
      throw ConfigError(
          field, std::to_string(tp),
          what + "." + name + " = " + std::to_string(v) + " must be a multiple of the GPU count");
    return v / tp;
  };
  s.tensor_parallel = tp;
  s.full_vocab_size = m.vocab_size;
  s.vocab_size = static_cast<std::uint32_t>(ceil_div(m.vocab_size, tp));  // vocab-parallel embedding, LM head
  s.num_heads = split(m.num_heads, "num_heads");
  if (m.attention == AttentionKind::kGqa) {
    if (m.num_kv_heads % tp != 0 && tp % m.num_kv_heads != 0)
      throw ConfigError(field, std::to_string(tp),
                        what + ".num_kv_heads = " + std::to_string(m.num_kv_heads) +
                            " must be a multiple or a divisor of the GPU count");
    s.num_kv_heads = std::max<std::uint32_t>(1, m.num_kv_heads / tp);  // replicated when tp > kv heads
  }
  s.moe_intermediate_size = split(m.moe_intermediate_size, "moe_intermediate_size");
  s.shared_expert_intermediate_size =
      split(m.shared_expert_intermediate_size, "shared_expert_intermediate_size");
  s.dense_intermediate_size = split(m.dense_intermediate_size, "dense_intermediate_size");
  if (s.linear) {
    s.linear->num_key_heads = split(m.linear->num_key_heads, "linear_attention.num_key_heads");
    s.linear->num_value_heads = split(m.linear->num_value_heads, "linear_attention.num_value_heads");
  }
  if (s.expert_page_payload_bytes() % 16 != 0)
    throw ConfigError(field, std::to_string(tp),
                      what + ": one GPU's expert page (" + std::to_string(s.expert_page_payload_bytes()) +
                          " B) must be a multiple of 16 bytes");
  (void)page_geometry(s);
  return s;
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
