// GPU tests of the CUDA backend (engine/cuda_backend.hpp) driven by the real engine: the same requests served
// with every expert resident and with experts evicted and restored at every step (misses loaded on demand
// into the load buffer, restores copied into reserved pages while the step runs) give bit-identical tokens,
// also when a KV page limit forces preemptions in both runs (SchedulerConfig::kv_page_limit: the same KV
// capacity, so the same preemptions and recomputes); and a KV cache short enough to force preemptions still
// serves every request (recomputed sequences read their own tokens again). Small random models of both
// architectures (Qwen2-MoE with biases and shared expert chunks, Qwen3-MoE with q/k norms and 8 query heads
// per KV head). Exits 77 (skipped) without a GPU.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/adjust/adjuster.hpp"
#include "amoeba/policies/stacks.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/cuda_backend.hpp"
#include "engine/engine.hpp"
#include "engine/model_weights.hpp"
#include "engine/routing_source.hpp"
#include "small_models.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

HfMoeConfig small_qwen2() {
  return test::small_config(test::small_qwen2_json(3));
}
HfMoeConfig small_qwen3() {
  return test::small_config(test::small_qwen3_json(3));
}

// Evicts `n` experts at even steps and asks for `n` back at odd ones, whatever the memory pressure.
struct ChurnCapacity {
  std::uint32_t n = 3;
  std::shared_ptr<std::uint64_t> steps = std::make_shared<std::uint64_t>(0);
  CapacityDecision decide(const AdjustSignal&, const AdjustView&) const {
    return (*steps)++ % 2 == 0 ? CapacityDecision{n, 0} : CapacityDecision{0, n};
  }
  std::uint32_t layer_capacity(const AdjustView& v, std::uint32_t) const { return v.experts_per_layer(); }
  std::uint32_t initial_resident(const AdjustView& v, std::uint32_t) const { return v.experts_per_layer(); }
};
static_assert(capacity_rule<ChurnCapacity>);
using ChurnAdjuster = Adjuster<policies::RankedEvict, policies::RankedRestore, ChurnCapacity>;

// Every request arrives at 0: a measured backend's clock is its real step times, so staggered arrivals would
// meet different steps in different runs, the batches would differ, and bf16 sums over other batch shapes
// need not be bit-identical. With one arrival time the scheduler alone decides the batches.
std::vector<Request> requests(std::uint32_t n) {
  std::vector<Request> r;
  for (std::uint32_t i = 0; i < n; ++i) r.push_back(Request{i, 0.0, 5 + 37 * i % 90, 6 + 11 * i % 20});
  return r;
}

struct Served {
  std::map<std::uint64_t, std::vector<std::int32_t>> tokens;
  RunResult result;
};

// Serves `trace` with adjuster `adj` on a pool of every expert plus `kv_pages` KV pages, at most
// `kv_page_limit` of them held at once (0: no limit).
template <class Adj>
Served serve(const HfMoeConfig& hf, Adj adj, std::uint32_t offload_limit, std::uint64_t kv_pages,
             const std::vector<Request>& trace, std::uint64_t kv_page_limit = 0) {
  const ModelSpec model = hf.to_model_spec("test");
  const PageGeometry g = page_geometry(model);
  const std::uint64_t pool_bytes = model.total_experts() * model.expert_bytes() + kv_pages * g.kv_page_bytes;
  SchedulerConfig sched;
  sched.max_num_batched_tokens = 128;
  sched.max_num_seqs = 16;
  sched.max_model_len = 256;
  sched.kv_page_limit = kv_page_limit;
  CudaBackendConfig cfg;
  cfg.model = hf;
  cfg.seed = 7;
  cfg.geometry = g;
  cfg.pool_bytes = pool_bytes;
  cfg.load_buffer_experts = offload_limit;
  cfg.max_batched_tokens = sched.max_num_batched_tokens;
  cfg.max_seqs = sched.max_num_seqs;
  cfg.keep_tokens = true;  // read after the run
  const std::uint32_t vocab = hf.vocab_size;
  CudaBackend backend(
      cfg, [vocab](std::uint64_t r, std::uint32_t p) { return synthetic_prompt_token(1, vocab, r, p); });
  MoePool pool(
      ArenaSpan{nullptr, pool_bytes},
      MoePool::Layout{PageSpec{g.expert_page_bytes, 0}, PageSpec{g.kv_page_bytes, g.kv_payload_bytes}});
  auto routing = std::make_unique<ModelRouting>(model.moe_layers(), model.num_experts);
  Engine<MoePool, Adj, CudaBackend> engine(model, g, sched, std::move(pool), std::move(adj),
                                           std::move(backend), std::move(routing), trace);
  Served s;
  s.result = engine.run();
  for (const Request& r : trace) {
    const auto t = engine.backend().tokens(r.id);
    s.tokens[r.id].assign(t.begin() + r.prompt_tokens, t.end());
  }
  REQUIRE_FALSE(engine.drain().has_value());
  return s;
}

// With kv_page_limit > 0 both runs hold at most that many KV pages, so they preempt at the same steps
// (the churned run's pool has pages to spare whenever experts are out) and recompute alike.
void same_tokens_under_pressure(const HfMoeConfig& hf, std::uint64_t kv_page_limit = 0) {
  const std::vector<Request> trace = requests(24);
  const ModelSpec model = hf.to_model_spec("test");
  AdjusterConfig ac;
  ac.expert_offload_limit = 4;
  const Served all =
      serve(hf, policies::StaticAdjuster(ExpertRanker::uniform(model.moe_layers(), model.num_experts)), 0,
            4096, trace, kv_page_limit);
  ChurnCapacity churn;
  const Served moved =
      serve(hf, ChurnAdjuster(ExpertRanker::uniform(model.moe_layers(), model.num_experts), ac, churn), 4,
            4096, trace, kv_page_limit);
  INFO("evictions " << moved.result.evictions << ", restores " << moved.result.restores << ", bytes "
                    << moved.result.expert_bytes_h2d << ", preemptions " << all.result.preemptions << " / "
                    << moved.result.preemptions);
  if (kv_page_limit > 0) {
    CHECK(all.result.preemptions > 0);
    CHECK(moved.result.preemptions == all.result.preemptions);
  }
  CHECK(moved.result.evictions > 0);
  CHECK(moved.result.restores > 0);
  CHECK(moved.result.expert_bytes_h2d > 0);
  for (const Request& r : trace) {
    INFO("request " << r.id);
    REQUIRE(all.tokens.at(r.id).size() == r.output_tokens);
    CHECK(moved.tokens.at(r.id) == all.tokens.at(r.id));
  }
}

}  // namespace

TEST_CASE("cuda backend: evictions and restores at every step leave the tokens bit-identical", "[engine]") {
  SECTION("qwen2-moe (biases, shared expert chunks)") {
    same_tokens_under_pressure(small_qwen2());
  }
  SECTION("qwen3-moe (q/k norm, GQA 8)") {
    same_tokens_under_pressure(small_qwen3());
  }
}

TEST_CASE(
    "cuda backend: evictions and restores at every step and forced preemptions leave the tokens "
    "bit-identical to an all-resident run with the same KV capacity",
    "[engine]") {
  // 60 KV pages held at most (3 layers x ceil(256 / 16) = 48 hold one max_model_len request): preemptions.
  SECTION("qwen2-moe") {
    same_tokens_under_pressure(small_qwen2(), 60);
  }
  SECTION("qwen3-moe") {
    same_tokens_under_pressure(small_qwen3(), 60);
  }
}

TEST_CASE("cuda backend: a KV cache too small for the batch forces preemptions, every request is served",
          "[engine]") {
  const HfMoeConfig hf = small_qwen2();
  const ModelSpec model = hf.to_model_spec("test");
  const std::vector<Request> trace = requests(24);
  const Served roomy =
      serve(hf, policies::StaticAdjuster(ExpertRanker::uniform(model.moe_layers(), model.num_experts)), 0,
            4096, trace);
  // 3 layers x ceil(256 / 16) blocks = 48 pages hold one max_model_len request; 60 force preemptions.
  const Served tight =
      serve(hf, policies::StaticAdjuster(ExpertRanker::uniform(model.moe_layers(), model.num_experts)), 0, 60,
            trace);
  CHECK(tight.result.preemptions > 0);
  std::size_t same = 0, total = 0;
  for (const Request& r : trace) {
    REQUIRE(tight.tokens.at(r.id).size() == r.output_tokens);
    for (std::size_t i = 0; i < r.output_tokens; ++i, ++total)
      same += tight.tokens.at(r.id)[i] == roomy.tokens.at(r.id)[i];
  }
  // A recomputed sequence's K/V comes from a prefill instead of decode steps (other kernels, other summation
  // orders), so its logits differ in the last bits and a near-tie can flip a token, after which the request
  // goes its own way: bit-identical tokens are not promised here (the kernels are not batch-invariant). The
  // H200 gave 360 and 337 of 360 equal in two builds; every request must still be served in full.
  WARN("preempted run: " << same << " of " << total << " tokens equal to the roomy run's ("
                         << tight.result.preemptions << " preemptions)");
  CHECK(same * 10 >= total * 9);
}
