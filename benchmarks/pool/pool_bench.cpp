// Pool allocate+free cost per page (target <= 50 ns, DESIGN §8), next to two baselines in the same run: a
// plain index free list (the least any page allocator can do) and std::pmr::unsynchronized_pool_resource.
// Each pool benchmark starts from a half-full pool with pages of random requests, so lists are not trivially
// empty.
#include <benchmark/benchmark.h>

#include <memory_resource>
#include <random>
#include <vector>

#include "amoeba/pool.hpp"

using namespace amoeba;

namespace {
constexpr std::uint64_t kExpert = 1408ull * 2048 * 2;  // Qwen1.5-MoE expert matrix
constexpr std::uint64_t kKv = 131072;                  // 16 tokens of its KV for one layer
constexpr std::uint64_t kLarge = 2000;                 // ~11.5 GB of bookkeeping-only arena

MoePool half_full_pool(std::vector<PageHandle>& held) {
  MoePool pool(ArenaSpan{nullptr, kLarge * kExpert}, {PageSpec{kExpert}, PageSpec{kKv}});
  std::mt19937 rng(1);
  for (int i = 0; i < 600; ++i) held.push_back(*pool.allocate<ExpertPage>(1'000'000 + i));
  std::optional<PageHandle> last;
  for (int i = 0; i < 20000; ++i) {
    auto p = pool.allocate<KvPage>(rng() % 300, last);
    held.push_back(*p);
    last = *p;
  }
  // free a random third so carriers are partly used
  for (std::size_t i = 0; i < held.size(); i += 3) (void)pool.free(held[i]);
  return pool;
}

void BM_Pool_KvPage_AllocFree(benchmark::State& state) {
  std::vector<PageHandle> held;
  MoePool pool = half_full_pool(held);
  std::optional<PageHandle> near = held[601];  // a KV page still held
  for (auto _ : state) {
    auto p = pool.allocate<KvPage>(7, near);
    benchmark::DoNotOptimize(p);
    (void)pool.free(*p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pool_KvPage_AllocFree);

// Worst case for the attention-only pool: large == expert page, so every allocation cuts a large page and
// every free merges it back.
void BM_Pool_ExpertPage_AllocFree(benchmark::State& state) {
  std::vector<PageHandle> held;
  MoePool pool = half_full_pool(held);
  for (auto _ : state) {
    auto p = pool.allocate<ExpertPage>(7);
    benchmark::DoNotOptimize(p);
    (void)pool.free(*p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pool_ExpertPage_AllocFree);

// An expert's three matrix pages side by side (allocate_adjacent searches the free-page bit set for a run),
// then freed: what the adjuster does for each restore.
void BM_Pool_ExpertTriple_Adjacent(benchmark::State& state) {
  std::vector<PageHandle> held;
  MoePool pool = half_full_pool(held);
  std::vector<PageHandle> got;
  got.reserve(3);
  for (auto _ : state) {
    got.clear();
    (void)pool.allocate_adjacent<ExpertPage>(3, 9, got);
    for (auto p : got) (void)pool.free(p);
  }
  state.SetItemsProcessed(state.iterations() * 3);
}
BENCHMARK(BM_Pool_ExpertTriple_Adjacent);

// A burst: 64 KV pages for one request (all or nothing, chained affinity), then all freed.
void BM_Pool_KvPage_Burst64(benchmark::State& state) {
  std::vector<PageHandle> held;
  MoePool pool = half_full_pool(held);
  std::vector<PageHandle> got;
  got.reserve(64);
  for (auto _ : state) {
    got.clear();
    (void)pool.allocate_n<KvPage>(64, 9, got);
    for (auto p : got) (void)pool.free(p);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_Pool_KvPage_Burst64);

// Baseline: a plain stack of free page indices (what vLLM's block pool does, without tiers).
void BM_Baseline_FreeList_AllocFree(benchmark::State& state) {
  std::vector<std::uint32_t> free_list(kLarge * 44);
  for (std::uint32_t i = 0; i < free_list.size(); ++i) free_list[i] = i;
  std::vector<std::uint64_t> owner(free_list.size(), ~0ull);
  for (auto _ : state) {
    const std::uint32_t p = free_list.back();
    free_list.pop_back();
    owner[p] = 7;
    benchmark::DoNotOptimize(p);
    owner[p] = ~0ull;
    free_list.push_back(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_FreeList_AllocFree);

// Baseline: std::pmr pool resource handing out KV-page-sized blocks of real memory.
void BM_Baseline_PmrPool_AllocFree(benchmark::State& state) {
  std::pmr::unsynchronized_pool_resource res(std::pmr::pool_options{64, kKv});
  std::vector<void*> warm;
  for (int i = 0; i < 64; ++i) warm.push_back(res.allocate(kKv, 256));
  for (void* p : warm) res.deallocate(p, kKv, 256);
  for (auto _ : state) {
    void* p = res.allocate(kKv, 256);
    benchmark::DoNotOptimize(p);
    res.deallocate(p, kKv, 256);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_PmrPool_AllocFree);
}  // namespace

BENCHMARK_MAIN();
