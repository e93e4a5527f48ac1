// Scheduler: vLLM-v1-style continuous batching on the unified pool -- FCFS, token budget, sequence cap,
// chunked prefill, decode first, 16-token KV pages per attention layer, preemption by recompute to the front,
// and the shortfall R_b in expert pages.
#include <deque>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/model.hpp"
#include "engine/scheduler.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {
// A tiny model: 2 layers, expert page 4096 B, KV page 16 x 2 x 1 x 16 x 2 = 1024 B (4 per expert page).
ModelSpec tiny_model() {
  ModelSpec m;
  m.name = "tiny";
  m.num_layers = 2;
  m.hidden_size = 64;
  m.vocab_size = 100;
  m.num_heads = 1;
  m.num_kv_heads = 1;
  m.head_dim = 16;
  m.num_experts = 4;
  m.top_k = 1;
  m.moe_intermediate_size = 32;
  return m;
}

struct Fixture {
  ModelSpec model = tiny_model();
  PageGeometry geo = page_geometry(model);
  MoePool pool;
  std::deque<Sequence> seqs;
  Scheduler<MoePool> sched;
  Fixture(std::uint64_t expert_pages, SchedulerConfig cfg)
      : pool(ArenaSpan{nullptr, expert_pages * 4096}, {PageSpec{4096, 0}, PageSpec{1024, 0}}),
        sched(model, geo, cfg, pool) {}
  Sequence& add(std::uint32_t prompt, std::uint32_t output) {
    seqs.emplace_back(Request{seqs.size(), 0.0, prompt, output});
    sched.add(seqs.back());
    return seqs.back();
  }
};
}  // namespace

TEST_CASE("geometry of the tiny model", "[scheduler]") {
  const PageGeometry g = page_geometry(tiny_model());
  CHECK(g.expert_page_bytes == 4096);
  CHECK(g.kv_page_bytes == 1024);
  CHECK(g.kv_pages_per_expert_page() == 4);
}

TEST_CASE("FCFS admission within the token budget / chunked prefill / then decode", "[scheduler]") {
  Fixture f(64, SchedulerConfig{100, 8, 2048});
  Sequence& a = f.add(150, 3);  // longer than the budget: chunked
  Sequence& b = f.add(20, 2);
  StepPlan p = f.sched.schedule();
  REQUIRE(p.size() == 1);  // a takes the whole budget
  CHECK(p.seqs[0] == &a);
  CHECK(p.batch.seqs[0].new_tokens == 100);
  CHECK(p.batch.tokens == 100);
  CHECK(a.blocks == 7);               // ceil(100 / 16)
  CHECK(a.kv_pages.size() == 7 * 2);  // one page per attention layer per block
  // The step contract's view of a: its context, its chunk, and exactly the pages it holds, block-major.
  CHECK(p.batch.attention_layers == 2);
  CHECK(p.batch.seqs[0].request == a.id);
  CHECK(p.batch.seqs[0].context_before == 0);
  CHECK_FALSE(p.batch.seqs[0].samples);  // a chunk short of the prompt's end samples nothing
  CHECK(p.batch.seqs[0].kv_pages.data() == a.kv_pages.data());
  CHECK(p.batch.seqs[0].kv_pages.size() == a.kv_pages.size());
  CHECK(p.shortfall_pages == 0);  // b waits for the budget, not for memory
  f.sched.complete(p, 1.0);
  CHECK(a.computed == 100);
  CHECK(a.generated == 0);  // prefill not finished: no token yet
  p = f.sched.schedule();
  REQUIRE(p.size() == 2);
  CHECK(p.seqs[0] == &a);  // running first
  CHECK(p.batch.seqs[0].new_tokens == 50);
  CHECK(p.batch.seqs[0].context_before == 100);
  CHECK(p.batch.seqs[0].samples);  // reaches the prompt's end: samples the first token
  CHECK(p.seqs[1] == &b);
  CHECK(p.batch.seqs[1].new_tokens == 20);
  f.sched.complete(p, 2.0);
  CHECK(a.generated == 1);
  CHECK(a.first_token_s == 2.0);
  CHECK(b.generated == 1);
  p = f.sched.schedule();  // both decode: one token each
  CHECK(p.batch.tokens == 2);
  CHECK(p.batch.sampling_seqs == 2);
  f.sched.complete(p, 3.0);
  CHECK(b.status == SeqStatus::kFinished);  // 2 outputs
  CHECK(b.kv_pages.empty());
  CHECK(f.sched.num_running() == 1);
}

TEST_CASE("max_num_seqs caps the running set", "[scheduler]") {
  Fixture f(64, SchedulerConfig{1000, 2, 2048});
  for (int i = 0; i < 4; ++i) f.add(10, 5);
  const StepPlan p = f.sched.schedule();
  CHECK(p.size() == 2);
  CHECK(f.sched.num_waiting() == 2);
  CHECK(p.shortfall_pages == 0);
}

TEST_CASE("a waiting head that does not fit sets R_b in expert pages", "[scheduler]") {
  // 4 expert pages = 16 KV pages = 8 blocks of 16 tokens (2 layers).
  Fixture f(4, SchedulerConfig{1000, 8, 2048});
  Sequence& a = f.add(96, 10);  // 6 blocks = 12 KV pages
  f.add(64, 10);                // 4 blocks = 8 KV pages: only 4 left -> short 4 KV pages = 1 expert page
  const StepPlan p = f.sched.schedule();
  REQUIRE(p.size() == 1);
  CHECK(p.seqs[0] == &a);
  CHECK(p.shortfall_pages == 1);
  CHECK(f.sched.num_waiting() == 1);
  CHECK(f.pool.available<KvPage>() == 4);  // nothing was taken for the head that did not fit
}

TEST_CASE("a running sequence that cannot grow preempts the newest one recompute / to the front",
          "[scheduler]") {
  Fixture f(2, SchedulerConfig{1000, 8, 2048});  // 8 KV pages = 4 blocks
  Sequence& a = f.add(32, 40);                   // 2 blocks
  Sequence& b = f.add(32, 40);                   // 2 blocks: pool full
  StepPlan p = f.sched.schedule();
  REQUIRE(p.size() == 2);
  f.sched.complete(p, 1.0);
  CHECK(a.generated == 1);
  // a's next token (position 32) needs a third block: b (newest) is preempted.
  p = f.sched.schedule();
  CHECK(p.preempted == 1);
  REQUIRE(p.size() == 1);
  CHECK(p.seqs[0] == &a);
  CHECK(b.status == SeqStatus::kWaiting);
  CHECK(b.computed == 0);
  CHECK(b.kv_pages.empty());
  CHECK(b.preemptions == 1);
  CHECK(p.shortfall_pages == 1);  // the growth that failed lacked 2 KV pages -> 1 expert page
  f.sched.complete(p, 2.0);
  // b is at the front and recomputes prompt + its generated token; it is not admitted in a step that
  // preempted, and now a holds 3 blocks, so b (33 tokens = 3 blocks) does not fit: R_b again.
  p = f.sched.schedule();
  CHECK(p.size() == 1);
  CHECK(p.shortfall_pages == 1);
  CHECK(b.num_tokens() == 33);
}

TEST_CASE("the last running sequence that cannot grow preempts itself", "[scheduler]") {
  Fixture f(1, SchedulerConfig{1000, 8, 2048});  // 4 KV pages = 2 blocks
  Sequence& a = f.add(32, 40);
  StepPlan p = f.sched.schedule();
  REQUIRE(p.size() == 1);
  f.sched.complete(p, 1.0);
  p = f.sched.schedule();
  CHECK(p.empty());
  CHECK(p.preempted == 1);
  CHECK(a.status == SeqStatus::kWaiting);
  CHECK(p.shortfall_pages == 1);
  CHECK(f.pool.fully_merged());
}

TEST_CASE("every page returns and the pool merges when all requests finish", "[scheduler]") {
  Fixture f(16, SchedulerConfig{64, 4, 2048});
  for (std::uint32_t i = 0; i < 12; ++i) f.add(20 + 7 * i, 3 + i % 5);
  double t = 0;
  for (int guard = 0; guard < 10000 && !f.sched.idle(); ++guard) {
    const StepPlan p = f.sched.schedule();
    f.sched.complete(p, t += 1);
    REQUIRE_FALSE(f.pool.check_invariants().has_value());
  }
  CHECK(f.sched.idle());
  for (const Sequence& s : f.seqs) {
    CHECK(s.status == SeqStatus::kFinished);
    CHECK(s.generated == s.output_tokens);
  }
  CHECK(f.pool.fully_merged());
}
