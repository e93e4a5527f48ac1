// Model catalog, GPU profiles, cost-model files and the memory plan: public config facts, derived page
// sizes (DESIGN §3.1 worked numbers), and refusals that name the numbers.
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/gpu.hpp"
#include "engine/memory_plan.hpp"
#include "engine/model.hpp"

using namespace amoeba;
using namespace amoeba::engine;

TEST_CASE("catalog parameter counts match the published model sizes", "[catalog]") {
  struct Want {
    const char* name;
    double total_b;
  };
  for (const Want& w :
       {Want{"qwen1.5-moe-a2.7b", 14.3}, Want{"qwen3-30b-a3b", 30.5}, Want{"mixtral-8x7b", 46.7},
        Want{"deepseek-v2-lite", 15.7}, Want{"qwen3-next-80b-a3b", 80.0},
        // text models without the vision encoder and the multi-token-prediction layer
        Want{"qwen3.5-35b-a3b", 35.0}, Want{"qwen3.5-122b-a10b", 122.0}}) {
    INFO(w.name);
    const ModelSpec m = find_model(w.name);
    CHECK(double(m.total_params()) / 1e9 == Approx(w.total_b).epsilon(0.01));
  }
  // DESIGN §4: Qwen1.5-MoE routed experts ~24.9 GB, one expert ~17.3 MB, KV 192 KiB per token.
  const ModelSpec q = find_model("qwen1.5-moe-a2.7b");
  CHECK(2.0 * double(q.routed_expert_params()) / 1e9 == Approx(24.9).epsilon(0.005));
  CHECK(double(q.expert_bytes()) / 1e6 == Approx(17.3).epsilon(0.005));
  CHECK(q.kv_bytes_per_token() == 192 * 1024);
}

TEST_CASE("page sizes: the worked numbers of DESIGN 3.1", "[catalog]") {
  auto geo = [](const char* n) { return page_geometry(find_model(n)); };
  CHECK(geo("qwen1.5-moe-a2.7b").expert_page_bytes == 5'767'168);
  CHECK(geo("qwen1.5-moe-a2.7b").kv_page_bytes == 131'072);
  CHECK(geo("qwen1.5-moe-a2.7b").kv_pages_per_expert_page() == 44);
  CHECK(geo("qwen3-30b-a3b").expert_page_bytes == 3'145'728);
  CHECK(geo("qwen3-30b-a3b").kv_pages_per_expert_page() == 96);
  CHECK(geo("mixtral-8x7b").expert_page_bytes == 117'440'512);
  CHECK(geo("mixtral-8x7b").kv_pages_per_expert_page() == 1792);
  // DeepSeek-V2-Lite: the 576-value MLA latent gives 18,432 B per 16 tokens, which divides no expert page;
  // rounded up to the smallest divisor (11 x 2^11 = 22,528 B), 4,096 B of padding per page.
  const PageGeometry d = geo("deepseek-v2-lite");
  CHECK(d.kv_payload_bytes == 18'432);
  CHECK(d.kv_page_bytes == 22'528);
  CHECK(d.kv_padding_bytes() == 4'096);
  CHECK(d.expert_page_bytes % d.kv_page_bytes == 0);
  // Hybrid: one SSM page per linear layer (1 MiB of bf16 recurrent state), conv state padded to 64 KiB.
  const ModelSpec n = find_model("qwen3-next-80b-a3b");
  CHECK(n.attention_layers() == 12);
  CHECK(n.linear_layers() == 36);
  const PageGeometry g = page_geometry(n);
  CHECK(g.ssm_page_bytes == 1'048'576);
  CHECK(g.conv_payload_bytes == 49'152);
  CHECK(g.conv_page_bytes == 65'536);
}

TEST_CASE("unknown names and bad files are errors naming field / value and rule", "[catalog]") {
  CHECK_THROWS_WITH(find_model("gpt-5"), Catch::Contains("--model = gpt-5: unknown model (known: ") &&
                                             Catch::Contains("qwen1.5-moe-a2.7b"));
  CHECK_THROWS_WITH(find_gpu("rtx9090"), Catch::Contains("--gpu = rtx9090: unknown GPU (known: "));
  CHECK_THROWS_WITH(find_cost_model("fancy"), Catch::Contains("--cost-model = fancy"));
  nlohmann::json j = nlohmann::json::parse(R"({"name":"x","num_layers":2,"hidden_size":64,"vocab_size":10,
      "attention":{"kind":"gqa","num_heads":2,"num_kv_heads":4,"head_dim":16},
      "moe":{"num_experts":4,"top_k":1,"moe_intermediate_size":32}})");
  CHECK_THROWS_WITH(parse_model(j.dump(), "m.json"), Catch::Contains("m.json.attention.num_kv_heads = 4") &&
                                                         Catch::Contains("must be in [1, 2]"));
  j["attention"]["num_kv_heads"] = 1;
  j["attention"]["kind"] = "sparse";
  CHECK_THROWS_WITH(parse_model(j.dump(), "m.json"), Catch::Contains("m.json.attention.kind = sparse"));
  j["attention"]["kind"] = "gqa";
  CHECK(parse_model(j.dump(), "m.json").num_experts == 4);
  j["moe"]["top_k"] = 5;
  CHECK_THROWS_WITH(parse_model(j.dump(), "m.json"), Catch::Contains("m.json.moe.top_k = 5"));
  j["moe"]["top_k"] = 1;
  j["extra"] = true;
  CHECK_THROWS_WITH(parse_model(j.dump(), "m.json"),
                    Catch::Contains("m.json.extra = true: is not a known field"));
  CHECK_THROWS_WITH(parse_gpu(R"({"name":"g","memory_mib":1024,"hbm_bandwidth_gbs":-5,"bf16_tflops":1,
      "h2d_bandwidth_gbs":1,"h2d_copy_latency_us":1})",
                              "g.json"),
                    Catch::Contains("g.json.hbm_bandwidth_gbs = -5"));
}

TEST_CASE("cost-model files round-trip the format a calibration run writes", "[catalog]") {
  CostModelParams p = find_cost_model("default");
  CHECK_FALSE(p.calibrated);
  p.name = "h200-calibrated";
  p.calibrated = true;
  p.moe_memory_efficiency = 0.83;
  const CostModelParams q = parse_cost_model(cost_model_to_json(p), "c.json");
  CHECK(q.name == "h200-calibrated");
  CHECK(q.calibrated);
  CHECK(q.moe_memory_efficiency == 0.83);
  CHECK(q.step_overhead_s == Approx(p.step_overhead_s));
  CHECK_THROWS_WITH(parse_cost_model(R"({"moe_memory_efficiency": 1.5})", "c.json"),
                    Catch::Contains("c.json.moe_memory_efficiency = 1.5"));
}

TEST_CASE("memory plan: what the pool gets / and refusals with the numbers", "[catalog][memory]") {
  const ModelSpec q = find_model("qwen1.5-moe-a2.7b");
  const GpuProfile g = find_gpu("rtx5090");
  MemoryConfig mem;
  mem.usable_fraction = 0.9;
  const MemoryPlan s = plan_memory(q, g, mem, 2048, 256, 2048, 0, 60, 60, "static");
  CHECK(s.initial_resident_per_layer == 60);
  CHECK(s.pool_bytes == s.budget_bytes - s.context_bytes - s.non_expert_bytes - s.activation_bytes);
  CHECK(double(s.initial_kv_bytes()) / 1e9 == Approx(1.30).margin(0.02));
  // Each offloaded expert per layer buys 24 x 17.3 MB of KV, minus 2 x 17.3 MB of load buffer.
  const MemoryPlan f = plan_memory(q, g, mem, 2048, 256, 2048, 6, 54, 54, "fixed");
  CHECK(f.initial_kv_bytes() - s.initial_kv_bytes() == (6 * 24 - 12) * q.expert_bytes());
  // Qwen3-30B-A3B does not fit a 24 GB card all-resident: refused before start, with the numbers.
  CHECK_THROWS_WITH(plan_memory(find_model("qwen3-30b-a3b"), find_gpu("rtx4090d"), mem, 2048, 256, 2048, 0,
                                128, 128, "static"),
                    Catch::Contains("memory = qwen3-30b-a3b on rtx4090d (policy static): does not fit") &&
                        Catch::Contains("GB") && Catch::Contains("128 resident experts per layer"));
  // A memory cap smaller than the non-expert weights.
  mem.memory_cap_bytes = 2ull << 30;
  CHECK_THROWS_WITH(plan_memory(q, g, mem, 2048, 256, 2048, 0, 60, 60, "static"),
                    Catch::Contains("non-expert weights"));
  // Elastic starts with as many experts as fit, never fewer than E - limit.
  mem.memory_cap_bytes = 0;
  const MemoryPlan e = plan_memory(find_model("qwen3-30b-a3b"), find_gpu("rtx5090"), mem, 2048, 256, 2048,
                                   100, 28, 128, "elastic");
  CHECK(e.initial_resident_per_layer >= 28);
  CHECK(e.initial_resident_per_layer < 128);
  CHECK(e.initial_kv_bytes() >= e.min_kv_bytes);
}
