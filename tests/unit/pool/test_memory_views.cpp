// Typed views over one host arena: bytes written through an expert view are read back through a KV view after
// the page is freed and handed out again; canary bytes around each page are never touched.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <type_traits>

#include "amoeba/core/bf16.hpp"
#include "amoeba/pool.hpp"

using namespace amoeba;

static_assert(std::is_trivially_copyable_v<ExpertMatrixView<bf16>>);
static_assert(std::is_trivially_copyable_v<KvPageView<bf16>>);
static_assert(std::is_trivially_copyable_v<SsmStateView<float>>);
static_assert(std::is_trivially_copyable_v<ConvStateView<bf16>>);

TEST_CASE("expert bytes are readable through a KV view after reuse", "[pool][views]") {
  // Small shapes with the real nesting: expert [F=64, H=128] bf16 = 16 KiB = 4 KV pages of
  // [2, tokens=4, kv_heads=2, head_dim=64] bf16 (4 KiB).
  constexpr std::uint32_t F = 64, H = 128;
  constexpr std::uint64_t kExpert = F * H * 2, kKv = 2 * 4 * 2 * 64 * 2;
  constexpr std::uint64_t kCanary = 4096;
  HostArena mem(4 * kExpert + 2 * kCanary);
  std::memset(mem.data(), 0xA5, mem.size());
  MoePool pool(ArenaSpan{mem.data() + kCanary, 4 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});

  auto ev = make_page_view<bf16>(pool, MoePool::kind_index<ExpertPage>, F, H);
  auto kv = make_page_view<bf16>(pool, MoePool::kind_index<KvPage>, 2, 4, 2, 64);
  REQUIRE((ev && kv));
  REQUIRE_FALSE(make_page_view<bf16>(pool, MoePool::kind_index<KvPage>, 2, 4, 2, 65).has_value());  // too big

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<bf16> written(F * H);
  auto page = pool.allocate<ExpertPage>(1);
  REQUIRE(page.has_value());
  for (std::uint32_t f = 0; f < F; ++f)
    for (std::uint32_t h = 0; h < H; ++h)
      (*ev)(page->index, f, h) = written[f * H + h] = bf16::from_float(u(rng));
  const std::uint64_t base = pool.offset_of(*page);
  REQUIRE(pool.free(*page) == PageStatus::kOk);

  // The same bytes, handed out again as KV pages (the carrier split from the freed expert page).
  std::vector<PageHandle> kvp;
  REQUIRE_FALSE(pool.allocate_n<KvPage>(4, 2, kvp).has_value());
  std::size_t checked = 0;
  for (auto p : kvp) {
    if (pool.offset_of(p) / kExpert != base / kExpert) continue;
    const std::uint64_t first = (pool.offset_of(p) - base) / 2;  // element offset inside the expert matrix
    for (std::uint32_t t = 0; t < 4; ++t)
      for (std::uint32_t hd = 0; hd < 2; ++hd)
        for (std::uint32_t d = 0; d < 64; ++d) {
          const std::uint64_t e = first + ((0 * 4 + t) * 2 + hd) * 64 + d;
          REQUIRE((*kv)(p.index, 0, t, hd, d).bits == written[e].bits);
          ++checked;
        }
  }
  REQUIRE(checked == 4 * 512);
  for (std::uint64_t i = 0; i < kCanary; ++i) {
    REQUIRE(mem.data()[i] == std::byte{0xA5});
    REQUIRE(mem.data()[kCanary + 4 * kExpert + i] == std::byte{0xA5});
  }
}

TEST_CASE("a page is never handed out while owned", "[pool][views]") {
  constexpr std::uint64_t kExpert = 16384, kKv = 4096;
  HostArena mem(8 * kExpert);
  MoePool pool(mem.span(), {PageSpec{kExpert}, PageSpec{kKv}});
  auto kv = *make_page_view<std::uint32_t>(pool, 1, kKv / 4);
  auto ex = *make_page_view<std::uint32_t>(pool, 0, kExpert / 4);
  // Every owned page holds its owner's stamp; any handout of an owned page would overwrite a stamp.
  std::mt19937 rng(3);
  std::vector<std::pair<PageHandle, std::uint32_t>> live;
  for (std::uint32_t step = 1; step < 20000; ++step) {
    if (live.empty() || rng() % 2) {
      const bool small = rng() % 3 != 0;
      auto p = pool.allocate(small ? 1 : 0, step);
      if (!p) continue;
      auto& v = small ? kv : ex;
      for (std::uint32_t i = 0; i < v.extents[0]; ++i) v(p->index, i) = step;
      live.emplace_back(*p, step);
    } else {
      const std::size_t i = rng() % live.size();
      auto [p, stamp] = live[i];
      auto& v = p.kind == 1 ? kv : ex;
      for (std::uint32_t j = 0; j < v.extents[0]; ++j) REQUIRE(v(p.index, j) == stamp);
      REQUIRE(pool.free(p) == PageStatus::kOk);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (auto [p, stamp] : live) {
    auto& v = p.kind == 1 ? kv : ex;
    for (std::uint32_t j = 0; j < v.extents[0]; ++j) REQUIRE(v(p.index, j) == stamp);
  }
}
