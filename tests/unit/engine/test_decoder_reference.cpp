// The host reference decoder (engine/decoder_reference.hpp) on checkpoints the test writes: a prefill over
// the whole prompt gives the same logits and routing as feeding the tokens one at a time (the KV cache and
// the causal mask), both expert layouts give the same logits, and a model whose mixers are zero reduces to
// its embedding (greedy decoding repeats the last token). Comparison with transformers runs on the GPU
// machine (benchmarks/device/hf_oracle.py).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/bf16.hpp"
#include "engine/checkpoint.hpp"
#include "engine/decoder_reference.hpp"
#include "engine/safetensors.hpp"

using namespace amoeba;
using namespace amoeba::engine;
namespace fs = std::filesystem;

namespace {

const char* kQwen2 = R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "num_experts": 8,
  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
  "norm_topk_prob": false, "rope_theta": 10000.0, "rms_norm_eps": 1e-6})";
const char* kQwen3 = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 96, "num_experts": 16,
  "num_experts_per_tok": 4, "moe_intermediate_size": 16, "norm_topk_prob": true})";

// Writes a checkpoint of `config` whose values come from `value(tensor name, index)` (norm weights: 1).
fs::path write_model(const std::string& name, const char* config, ExpertLayout layout,
                     const std::function<float(const std::string&, std::uint64_t)>& value) {
  const fs::path dir = fs::temp_directory_path() / ("amoeba_ref_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config;
  std::vector<TensorInfo> t;
  for (const ExpectedTensor& e : expected_tensors(parse_hf_moe_config(config, "config.json"), layout))
    t.push_back(TensorInfo{e.name, TensorDtype::kBF16, e.shape, 0, 0});
  std::string out = SafetensorsFile::make_header(t);
  for (const TensorInfo& x : t) {
    const bool norm = x.name.find("norm.weight") != std::string::npos;
    for (std::uint64_t i = 0; i < x.elements(); ++i) {
      const bf16 b = bf16::from_float(norm ? 1.0f : value(x.name, i));
      out.append(reinterpret_cast<const char*>(&b.bits), 2);
    }
  }
  std::ofstream(dir / "model.safetensors", std::ios::binary) << out;
  return dir;
}

// Deterministic values in [-scale, scale) that depend on the tensor and the index.
float noise(const std::string& name, std::uint64_t i, float scale = 0.25f) {
  std::uint64_t h = std::hash<std::string>{}(name) ^ (i * 0x9e3779b97f4a7c15ull);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return scale * (float(h >> 40) / float(1ull << 24) * 2.0f - 1.0f);
}

// The same weights in the fused layout: gate_up_proj[e] = [gate; up], down_proj[e] = down.
float fused_value(const std::string& name, std::uint64_t i, std::uint32_t f, std::uint32_t h) {
  const auto at = name.find("mlp.experts.");
  if (at == std::string::npos) return noise(name, i);
  const std::string layer = name.substr(0, at) + "mlp.experts.";
  const std::uint64_t m = std::uint64_t(f) * h;
  if (name.ends_with("gate_up_proj")) {
    const std::uint64_t e = i / (2 * m), within = i % (2 * m);
    const char* proj = within < m ? "gate_proj" : "up_proj";
    return noise(layer + std::to_string(e) + "." + proj + ".weight", within % m);
  }
  return noise(layer + std::to_string(i / m) + ".down_proj.weight", i % m);
}

}  // namespace

TEST_CASE("reference: prefill equals token-by-token decoding, for both architectures", "[reference]") {
  for (const char* cfg : {kQwen2, kQwen3}) {
    INFO(cfg);
    const fs::path dir = write_model("prefill", cfg, ExpertLayout::kPerExpert,
                                     [](const std::string& n, std::uint64_t i) { return noise(n, i); });
    const Checkpoint ck = open_checkpoint(dir.string());
    DecoderReference a(ck), b(ck);
    const std::vector<std::int32_t> prompt{5, 17, 3, 88, 41, 9};
    const auto whole = a.generate(prompt, 4);
    // c sees the prompt one token at a time (decode steps over the KV cache), then the generated tokens.
    DecoderReference c(ck);
    std::vector<float> logits;
    for (std::int32_t t : prompt) logits = c.feed(std::span(&t, 1));
    CHECK(logits == whole.front().logits);  // the last prompt token's logits, bit for bit
    for (std::size_t s = 0; s + 1 < whole.size(); ++s) {
      const std::int32_t t = whole[s].token;
      CHECK(c.feed(std::span(&t, 1)) == whole[s + 1].logits);
    }
    CHECK(c.position() == prompt.size() + whole.size() - 1);
    const auto again = b.generate(prompt, 4);
    for (std::size_t s = 0; s < whole.size(); ++s) {
      CHECK(again[s].token == whole[s].token);
      CHECK(again[s].logits == whole[s].logits);
    }
    for (const auto& st : whole) {
      CHECK(st.token >= 0);
      CHECK(st.token < 96);
      for (float v : st.logits) CHECK(std::isfinite(v));
    }
    // Teacher forcing with its own tokens is the free run; with other tokens the logits part after step 0.
    std::vector<std::int32_t> own;
    for (const auto& st : whole) own.push_back(st.token);
    const auto forced = b.generate_forced(prompt, own);
    REQUIRE(forced.size() == whole.size());
    for (std::size_t s = 0; s < whole.size(); ++s) CHECK(forced[s].logits == whole[s].logits);
    std::vector<std::int32_t> other(own.size(), (own[0] + 1) % 96);
    const auto moved = b.generate_forced(prompt, other);
    CHECK(moved[0].logits == whole[0].logits);
    CHECK(moved[1].logits != whole[1].logits);
    const auto& routed = a.last_routing(1);
    REQUIRE(routed.size() == 1);  // the last forward was one decode token
    CHECK(routed[0].size() == ck.config.top_k);
  }
}

TEST_CASE("reference: fused and per-expert layouts give the same logits", "[reference]") {
  const HfMoeConfig c = parse_hf_moe_config(kQwen3, "c");
  const fs::path per = write_model("per", kQwen3, ExpertLayout::kPerExpert,
                                   [](const std::string& n, std::uint64_t i) { return noise(n, i); });
  const fs::path fused =
      write_model("fused", kQwen3, ExpertLayout::kFused, [&](const std::string& n, std::uint64_t i) {
        return fused_value(n, i, c.moe_intermediate_size, c.hidden_size);
      });
  const std::vector<std::int32_t> prompt{1, 2, 3, 4, 60, 61};
  DecoderReference a(open_checkpoint(per.string())), b(open_checkpoint(fused.string()));
  const auto x = a.generate(prompt, 3), y = b.generate(prompt, 3);
  for (std::size_t s = 0; s < x.size(); ++s) CHECK(x[s].logits == y[s].logits);
}

TEST_CASE("reference: with every mixer zero the model is its embedding, so greedy repeats the token",
          "[reference]") {
  // o_proj and every down projection zero: attention and MoE add nothing; the final norm of an embedding row
  // scores highest against itself when the rows are near-orthogonal (random, dimension 64, tied LM head).
  std::string cfg = kQwen2;
  cfg.replace(cfg.find("\"rope_theta\""), 0, "\"tie_word_embeddings\": true, ");
  const fs::path dir =
      write_model("zero", cfg.c_str(), ExpertLayout::kPerExpert, [](const std::string& n, std::uint64_t i) {
        if (n.find("o_proj") != std::string::npos || n.find("down_proj") != std::string::npos) return 0.0f;
        return noise(n, i, n.find("embed_tokens") != std::string::npos ? 1.0f : 0.25f);
      });
  DecoderReference ref(open_checkpoint(dir.string()));
  const std::vector<std::int32_t> prompt{7, 31, 50};
  for (const auto& st : ref.generate(prompt, 5)) CHECK(st.token == 50);
}
