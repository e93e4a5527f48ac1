// Device test of KvAppend (kernels/attention/kv_append.cuh): on shuffled pool pages, after the slots of a
// step's new tokens in one layer are poisoned, appending their K/V rows restores the arena byte for byte --
// every row lands in its page and slot, and no other byte changes. Batches mix fresh prefills, decodes that
// open a new page, decodes into a partly filled page, and chunks after a prefix.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "attention/kv_append.cuh"
#include "attention_fixture.cuh"

namespace {

using namespace amoeba;
using namespace amoeba::testing;

struct Case {
  const char* name;
  std::uint32_t kv_heads;
  std::uint64_t page_bytes;
};

}  // namespace

TEST_CASE("K/V append writes each new row into its page and slot, and nothing else",
          "[gpu][attention][append]") {
  for (const Case& c :
       {Case{"16 kv heads (Qwen1.5-MoE)", 16, 131072}, Case{"4 kv heads (Qwen3-30B-A3B)", 4, 32768},
        Case{"4 kv heads, padded pages", 4, 49152}}) {
    INFO(c.name);
    KvArena arena(c.kv_heads, 128, c.page_bytes, 1024, 11);
    const std::vector<SeqSpec> specs{{0, 37}, {15, 1}, {16, 1}, {100, 20}, {31, 1}, {5, 60}, {0, 1}};
    const std::uint32_t layers = 3, layer = 1;
    AttentionBatch b = arena.make_batch(c.kv_heads * 2, layers, specs);
    const std::size_t arena_bytes = c.page_bytes * 1024;
    std::vector<unsigned char> expected(arena_bytes), got(arena_bytes);
    AMOEBA_ATTN_CHECK(cudaMemcpy(expected.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));

    // The new rows of `layer`, in query order, and their slots poisoned in the arena.
    const std::size_t row = std::size_t{c.kv_heads} * 128;
    std::vector<std::uint16_t> k, v;
    for (std::size_t s = 0; s < specs.size(); ++s)
      for (std::uint32_t p = specs[s].context_before; p < specs[s].context_before + specs[s].new_tokens;
           ++p) {
        const auto& K = b.k[s * layers + layer];
        const auto& V = b.v[s * layers + layer];
        k.insert(k.end(), K.begin() + std::ptrdiff_t(p * row), K.begin() + std::ptrdiff_t((p + 1) * row));
        v.insert(v.end(), V.begin() + std::ptrdiff_t(p * row), V.begin() + std::ptrdiff_t((p + 1) * row));
        const auto page = static_cast<std::int32_t>(b.pages[s][std::size_t{p / 16} * layers + layer].index);
        AMOEBA_ATTN_CHECK(cudaMemset(b.kv.k(page, p % 16, 0), 0xFF, row * 2));
        AMOEBA_ATTN_CHECK(cudaMemset(b.kv.v(page, p % 16, 0), 0xFF, row * 2));
      }
    AMOEBA_ATTN_CHECK(cudaMemcpy(got.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));
    REQUIRE(got != expected);  // the poison did change the new rows
    DeviceBytes d_k(k.size() * 2), d_v(v.size() * 2);
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_k.get(), k.data(), d_k.size(), cudaMemcpyHostToDevice));
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_v.get(), v.data(), d_v.size(), cudaMemcpyHostToDevice));

    kernels::KvAppendArguments a;
    a.kv = b.kv;
    a.table = b.table.view(b.d_words.get<const std::int32_t>());
    a.layer = layer;
    a.k = d_k.get<const kernels::bf16>();
    a.v = d_v.get<const kernels::bf16>();
    REQUIRE(kernels::KvAppend::run(a, nullptr).ok);
    AMOEBA_ATTN_CHECK(cudaDeviceSynchronize());
    AMOEBA_ATTN_CHECK(cudaMemcpy(got.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));
    std::size_t differing = 0;
    for (std::size_t i = 0; i < arena_bytes; ++i) differing += got[i] != expected[i];
    CHECK(differing == 0);

    // Refusals name the field.
    kernels::KvAppendArguments bad = a;
    bad.layer = layers;
    CHECK_THAT(kernels::KvAppend::can_implement(bad).message, Catch::Contains("layer = 3"));
    bad = a;
    bad.k = nullptr;
    CHECK_FALSE(kernels::KvAppend::can_implement(bad).ok);
  }
}
