// Checkpoint validation on the CPU, on checkpoints the test writes itself: a well-formed tiny Qwen2-MoE and
// Qwen3-MoE pass; a missing tensor, a wrong shape or dtype, a truncated shard, a broken safetensors header or
// a config of another architecture are refused with the tensor, the expected and the found value.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/errors.hpp"
#include "checkpoint_files.hpp"
#include "engine/checkpoint.hpp"
#include "engine/safetensors.hpp"

using namespace amoeba;
using namespace amoeba::engine;
using namespace amoeba::engine::checkpoint_files;
namespace fs = std::filesystem;

namespace {

const char* kQwen2Config = R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
  "vocab_size": 50, "intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
  "moe_intermediate_size": 16, "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "norm_topk_prob": false, "tie_word_embeddings": false, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0, "torch_dtype": "bfloat16"})";
const char* kQwen3Config = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
  "head_dim": 16, "vocab_size": 50, "intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
  "moe_intermediate_size": 8, "norm_topk_prob": true, "attention_bias": false, "tie_word_embeddings": false})";

}  // namespace

TEST_CASE("well-formed Qwen2-MoE and Qwen3-MoE checkpoints pass, single file and sharded", "[checkpoint]") {
  const Checkpoint a = open_checkpoint(write_checkpoint("q2", kQwen2Config).string());
  CHECK(a.config.arch == MoeArchitecture::kQwen2Moe);
  CHECK(a.config.head_dim == 8);
  CHECK(a.config.qkv_bias);
  CHECK_FALSE(a.config.norm_topk_prob);
  CHECK(a.unused.empty());
  // 1 embedding + 2 layers x (2 norms + 4 proj + 3 biases + router + 4 experts x 3 + shared 3 + gate) + norm
  // + head
  CHECK(a.shard_of.size() == 1 + 2 * (2 + 4 + 3 + 1 + 12 + 3 + 1) + 2);
  const TensorInfo& w2 = a.tensor(expert_tensor_name(1, 3, ExpertMatrix::kW2));
  CHECK(w2.shape == std::vector<std::uint64_t>{32, 16});
  std::vector<std::byte> buf(w2.bytes());
  a.shard(w2.name).read(w2.name, buf);
  CHECK(buf[0] == static_cast<std::byte>((w2.begin * 7 + 3) & 0xff));

  const Checkpoint b = open_checkpoint(write_checkpoint("q3", kQwen3Config, 3).string());
  CHECK(b.config.arch == MoeArchitecture::kQwen3Moe);
  CHECK(b.shards.size() == 3);
  CHECK(b.config.qk_norm);
  CHECK(b.config.norm_topk_prob);
  CHECK(b.tensor("model.layers.0.self_attn.q_proj.weight").shape == std::vector<std::uint64_t>{128, 32});
  CHECK(b.tensor("model.layers.1.self_attn.k_norm.weight").shape == std::vector<std::uint64_t>{16});
  const ModelSpec m = b.config.to_model_spec("tiny-qwen3");
  CHECK(m.expert_page_bytes() == 8 * 32 * 2);
  CHECK(m.moe_layers() == 2);
  CHECK(m.num_shared_experts == 0);
}

TEST_CASE("fused experts (transformers 5 names): accepted, and each matrix found inside its tensor",
          "[checkpoint]") {
  const Checkpoint c =
      open_checkpoint(write_checkpoint("fused", kQwen3Config, 2, {}, ExpertLayout::kFused).string());
  CHECK(c.layout == ExpertLayout::kFused);
  CHECK(c.tensor("model.layers.1.mlp.experts.gate_up_proj").shape == std::vector<std::uint64_t>{8, 16, 32});
  const std::uint64_t m = 8 * 32 * 2;  // F x H bf16
  const ExpertSlice w3 = c.expert_slice(1, 5, ExpertMatrix::kW3);
  CHECK(w3.tensor == "model.layers.1.mlp.experts.gate_up_proj");
  CHECK(w3.offset == (2 * 5 + 1) * m);
  CHECK(w3.bytes == m);
  CHECK(c.expert_slice(0, 7, ExpertMatrix::kW2).offset == 7 * m);
  const Checkpoint p = open_checkpoint(write_checkpoint("perexpert", kQwen3Config).string());
  CHECK(p.expert_slice(1, 5, ExpertMatrix::kW3).tensor == "model.layers.1.mlp.experts.5.up_proj.weight");
  CHECK(p.expert_slice(1, 5, ExpertMatrix::kW3).offset == 0);
  // One layer fused and the next per expert is refused: the fused down_proj of layer 1 is missing.
  const auto mixed = write_checkpoint(
      "mixed", kQwen3Config, 1,
      [](std::vector<TensorInfo>& t) {
        std::erase_if(t,
                      [](const TensorInfo& x) { return x.name == "model.layers.1.mlp.experts.down_proj"; });
      },
      ExpertLayout::kFused);
  CHECK_THROWS_WITH(open_checkpoint(mixed.string()),
                    Catch::Contains("tensor model.layers.1.mlp.experts.down_proj = (missing)"));
}

TEST_CASE("the public Qwen1.5-MoE-A2.7B config gives the catalog's shapes", "[checkpoint]") {
  const HfMoeConfig c = parse_hf_moe_config(R"({"architectures": ["Qwen2MoeForCausalLM"],
    "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "vocab_size": 151936, "intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
    "norm_topk_prob": false, "tie_word_embeddings": false})",
                                            "config.json");
  const ModelSpec a = c.to_model_spec("from-config"), b = find_model("qwen1.5-moe-a2.7b");
  CHECK(a.expert_bytes() == b.expert_bytes());
  CHECK(a.kv_bytes_per_token() == b.kv_bytes_per_token());
  CHECK(a.total_params() == b.total_params());
}

TEST_CASE("bad checkpoints are refused naming the tensor, the expected and the found value", "[checkpoint]") {
  SECTION("a missing expert matrix") {
    const auto dir = write_checkpoint("missing", kQwen2Config, 2, [](std::vector<TensorInfo>& t) {
      std::erase_if(
          t, [](const TensorInfo& x) { return x.name == expert_tensor_name(1, 2, ExpertMatrix::kW3); });
    });
    CHECK_THROWS_WITH(
        open_checkpoint(dir.string()),
        Catch::Contains("tensor model.layers.1.mlp.experts.2.up_proj.weight = (missing): is required "
                        "by Qwen2MoeForCausalLM (shape [16, 32], BF16)"));
  }
  SECTION("a wrong shape") {
    const auto dir = write_checkpoint("shape", kQwen2Config, 1, [](std::vector<TensorInfo>& t) {
      for (auto& x : t)
        if (x.name == "model.layers.0.mlp.experts.3.down_proj.weight") x.shape = {32, 15};
    });
    CHECK_THROWS_WITH(
        open_checkpoint(dir.string()),
        Catch::Contains("tensor model.layers.0.mlp.experts.3.down_proj.weight: shape = [32, 15]: "
                        "expected [32, 16]"));
  }
  SECTION("a wrong dtype") {
    const auto dir = write_checkpoint("dtype", kQwen3Config, 1, [](std::vector<TensorInfo>& t) {
      for (auto& x : t)
        if (x.name == "model.layers.1.self_attn.q_norm.weight") x.dtype = TensorDtype::kF32;
    });
    CHECK_THROWS_WITH(
        open_checkpoint(dir.string()),
        Catch::Contains("tensor model.layers.1.self_attn.q_norm.weight: dtype = F32: expected BF16"));
  }
  SECTION("a truncated shard") {
    const auto dir = write_checkpoint("trunc", kQwen2Config, 2);
    const fs::path shard = dir / "model-00002-of-00002.safetensors";
    fs::resize_file(shard, fs::file_size(shard) - 100);
    CHECK_THROWS_WITH(open_checkpoint(dir.string()), Catch::Contains("truncated shard?") &&
                                                         Catch::Contains("model-00002-of-00002.safetensors"));
  }
  SECTION("a config of another architecture") {
    const auto dir = write_checkpoint("arch", kQwen2Config);
    write_file(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32})");
    CHECK_THROWS_WITH(
        open_checkpoint(dir.string()),
        Catch::Contains("config.json.architectures = LlamaForCausalLM: is not served by the GPU "
                        "backend (known: Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)"));
  }
  SECTION("a tensor stored in two shards") {
    const auto dir = write_checkpoint("twice", kQwen2Config, 2);
    write_shard(dir / "extra.safetensors", {TensorInfo{"model.norm.weight", TensorDtype::kBF16, {32}, 0, 0}});
    fs::remove(dir / "model.safetensors.index.json");
    CHECK_THROWS_WITH(open_checkpoint(dir.string()),
                      Catch::Contains("model.norm.weight") && Catch::Contains("is stored twice"));
  }
  SECTION("a config field out of range") {
    const auto dir = write_checkpoint("cfg", kQwen3Config);
    std::string cfg = kQwen3Config;
    cfg.replace(cfg.find("\"num_experts_per_tok\": 2"), 24, "\"num_experts_per_tok\": 9");
    write_file(dir / "config.json", cfg);
    CHECK_THROWS_WITH(open_checkpoint(dir.string()),
                      Catch::Contains("num_experts_per_tok = 9: must be an integer in [1, 8]"));
  }
}

TEST_CASE("safetensors headers: every rule of the format is checked", "[checkpoint][safetensors]") {
  const fs::path p = fs::temp_directory_path() / "amoeba_header_test.safetensors";
  auto with_header = [&](const std::string& json, std::size_t data_bytes) {
    std::string h = json;
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    write_file(p, out + h + std::string(data_bytes, '\0'));
    return p.string();
  };
  const auto ok = SafetensorsFile::open(with_header(
      R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},)"
      R"( "b": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]}})",
      16));
  CHECK(ok.tensors().size() == 2);
  CHECK(ok.metadata().at("format") == "pt");
  CHECK(ok.find("b")->elements() == 1);
  struct Bad {
    std::string json;
    std::size_t data;
    std::string message;
  };
  const std::vector<Bad> bad{
      {R"({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})", 12,
       "a.data_offsets = [0,10]: span 10 bytes, but 6 BF16 elements take 12"},
      {R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]}})", 8, "leaves a hole after byte 0"},
      {R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}, "b": {"dtype": "BF16", "shape": [2],)"
       R"( "data_offsets": [2, 6]}})",
       8, "overlaps the tensor before it (which ends at 4)"},
      {R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 4]}})", 4,
       "a.dtype = \"Q4\": is not a safetensors dtype"},
      {R"({"a": {"dtype": "BF16", "shape": [-2], "data_offsets": [0, 4]}})", 4, "a.shape = [-2]"},
      {R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4], "x": 1}})", 4,
       "a.x = 1: is not a safetensors field"},
      {R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})", 6,
       "end past the file's data (6 bytes)"},
      {R"([1, 2])", 0, "header = array: must be a JSON object"},
  };
  for (const Bad& b : bad) {
    INFO(b.json);
    CHECK_THROWS_WITH(SafetensorsFile::open(with_header(b.json, b.data)), Catch::Contains(b.message));
  }
  // A header length beyond the file.
  std::string huge(8, '\0');
  huge[0] = static_cast<char>(0xff);
  huge[1] = static_cast<char>(0x01);
  write_file(p, huge + "{}");
  CHECK_THROWS_WITH(SafetensorsFile::open(p.string()),
                    Catch::Contains("exceeds the file (2 bytes after the length)"));
  fs::remove(p);
}

TEST_CASE("RoPE settings: top-level rope_theta or transformers 5's rope_parameters, scaled RoPE refused",
          "[checkpoint]") {
  std::string cfg = kQwen3Config;
  cfg.insert(cfg.rfind('}'), R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})");
  CHECK(parse_hf_moe_config(cfg, "c").rope_theta == 1e6);
  std::string yarn = kQwen3Config;
  yarn.insert(yarn.rfind('}'), R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})");
  CHECK_THROWS_WITH(parse_hf_moe_config(yarn, "c"),
                    Catch::Contains("c.rope_scaling.rope_type = yarn: only the default RoPE is supported"));
  CHECK(parse_hf_moe_config(kQwen2Config, "c").rope_theta == 1e6);
  // transformers 5 names Qwen3-MoE's expert count num_local_experts.
  std::string local = kQwen3Config;
  local.replace(local.find("\"num_experts\""), 13, "\"num_local_experts\"");
  CHECK(parse_hf_moe_config(local, "c").num_experts == 8);
}

TEST_CASE("read_expert: W1, W3, W2 back to back from either layout, MoE layers after a dense prefix",
          "[checkpoint]") {
  // Every byte of every tensor is a function of (tensor name, position): compare against the per-expert
  // files.
  const Checkpoint per = open_checkpoint(write_checkpoint("rx_per", kQwen3Config).string());
  const Checkpoint fused =
      open_checkpoint(write_checkpoint("rx_fused", kQwen3Config, 1, {}, ExpertLayout::kFused).string());
  const std::uint64_t m = 8 * 32 * 2;
  std::vector<std::byte> a(3 * m), b(3 * m), w(m);
  per.read_expert(1, 6, a);
  std::size_t j = 0;
  for (ExpertMatrix x : {ExpertMatrix::kW1, ExpertMatrix::kW3, ExpertMatrix::kW2}) {
    const std::string name = expert_tensor_name(1, 6, x);
    per.shard(name).read(name, w);
    CHECK(std::equal(w.begin(), w.end(), a.begin() + std::ptrdiff_t(j++ * m)));
  }
  fused.read_expert(1, 6, b);
  const ExpertSlice s = fused.expert_slice(1, 6, ExpertMatrix::kW3);
  fused.shard(s.tensor).read_range(s.tensor, s.offset, w);
  CHECK(std::equal(w.begin(), w.end(), b.begin() + std::ptrdiff_t(m)));
  CHECK_THROWS_WITH(per.read_expert(2, 0, a), Catch::Contains("needs a MoE layer < 2"));
  const std::string w1 = expert_tensor_name(0, 0, ExpertMatrix::kW1);
  CHECK_THROWS_WITH(per.shard(w1).read_range(w1, m - 2, std::span(w).first(4)),
                    Catch::Contains("lie outside the tensor's 512 bytes"));
  // A dense first layer: MoE layer 0 is model layer 1.
  std::string cfg = kQwen2Config;
  cfg.replace(cfg.find("\"mlp_only_layers\": []"), 21, "\"mlp_only_layers\": [0]");
  const Checkpoint d = open_checkpoint(write_checkpoint("rx_dense", cfg.c_str()).string());
  CHECK(d.config.moe_layers() == 1);
  CHECK(d.model_layer(0) == 1);
  CHECK(d.tensor("model.layers.0.mlp.down_proj.weight").shape == std::vector<std::uint64_t>{32, 64});
  std::vector<std::byte> e(3 * 16 * 32 * 2), f(16 * 32 * 2);
  d.read_expert(0, 3, e);
  d.shard(expert_tensor_name(1, 3, ExpertMatrix::kW1)).read(expert_tensor_name(1, 3, ExpertMatrix::kW1), f);
  CHECK(std::equal(f.begin(), f.end(), e.begin()));
}
