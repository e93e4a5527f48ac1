// Tensor parallelism's host side (engine/tp_shard.hpp): per-rank shapes and their validation for the
// catalog's Qwen MoE models, agreement with the simulator's shard_model, every sharded read element-equal to
// the whole tensor's elements it stands for, the ranks' partial outputs summing to the whole model's,
// per-rank bytes, and the change-list digest the ranks compare.
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/core/bf16.hpp"
#include "amoeba/core/errors.hpp"
#include "checkpoint_files.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/model_weights.hpp"
#include "engine/tp_shard.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

// H 256, 4 heads of 64, 2 KV heads, F 128, Fs 256 (two chunks), E 8; layer 0 dense (intermediate 512).
const char* kQwen2Small = R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 256,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
  "intermediate_size": 512, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
  "shared_expert_intermediate_size": 256, "mlp_only_layers": [0], "norm_topk_prob": false})";
// Qwen3-MoE's q_norm/k_norm, no biases, no shared expert; 2 KV heads, so tp 4 replicates them.
const char* kQwen3Small = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
  "vocab_size": 320, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
  "norm_topk_prob": true})";

HfMoeConfig parse(const char* json) {
  return parse_hf_moe_config(json, "test config");
}

std::string with(std::string cfg, const std::string& from, const std::string& to) {
  cfg.replace(cfg.find(from), from.size(), to);
  return cfg;
}

std::vector<std::uint16_t> bits(const ModelWeights& w, const std::string& name, std::uint64_t elements) {
  std::vector<bf16> v(elements);
  w.read(name, v);
  std::vector<std::uint16_t> out(elements);
  std::memcpy(out.data(), v.data(), elements * 2);
  return out;
}
std::vector<std::uint16_t> bits(std::span<const std::byte> b) {
  std::vector<std::uint16_t> v(b.size() / 2);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}
std::vector<std::uint16_t> expert_bits(const ModelWeights& w, std::uint32_t moe_layer, std::uint32_t e) {
  std::vector<std::byte> b(3ull * w.config().moe_intermediate_size * w.config().hidden_size * 2);
  w.read_expert(moe_layer, e, b);
  return bits(b);
}
std::vector<std::uint16_t> chunk_bits(const ModelWeights& w, std::uint32_t moe_layer, std::uint32_t chunk) {
  std::vector<std::byte> b(3ull * w.config().moe_intermediate_size * w.config().hidden_size * 2);
  w.read_shared_chunk(moe_layer, chunk, b);
  return bits(b);
}

const WeightTensor& tensor_of(const ModelWeights& w, const std::string& name) {
  for (const WeightTensor& t : w.tensors())
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return w.tensors().front();
}
std::uint64_t rows_of(const std::vector<std::uint64_t>& shape) {
  return shape[0];
}
std::uint64_t cols_of(const std::vector<std::uint64_t>& shape) {
  return shape.size() == 1 ? 1 : shape[1];
}

// Which slice of the whole tensor `name` rank s holds, written out from the sharding rules (tp_shard.hpp)
// independently of the implementation's table: rows (q/k/v and their biases, gate/up), columns (o_proj,
// down), or the whole tensor.
struct Slice {
  char dim = 'w';  // 'r' rows, 'c' columns, 'w' whole
  std::uint64_t offset = 0;
};
Slice expected_slice(const std::string& name, const HfMoeConfig& c, TpShard s) {
  const std::uint64_t d = c.head_dim, q0 = std::uint64_t{s.rank} * (c.num_heads / s.tp) * d;
  const std::uint64_t kv0 =
      (c.num_kv_heads >= s.tp ? s.rank * (c.num_kv_heads / s.tp) : s.rank * c.num_kv_heads / s.tp) * d;
  const std::uint64_t fs0 = std::uint64_t{s.rank} * c.shared_expert_intermediate_size / s.tp;
  const std::uint64_t i0 = std::uint64_t{s.rank} * c.intermediate_size / s.tp;
  auto ends = [&](const char* x) { return name.ends_with(x); };
  if (ends("q_proj.weight") || ends("q_proj.bias")) return {'r', q0};
  if (ends("k_proj.weight") || ends("k_proj.bias") || ends("v_proj.weight") || ends("v_proj.bias"))
    return {'r', kv0};
  if (ends("o_proj.weight")) return {'c', q0};
  if (ends("shared_expert.gate_proj.weight") || ends("shared_expert.up_proj.weight")) return {'r', fs0};
  if (ends("shared_expert.down_proj.weight")) return {'c', fs0};
  if (ends("mlp.gate_proj.weight") || ends("mlp.up_proj.weight")) return {'r', i0};
  if (ends("mlp.down_proj.weight")) return {'c', i0};
  return {};
}

// Every tensor, routed expert and shared chunk of `part` (rank s of `full`) against the whole tensors'
// elements; returns how many elements were compared.
std::uint64_t check_every_slice(const ModelWeights& full, const ModelWeights& part, TpShard s) {
  const HfMoeConfig& c = full.config();
  std::uint64_t compared = 0;
  REQUIRE(part.tensors().size() == full.tensors().size());
  for (std::size_t i = 0; i < part.tensors().size(); ++i) {
    const WeightTensor& p = part.tensors()[i];
    const WeightTensor& f = full.tensors()[i];
    INFO(p.name << " on rank " << s.rank << " of " << s.tp);
    REQUIRE(p.name == f.name);
    const Slice sl = expected_slice(p.name, c, s);
    const std::uint64_t rows = rows_of(p.shape), cols = cols_of(p.shape), full_cols = cols_of(f.shape);
    // Split rows are 1/tp of the whole, but a replicated KV head's: one head of num_kv_heads.
    const bool kv = p.name.find("k_proj") != std::string::npos || p.name.find("v_proj") != std::string::npos;
    const std::uint64_t split = kv && c.num_kv_heads < s.tp ? c.num_kv_heads : s.tp;
    CHECK(rows == (sl.dim == 'r' ? rows_of(f.shape) / split : rows_of(f.shape)));
    CHECK(cols == (sl.dim == 'c' ? full_cols / s.tp : full_cols));
    const auto pb = bits(part, p.name, p.elements()), fb = bits(full, f.name, f.elements());
    bool equal = true;
    for (std::uint64_t r = 0; r < rows; ++r)
      for (std::uint64_t k = 0; k < cols; ++k) {
        const std::uint64_t fr = r + (sl.dim == 'r' ? sl.offset : 0),
                            fk = k + (sl.dim == 'c' ? sl.offset : 0);
        equal = equal && pb[r * cols + k] == fb[fr * full_cols + fk];
      }
    CHECK(equal);
    compared += p.elements();
  }
  // Routed experts: W1, W3 rows [r F/tp, (r+1) F/tp) as [F/tp, H], W2 columns of that range as [H, F/tp].
  const std::uint64_t h = c.hidden_size, f = c.moe_intermediate_size, fp = f / s.tp, f0 = s.rank * fp;
  for (std::uint32_t l = 0; l < c.moe_layers(); ++l)
    for (std::uint32_t e = 0; e < c.num_experts; ++e) {
      INFO("expert " << e << " of MoE layer " << l << " on rank " << s.rank);
      const auto pb = expert_bits(part, l, e), fb = expert_bits(full, l, e);
      REQUIRE(pb.size() == 3 * fp * h);
      bool equal = true;
      for (std::uint64_t m = 0; m < 2; ++m)  // W1, W3
        for (std::uint64_t r = 0; r < fp; ++r)
          for (std::uint64_t k = 0; k < h; ++k)
            equal = equal && pb[m * fp * h + r * h + k] == fb[m * f * h + (f0 + r) * h + k];
      for (std::uint64_t r = 0; r < h; ++r)  // W2
        for (std::uint64_t k = 0; k < fp; ++k)
          equal = equal && pb[2 * fp * h + r * fp + k] == fb[2 * f * h + r * f + f0 + k];
      CHECK(equal);
      compared += pb.size();
    }
  // Shared chunks: chunk i of rank r covers the shared expert's intermediate range
  // [r Fs/tp + i F/tp, r Fs/tp + (i+1) F/tp) (gate, up rows; down columns).
  const std::uint64_t fs = c.shared_expert_intermediate_size;
  REQUIRE(part.shared_chunks() == full.shared_chunks());
  for (std::uint32_t l = 0; l < c.moe_layers() && part.shared_chunks() > 0; ++l) {
    const std::string p = "model.layers." + std::to_string(full.model_layer(l)) + ".mlp.shared_expert.";
    const auto gate = bits(full, p + "gate_proj.weight", fs * h),
               up = bits(full, p + "up_proj.weight", fs * h);
    const auto down = bits(full, p + "down_proj.weight", fs * h);
    for (std::uint32_t i = 0; i < part.shared_chunks(); ++i) {
      INFO("shared chunk " << i << " of MoE layer " << l << " on rank " << s.rank);
      const auto pb = chunk_bits(part, l, i);
      const std::uint64_t first = s.rank * (fs / s.tp) + i * fp;
      bool equal = true;
      for (std::uint64_t r = 0; r < fp; ++r)
        for (std::uint64_t k = 0; k < h; ++k) {
          equal = equal && pb[r * h + k] == gate[(first + r) * h + k];
          equal = equal && pb[fp * h + r * h + k] == up[(first + r) * h + k];
        }
      for (std::uint64_t r = 0; r < h; ++r)
        for (std::uint64_t k = 0; k < fp; ++k)
          equal = equal && pb[2 * fp * h + r * fp + k] == down[r * fs + first + k];
      CHECK(equal);
      compared += pb.size();
    }
  }
  return compared;
}

// ---- a double-precision forward of the sharded pieces

std::vector<double> to_double(const std::vector<std::uint16_t>& b) {
  std::vector<double> v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) v[i] = bf16{b[i]}.to_float();
  return v;
}
// y = W x, W [rows, cols] row-major.
std::vector<double> matvec(const std::vector<double>& w, std::uint64_t rows, std::uint64_t cols,
                           const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t k = 0; k < cols; ++k) y[r] += w[r * cols + k] * x[k];
  return y;
}
// SwiGLU over [W1 | W3 | W2] with intermediate size f: W2 (silu(W1 x) * (W3 x)).
std::vector<double> swiglu(const std::vector<double>& e, std::uint64_t f, std::uint64_t h,
                           const std::vector<double>& x) {
  const std::vector<double> w1(e.begin(), e.begin() + f * h), w3(e.begin() + f * h, e.begin() + 2 * f * h),
      w2(e.begin() + 2 * f * h, e.end());
  std::vector<double> g = matvec(w1, f, h, x), u = matvec(w3, f, h, x);
  for (std::uint64_t i = 0; i < f; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return matvec(w2, h, f, g);
}
std::vector<double> random_vector(std::uint64_t n, std::uint64_t seed) {
  std::vector<double> v(n);
  std::uint64_t z = seed;
  for (double& x : v) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(z >> 11) / 9007199254740992.0 - 0.5;  // [-0.5, 0.5)
  }
  return v;
}
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

Eviction eviction(std::uint32_t layer, std::uint32_t expert, std::uint32_t page0,
                  EvictionCause cause = EvictionCause::kPressure) {
  Eviction e{ExpertKey{layer, expert}, {}, cause};
  for (std::uint32_t m = 0; m < kMatricesPerExpert; ++m) e.pages.pages[m] = PageHandle{page0 + m, 0};
  return e;
}
Restore restore(std::uint32_t layer, std::uint32_t expert, std::uint32_t page0) {
  Restore r{ExpertKey{layer, expert}, {}};
  for (std::uint32_t m = 0; m < kMatricesPerExpert; ++m) r.pages.pages[m] = PageHandle{page0 + m, 0};
  return r;
}

}  // namespace

TEST_CASE("tp shard: Qwen1.5-MoE's per-rank shapes at tp 1, 2, 4 agree with shard_model", "[tp]") {
  const ModelSpec catalog = find_model("qwen1.5-moe-a2.7b");
  const HfMoeConfig c = hf_config_for(catalog);
  for (const std::uint32_t tp : {1u, 2u, 4u}) {
    INFO("tp " << tp);
    for (std::uint32_t rank = 0; rank < tp; ++rank) {
      const HfMoeConfig r = shard_config(c, TpShard{tp, rank});
      CHECK(r.num_heads == 16 / tp);
      CHECK(r.num_kv_heads == 16 / tp);
      CHECK(r.head_dim == 128);
      CHECK(r.moe_intermediate_size == 1408 / tp);
      CHECK(r.shared_expert_intermediate_size == 5632 / tp);
      CHECK(r.intermediate_size == 5632);  // no dense layer reads it: kept
      CHECK(r.hidden_size == 2048);
      CHECK(r.vocab_size == 151936);
      CHECK(r.num_experts == 60);
      CHECK(r.top_k == 4);
      CHECK(r.num_layers == 24);
      CHECK(r.qkv_bias);
      const TpHeads heads = tp_heads(c, TpShard{tp, rank});
      CHECK(heads.q_first == rank * 16 / tp);
      CHECK(heads.q_count == 16 / tp);
      CHECK(heads.kv_first == rank * 16 / tp);
      CHECK(heads.kv_count == 16 / tp);
    }
    // The same sizes as the simulator's shard (every field both define), but the vocabulary: replicated here,
    // split by shard_model.
    const ModelSpec mine = tp_rank_model(c, TpShard{tp, 0}, catalog.name);
    const ModelSpec sim = shard_model(c.to_model_spec(catalog.name), tp, ExpertPrecision::kBf16, "--tp");
    CHECK(mine.tensor_parallel == sim.tensor_parallel);
    CHECK(mine.num_layers == sim.num_layers);
    CHECK(mine.hidden_size == sim.hidden_size);
    CHECK(mine.num_heads == sim.num_heads);
    CHECK(mine.num_kv_heads == sim.num_kv_heads);
    CHECK(mine.head_dim == sim.head_dim);
    CHECK(mine.qkv_bias == sim.qkv_bias);
    CHECK(mine.num_experts == sim.num_experts);
    CHECK(mine.top_k == sim.top_k);
    CHECK(mine.moe_intermediate_size == sim.moe_intermediate_size);
    CHECK(mine.num_shared_experts == sim.num_shared_experts);
    CHECK(mine.shared_expert_intermediate_size == sim.shared_expert_intermediate_size);
    CHECK(mine.first_dense_layers == sim.first_dense_layers);
    CHECK(mine.dense_intermediate_size == sim.dense_intermediate_size);
    CHECK(mine.vocab_size == 151936);
    CHECK(sim.vocab_size == (151936 + tp - 1) / tp);
    CHECK(mine.logits_vocab() == sim.logits_vocab());
    const PageGeometry gm = page_geometry(mine), gs = page_geometry(sim);
    CHECK(gm.expert_page_bytes == gs.expert_page_bytes);
    CHECK(gm.kv_page_bytes == gs.kv_page_bytes);
    CHECK(gm.kv_payload_bytes == gs.kv_payload_bytes);
  }
  CHECK(shard_config(c, TpShard{2, 1}).moe_intermediate_size == 704);
  CHECK(shard_config(c, TpShard{4, 3}).num_heads == 4);
}

TEST_CASE("tp shard: Qwen3-30B-A3B at tp 8 replicates its 4 KV heads", "[tp]") {
  const ModelSpec catalog = find_model("qwen3-30b-a3b");
  const HfMoeConfig c = hf_config_for(catalog);
  for (const std::uint32_t tp : {2u, 4u, 8u}) {
    INFO("tp " << tp);
    const HfMoeConfig r = shard_config(c, TpShard{tp, tp - 1});
    CHECK(r.num_heads == 32 / tp);
    CHECK(r.num_kv_heads == std::max(1u, 4 / tp));
    CHECK(r.head_dim == 128);
    CHECK(r.moe_intermediate_size == 768 / tp);
    CHECK(r.shared_expert_intermediate_size == 0);
    CHECK(r.num_experts == 128);
    CHECK(r.top_k == 8);
    CHECK(r.qk_norm);
    const ModelSpec mine = tp_rank_model(c, TpShard{tp, 0}, catalog.name);
    const ModelSpec sim = shard_model(c.to_model_spec(catalog.name), tp, ExpertPrecision::kBf16, "--tp");
    CHECK(mine.num_heads == sim.num_heads);
    CHECK(mine.num_kv_heads == sim.num_kv_heads);
    CHECK(mine.moe_intermediate_size == sim.moe_intermediate_size);
    CHECK(page_geometry(mine).kv_page_bytes == page_geometry(sim).kv_page_bytes);
  }
  // tp 8: 4 query heads per rank, two ranks per KV head; rank r's q heads [4r, 4r + 4) read KV head r / 2,
  // which is the head GQA gives them (q head i reads KV head i / 8).
  for (std::uint32_t rank = 0; rank < 8; ++rank) {
    const TpHeads h = tp_heads(c, TpShard{8, rank});
    CHECK(h.q_first == 4 * rank);
    CHECK(h.q_count == 4);
    CHECK(h.kv_first == rank / 2);
    CHECK(h.kv_count == 1);
    CHECK(h.q_first / (32 / 4) == h.kv_first);
    CHECK((h.q_first + h.q_count - 1) / (32 / 4) == h.kv_first);
  }
  CHECK(tp_heads(c, TpShard{4, 3}).kv_first == 3);
  CHECK(tp_heads(c, TpShard{2, 1}).kv_first == 2);
  CHECK(tp_heads(c, TpShard{2, 1}).kv_count == 2);
}

TEST_CASE("tp shard: what does not split is refused, naming --tp, the field and its value", "[tp]") {
  const HfMoeConfig q15 = hf_config_for(find_model("qwen1.5-moe-a2.7b"));
  CHECK_THROWS_WITH(
      shard_config(q15, TpShard{3, 0}),
      Catch::StartsWith("--tp = 3: config.num_attention_heads = 16 must be a multiple of --tp"));
  for (const std::uint32_t tp : {2u, 4u, 8u}) CHECK_NOTHROW(validate_tp_shard(q15, TpShard{tp, tp - 1}));
  CHECK_THROWS_WITH(shard_config(q15, TpShard{0, 0}), Catch::StartsWith("--tp = 0: must be at least 1"));
  CHECK_THROWS_WITH(shard_config(q15, TpShard{2, 2}),
                    Catch::StartsWith("--tp rank = 2: must be below --tp = 2"));
  CHECK_THROWS_WITH(validate_tp_shard(q15, TpShard{3, 0}, "gpu.gpus"), Catch::StartsWith("gpu.gpus = 3: "));
  HfMoeConfig f = q15;  // an expert size that tp 16 does not split (1408 does: 2^7 x 11)
  f.moe_intermediate_size = 1400, f.shared_expert_intermediate_size = 5600;
  CHECK_THROWS_WITH(shard_config(f, TpShard{16, 0}),
                    Catch::StartsWith("--tp = 16: config.moe_intermediate_size = 1400 must be a multiple"));
  CHECK_THROWS_WITH(validate_tp_shard(q15, TpShard{32, 0}), Catch::Contains("num_attention_heads = 16"));

  // Fs is a multiple of F (the chunks), so it splits whenever F does; a config where it does not: Fs 200.
  HfMoeConfig c = parse(kQwen2Small);
  c.num_heads = 16, c.num_kv_heads = 16, c.head_dim = 16, c.shared_expert_intermediate_size = 200;
  CHECK_THROWS_WITH(validate_tp_shard(c, TpShard{16, 0}),
                    Catch::StartsWith("--tp = 16: config.shared_expert_intermediate_size = 200 must be a "
                                      "multiple of --tp"));
  // The dense layer's intermediate size splits only when a dense layer reads it.
  c = parse(kQwen2Small);
  c.intermediate_size = 511;
  CHECK_THROWS_WITH(validate_tp_shard(c, TpShard{2, 0}),
                    Catch::StartsWith("--tp = 2: config.intermediate_size = 511 must be a multiple of --tp"));
  c.mlp_only_layers.clear();
  CHECK(shard_config(c, TpShard{2, 0}).intermediate_size == 511);
  // KV heads neither a multiple nor a divisor of tp: 12 heads, 4 KV heads, tp 6.
  const HfMoeConfig kv = parse(with(with(kQwen3Small, R"("num_attention_heads": 4, "num_key_value_heads": 2)",
                                         R"("num_attention_heads": 12, "num_key_value_heads": 4)"),
                                    R"("moe_intermediate_size": 128)", R"("moe_intermediate_size": 96)")
                                   .c_str());
  CHECK_THROWS_WITH(validate_tp_shard(kv, TpShard{6, 0}),
                    Catch::StartsWith("--tp = 6: config.num_key_value_heads = 4 must be a multiple of --tp"));
  CHECK_NOTHROW(validate_tp_shard(kv, TpShard{4, 3}));
  CHECK_NOTHROW(validate_tp_shard(kv, TpShard{2, 1}));
}

TEST_CASE("sharded weights: every slice at tp 2 equals the whole tensors' elements", "[tp]") {
  const HfMoeConfig c = parse(kQwen2Small);
  const std::shared_ptr<const ModelWeights> full = random_weights(c, 7);
  std::uint64_t per_rank = 0;
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    const auto part = sharded_weights(full, TpShard{2, rank});
    const HfMoeConfig& r = part->config();
    CHECK(r.num_heads == 2);
    CHECK(r.num_kv_heads == 1);
    CHECK(r.moe_intermediate_size == 64);
    CHECK(r.shared_expert_intermediate_size == 128);
    CHECK(r.intermediate_size == 256);
    CHECK(part->shared_chunks() == 2);
    // The rank's shapes under the Hugging Face names.
    CHECK(tensor_of(*part, "model.layers.1.self_attn.q_proj.weight").shape ==
          std::vector<std::uint64_t>{128, 256});
    CHECK(tensor_of(*part, "model.layers.1.self_attn.k_proj.bias").shape == std::vector<std::uint64_t>{64});
    CHECK(tensor_of(*part, "model.layers.1.self_attn.o_proj.weight").shape ==
          std::vector<std::uint64_t>{256, 128});
    CHECK(tensor_of(*part, "model.layers.0.mlp.down_proj.weight").shape ==
          std::vector<std::uint64_t>{256, 256});
    CHECK(tensor_of(*part, "model.layers.2.mlp.gate.weight").shape == std::vector<std::uint64_t>{8, 256});
    CHECK(tensor_of(*part, "model.embed_tokens.weight").shape == std::vector<std::uint64_t>{320, 256});
    // Rank 1's q rows start at its first head (2 x 64), its KV rows at KV head 1, its shared slice at 128:
    // written out once here, the rest by expected_slice.
    CHECK(expected_slice("model.layers.1.self_attn.q_proj.weight", c, TpShard{2, 1}).offset == 128);
    CHECK(expected_slice("model.layers.1.self_attn.v_proj.weight", c, TpShard{2, 1}).offset == 64);
    CHECK(expected_slice("model.layers.1.mlp.shared_expert.down_proj.weight", c, TpShard{2, 1}).offset ==
          128);
    per_rank = check_every_slice(*full, *part, TpShard{2, rank});
    // Sizes are the rank's: the whole tensor's or the whole expert's do not fit.
    std::vector<bf16> whole_q(256 * 256);
    CHECK_THROWS_WITH(part->read("model.layers.1.self_attn.q_proj.weight", whole_q),
                      Catch::Contains("q_proj.weight = 32768 elements: do not fit the 65536-element"));
    std::vector<std::byte> whole_expert(3 * 128 * 256 * 2);
    CHECK_THROWS_WITH(part->read_expert(0, 0, whole_expert),
                      Catch::StartsWith("weights.read_expert = (0, 0) into 196608 bytes: needs a MoE layer < "
                                        "2, an expert < 8 and 98304 bytes (one rank's slice of 2 GPUs)"));
  }
  CHECK(per_rank > 0);
}

TEST_CASE("sharded weights: Qwen3-MoE at tp 4 reads the replicated KV head and whole q/k norms", "[tp]") {
  const HfMoeConfig c = parse(kQwen3Small);
  const std::shared_ptr<const ModelWeights> full = random_weights(c, 11);
  const std::uint64_t d = 64, h = 256;
  const auto k_full = bits(*full, "model.layers.1.self_attn.k_proj.weight", 2 * d * h);
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    const auto part = sharded_weights(full, TpShard{4, rank});
    CHECK(part->config().num_heads == 1);
    CHECK(part->config().num_kv_heads == 1);
    CHECK(part->shared_chunks() == 0);
    // KV head rank x 2 / 4: ranks 0, 1 read head 0; ranks 2, 3 head 1.
    const auto k = bits(*part, "model.layers.1.self_attn.k_proj.weight", d * h);
    const std::uint64_t head = rank / 2;
    CHECK(k ==
          std::vector<std::uint16_t>(k_full.begin() + head * d * h, k_full.begin() + (head + 1) * d * h));
    CHECK(bits(*part, "model.layers.0.self_attn.q_norm.weight", d) ==
          bits(*full, "model.layers.0.self_attn.q_norm.weight", d));
    check_every_slice(*full, *part, TpShard{4, rank});
  }
  for (std::uint32_t rank = 0; rank < 2; ++rank)
    check_every_slice(*full, *sharded_weights(full, TpShard{2, rank}), TpShard{2, rank});
}

// The test files' bytes repeat every 128 elements, so this checks the checkpoint's block reads (row ranges,
// column blocks, fused experts); the random weights above check the offsets.
TEST_CASE("sharded weights: a checkpoint's slices (per-expert and fused experts) are its files' elements",
          "[tp]") {
  using checkpoint_files::write_checkpoint;
  for (const ExpertLayout layout : {ExpertLayout::kPerExpert, ExpertLayout::kFused}) {
    INFO((layout == ExpertLayout::kFused ? "fused" : "per expert"));
    const Checkpoint ck = open_checkpoint(
        write_checkpoint(layout == ExpertLayout::kFused ? "tp_fused" : "tp_per", kQwen2Small, 2, {}, layout)
            .string());
    const std::shared_ptr<const ModelWeights> full = checkpoint_weights(ck);
    for (std::uint32_t rank = 0; rank < 2; ++rank)
      check_every_slice(*full, *sharded_weights(full, TpShard{2, rank}), TpShard{2, rank});
  }
}

TEST_CASE("sharded weights: tp 1 reads are the whole weights'", "[tp]") {
  for (const char* json : {kQwen2Small, kQwen3Small}) {
    const HfMoeConfig c = parse(json);
    const std::shared_ptr<const ModelWeights> full = random_weights(c, 3);
    const auto one = sharded_weights(full, TpShard{1, 0});
    CHECK(one->config().num_heads == c.num_heads);
    CHECK(one->config().moe_intermediate_size == c.moe_intermediate_size);
    CHECK(one->tensor_bytes() == full->tensor_bytes());
    CHECK(one->shared_chunks() == full->shared_chunks());
    REQUIRE(one->tensors().size() == full->tensors().size());
    for (std::size_t i = 0; i < full->tensors().size(); ++i) {
      const WeightTensor& t = full->tensors()[i];
      CHECK(one->tensors()[i].shape == t.shape);
      CHECK(bits(*one, t.name, t.elements()) == bits(*full, t.name, t.elements()));
    }
    for (std::uint32_t l = 0; l < c.moe_layers(); ++l) {
      for (std::uint32_t e = 0; e < c.num_experts; ++e)
        CHECK(expert_bits(*one, l, e) == expert_bits(*full, l, e));
      for (std::uint32_t i = 0; i < full->shared_chunks(); ++i)
        CHECK(chunk_bits(*one, l, i) == chunk_bits(*full, l, i));
    }
  }
}

TEST_CASE("sharded weights: the ranks' partial outputs sum to the whole model's", "[tp]") {
  const HfMoeConfig c = parse(kQwen2Small);
  const std::shared_ptr<const ModelWeights> full = random_weights(c, 5);
  const std::uint32_t tp = 2;
  const std::uint64_t h = c.hidden_size, f = c.moe_intermediate_size, fs = c.shared_expert_intermediate_size;
  const std::uint64_t q = std::uint64_t{c.num_heads} * c.head_dim, in = c.intermediate_size;
  const std::vector<double> x = random_vector(h, 1), a = random_vector(q, 2);
  const std::uint32_t layer = 2, moe_layer = 1, expert = 5;  // model layer 2 is MoE layer 1
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  REQUIRE(full->model_layer(moe_layer) == layer);

  // Whole-model references.
  const auto expert_full = swiglu(to_double(expert_bits(*full, moe_layer, expert)), f, h, x);
  std::vector<double> shared_full(to_double(bits(*full, p + "mlp.shared_expert.gate_proj.weight", fs * h)));
  const auto up = to_double(bits(*full, p + "mlp.shared_expert.up_proj.weight", fs * h));
  shared_full.insert(shared_full.end(), up.begin(), up.end());
  const auto down = to_double(bits(*full, p + "mlp.shared_expert.down_proj.weight", h * fs));
  shared_full.insert(shared_full.end(), down.begin(), down.end());
  const auto shared_ref = swiglu(shared_full, fs, h, x);
  const auto o_ref = matvec(to_double(bits(*full, p + "self_attn.o_proj.weight", h * q)), h, q, a);
  const auto q_ref = matvec(to_double(bits(*full, p + "self_attn.q_proj.weight", q * h)), q, h, x);
  std::vector<double> dense_full(to_double(bits(*full, "model.layers.0.mlp.gate_proj.weight", in * h)));
  for (const char* m : {"up_proj", "down_proj"}) {
    const auto v = to_double(bits(*full, std::string("model.layers.0.mlp.") + m + ".weight", in * h));
    dense_full.insert(dense_full.end(), v.begin(), v.end());
  }
  const auto dense_ref = swiglu(dense_full, in, h, x);

  // The ranks' partials, summed as the all-reduce would; q concatenated (column-parallel: no reduction).
  std::vector<double> expert_sum(h, 0.0), shared_sum(h, 0.0), o_sum(h, 0.0), dense_sum(h, 0.0), q_cat;
  for (std::uint32_t rank = 0; rank < tp; ++rank) {
    const auto part = sharded_weights(full, TpShard{tp, rank});
    const std::uint64_t fp = f / tp, qp = q / tp, ip = in / tp;
    const auto add = [&](std::vector<double>& sum, const std::vector<double>& y) {
      for (std::uint64_t i = 0; i < h; ++i) sum[i] += y[i];
    };
    add(expert_sum, swiglu(to_double(expert_bits(*part, moe_layer, expert)), fp, h, x));
    for (std::uint32_t i = 0; i < part->shared_chunks(); ++i)
      add(shared_sum, swiglu(to_double(chunk_bits(*part, moe_layer, i)), fp, h, x));
    const std::vector<double> a_rank(a.begin() + rank * qp,
                                     a.begin() + (rank + 1) * qp);  // its heads' output
    add(o_sum, matvec(to_double(bits(*part, p + "self_attn.o_proj.weight", h * qp)), h, qp, a_rank));
    const auto q_rank = matvec(to_double(bits(*part, p + "self_attn.q_proj.weight", qp * h)), qp, h, x);
    q_cat.insert(q_cat.end(), q_rank.begin(), q_rank.end());
    std::vector<double> dense(to_double(bits(*part, "model.layers.0.mlp.gate_proj.weight", ip * h)));
    for (const char* m : {"up_proj", "down_proj"}) {
      const auto v = to_double(bits(*part, std::string("model.layers.0.mlp.") + m + ".weight", ip * h));
      dense.insert(dense.end(), v.begin(), v.end());
    }
    add(dense_sum, swiglu(dense, ip, h, x));
  }
  // Summation order only: double rounding, far below bf16's.
  CHECK(max_abs(expert_full) > 0);
  CHECK(max_abs_diff(expert_sum, expert_full) <= 1e-12 * max_abs(expert_full));
  CHECK(max_abs_diff(shared_sum, shared_ref) <= 1e-12 * max_abs(shared_ref));
  CHECK(max_abs_diff(o_sum, o_ref) <= 1e-12 * max_abs(o_ref));
  CHECK(max_abs_diff(dense_sum, dense_ref) <= 1e-12 * max_abs(dense_ref));
  CHECK(q_cat == q_ref);  // each row is the same dot product in the same order
}

TEST_CASE("tp rank bytes: experts over PCIe halve at tp 2, KV and non-expert bytes as shard_model's",
          "[tp]") {
  for (const char* name : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    const ModelSpec catalog = find_model(name);
    const HfMoeConfig c = hf_config_for(catalog);
    const TpRankBytes one = tp_rank_bytes(c, TpShard{1, 0});
    CHECK(one.expert_transfer_bytes == catalog.expert_transfer_bytes());
    CHECK(one.non_expert_bytes == 2 * catalog.non_expert_params());
    CHECK(one.replicated_vocab_bytes == 0);
    CHECK(one.kv_bytes_per_token == catalog.kv_bytes_per_token());
    for (const std::uint32_t tp : {2u, 4u, 8u}) {
      INFO(name << " at tp " << tp);
      const TpRankBytes b = tp_rank_bytes(c, TpShard{tp, tp - 1});
      const ModelSpec sim = shard_model(catalog, tp, ExpertPrecision::kBf16, "--tp");
      CHECK(b.expert_transfer_bytes == sim.expert_transfer_bytes());
      CHECK(b.expert_transfer_bytes * tp == one.expert_transfer_bytes);
      CHECK(b.expert_page_bytes == sim.expert_page_bytes());
      CHECK(b.kv_bytes_per_token_layer == sim.kv_bytes_per_token_layer());
      CHECK(b.kv_bytes_per_token == sim.kv_bytes_per_token());
      // shard_model splits the vocabulary; this rank holds it whole, the difference is named.
      CHECK(b.non_expert_bytes == 2 * sim.non_expert_params() + b.replicated_vocab_bytes);
      CHECK(b.replicated_vocab_bytes ==
            (151936ull - (151936 + tp - 1) / tp) * 2048 * 2 * (catalog.tie_word_embeddings ? 1 : 2));
    }
  }
  // Qwen1.5-MoE at tp 2: 8.65 MB per expert instead of 17.3 MB, 622 MB more than a vocab-parallel shard.
  const TpRankBytes q2 = tp_rank_bytes(hf_config_for(find_model("qwen1.5-moe-a2.7b")), TpShard{2, 0});
  CHECK(q2.expert_transfer_bytes == 3ull * 704 * 2048 * 2);
  CHECK(q2.replicated_vocab_bytes == 75968ull * 2048 * 2 * 2);
  // Qwen3-30B-A3B at tp 8: one replicated KV head per rank, 48 layers.
  CHECK(tp_rank_bytes(hf_config_for(find_model("qwen3-30b-a3b")), TpShard{8, 0}).kv_bytes_per_token ==
        48ull * 2 * 1 * 128 * 2);
}

TEST_CASE("tp rank bytes: the sharded weights hold what the plan counts", "[tp]") {
  for (const char* json : {kQwen2Small, kQwen3Small})
    for (const std::uint32_t tp : {1u, 2u, 4u}) {
      const HfMoeConfig c = parse(json);
      INFO(c.architecture << " at tp " << tp);
      const auto part = sharded_weights(random_weights(c, 1), TpShard{tp, 0});
      const TpRankBytes b = tp_rank_bytes(c, TpShard{tp, 0});
      const std::uint64_t chunks =
          std::uint64_t{part->shared_chunks()} * c.moe_layers() * b.expert_page_bytes * 3;
      // ModelSpec leaves q_norm and k_norm out (2 x head_dim per layer): they are the only difference.
      const std::uint64_t qk_norms = c.qk_norm ? 2ull * c.num_layers * 2 * c.head_dim : 0;
      CHECK(part->tensor_bytes() + chunks == b.non_expert_bytes + qk_norms);
    }
}

TEST_CASE("change_list_digest: equal lists agree, order, one page, one field or the section differ", "[tp]") {
  ChangeList a;
  a.evictions = {eviction(3, 7, 30), eviction(3, 9, 60, EvictionCause::kSwap)};
  a.restores = {restore(5, 1, 90)};
  ChangeList same = a;
  same.signal = AdjustSignal{12, 3};  // the adjuster's inputs are not digested
  same.decision = CapacityDecision{4, 1};
  CHECK(change_list_digest(a) == change_list_digest(same));
  CHECK(change_list_digest(ChangeList{}) == change_list_digest(ChangeList{}));
  CHECK(change_list_digest(a) != change_list_digest(ChangeList{}));

  std::set<std::uint64_t> digests{change_list_digest(a)};
  const auto differs = [&](const ChangeList& b) {
    const std::uint64_t d = change_list_digest(b);
    CHECK(d != change_list_digest(a));
    digests.insert(d);
  };
  ChangeList b = a;  // order of evictions
  std::swap(b.evictions[0], b.evictions[1]);
  differs(b);
  b = a;  // one page index
  b.evictions[1].pages.pages[2].index += 1;
  differs(b);
  b = a;  // two pages of one expert swapped
  std::swap(b.restores[0].pages.pages[0], b.restores[0].pages.pages[1]);
  differs(b);
  b = a;  // a page's kind
  b.restores[0].pages.pages[0].kind = 1;
  differs(b);
  b = a;  // layer and expert
  b.evictions[0].expert.expert = 8;
  differs(b);
  b = a;
  b.evictions[0].expert = ExpertKey{7, 3};
  differs(b);
  b = a;  // the cause
  b.evictions[1].cause = EvictionCause::kPressure;
  differs(b);
  b = a;  // one eviction restored instead (same key and pages, other section)
  b.restores.insert(b.restores.begin(), Restore{a.evictions[1].expert, a.evictions[1].pages});
  b.evictions.pop_back();
  differs(b);
  b = a;  // one fewer restore
  b.restores.clear();
  differs(b);
  CHECK(digests.size() == 10);  // and the differing lists differ among themselves
  // Pinned: the definition is fixed, so every build and machine computes these.
  CHECK(change_list_digest(ChangeList{}) == 0xa53caeddfc9e33daull);
  CHECK(change_list_digest(a) == 0x2144115974ac3c9bull);
}
