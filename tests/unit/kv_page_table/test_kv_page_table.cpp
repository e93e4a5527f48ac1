// KvPageTable on the CPU: the CSR arrays paged attention reads, built from a StepBatch's block-major page
// lists (layer-major indices, last-page lengths, query offsets, the leading decode run), and the batches it
// refuses, each with an error naming the field, the value and the rule.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "amoeba/engine/kv_page_table.hpp"

using namespace amoeba;

namespace {

// Sequence s's page of block b at layer a gets index 1000 * s + 10 * b + a: every id says where it came from.
struct Batch {
  std::vector<std::vector<PageHandle>> pages;
  StepBatch step;

  Batch(std::uint32_t layers, std::vector<std::pair<std::uint32_t, std::uint32_t>> seqs,
        std::uint32_t extra_blocks = 0) {
    step.attention_layers = layers;
    step.tokens_per_kv_page = 16;
    pages.resize(seqs.size());
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      const auto [before, fresh] = seqs[s];
      const std::uint32_t blocks = (before + fresh + 15) / 16 + extra_blocks;
      for (std::uint32_t b = 0; b < blocks; ++b)
        for (std::uint32_t a = 0; a < layers; ++a)
          pages[s].push_back(PageHandle{static_cast<std::uint32_t>(1000 * s + 10 * b + a), 2});
    }
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      SequenceStep x;
      x.request = s;
      x.context_before = seqs[s].first;
      x.new_tokens = seqs[s].second;
      x.kv_pages = pages[s];
      step.seqs.push_back(x);
      step.tokens += x.new_tokens;
    }
  }
};

std::vector<std::int32_t> span_of(const std::int32_t* p, std::size_t n) {
  return {p, p + n};
}

}  // namespace

TEST_CASE("KvPageTable lays out one step's pages as CSR arrays per layer", "[kv_page_table]") {
  // Two decode sequences (contexts 17 and 16), then a prefill chunk of 20 after 30, then a one-token
  // sequence.
  Batch b(3, {{16, 1}, {15, 1}, {30, 20}, {0, 1}});
  KvPageTable t;
  REQUIRE_FALSE(t.assign(b.step).has_value());
  const KvPageTableView v = t.host_view();
  CHECK(v.sequences == 4);
  CHECK(v.decode_sequences == 2);  // the leading one-token run; the last sequence is not part of it
  CHECK(v.prefill_sequences() == 2);
  CHECK(v.tokens == 23);
  CHECK(v.attention_layers == 3);
  CHECK(v.tokens_per_page == 16);
  CHECK(v.pages_per_layer == 2 + 1 + 4 + 1);
  CHECK(span_of(v.kv_indptr, 5) == std::vector<std::int32_t>{0, 2, 3, 7, 8});
  CHECK(span_of(v.kv_last_page_len, 4) == std::vector<std::int32_t>{1, 16, 2, 1});
  CHECK(span_of(v.qo_indptr, 5) == std::vector<std::int32_t>{0, 1, 2, 22, 23});
  CHECK(span_of(v.prefill_qo_indptr, 3) == std::vector<std::int32_t>{0, 20, 21});
  for (std::uint32_t a = 0; a < 3; ++a) {
    const std::vector<std::int32_t> want = {
        0 + std::int32_t(a),    10 + std::int32_t(a),   1000 + std::int32_t(a), 2000 + std::int32_t(a),
        2010 + std::int32_t(a), 2020 + std::int32_t(a), 2030 + std::int32_t(a), 3000 + std::int32_t(a)};
    CHECK(span_of(v.layer_indices(a), 8) == want);
  }
  // view() over another copy of words() points at the same offsets.
  std::vector<std::int32_t> copy(t.words().begin(), t.words().end());
  const KvPageTableView w = t.view(copy.data());
  CHECK(w.kv_indices - copy.data() == v.kv_indices - t.words().data());
  CHECK(w.prefill_qo_indptr - copy.data() == v.prefill_qo_indptr - t.words().data());
  CHECK(t.words().size() == 5 + 4 + 5 + 3 + 3 * 8);
}

TEST_CASE("KvPageTable reads only the blocks the context needs", "[kv_page_table]") {
  Batch b(2, {{40, 1}, {0, 3}}, /*extra_blocks=*/2);
  KvPageTable t;
  REQUIRE_FALSE(t.assign(b.step).has_value());
  const KvPageTableView v = t.host_view();
  CHECK(span_of(v.kv_indptr, 3) == std::vector<std::int32_t>{0, 3, 4});
  CHECK(span_of(v.layer_indices(1), 4) == std::vector<std::int32_t>{1, 11, 21, 1001});
  CHECK(span_of(v.kv_last_page_len, 2) == std::vector<std::int32_t>{9, 3});
}

TEST_CASE("KvPageTable: an all-prefill step has no decode run, reuse keeps nothing stale",
          "[kv_page_table]") {
  KvPageTable t;
  Batch big(4, {{0, 300}, {100, 1}, {5, 7}});
  REQUIRE_FALSE(t.assign(big.step).has_value());
  CHECK(t.host_view().decode_sequences == 0);
  CHECK(span_of(t.host_view().prefill_qo_indptr, 4) == span_of(t.host_view().qo_indptr, 4));
  Batch small(1, {{3, 1}});
  REQUIRE_FALSE(t.assign(small.step).has_value());
  const KvPageTableView v = t.host_view();
  CHECK(v.sequences == 1);
  CHECK(v.decode_sequences == 1);
  CHECK(v.prefill_sequences() == 0);
  CHECK(t.words().size() == 2 + 1 + 2 + 1 + 1);
  CHECK(v.kv_indices[0] == 0);
  StepBatch empty;
  empty.attention_layers = 2;
  REQUIRE_FALSE(t.assign(empty).has_value());
  CHECK(t.empty());
  CHECK(t.words().empty());
}

TEST_CASE("KvPageTable refuses a batch it cannot express, naming field, value and rule", "[kv_page_table]") {
  KvPageTable t;
  auto refuse = [&](const StepBatch& s, const std::string& starts) {
    const auto e = t.assign(s);
    REQUIRE(e.has_value());
    INFO(*e);
    CHECK(e->rfind(starts, 0) == 0);
    CHECK(t.empty());
  };
  {
    Batch b(2, {{3, 1}});
    b.step.attention_layers = 0;
    refuse(b.step, "batch.attention_layers = 0: must be >= 1");
  }
  {
    Batch b(2, {{3, 1}});
    b.step.tokens_per_kv_page = 0;
    refuse(b.step, "batch.tokens_per_kv_page = 0: must be >= 1");
  }
  {
    Batch b(2, {{3, 1}, {4, 0}});
    refuse(b.step, "batch.seqs[1].new_tokens = 0: must be >= 1");
  }
  {
    Batch b(2, {{3, 1}, {40, 1}});
    b.step.seqs[1].kv_pages = b.step.seqs[1].kv_pages.first(5);
    refuse(b.step, "batch.seqs[1].kv_pages.size() = 5: must be a multiple of attention_layers (2)");
  }
  {
    Batch b(2, {{3, 1}, {40, 1}});
    b.step.seqs[1].kv_pages = b.step.seqs[1].kv_pages.first(4);  // 2 blocks for 41 tokens
    refuse(b.step, "batch.seqs[1].kv_pages.size() = 4: must cover context_before + new_tokens = 41 tokens");
  }
  {
    Batch b(2, {{3, 1}, {40, 1}});
    b.pages[1][3].index = 0x80000000u;
    refuse(b.step, "batch.seqs[1].kv_pages[3].index = 2147483648: must fit int32");
  }
  {
    Batch b(2, {{3, 1}, {40, 1}});
    b.pages[1][2].kind = 1;
    refuse(b.step, "batch.seqs[1].kv_pages[2].kind = 1: every KV page must be of one kind (2)");
  }
}
