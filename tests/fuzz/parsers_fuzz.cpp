// Fuzz target for every file parser the engine exposes to users: JSONL traces, scenario configs, and model,
// GPU and cost-model files, routing records and Hugging Face config.json files. Any input must either parse
// into values that satisfy the documented rules or throw amoeba::ConfigError with a bounded message; anything
// else (another exception, a crash, a stack overflow, a sanitizer report) is a bug. The first byte picks the
// parser: below 250, byte % 5 picks the first five (so older corpus files keep their parser); 250 and up pick
// a routing record (even) or a config.json (odd). libFuzzer build: preset `fuzz` (clang,
// AMOEBA_BUILD_FUZZERS=ON), run from the source root with the seed corpus and dictionary here (new inputs go
// to WORK_DIR):
//   build/fuzz/tests/fuzz/parsers_fuzz -dict=tests/fuzz/parsers.dict -runs=1000000 WORK_DIR corpus_dir
// where corpus_dir = tests/fuzz/corpus/parsers.
// Otherwise (gcc) a replay main runs random and mutated-seed inputs (deep nesting and huge numbers among
// them) as an ordinary ctest.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/core/errors.hpp"
#include "engine/checkpoint.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/routing_record.hpp"
#include "engine/scenario.hpp"
#include "engine/workload.hpp"

using namespace amoeba;
using namespace amoeba::engine;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] >= 250 ? 5 + data[0] % 2 : data[0] % 5) {
      case 0: {
        const TraceLimits lim{2048};
        const auto t = parse_trace(text, "fuzz", lim);
        double last = 0;
        for (const Request& r : t) {
          if (r.prompt_tokens < 1 || r.output_tokens < 1 || r.prompt_tokens + r.output_tokens > 2048 ||
              !(r.arrival_s >= last))
            std::abort();  // a rule the parser promised
          last = r.arrival_s;
        }
        break;
      }
      case 1: {
        const Scenario s = parse_scenario(text, "fuzz");
        if (!(s.rate > 0) || s.requests == 0) std::abort();
        (void)scenario_to_json(s);
        break;
      }
      case 2: {
        const ModelSpec m = parse_model(text, "fuzz");
        const PageGeometry g = page_geometry(m);
        if (g.kv_page_bytes == 0 || g.expert_page_bytes % g.kv_page_bytes != 0) std::abort();
        break;
      }
      case 3:
        (void)parse_gpu(text, "fuzz");
        break;
      case 4:
        (void)parse_cost_model(text, "fuzz");
        break;
      case 5: {
        const RoutingRecord r = parse_routing_record(text, "fuzz");
        for (const RecordedStep& st : r.steps) {
          if (st.size() != r.header.moe_layers) std::abort();
          for (const auto& layer : st)
            for (std::size_t i = 0; i < layer.size(); ++i)
              if (layer[i] >= r.header.experts || (i > 0 && layer[i] <= layer[i - 1])) std::abort();
        }
        (void)routing_counts(r);
        break;
      }
      default: {
        const HfMoeConfig c = parse_hf_moe_config(text, "fuzz");
        if (c.moe_layers() == 0 || c.top_k > c.num_experts || c.num_heads % c.num_kv_heads != 0) std::abort();
        break;
      }
    }
  } catch (const ConfigError& e) {
    // Quoted values are cut short (json_fields.hpp); a field path is at most kMaxJsonDepth quoted keys.
    if (e.value().size() > 256 || e.field().size() > 4096) std::abort();
  }
  return 0;
}

#ifndef AMOEBA_LIBFUZZER
int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 3000;
  const std::vector<std::string> seeds = {
      "{\"arrival_s\": 0.5, \"prompt_tokens\": 10, \"output_tokens\": 5}\n{\"arrival_s\": 1, "
      "\"prompt_tokens\": "
      "3, \"output_tokens\": 9}\n",
      R"({"model": "qwen3-30b-a3b", "workload": {"rate": 3, "requests": 10}, "experts": {"fixed_offload": 4}})",
      R"({"name":"x","num_layers":2,"hidden_size":64,"vocab_size":10,"attention":{"kind":"mla","num_heads":2,
        "num_kv_heads":1,"head_dim":16,"kv_lora_rank":32,"qk_rope_head_dim":8,"qk_nope_head_dim":8,
        "v_head_dim":8},"moe":{"num_experts":4,"top_k":1,"moe_intermediate_size":32}})",
      R"({"name":"g","memory_mib":1024,"hbm_bandwidth_gbs":5,"bf16_tflops":1,"h2d_bandwidth_gbs":1,
        "h2d_copy_latency_us":1})",
      R"({"moe_memory_efficiency":0.5,"moe_compute_efficiency":0.5,"dense_memory_efficiency":0.5,
        "dense_compute_efficiency":0.5,"attention_memory_efficiency":0.5,"attention_compute_efficiency":0.5,
        "per_layer_overhead_us":1,"step_overhead_us":1})",
      "{\"format\": \"amoeba.routing\", \"version\": 1, \"model\": \"m\", \"moe_layers\": 2, \"experts\": 4, "
      "\"top_k\": 2, \"backend\": \"sim\", \"routing\": \"synthetic\"}\n{\"step\": 0, \"tokens\": 3, "
      "\"experts\": [[0, 2], [1]], \"counts\": [[2, 1], [3]]}\n",
      R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 96, "num_experts": 16,
        "num_experts_per_tok": 4, "moe_intermediate_size": 16, "mlp_only_layers": [0],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})"};
  // Hostile shapes: nesting far past the limit (under known and unknown keys), numbers past a double and
  // past 2^64, a huge string, a repeated key.
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  const std::vector<std::string> hostile = {
      "{\"arrival_s\": " + deep + ", \"prompt_tokens\": 3, \"output_tokens\": 4}\n",
      R"({"workload": {"rate": 1e400, "seed": 184467440737095516160, "requests": 1e300}, "x": )" + deep + "}",
      R"({"name": "m", "attention": )" + deep + "}",
      R"({"name": "g", "sources": {"a": ")" + std::string(100000, 's') + R"("}, "memory_mib": 1e19})",
      R"({"name": "k", "name": "k", "step_overhead_us": -1e-400})",
      "{\"format\": \"amoeba.routing\", \"version\": 1, \"model\": \"m\", \"moe_layers\": 1, \"experts\": 4, "
      "\"top_k\": 1, \"backend\": \"sim\", \"routing\": \"x\"}\n{\"step\": 0, \"tokens\": 1e400, "
      "\"experts\": " +
          deep + "}\n",
      R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 184467440737095516160, "x": )" + deep +
          "}"};
  std::mt19937_64 rng(2024);
  std::vector<std::uint8_t> buf;
  for (int r = 0; r < runs; ++r) {
    const std::size_t kind = r % 7;
    std::string s = (r / 7) % 4 == 3 ? hostile[kind] : seeds[kind];
    const int edits = static_cast<int>(rng() % 6);
    for (int e = 0; e < edits && !s.empty(); ++e) {  // mutate the seed: flip, insert, delete bytes
      const std::size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[at] = static_cast<char>(rng());
          break;
        case 1:
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), "{}[]\":,-0123456789e."[rng() % 20]);
          break;
        default:
          s.erase(at, 1 + rng() % 4);
          break;
      }
    }
    if (r % 7 == 0) {  // pure noise too
      s.resize(rng() % 256);
      for (char& c : s) c = static_cast<char>(rng());
    }
    buf.assign(1, static_cast<std::uint8_t>(kind < 5 ? kind : 250 + (kind - 5)));
    buf.insert(buf.end(), s.begin(), s.end());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("parsers_fuzz: %d inputs, no failure\n", runs);
  return 0;
}
#endif
