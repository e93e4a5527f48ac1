// The paper's worked example (DESIGN §3.1) and the hybrid-model variant, with exact page counts.
#include <catch2/catch.hpp>

#include <vector>

#include "amoeba/pool.hpp"

using namespace amoeba;

namespace {
// Qwen1.5-MoE-A2.7B, bf16, one GPU: one expert matrix 1408 x 2048 x 2 B; one KV page 16 tokens x 2 x 16 heads
// x 128 x 2 B.
constexpr std::uint64_t kExpert = 1408ull * 2048 * 2;    // 5,767,168 B
constexpr std::uint64_t kKv = 16ull * 2 * 16 * 128 * 2;  // 131,072 B
static_assert(kExpert == 5'767'168 && kKv == 131'072 && kExpert / kKv == 44);

std::vector<PageHandle> take_kv(MoePool& pool, OwnerId owner, int n) {
  std::vector<PageHandle> pages;
  REQUIRE_FALSE(pool.allocate_n<KvPage>(static_cast<std::uint64_t>(n), owner, pages).has_value());
  return pages;
}
void give_back(MoePool& pool, const std::vector<PageHandle>& pages) {
  for (auto p : pages) REQUIRE(pool.free(p) == PageStatus::kOk);
}
}  // namespace

TEST_CASE("paper example: an expert page cut into KV pages for three requests", "[pool][paper]") {
  MoePool pool(ArenaSpan{nullptr, kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  REQUIRE(pool.large_page_bytes() == kExpert);
  REQUIRE(pool.large_page_count() == 1);
  REQUIRE(pool.available<KvPage>() == 44);

  const auto a = take_kv(pool, 1, 20);
  const auto b = take_kv(pool, 2, 14);
  const auto c = take_kv(pool, 3, 10);
  for (auto* pages : {&a, &b, &c})
    for (auto p : *pages) REQUIRE(pool.offset_of(p) / kExpert == 0);  // all from the one expert page
  REQUIRE(pool.stats().large_pages_in_use == 1);
  REQUIRE(pool.available<KvPage>() == 0);
  REQUIRE(pool.available<ExpertPage>() == 0);

  give_back(pool, a);
  give_back(pool, b);
  auto s = pool.stats();
  // 34 free KV slots are trapped inside the page: usable for KV only, not mergeable.
  REQUIRE(s.free_of<KvPage>() == 34);
  REQUIRE(s.trapped_bytes == 34 * kKv);
  REQUIRE_FALSE(s.fully_merged);
  auto expert = pool.allocate<ExpertPage>(100);
  REQUIRE_FALSE(expert.has_value());
  REQUIRE(expert.error().reason == ShortfallReason::kFragmented);  // enough bytes, wrong shape
  REQUIRE(pool.check_invariants() == std::nullopt);

  auto kv = pool.allocate<KvPage>(4);  // the trapped space still serves KV
  REQUIRE(kv.has_value());
  REQUIRE(pool.free(*kv) == PageStatus::kOk);

  give_back(pool, c);
  s = pool.stats();
  REQUIRE(s.fully_merged);
  REQUIRE(s.trapped_bytes == 0);
  REQUIRE(s.large_pages_in_use == 0);
  expert = pool.allocate<ExpertPage>(100);  // whole again: it can hold an expert matrix
  REQUIRE(expert.has_value());
  REQUIRE(pool.offset_of(*expert) == 0);
  REQUIRE(pool.check_invariants() == std::nullopt);
}

TEST_CASE("allocation order: free small page, then split an expert page, then cut a large page", "[pool]") {
  MoePool pool(ArenaSpan{nullptr, 3 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  const auto a = take_kv(pool, 1, 43);  // one carrier, one slot left
  REQUIRE(pool.stats().large_pages_in_use == 1);
  auto b = pool.allocate<KvPage>(2);  // a fresh expert page is split, not owner 1's claimed carrier
  REQUIRE(b.has_value());
  // owner 2 has no hint: the claimed carrier of owner 1 is left alone while fresh pages exist
  REQUIRE(pool.offset_of(*b) / kExpert != pool.offset_of(a[0]) / kExpert);
  REQUIRE(pool.stats().large_pages_in_use == 2);
  REQUIRE(pool.free(a[5]) == PageStatus::kOk);  // owner 1 starts to give back: its carrier opens
  auto c = pool.allocate<KvPage>(3);
  REQUIRE(c.has_value());
  REQUIRE(pool.offset_of(*c) / kExpert == pool.offset_of(a[0]) / kExpert);  // trapped space reused first
  REQUIRE(pool.check_invariants() == std::nullopt);
}

TEST_CASE("affinity: a request's next page comes from its previous page's expert page", "[pool]") {
  MoePool pool(ArenaSpan{nullptr, 4 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  // Two requests grow one page at a time, interleaved, each passing its last page as the hint.
  std::optional<PageHandle> last1, last2;
  std::vector<PageHandle> p1, p2;
  for (int i = 0; i < 40; ++i) {
    auto x = pool.allocate<KvPage>(1, last1);
    auto y = pool.allocate<KvPage>(2, last2);
    REQUIRE((x && y));
    p1.push_back(*x);
    p2.push_back(*y);
    last1 = *x;
    last2 = *y;
  }
  for (auto p : p1) REQUIRE(pool.offset_of(p) / kExpert == pool.offset_of(p1[0]) / kExpert);
  for (auto p : p2) REQUIRE(pool.offset_of(p) / kExpert == pool.offset_of(p2[0]) / kExpert);
  REQUIRE(pool.offset_of(p1[0]) / kExpert != pool.offset_of(p2[0]) / kExpert);
  // Request 1 finishes: its expert page heals at once although request 2 is still running.
  give_back(pool, p1);
  REQUIRE(pool.available<ExpertPage>() == 3);
  REQUIRE(pool.stats().trapped_bytes == 4 * kKv);  // only request 2's carrier has free slots
  give_back(pool, p2);
  REQUIRE(pool.fully_merged());
}

TEST_CASE("hybrid model: large page = lcm(expert, SSM) != expert page", "[pool][hybrid]") {
  // expert 96 KiB, SSM 64 KiB -> large 192 KiB = 2 expert pages = 3 SSM pages; KV 4 KiB, conv 2 KiB.
  constexpr std::uint64_t E = 96 * 1024, S = 64 * 1024, L = 192 * 1024;
  HybridMoePool pool(ArenaSpan{nullptr, 4 * L + 1000},
                     {PageSpec{E}, PageSpec{S}, PageSpec{4096}, PageSpec{2048, 1536}});
  REQUIRE(pool.large_page_bytes() == L);
  REQUIRE(pool.large_page_count() == 4);
  auto st = pool.stats();
  REQUIRE(st.unused_tail_bytes == 1000);
  REQUIRE(st.available_of<ExpertPage>() == 8);
  REQUIRE(st.available_of<SsmPage>() == 12);
  REQUIRE(st.available_of<KvPage>() == 8 * 24);

  auto ssm = pool.allocate<SsmPage>(7);  // cuts one large page into 3 SSM pages
  REQUIRE(ssm.has_value());
  REQUIRE(pool.stats().free_of<SsmPage>() == 2);
  REQUIRE(pool.available<ExpertPage>() == 6);
  auto ex = pool.allocate<ExpertPage>(8);  // cuts a second large page into 2 expert pages
  REQUIRE(ex.has_value());
  REQUIRE(pool.stats().free_of<ExpertPage>() == 1);
  auto kv = pool.allocate<KvPage>(9);  // splits the free expert page of that large page, not a new large page
  REQUIRE(kv.has_value());
  REQUIRE(pool.offset_of(*kv) / L == pool.offset_of(*ex) / L);
  REQUIRE(pool.stats().large_pages_in_use == 2);
  auto conv =
      pool.allocate<ConvPage>(9);  // conv pages need their own carrier (one small kind per expert page)
  REQUIRE(conv.has_value());
  REQUIRE(pool.stats().large_pages_in_use == 3);
  REQUIRE(pool.set_used_bytes(*conv, 1000) == PageStatus::kOk);
  REQUIRE(pool.set_used_bytes(*kv, 1024) == PageStatus::kOk);
  st = pool.stats();
  REQUIRE(st.tail_waste_of<ConvPage>() == 536);
  REQUIRE(st.tail_waste_of<KvPage>() == 3072);
  REQUIRE(st.padding_of<ConvPage>() == 512);
  REQUIRE(st.trapped_bytes == 23 * 4096 + 47 * 2048);
  REQUIRE(pool.check_invariants() == std::nullopt);

  for (auto p : {*ssm, *ex, *kv, *conv}) REQUIRE(pool.free(p) == PageStatus::kOk);
  st = pool.stats();
  REQUIRE(st.fully_merged);
  REQUIRE(st.tail_waste_of<KvPage>() == 0);
  REQUIRE(st.tail_waste_of<ConvPage>() == 0);
  REQUIRE(pool.check_invariants() == std::nullopt);
}

TEST_CASE("a failed call changes nothing", "[pool]") {
  MoePool pool(ArenaSpan{nullptr, 2 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  std::vector<PageHandle> got;
  REQUIRE_FALSE(pool.allocate_n<KvPage>(10, 1, got).has_value());
  const auto before = pool.stats();
  auto err = pool.allocate_n<KvPage>(100, 2, got);  // 78 available
  REQUIRE(err.has_value());
  REQUIRE(err->requested_pages == 100);
  REQUIRE(err->available_pages == 78);
  REQUIRE(got.size() == 10);
  REQUIRE(pool.stats().used_pages == before.used_pages);
  REQUIRE(pool.stats().available_pages == before.available_pages);

  REQUIRE(pool.free(got[0]) == PageStatus::kOk);
  REQUIRE(pool.free(got[0]) == PageStatus::kNotOwned);  // double free
  REQUIRE(pool.free(PageHandle{9999, 1}) == PageStatus::kOutOfRange);
  REQUIRE(pool.free(PageHandle{1, 0}) == PageStatus::kNotOwned);  // the split carrier is nobody's page
  REQUIRE(pool.set_used_bytes(got[1], kKv + 1) == PageStatus::kBadValue);
  REQUIRE(pool.set_owner(got[1], kFreeOwner) == PageStatus::kBadValue);
  REQUIRE_FALSE(pool.allocate<KvPage>(kFreeOwner).has_value());
  REQUIRE(pool.stats().used_of<KvPage>() == 9);
  REQUIRE(pool.check_invariants() == std::nullopt);
  auto whole = pool.allocate<ExpertPage>(3);
  REQUIRE(whole.has_value());
  auto none = pool.allocate<ExpertPage>(3);
  REQUIRE_FALSE(none.has_value());
  REQUIRE(none.error().reason == ShortfallReason::kFragmented);
  REQUIRE(pool.set_owner(*whole, 42) == PageStatus::kOk);
  REQUIRE(pool.owner_of(*whole) == OwnerId{42});
}

TEST_CASE("adjacent runs: an expert's three pages side by side when a run is free", "[pool]") {
  MoePool pool(ArenaSpan{nullptr, 10 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  // Fragment the free space: pages 0..9 taken one by one, then 1, 4, 5, 7, 8, 9 freed -> free {1}, {4,5},
  // {7,8,9}.
  std::vector<PageHandle> one;
  for (int i = 0; i < 10; ++i) one.push_back(*pool.allocate<ExpertPage>(1));
  for (int i : {1, 4, 5, 7, 8, 9}) REQUIRE(pool.free(one[i]) == PageStatus::kOk);
  std::vector<PageHandle> run;
  REQUIRE_FALSE(pool.allocate_adjacent<ExpertPage>(3, 2, run).has_value());
  REQUIRE(run.size() == 3);
  CHECK(run[0].index == 7);  // the first run of three, not the lowest free page
  CHECK(run[1].index == 8);
  CHECK(run[2].index == 9);
  // No run of three left ({1}, {4,5}): falls back to any three pages, still all or nothing.
  std::vector<PageHandle> scattered;
  REQUIRE_FALSE(pool.allocate_adjacent<ExpertPage>(3, 3, scattered).has_value());
  CHECK(scattered.size() == 3);
  std::vector<PageHandle> none;
  auto err = pool.allocate_adjacent<ExpertPage>(1, 4, none);
  REQUIRE(err.has_value());
  CHECK(none.empty());
  REQUIRE(pool.check_invariants() == std::nullopt);
  for (auto* v : {&run, &scattered})
    for (auto p : *v) REQUIRE(pool.free(p) == PageStatus::kOk);
  for (int i : {0, 2, 3, 6}) REQUIRE(pool.free(one[i]) == PageStatus::kOk);
  REQUIRE(pool.fully_merged());
  // A run across a 64-page word boundary.
  MoePool big(ArenaSpan{nullptr, 130 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  std::vector<PageHandle> head;
  REQUIRE_FALSE(big.allocate_n<ExpertPage>(62, 1, head).has_value());
  auto lone = big.allocate<ExpertPage>(1);      // page 62
  auto gap = big.allocate<ExpertPage>(1);       // page 63
  REQUIRE(big.free(*lone) == PageStatus::kOk);  // free: 62, 64..129
  std::vector<PageHandle> cross;
  REQUIRE_FALSE(big.allocate_adjacent<ExpertPage>(3, 2, cross).has_value());
  CHECK(cross[0].index == 64);
  REQUIRE(big.free(*gap) == PageStatus::kOk);  // free: 62, 63, 67..129 -> a run of 2 spans the boundary
  std::vector<PageHandle> two;
  REQUIRE_FALSE(big.allocate_adjacent<ExpertPage>(2, 2, two).has_value());
  CHECK(two[0].index == 62);
  CHECK(two[1].index == 63);
  REQUIRE(big.check_invariants() == std::nullopt);
  // A run of three straddling the word boundary (63, 64, 65) and nothing else free.
  MoePool full(ArenaSpan{nullptr, 130 * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  std::vector<PageHandle> all;
  REQUIRE_FALSE(full.allocate_n<ExpertPage>(130, 1, all).has_value());
  for (int i : {60, 63, 64, 65, 100}) REQUIRE(full.free(all[i]) == PageStatus::kOk);
  std::vector<PageHandle> straddle;
  REQUIRE_FALSE(full.allocate_adjacent<ExpertPage>(3, 2, straddle).has_value());
  CHECK(straddle[0].index == 63);
  CHECK(straddle[2].index == 65);
  REQUIRE(full.check_invariants() == std::nullopt);
}
