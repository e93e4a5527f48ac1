// ModelWeights (engine/model_weights.hpp) on the CPU: the built-in Hugging Face configs agree with the
// catalog; checkpoint weights return the files' bytes (per-expert and fused experts, the shared expert cut
// into chunks element by element); random weights are deterministic, seed-dependent, of mean 0 and std 0.02
// with RMSNorm weights 1, and the same whatever thread or order reads them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/bf16.hpp"
#include "amoeba/core/errors.hpp"
#include "checkpoint_files.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/model_weights.hpp"

using namespace amoeba;
using namespace amoeba::engine;
using namespace amoeba::engine::checkpoint_files;

namespace {

// H = 64, F = 32, Fs = 64: two shared-expert chunks per MoE layer.
const char* kQwen2 = R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "intermediate_size": 128,
  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "shared_expert_intermediate_size": 64, "mlp_only_layers": [], "norm_topk_prob": false})";
const char* kQwen3 = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 96, "num_experts": 8,
  "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true})";

std::string with(std::string cfg, const std::string& from, const std::string& to) {
  cfg.replace(cfg.find(from), from.size(), to);
  return cfg;
}

std::vector<std::uint16_t> bits_of(std::span<const std::byte> b) {
  std::vector<std::uint16_t> v(b.size() / 2);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}
std::vector<std::uint16_t> bits_of(const std::vector<bf16>& b) {
  return bits_of(std::as_bytes(std::span(b)));
}

std::vector<bf16> read_all(const ModelWeights& w, const std::string& name, std::uint64_t elements) {
  std::vector<bf16> v(elements);
  w.read(name, v);
  return v;
}

std::vector<std::uint16_t> file_bits(const Checkpoint& ck, const std::string& name) {
  std::vector<std::byte> b(ck.tensor(name).bytes());
  ck.shard(name).read(name, b);
  return bits_of(b);
}

// Chunk `i` of a shared expert cut by hand from its three whole tensors (gate, up [Fs, H]; down [H, Fs]).
std::vector<std::uint16_t> manual_chunk(const std::vector<std::uint16_t>& gate,
                                        const std::vector<std::uint16_t>& up,
                                        const std::vector<std::uint16_t>& down, std::uint64_t h,
                                        std::uint64_t f, std::uint64_t fs, std::uint64_t i) {
  std::vector<std::uint16_t> out;
  for (const auto* w : {&gate, &up})
    for (std::uint64_t r = 0; r < f; ++r)
      for (std::uint64_t c = 0; c < h; ++c) out.push_back((*w)[(i * f + r) * h + c]);
  for (std::uint64_t r = 0; r < h; ++r)
    for (std::uint64_t c = 0; c < f; ++c) out.push_back(down[r * fs + i * f + c]);
  return out;
}

// A source implementing only the three reads: its shared chunks come through the default read_block.
class Forwarding final : public ModelWeights {
 public:
  explicit Forwarding(const ModelWeights& inner) : inner_(inner) { init(inner.config()); }
  const HfMoeConfig& config() const noexcept override { return inner_.config(); }
  void read(const std::string& name, std::span<bf16> dst) const override { inner_.read(name, dst); }
  void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const override {
    inner_.read_expert(moe_layer, expert, dst);
  }

 private:
  const ModelWeights& inner_;
};

}  // namespace

TEST_CASE("hf_config_for: the built-in configs give the catalog's shapes", "[weights]") {
  for (const char* name : {"qwen1.5-moe-a2.7b", "qwen3-30b-a3b"}) {
    INFO(name);
    const ModelSpec m = find_model(name);
    const HfMoeConfig c = hf_config_for(m);
    const ModelSpec s = c.to_model_spec(m.name);
    CHECK(s.num_layers == m.num_layers);
    CHECK(s.hidden_size == m.hidden_size);
    CHECK(s.num_heads == m.num_heads);
    CHECK(s.num_kv_heads == m.num_kv_heads);
    CHECK(s.head_dim == m.head_dim);
    CHECK(s.vocab_size == m.vocab_size);
    CHECK(s.tie_word_embeddings == m.tie_word_embeddings);
    CHECK(s.qkv_bias == m.qkv_bias);
    CHECK(s.num_experts == m.num_experts);
    CHECK(s.top_k == m.top_k);
    CHECK(s.moe_intermediate_size == m.moe_intermediate_size);
    CHECK(s.num_shared_experts == m.num_shared_experts);
    CHECK(s.shared_expert_intermediate_size == m.shared_expert_intermediate_size);
    CHECK(s.first_dense_layers == m.first_dense_layers);
    CHECK(s.total_params() == m.total_params());
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.rope_theta == 1e6);
    CHECK(c.decoder_sparse_step == 1);
    // Matched by hf_id as well as by name.
    ModelSpec renamed = m;
    renamed.name = "my-copy";
    CHECK(hf_config_for(renamed).hidden_size == c.hidden_size);
  }
  const HfMoeConfig q2 = hf_config_for(find_model("qwen1.5-moe-a2.7b"));
  CHECK(q2.arch == MoeArchitecture::kQwen2Moe);
  CHECK(q2.intermediate_size == 5632);
  CHECK(q2.qkv_bias);
  CHECK_FALSE(q2.qk_norm);
  CHECK_FALSE(q2.norm_topk_prob);
  const HfMoeConfig q3 = hf_config_for(find_model("qwen3-30b-a3b"));
  CHECK(q3.arch == MoeArchitecture::kQwen3Moe);
  CHECK(q3.intermediate_size == 6144);
  CHECK_FALSE(q3.qkv_bias);
  CHECK(q3.qk_norm);
  CHECK(q3.norm_topk_prob);
}

TEST_CASE("hf_config_for refuses other models, naming the field", "[weights]") {
  CHECK_THROWS_WITH(hf_config_for(find_model("mixtral-8x7b"), "--model"),
                    Catch::Contains("--model = mixtral-8x7b: random weights exist only for") &&
                        Catch::Contains("(known: qwen1.5-moe-a2.7b, qwen3-30b-a3b); pass --weights DIR"));
  CHECK_THROWS_WITH(hf_config_for(find_model("deepseek-v2-lite"), "run.model"),
                    Catch::StartsWith("run.model = deepseek-v2-lite: "));
  // A model file reusing a catalog name with other shapes is another model.
  ModelSpec m = find_model("qwen3-30b-a3b");
  m.num_layers = 12;
  CHECK_THROWS_WITH(hf_config_for(m), Catch::Contains("--model = qwen3-30b-a3b: has num_layers = 12 but "
                                                      "Qwen/Qwen3-30B-A3B's config.json gives 48"));
}

TEST_CASE("checkpoint weights: tensors(), read, read_expert and shared chunks are the files' bytes",
          "[weights]") {
  for (const ExpertLayout layout : {ExpertLayout::kPerExpert, ExpertLayout::kFused}) {
    const bool fused = layout == ExpertLayout::kFused;
    INFO((fused ? "fused" : "per expert"));
    const Checkpoint ck =
        open_checkpoint(write_checkpoint(fused ? "mw_fused" : "mw_per", kQwen2, 2, {}, layout).string());
    REQUIRE(ck.layout == layout);
    const auto w = checkpoint_weights(ck);
    const HfMoeConfig& c = w->config();
    CHECK(c.hidden_size == 64);
    CHECK(w->shared_chunks() == 2);
    CHECK(w->model_layer(1) == 1);

    std::vector<std::string> expected{"model.embed_tokens.weight"};
    for (int l = 0; l < 2; ++l)
      for (const char* t : {"input_layernorm.weight", "post_attention_layernorm.weight",
                            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                            "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
                            "self_attn.v_proj.bias", "mlp.gate.weight", "mlp.shared_expert_gate.weight"})
        expected.push_back("model.layers." + std::to_string(l) + "." + t);
    expected.push_back("model.norm.weight");
    expected.push_back("lm_head.weight");
    std::vector<std::string> names;
    for (const WeightTensor& t : w->tensors()) {
      names.push_back(t.name);
      CHECK(t.shape == ck.tensor(t.name).shape);
      CHECK(t.elements() == ck.tensor(t.name).elements());
    }
    CHECK(names == expected);
    // embedding + 2 x (norms + q, k, v, o + biases + router + shared gate) + norm + head, in elements.
    CHECK(w->tensor_bytes() ==
          2 * (96 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 128 + 4 * 64 + 64) + 64 + 96 * 64));

    for (const WeightTensor& t : w->tensors())
      CHECK(bits_of(read_all(*w, t.name, t.elements())) == file_bits(ck, t.name));
    const std::string sh = "model.layers.1.mlp.shared_expert.";
    CHECK(bits_of(read_all(*w, sh + "down_proj.weight", 64 * 64)) == file_bits(ck, sh + "down_proj.weight"));
    std::vector<bf16> wrong(10);
    CHECK_THROWS_WITH(
        w->read("model.norm.weight", wrong),
        Catch::Contains("model.norm.weight = 64 elements: do not fit the 10-element destination"));
    CHECK_THROWS_WITH(w->read("model.layers.0.mlp.experts.0.up_proj.weight", wrong),
                      Catch::Contains("is not a tensor these weights read by name"));

    // A routed expert: W1, W3, W2 back to back, cut from the files by hand.
    const std::uint64_t m = 32 * 64;  // F x H elements
    std::vector<std::byte> e(3 * m * 2);
    w->read_expert(1, 3, e);
    std::vector<std::uint16_t> want;
    if (fused) {
      const auto gate_up = file_bits(ck, "model.layers.1.mlp.experts.gate_up_proj");  // [E, 2F, H]
      const auto down = file_bits(ck, "model.layers.1.mlp.experts.down_proj");        // [E, H, F]
      want.assign(gate_up.begin() + 3 * 2 * m, gate_up.begin() + 4 * 2 * m);
      want.insert(want.end(), down.begin() + 3 * m, down.begin() + 4 * m);
    } else {
      for (ExpertMatrix x : {ExpertMatrix::kW1, ExpertMatrix::kW3, ExpertMatrix::kW2}) {
        const auto part = file_bits(ck, expert_tensor_name(1, 3, x));
        want.insert(want.end(), part.begin(), part.end());
      }
    }
    CHECK(bits_of(e) == want);

    // Shared-expert chunks, element by element.
    for (std::uint32_t layer = 0; layer < 2; ++layer)
      for (std::uint32_t i = 0; i < 2; ++i) {
        const std::string p = "model.layers." + std::to_string(layer) + ".mlp.shared_expert.";
        w->read_shared_chunk(layer, i, e);
        CHECK(bits_of(e) == manual_chunk(file_bits(ck, p + "gate_proj.weight"),
                                         file_bits(ck, p + "up_proj.weight"),
                                         file_bits(ck, p + "down_proj.weight"), 64, 32, 64, i));
      }
    CHECK_THROWS_WITH(w->read_shared_chunk(0, 2, e), Catch::Contains("needs a MoE layer < 2, a chunk < 2"));
    CHECK_THROWS_WITH(w->read_shared_chunk(2, 0, e), Catch::Contains("needs a MoE layer < 2"));
    CHECK_THROWS_WITH(w->read_expert(0, 4, e), Catch::Contains("an expert < 4"));
  }
}

TEST_CASE("checkpoint weights: MoE layers after a dense layer, and Fs not a multiple of F", "[weights]") {
  const std::string dense = with(kQwen2, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]");
  const Checkpoint ck = open_checkpoint(write_checkpoint("mw_dense", dense.c_str()).string());
  const auto w = checkpoint_weights(ck);
  CHECK(w->model_layer(0) == 1);
  CHECK(std::count_if(w->tensors().begin(), w->tensors().end(), [](const WeightTensor& t) {
          return t.name == "model.layers.0.mlp.down_proj.weight";
        }) == 1);
  std::vector<std::byte> e(3 * 32 * 64 * 2);
  w->read_shared_chunk(0, 1, e);
  const std::string p = "model.layers.1.mlp.shared_expert.";
  CHECK(bits_of(e) == manual_chunk(file_bits(ck, p + "gate_proj.weight"), file_bits(ck, p + "up_proj.weight"),
                                   file_bits(ck, p + "down_proj.weight"), 64, 32, 64, 1));
  CHECK_THROWS_WITH(w->read_shared_chunk(1, 0, e), Catch::Contains("needs a MoE layer < 1"));

  const std::string odd =
      with(kQwen2, "\"shared_expert_intermediate_size\": 64", "\"shared_expert_intermediate_size\": 48");
  const Checkpoint bad = open_checkpoint(write_checkpoint("mw_odd", odd.c_str()).string());
  const char* rule = "shared_expert_intermediate_size = 48: must be a multiple of moe_intermediate_size (32)";
  CHECK_THROWS_AS(checkpoint_weights(bad), ConfigError);
  CHECK_THROWS_WITH(checkpoint_weights(bad), Catch::Contains(rule));
  CHECK_THROWS_WITH(random_weights(bad.config, 1), Catch::Contains(rule));

  const auto q3 = random_weights(parse_hf_moe_config(kQwen3, "c"), 1);
  CHECK(q3->shared_chunks() == 0);
  std::vector<std::byte> e3(3 * 16 * 64 * 2);
  CHECK_THROWS_WITH(q3->read_shared_chunk(0, 0, e3), Catch::Contains("a chunk < 0"));
}

TEST_CASE("random weights: deterministic in the seed, norms 1, mean 0 and std 0.02", "[weights]") {
  const HfMoeConfig c = parse_hf_moe_config(kQwen2, "c");
  const auto a = random_weights(c, 42), b = random_weights(c, 42), other = random_weights(c, 43);
  CHECK(a->tensor_bytes() ==
        checkpoint_weights(open_checkpoint(write_checkpoint("mw_q2", kQwen2).string()))->tensor_bytes());
  for (const WeightTensor& t : a->tensors()) {
    INFO(t.name);
    const auto x = bits_of(read_all(*a, t.name, t.elements()));
    CHECK(x == bits_of(read_all(*b, t.name, t.elements())));
    if (t.name.ends_with("norm.weight"))
      CHECK(std::all_of(x.begin(), x.end(), [](std::uint16_t v) { return v == 0x3f80; }));  // 1.0
    else
      CHECK(x != bits_of(read_all(*other, t.name, t.elements())));
  }
  std::vector<std::byte> ea(3 * 32 * 64 * 2), eb(ea.size()), eo(ea.size());
  a->read_expert(1, 2, ea);
  b->read_expert(1, 2, eb);
  other->read_expert(1, 2, eo);
  CHECK(ea == eb);
  CHECK(ea != eo);
  b->read_expert(1, 3, eb);
  CHECK(ea != eb);
  // Shared chunks of random weights are cut from the same values read() gives for the whole tensors.
  for (std::uint32_t i = 0; i < 2; ++i) {
    const std::string p = "model.layers.0.mlp.shared_expert.";
    a->read_shared_chunk(0, i, ea);
    CHECK(bits_of(ea) == manual_chunk(bits_of(read_all(*a, p + "gate_proj.weight", 64 * 64)),
                                      bits_of(read_all(*a, p + "up_proj.weight", 64 * 64)),
                                      bits_of(read_all(*a, p + "down_proj.weight", 64 * 64)), 64, 32, 64, i));
  }
  const Forwarding forwarding(*a);
  for (std::uint32_t i = 0; i < 2; ++i) {
    a->read_shared_chunk(1, i, ea);
    forwarding.read_shared_chunk(1, i, eb);
    CHECK(ea == eb);
  }
  // Qwen3-MoE's q_norm and k_norm are RMSNorm weights too.
  const auto q3 = random_weights(parse_hf_moe_config(kQwen3, "c"), 5);
  for (const char* n : {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"}) {
    const auto x = read_all(*q3, n, 32);
    CHECK(std::all_of(x.begin(), x.end(), [](bf16 v) { return v.to_float() == 1.0f; }));
  }

  // Statistics over one real-sized matrix (Qwen1.5-MoE's q_proj, 2048 x 2048) and a bias.
  const auto real = random_weights(hf_config_for(find_model("qwen1.5-moe-a2.7b")), 7);
  for (const auto& [name, n] :
       {std::pair<const char*, std::uint64_t>{"model.layers.3.self_attn.q_proj.weight", 2048 * 2048},
        {"model.layers.3.self_attn.k_proj.bias", 2048}}) {
    INFO(name);
    const auto x = read_all(*real, name, n);
    double sum = 0, sq = 0, max = 0;
    std::uint64_t within_std = 0;
    for (bf16 v : x) {
      const double f = v.to_float();
      sum += f;
      sq += f * f;
      max = std::max(max, std::abs(f));
      within_std += std::abs(f) < 0.02;
    }
    const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
    const double tol = n > 100000 ? 0.01 : 0.1;  // relative, for the std; about 5 standard errors
    CHECK(std::abs(mean) < 5 * 0.02 / std::sqrt(double(n)));
    CHECK(std::abs(sd - 0.02) < tol * 0.02);
    CHECK(max <= 0.0693);  // the sum of four uniforms ends at 2 sqrt(3) std
    if (n > 100000) {
      // Within one std: 0.669 for the sum of four uniforms (0.683 for a normal).
      CHECK(double(within_std) / double(n) > 0.664);
      CHECK(double(within_std) / double(n) < 0.674);
    }
  }
}

TEST_CASE("random weights: an expert read from many threads equals the expert read alone", "[weights]") {
  const auto w = random_weights(hf_config_for(find_model("qwen3-30b-a3b")), 11);
  const std::size_t bytes = 3 * 768 * 2048 * 2;
  std::vector<std::byte> alone(bytes);
  w->read_expert(47, 127, alone);
  std::vector<std::vector<std::byte>> got(8, std::vector<std::byte>(bytes));
  std::vector<std::thread> threads;
  // Threads read experts in different orders; the even ones end with (47, 127), the odd ones start with it.
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      std::vector<std::byte> scratch(bytes);
      if (t % 2) w->read_expert(47, 127, got[t]);
      w->read_expert(std::uint32_t(t), std::uint32_t(t * 7), scratch);
      if (t % 2 == 0) w->read_expert(47, 127, got[t]);
    });
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) CHECK(g == alone);
}

TEST_CASE("synthetic prompt tokens: in range, deterministic, spread over the vocabulary", "[weights]") {
  std::vector<std::uint32_t> counts(10);
  for (std::uint64_t r = 0; r < 1000; ++r)
    for (std::uint32_t p = 0; p < 100; ++p) {
      const std::int32_t t = synthetic_prompt_token(3, 10, r, p);
      REQUIRE(t >= 0);
      REQUIRE(t < 10);
      ++counts[std::size_t(t)];
      const std::int32_t big = synthetic_prompt_token(3, 151936, r, p);
      REQUIRE(big >= 0);
      REQUIRE(big < 151936);
      REQUIRE(big == synthetic_prompt_token(3, 151936, r, p));
    }
  for (std::uint32_t c : counts) CHECK(std::abs(double(c) - 10000.0) < 500.0);  // 5 standard deviations
  int same_seed = 0, same_request = 0;
  for (std::uint32_t p = 0; p < 100; ++p) {
    same_seed += synthetic_prompt_token(3, 151936, 5, p) == synthetic_prompt_token(4, 151936, 5, p);
    same_request += synthetic_prompt_token(3, 151936, 5, p) == synthetic_prompt_token(3, 151936, 6, p);
  }
  CHECK(same_seed < 3);
  CHECK(same_request < 3);
  CHECK(synthetic_prompt_token(3, 0, 1, 2) == 0);
}
