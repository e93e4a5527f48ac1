// Device tests of PagedAttention (FlashInfer over the pool's KV pages): batch decode and causal paged prefill
// for Qwen1.5-MoE (16 q / 16 kv heads) and Qwen3-30B-A3B (32 q / 4 kv heads), head dim 128, against a
// double-precision CPU reference read through the same page table. Pages are shuffled through one arena in
// which every byte no sequence wrote is NaN (so is the rest of each last page, the workspace and the output
// before the run): a read of the wrong page, layer or token shows up as NaN or as a large error.
//
// Tolerance: relative L2 error <= 5e-3 over each batch and <= 1e-2 for its worst sequence; every element's
// absolute error <= 2e-2. The output is bf16 (unit roundoff u = 2^-8 = 3.9e-3: rounding alone costs ~1.5e-3
// in relative L2), and FlashInfer's prefill kernel also rounds the softmax weights to bf16 before P·V (as do
// split-KV partial outputs), which adds about as much again: 1-3e-3 is expected, 1.2-2.0e-3 was measured when
// the kernels were first tried on the H200. What the test must catch costs far more: a wrong page or layer is
// O(1), a read past last_page_len is NaN, and one key too many or too few at context 2048 moves that sequence
// by ~2e-2 (with these score scales, more at shorter contexts). |V| <= 1, so |O| <= 1 and 2e-2 is ~5 bf16
// ulps at the largest possible output.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "attention_fixture.cuh"

namespace {

using namespace amoeba;
using namespace amoeba::testing;
using kernels::AttentionSchedule;
using Attention = kernels::PagedAttention<128>;

constexpr double kBatchRelL2Tol = 5e-3;
constexpr double kSeqRelL2Tol = 1e-2;
constexpr double kMaxAbsTol = 2e-2;

struct Geometry {
  const char* name;
  std::uint32_t qo_heads, kv_heads;
};
constexpr Geometry kQwen15{"qwen1.5-moe 16q/16kv", 16, 16};
constexpr Geometry kQwen3{"qwen3-30b-a3b 32q/4kv", 32, 4};

std::uint64_t page_bytes_of(const Geometry& g) {
  return 2ull * 16 * g.kv_heads * 128 * 2;
}

struct Errors {
  double rel_l2 = 0, max_abs = 0, worst_seq_rel_l2 = 0;
  std::size_t nonfinite = 0;
};

// Double-precision attention of batch `b`, layer `layer`, compared with `out` (bf16 bits).
Errors compare(const AttentionBatch& b, std::uint32_t layer, const std::vector<std::uint16_t>& out) {
  const std::uint32_t d = b.kv.head_dim, kvh = b.kv.kv_heads, qoh = b.qo_heads, group = qoh / kvh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  struct Row {
    std::uint32_t seq, token;
  };
  std::vector<Row> rows;
  std::vector<std::uint32_t> row0(b.specs.size());
  for (std::uint32_t s = 0; s < b.specs.size(); ++s) {
    row0[s] = static_cast<std::uint32_t>(rows.size());
    for (std::uint32_t i = 0; i < b.specs[s].new_tokens; ++i) rows.push_back({s, i});
  }
  std::vector<double> err2(rows.size()), ref2(rows.size()), maxabs(rows.size());
  std::vector<std::size_t> bad(rows.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    std::vector<double> scores, acc(d);
    for (std::size_t r; (r = next.fetch_add(1)) < rows.size();) {
      const std::uint32_t s = rows[r].seq;
      const SeqSpec& spec = b.specs[s];
      const std::uint32_t keys = spec.context_before + rows[r].token + 1;  // causal: up to its own position
      const auto& K = b.k[std::size_t{s} * b.layers + layer];
      const auto& V = b.v[std::size_t{s} * b.layers + layer];
      for (std::uint32_t h = 0; h < qoh; ++h) {
        const std::uint16_t* q = b.q.data() + (r * qoh + h) * d;
        const std::uint32_t kh = h / group;
        scores.assign(keys, 0.0);
        double m = -INFINITY;
        for (std::uint32_t j = 0; j < keys; ++j) {
          const std::uint16_t* k = K.data() + (std::size_t{j} * kvh + kh) * d;
          double dot = 0;
          for (std::uint32_t x = 0; x < d; ++x) dot += double(bf16_value(q[x])) * bf16_value(k[x]);
          scores[j] = dot * scale;
          m = std::max(m, scores[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::uint32_t j = 0; j < keys; ++j) {
          const double w = std::exp(scores[j] - m);
          sum += w;
          const std::uint16_t* v = V.data() + (std::size_t{j} * kvh + kh) * d;
          for (std::uint32_t x = 0; x < d; ++x) acc[x] += w * bf16_value(v[x]);
        }
        const std::uint16_t* o = out.data() + (r * qoh + h) * d;
        for (std::uint32_t x = 0; x < d; ++x) {
          const double ref = acc[x] / sum, got = bf16_value(o[x]);
          if (!std::isfinite(got)) {
            ++bad[r];
            continue;
          }
          err2[r] += (got - ref) * (got - ref);
          ref2[r] += ref * ref;
          maxabs[r] = std::max(maxabs[r], std::fabs(got - ref));
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  Errors e;
  double e2 = 0, r2 = 0;
  for (std::uint32_t s = 0; s < b.specs.size(); ++s) {
    double se = 0, sr = 0;
    for (std::uint32_t i = 0; i < b.specs[s].new_tokens; ++i) {
      const std::size_t r = row0[s] + i;
      se += err2[r];
      sr += ref2[r];
      e.max_abs = std::max(e.max_abs, maxabs[r]);
      e.nonfinite += bad[r];
    }
    e.worst_seq_rel_l2 = std::max(e.worst_seq_rel_l2, std::sqrt(se / std::max(sr, 1e-300)));
    e2 += se;
    r2 += sr;
  }
  e.rel_l2 = std::sqrt(e2 / std::max(r2, 1e-300));
  return e;
}

// Plans `b` once, runs each of `layers` with that plan, checks each against the reference.
void run_and_check(const char* what, const Geometry& g, AttentionBatch& b, AttentionSchedule schedule,
                   std::vector<std::uint32_t> layers) {
  auto args = attention_args<128>(b, layers.front(), schedule);
  {
    const kernels::Status ok = Attention::can_implement(args);
    INFO(ok.message);
    REQUIRE(ok.ok);
  }
  const kernels::AttentionWorkspaceSize need = Attention::workspace_size(args);
  DeviceBytes ws_device(need.device_bytes);
  PinnedBytes ws_pinned(need.pinned_bytes);
  // Poisoned scratch: the kernels may read only what the plan wrote.
  if (need.device_bytes > 0) AMOEBA_ATTN_CHECK(cudaMemset(ws_device.get(), 0xFF, need.device_bytes));
  cudaStream_t stream;
  AMOEBA_ATTN_CHECK(cudaStreamCreate(&stream));
  Attention op;
  const kernels::Status planned =
      op.plan(args, b.table.host_view(),
              {ws_device.get(), ws_device.size(), ws_pinned.get(), ws_pinned.size()}, stream);
  INFO(planned.message);
  REQUIRE(planned.ok);
  const bool split = Attention::chosen_schedule(args) == AttentionSchedule::kSplit;
  for (std::uint32_t layer : layers) {
    args.layer = layer;
    AMOEBA_ATTN_CHECK(cudaMemsetAsync(b.d_o.get(), 0xFF, b.d_o.size(), stream));  // NaN
    const kernels::Status st = op.run(args, stream);
    INFO(st.message);
    REQUIRE(st.ok);
    AMOEBA_ATTN_CHECK(cudaStreamSynchronize(stream));
    AMOEBA_ATTN_CHECK(cudaGetLastError());
    std::vector<std::uint16_t> out(b.q.size());
    AMOEBA_ATTN_CHECK(cudaMemcpy(out.data(), b.d_o.get(), out.size() * 2, cudaMemcpyDeviceToHost));
    const Errors e = compare(b, layer, out);
    const KvPageTableView t = b.table.host_view();
    std::printf(
        "attn: %-30s %-22s %-8s layer %u  seqs %4u (decode %3u) tokens %5u pages/layer %6llu  rel_l2 %.2e  "
        "worst_seq %.2e  max_abs %.2e  nan %zu  split_kv %d/%d  tile_q %d\n",
        what, g.name,
        schedule == AttentionSchedule::kAuto ? (split ? "auto:split" : "auto:pref")
        : split                              ? "split"
                                             : "prefill",
        layer, t.sequences, split ? t.decode_sequences : 0u, t.tokens,
        static_cast<unsigned long long>(t.pages_per_layer), e.rel_l2, e.worst_seq_rel_l2, e.max_abs,
        e.nonfinite, op.decode_split_kv() ? 1 : 0, op.prefill_split_kv() ? 1 : 0, op.prefill_tile_q());
    CHECK(e.nonfinite == 0);
    CHECK(e.rel_l2 <= kBatchRelL2Tol);
    CHECK(e.worst_seq_rel_l2 <= kSeqRelL2Tol);
    CHECK(e.max_abs <= kMaxAbsTol);
  }
  AMOEBA_ATTN_CHECK(cudaStreamDestroy(stream));
}

std::vector<SeqSpec> decode_specs(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> ctx(1, 2048);
  std::vector<SeqSpec> v;
  // Edges: a one-token context, a page boundary either side, a full 2048.
  for (std::uint32_t c : {1u, 16u, 17u, 33u, 2048u})
    if (v.size() < n) v.push_back({c - 1, 1});
  while (v.size() < n) v.push_back({ctx(rng) - 1, 1});
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

std::vector<SeqSpec> prefill_specs(std::size_t n, std::uint32_t max_prefix, std::uint32_t min_new,
                                   std::uint32_t max_new, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> prefix(0, max_prefix), fresh(min_new, max_new);
  std::vector<SeqSpec> v;
  // Edges: no prefix, a prefix ending on / just past a page boundary, the longest prefix and chunk.
  const SeqSpec edges[] = {
      {0, max_new}, {16, min_new + 1}, {17, max_new / 2 + 1}, {max_prefix, max_new}, {0, min_new}};
  for (const SeqSpec& e : edges)
    if (v.size() < n) v.push_back(e);
  while (v.size() < n) v.push_back({prefix(rng), fresh(rng)});
  return v;
}

std::uint64_t pages_for(const std::vector<SeqSpec>& specs, std::uint32_t layers) {
  std::uint64_t p = 0;
  for (const SeqSpec& s : specs) p += (s.context_before + s.new_tokens + 15) / 16 * layers;
  return p;
}

// An arena with twice the pages the batch needs, so the sequences' pages are scattered among NaN pages.
KvArena arena_for(const Geometry& g, const std::vector<SeqSpec>& specs, std::uint32_t layers,
                  std::uint64_t seed) {
  return KvArena(g.kv_heads, 128, page_bytes_of(g), 2 * pages_for(specs, layers) + 64, seed);
}

}  // namespace

TEST_CASE("batch decode over shuffled pool pages matches the fp64 reference", "[gpu][attention][decode]") {
  for (const Geometry& g : {kQwen15, kQwen3}) {
    for (std::size_t n : {64u, 256u}) {
      const auto specs = decode_specs(n, 11 + n);
      KvArena arena = arena_for(g, specs, 2, 7 * n);
      AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
      REQUIRE(b.table.host_view().decode_sequences == n);
      // Both layers through one plan: the plan is per step, the page ids per layer.
      run_and_check(n == 64 ? "decode 64 seqs, ctx 1-2048" : "decode 256 seqs, ctx 1-2048", g, b,
                    AttentionSchedule::kSplit, {1, 0});
      run_and_check(n == 64 ? "decode 64 seqs, ctx 1-2048" : "decode 256 seqs, ctx 1-2048", g, b,
                    AttentionSchedule::kPrefillOnly, {1});
      // The default: the decode kernel without GQA grouping, the prefill kernel with it.
      auto args = attention_args<128>(b, 1, AttentionSchedule::kAuto);
      CHECK(Attention::chosen_schedule(args) ==
            (g.qo_heads == g.kv_heads ? AttentionSchedule::kSplit : AttentionSchedule::kPrefillOnly));
    }
  }
}

TEST_CASE("causal paged prefill after a cached prefix matches the fp64 reference",
          "[gpu][attention][prefill]") {
  for (const Geometry& g : {kQwen15, kQwen3}) {
    const auto specs = prefill_specs(8, 1024, 1, 512, 23);
    KvArena arena = arena_for(g, specs, 2, 29);
    AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
    run_and_check("prefill prefix 0-1024 + 1-512", g, b, AttentionSchedule::kSplit, {1});
    run_and_check("prefill prefix 0-1024 + 1-512", g, b, AttentionSchedule::kPrefillOnly, {0});
  }
}

TEST_CASE("short prefill chunks of 1-8 tokens match the fp64 reference", "[gpu][attention][prefill]") {
  for (const Geometry& g : {kQwen15, kQwen3}) {
    const auto specs = prefill_specs(48, 1024, 1, 8, 31);
    KvArena arena = arena_for(g, specs, 2, 37);
    AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
    run_and_check("prefill prefix 0-1024 + 1-8", g, b, AttentionSchedule::kSplit, {1});
    run_and_check("prefill prefix 0-1024 + 1-8", g, b, AttentionSchedule::kPrefillOnly, {1});
  }
}

TEST_CASE("a mixed step: decode sequences first, then prefill chunks", "[gpu][attention][mixed]") {
  for (const Geometry& g : {kQwen15, kQwen3}) {
    auto specs = decode_specs(48, 41);
    for (const SeqSpec& s : prefill_specs(4, 1024, 1, 512, 43)) specs.push_back(s);
    specs.push_back({700, 1});  // a one-token sequence after the prefill chunks goes through the prefill call
    KvArena arena = arena_for(g, specs, 3, 47);
    AttentionBatch b = arena.make_batch(g.qo_heads, 3, specs);
    REQUIRE(b.table.host_view().decode_sequences == 48);
    run_and_check("mixed 48 decode + 5 prefill", g, b, AttentionSchedule::kSplit, {2, 1});
    run_and_check("mixed 48 decode + 5 prefill", g, b, AttentionSchedule::kPrefillOnly, {2});
    // The default runs a mixed step in one prefill launch, whatever the grouping.
    CHECK(Attention::chosen_schedule(attention_args<128>(b, 2, AttentionSchedule::kAuto)) ==
          AttentionSchedule::kPrefillOnly);
    run_and_check("mixed 48 decode + 5 prefill", g, b, AttentionSchedule::kAuto, {0});
  }
}

TEST_CASE("pages padded past K and V (page_bytes > K+V)", "[gpu][attention][small]") {
  const Geometry& g = kQwen3;
  auto specs = decode_specs(16, 53);
  for (const SeqSpec& s : prefill_specs(3, 300, 1, 100, 59)) specs.push_back(s);
  KvArena arena(g.kv_heads, 128, page_bytes_of(g) + 4096, 2 * pages_for(specs, 2) + 64, 61);
  AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
  run_and_check("padded pages (+4096 B)", g, b, AttentionSchedule::kSplit, {1});
}

TEST_CASE("an arena past 2^32 elements: pages above the 32-bit offset range", "[gpu][attention][large]") {
  for (const Geometry& g : {kQwen15, kQwen3}) {
    const std::uint64_t arena_bytes = 10ull << 30;
    std::size_t free_bytes = 0, total = 0;
    AMOEBA_ATTN_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (free_bytes < arena_bytes + (2ull << 30)) {
      WARN("skipped: " << free_bytes << " bytes free, the 10 GiB arena does not fit");
      continue;
    }
    const std::uint64_t pages = arena_bytes / page_bytes_of(g);
    // The first page whose element offset is >= 2^32: every page handed out lies above it.
    const std::uint64_t first = ((1ull << 32) * 2 + page_bytes_of(g) - 1) / page_bytes_of(g) + 1;
    auto specs = decode_specs(32, 67);
    for (const SeqSpec& s : prefill_specs(4, 1024, 1, 512, 71)) specs.push_back(s);
    REQUIRE(pages - first > pages_for(specs, 2));
    KvArena arena(g.kv_heads, 128, page_bytes_of(g), pages, 73, first);
    AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
    for (const auto& seq : b.pages)
      for (PageHandle h : seq) REQUIRE(std::uint64_t{h.index} * page_bytes_of(g) / 2 >= (1ull << 32));
    run_and_check("10 GiB arena, pages past 2^32 elems", g, b, AttentionSchedule::kSplit, {1});
  }
}

TEST_CASE("can_implement and plan name the field, the value and the rule",
          "[gpu][attention][errors][small]") {
  const Geometry& g = kQwen3;
  const std::vector<SeqSpec> specs = {{10, 1}, {0, 5}};
  KvArena arena(g.kv_heads, 128, page_bytes_of(g), 64, 79);
  AttentionBatch b = arena.make_batch(g.qo_heads, 2, specs);
  const auto good = attention_args<128>(b, 1, AttentionSchedule::kSplit);
  REQUIRE(Attention::can_implement(good).ok);
  auto expect = [](const Attention::Arguments& a, const char* field, const char* words) {
    const kernels::Status st = Attention::can_implement(a);
    INFO(st.message);
    CHECK_FALSE(st.ok);
    CHECK(st.field == field);
    CHECK(st.message.find(words) != std::string::npos);
  };
  auto a = good;
  a.kv.head_dim = 64;
  a.kv.page_bytes = 2ull * 16 * g.kv_heads * 64 * 2;
  expect(a, "kv.head_dim", "unsupported head dim");
  a = good;
  a.qo_heads = 30;
  expect(a, "qo_heads", "multiple of kv.kv_heads");
  a = good;
  a.qo_heads = 4 * 5;  // group 5
  expect(a, "qo_heads / kv.kv_heads", "1, 2, 3, 4, 6, 8 or 16");
  a = good;
  a.kv.page_bytes = page_bytes_of(g) - 16;
  expect(a, "kv.page_bytes", "must hold K and V");
  a = good;
  a.kv.page_bytes = page_bytes_of(g) + 8;
  expect(a, "kv.page_bytes", "multiple of 16");
  a = good;
  a.layer = 2;
  expect(a, "layer", "< table.attention_layers");
  a = good;
  a.kv.tokens_per_page = 32;
  a.kv.page_bytes = 2 * page_bytes_of(g);
  expect(a, "table.tokens_per_page", "kv.tokens_per_page");
  a = good;
  a.q = nullptr;
  expect(a, "q", "null");

  // A workspace smaller than workspace_size() is refused before anything is written.
  const auto need = Attention::workspace_size(good);
  DeviceBytes dev(need.device_bytes);
  PinnedBytes pin(need.pinned_bytes);
  Attention op;
  kernels::Status st = op.plan(good, b.table.host_view(),
                               {dev.get(), need.device_bytes - 256, pin.get(), need.pinned_bytes}, nullptr);
  CHECK_FALSE(st.ok);
  CHECK(st.field == "workspace.device_bytes");
  st = op.run(good, nullptr);
  CHECK_FALSE(st.ok);
  CHECK(st.field == "plan");
  // A plan for one batch does not run another batch's arguments.
  st = op.plan(good, b.table.host_view(), {dev.get(), need.device_bytes, pin.get(), need.pinned_bytes},
               nullptr);
  REQUIRE(st.ok);
  a = good;
  a.schedule = AttentionSchedule::kPrefillOnly;
  st = op.run(a, nullptr);
  CHECK_FALSE(st.ok);
  CHECK(st.field == "arguments");
  AMOEBA_ATTN_CHECK(cudaDeviceSynchronize());
}
