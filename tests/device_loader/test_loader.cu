// DoubleBufferLoader on a GPU: a kernel never reads a half-copied expert or a reused page.
//
// Every forward: the real elastic Adjuster decides evictions/restores under random pressure, the loader moves
// experts (restores into reserved pages, predictions and misses into the load buffers), and a consumer kernel
// hashes every routed expert through the page table, exactly where the MoE kernel would read it. Destinations
// are poisoned (0xFF) on the copy stream before each copy and the copy stream is delayed by a spin kernel, so
// a missing wait shows up as a wrong hash. After each forward the pages freed by eviction are handed out as
// KV pages and overwritten, so a stale page-table entry shows up too. Hashes are compared with the pinned
// master copy; the test requires zero mismatches over all forwards.
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "amoeba/policies/stacks.hpp"
#include "amoeba/pool.hpp"
#include "loader/double_buffer_loader.cuh"
#include "moe/paged_moe.cuh"

using namespace amoeba;
using amoeba::kernels::DoubleBufferLoader;
using amoeba::kernels::LoaderOptions;
using amoeba::kernels::PinnedExpertStore;

namespace {

// h = sum_i word_i * (2i + 1) mod 2^64 over the 32-bit words of one matrix: position-dependent, order-free.
__global__ void hash_routed(const ExpertLocation* row, const __nv_bfloat16* pool, const __nv_bfloat16* buffer,
                            const std::uint32_t* experts, std::int64_t matrix_words,
                            unsigned long long* out /* [n][3] */) {
  const int i = blockIdx.y / 3, j = blockIdx.y % 3;
  const ExpertLocation loc = row[experts[i]];
  const std::uint32_t* base;
  if (loc.buffer_slot >= 0)
    base = reinterpret_cast<const std::uint32_t*>(buffer) +
           (3 * std::int64_t(loc.buffer_slot) + j) * matrix_words;
  else if (loc.page[j] >= 0)
    base = reinterpret_cast<const std::uint32_t*>(pool) + std::int64_t(loc.page[j]) * matrix_words;
  else {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(&out[blockIdx.y], 0x5eadbeefull);  // absent: a bug
    return;
  }
  unsigned long long h = 0;
  for (std::int64_t w = blockIdx.x * blockDim.x + threadIdx.x; w < matrix_words; w += gridDim.x * blockDim.x)
    h += static_cast<unsigned long long>(base[w]) * static_cast<unsigned long long>(2 * w + 1);
  atomicAdd(&out[blockIdx.y], h);
}

std::uint64_t host_hash(const std::byte* p, std::uint64_t bytes) {
  std::uint64_t h = 0;
  for (std::uint64_t w = 0; w < bytes / 4; ++w) {
    std::uint32_t v;
    std::memcpy(&v, p + 4 * w, 4);
    h += std::uint64_t(v) * (2 * w + 1);
  }
  return h;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct Harness {
  static constexpr std::uint32_t kLayers = 6, kExperts = 16, kTopK = 4, kLimit = 6;
  static constexpr std::uint64_t kMatrix = 128 * 256 * 2;  // F=128, H=256 bf16: 64 KiB per expert page
  static constexpr std::uint64_t kKv = kMatrix / 8;

  PinnedExpertStore store{kLayers, kExperts, kMatrix};
  kernels::DeviceArena arena{(kLayers * kExperts * 3 + 48) * kMatrix};
  MoePool pool{arena.span(), {PageSpec{kMatrix}, PageSpec{kKv}}};
  policies::ElasticAdjuster adjuster;
  cudaStream_t compute{};
  std::vector<std::uint64_t> expected;  // [layer][expert][matrix]
  std::mt19937 rng{2024};

  static ExpertRanker ranking() {
    std::vector<std::vector<double>> p(kLayers, std::vector<double>(kExperts));
    std::mt19937 r(5);
    for (auto& layer : p)
      for (auto& x : layer) x = std::uniform_real_distribution<double>(0.01, 1.0)(r);
    return ExpertRanker::from_probabilities(p);
  }

  Harness() : adjuster(ranking(), AdjusterConfig{kLimit}, policies::ElasticHysteresis{}) {
    store.fill(PinnedExpertStore::random_bf16(99));
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t e = 0; e < kExperts; ++e)
        for (ExpertMatrix m : kExpertMatrices)
          expected.push_back(host_hash(store.matrix({l, e}, m), kMatrix));
    REQUIRE(cudaStreamCreate(&compute) == cudaSuccess);
    REQUIRE(cudaMemset(arena.data(), 0xff, arena.size()) == cudaSuccess);  // poison the whole pool
    // Everything resident at first, uploaded with plain copies.
    REQUIRE_FALSE(adjuster.populate(pool).has_value());
    adjuster.residency().for_each_resident([&](ExpertKey k, const ExpertPages& p) {
      for (ExpertMatrix m : kExpertMatrices)
        REQUIRE(cudaMemcpy(arena.data() + pool.offset_of(p[m]), store.matrix(k, m), kMatrix,
                           cudaMemcpyHostToDevice) == cudaSuccess);
    });
  }
  ~Harness() { cudaStreamDestroy(compute); }

  std::vector<std::uint32_t> route() {
    std::vector<std::uint32_t> all(kExperts);
    std::iota(all.begin(), all.end(), 0u);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(kTopK);
    return all;
  }
  std::vector<std::uint32_t> predict(const std::vector<std::uint32_t>& truth) {  // ~75% accurate
    std::vector<std::uint32_t> p = truth;
    for (auto& x : p)
      if (rng() % 4 == 0) x = rng() % kExperts;
    return p;
  }
  // Evicts under pressure until layer 0 has at least n experts offloaded; returns them.
  std::vector<std::uint32_t> offload_in_layer0(std::size_t n) {
    std::vector<std::uint32_t> off;
    for (int tries = 0; tries < 20 && off.size() < n; ++tries) {
      ChangeList c = adjuster.adjust(AdjustSignal{30, 0}, pool);
      REQUIRE_FALSE(adjuster.commit(c, pool).has_value());
      off.clear();
      for (std::uint32_t e = 0; e < kExperts; ++e)
        if (!adjuster.residency().is_resident({0, e})) off.push_back(e);
    }
    REQUIRE(off.size() >= n);
    return off;
  }
  // Hands every free page out as KV pages, overwrites them on the compute stream, frees them again.
  void scribble_free_pages() {
    std::vector<PageHandle> kv;
    (void)pool.allocate_n<KvPage>(pool.available<KvPage>(), 999, kv);
    for (auto p : kv)
      REQUIRE(cudaMemsetAsync(arena.data() + pool.offset_of(p), 0xab, kKv, compute) == cudaSuccess);
    for (auto p : kv) REQUIRE(pool.free(p) == PageStatus::kOk);
  }

  // Runs `forwards` steps; returns the number of hash mismatches.
  std::uint64_t run(int forwards, LoaderOptions options) {
    DoubleBufferLoader loader(LoaderShape{kLayers, kExperts, kLimit}, store, arena.span(), compute, options);
    std::uint32_t* d_experts = nullptr;
    unsigned long long* d_hash = nullptr;
    REQUIRE(cudaMalloc(&d_experts, kLayers * kTopK * sizeof(std::uint32_t)) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_hash, kLayers * kTopK * 3 * sizeof(unsigned long long)) == cudaSuccess);
    std::vector<std::uint32_t> h_experts(kLayers * kTopK);
    std::vector<unsigned long long> h_hash(kLayers * kTopK * 3);
    std::uint64_t mismatches = 0, evictions = 0, restores = 0;

    for (int f = 0; f < forwards; ++f) {
      // Pressure comes and goes: a burst of shortfall, then calm with free pages (restores).
      const std::uint64_t shortfall = (f / 10) % 2 == 0 ? rng() % 10 : 0;
      ChangeList changes = adjuster.adjust(AdjustSignal{shortfall, pool.available<ExpertPage>()}, pool);
      evictions += changes.evictions.size();
      restores += changes.restores.size();
      REQUIRE_FALSE(loader.begin_forward(changes, adjuster.residency(), pool).has_value());

      std::vector<std::vector<std::uint32_t>> routed(kLayers);
      for (auto& r : routed) r = route();
      for (std::uint32_t l = 0; l < kLayers; ++l)
        std::copy(routed[l].begin(), routed[l].end(), h_experts.begin() + l * kTopK);
      REQUIRE(cudaMemcpyAsync(d_experts, h_experts.data(), h_experts.size() * 4, cudaMemcpyHostToDevice,
                              compute) == cudaSuccess);
      REQUIRE(cudaMemsetAsync(d_hash, 0, h_hash.size() * 8, compute) == cudaSuccess);

      REQUIRE_FALSE(loader.prefetch(0, predict(routed[0])).has_value());
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        auto w = loader.prepare_layer(l, routed[l]);
        REQUIRE(w.has_value());
        if (l + 1 < kLayers) REQUIRE_FALSE(loader.prefetch(l + 1, predict(routed[l + 1])).has_value());
        hash_routed<<<dim3(8, kTopK * 3), 256, 0, compute>>>(w->locations, w->pool_base, w->load_buffer,
                                                             d_experts + l * kTopK, kMatrix / 4,
                                                             d_hash + l * kTopK * 3);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        loader.layer_done(l);
      }
      // Mid-forward, evicted experts' pages still belong to them: nobody can be handed them.
      for (const Eviction& e : changes.evictions)
        for (ExpertMatrix m : kExpertMatrices)
          REQUIRE(pool.owner_of(e.pages[m]) == expert_owner(e.expert, m));

      const auto evicted = loader.end_forward();
      REQUIRE(evicted.size() == changes.evictions.size());
      REQUIRE_FALSE(adjuster.commit(changes, pool).has_value());
      scribble_free_pages();

      REQUIRE(cudaMemcpyAsync(h_hash.data(), d_hash, h_hash.size() * 8, cudaMemcpyDeviceToHost, compute) ==
              cudaSuccess);
      REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
      for (std::uint32_t l = 0; l < kLayers; ++l)
        for (std::uint32_t i = 0; i < kTopK; ++i)
          for (std::uint32_t j = 0; j < 3; ++j) {
            const std::uint32_t e = routed[l][i];
            mismatches += h_hash[(l * kTopK + i) * 3 + j] != expected[(l * kExperts + e) * 3 + j];
          }
    }
    const auto& s = loader.stats();
    INFO("forwards " << forwards << ", evictions " << evictions << ", restores " << restores << ", copies "
                     << s.copies << ", misses " << s.on_demand_misses << ", prefetch hits "
                     << s.prefetch_hits);
    CHECK(evictions > 0);  // the run exercised the protocol
    CHECK(restores > 0);
    CHECK(s.on_demand_misses > 0);
    CHECK(s.prefetch_hits > 0);
    REQUIRE(pool.check_invariants() == std::nullopt);
    cudaFree(d_experts);
    cudaFree(d_hash);
    return mismatches;
  }
};

}  // namespace

TEST_CASE("no torn or stale reads: poisoned destinations, delayed copy stream", "[gpu][loader]") {
  Harness h;
  const int forwards = env_int("AMOEBA_LOADER_FORWARDS", 200);
  REQUIRE(h.run(forwards, LoaderOptions{true, 300}) == 0);
}

TEST_CASE("no torn or stale reads at full speed", "[gpu][loader]") {
  Harness h;
  const int forwards = env_int("AMOEBA_LOADER_FORWARDS", 200);
  REQUIRE(h.run(forwards, LoaderOptions{false, 0}) == 0);
}

TEST_CASE("the hash detects a missing wait", "[gpu][loader]") {
  // Control experiment: reading a buffer slot while its poisoned copy is still delayed must mismatch, or the
  // tests above prove nothing.
  Harness h;
  const auto off = h.offload_in_layer0(1);
  const ExpertKey victim{0, off[0]};
  DoubleBufferLoader loader(LoaderShape{Harness::kLayers, Harness::kExperts, Harness::kLimit}, h.store,
                            h.arena.span(), h.compute, LoaderOptions{true, 20000});
  REQUIRE_FALSE(loader.begin_forward(ChangeList{}, h.adjuster.residency(), h.pool).has_value());
  const std::vector<std::uint32_t> routed{victim.expert};
  auto w = loader.prepare_layer(0, routed);  // queues the on-demand copy behind a 20 ms spin
  REQUIRE(w.has_value());
  // A rogue reader: the same locations, uploaded by hand, read on a stream that does NOT wait for the copy.
  std::vector<ExpertLocation> row(Harness::kExperts);
  loader.planner().locations(0, row);
  REQUIRE(row[victim.expert].buffer_slot >= 0);
  cudaStream_t rogue;
  REQUIRE(cudaStreamCreateWithFlags(&rogue, cudaStreamNonBlocking) == cudaSuccess);
  ExpertLocation* d_row;
  std::uint32_t* d_e;
  unsigned long long* d_h;
  REQUIRE(cudaMalloc(&d_row, row.size() * sizeof(ExpertLocation)) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_e, 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_h, 24) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d_row, row.data(), row.size() * sizeof(ExpertLocation), cudaMemcpyHostToDevice,
                          rogue) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d_e, &victim.expert, 4, cudaMemcpyHostToDevice, rogue) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d_h, 0, 24, rogue) == cudaSuccess);
  hash_routed<<<dim3(8, 3), 256, 0, rogue>>>(d_row, w->pool_base, w->load_buffer, d_e, Harness::kMatrix / 4,
                                             d_h);
  unsigned long long got[3];
  REQUIRE(cudaMemcpyAsync(got, d_h, 24, cudaMemcpyDeviceToHost, rogue) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(rogue) == cudaSuccess);
  const bool copy_done = cudaStreamQuery(loader.copy_stream()) == cudaSuccess;
  loader.layer_done(0);
  loader.end_forward();
  const auto base = (victim.layer * Harness::kExperts + victim.expert) * 3;
  REQUIRE_FALSE(copy_done);           // the rogue read really happened before the copy
  CHECK(got[0] != h.expected[base]);  // and the hash saw it
  cudaStreamDestroy(rogue);
  cudaFree(d_row);
  cudaFree(d_e);
  cudaFree(d_h);
}

TEST_CASE("a miss's copy waits for the routing event, without it the copy runs ahead of the compute stream",
          "[gpu][loader]") {
  // Synthetic routing is known on the host before the GPU computes the layer: the copy must still wait for
  // the event the compute stream records after its router, or it would be a perfect prefetch.
  Harness h;
  const auto off = h.offload_in_layer0(1);
  const std::vector<std::uint32_t> routed{off[0]};
  for (const bool with_event : {true, false}) {
    INFO("routed_ready given: " << with_event);
    DoubleBufferLoader loader(LoaderShape{Harness::kLayers, Harness::kExperts, Harness::kLimit}, h.store,
                              h.arena.span(), h.compute);
    REQUIRE_FALSE(loader.begin_forward(ChangeList{}, h.adjuster.residency(), h.pool).has_value());
    cudaEvent_t routed_ready;
    REQUIRE(cudaEventCreateWithFlags(&routed_ready, cudaEventDisableTiming) == cudaSuccess);
    // The compute stream is busy for 300 ms before it reaches the router.
    amoeba::kernels::detail::spin_kernel<<<1, 1, 0, h.compute>>>(300'000'000ull);
    REQUIRE(cudaEventRecord(routed_ready, h.compute) == cudaSuccess);
    auto w = loader.prepare_layer(0, routed, with_event ? routed_ready : nullptr);
    REQUIRE(w.has_value());
    REQUIRE(loader.stats().on_demand_misses == 1);
    // One expert takes well under 100 ms to copy; the spin has 200 ms left by then.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const bool compute_done = cudaStreamQuery(h.compute) == cudaSuccess;
    const cudaError_t copy_state = cudaStreamQuery(loader.copy_stream());
    REQUIRE_FALSE(compute_done);
    if (with_event)
      CHECK(copy_state == cudaErrorNotReady);
    else
      CHECK(copy_state == cudaSuccess);
    loader.layer_done(0);
    loader.end_forward();
    REQUIRE(cudaEventDestroy(routed_ready) == cudaSuccess);
  }
}

TEST_CASE("bad input: too many misses, unreserved restore pages, out-of-order layers", "[gpu][loader]") {
  Harness h;
  const auto off = h.offload_in_layer0(3);
  DoubleBufferLoader loader(LoaderShape{Harness::kLayers, Harness::kExperts, 2}, h.store, h.arena.span(),
                            h.compute);
  REQUIRE_FALSE(loader.begin_forward(ChangeList{}, h.adjuster.residency(), h.pool).has_value());
  const auto calls = loader.device_stats().copy_calls;
  auto w = loader.prepare_layer(0, off);  // 3 misses, 2 slots
  REQUIRE_FALSE(w.has_value());
  CHECK(w.error().code == LoaderErrorCode::kTooManyMisses);
  CHECK(loader.device_stats().copy_calls == calls);  // nothing issued
  REQUIRE(loader.prepare_layer(0, std::vector<std::uint32_t>{off[0]}).has_value());
  REQUIRE(loader.prepare_layer(1, {}).has_value());
  auto early = loader.prepare_layer(2, {});  // layer 0 was never marked done
  REQUIRE_FALSE(early.has_value());
  CHECK(early.error().code == LoaderErrorCode::kOutOfOrder);
  loader.layer_done(0);
  loader.layer_done(1);
  loader.end_forward();

  ChangeList bogus;
  bogus.restores.push_back(Restore{{0, off[0]}, {}});  // pages never reserved
  auto e = loader.begin_forward(bogus, h.adjuster.residency(), h.pool);
  REQUIRE(e.has_value());
  CHECK(e->code == ChangeErrorCode::kNotReserved);
}

// Every write of the page table goes to the compute stream, the constructor's clear included: a non-blocking
// compute stream does not wait for the legacy default stream, so a clear there could land after
// set_static_entries' rows and wipe them (docs/loader.md). While a blocking stream captures, the legacy
// stream is unusable (cudaErrorStreamCaptureImplicit), so constructing the loader then fails if it touches
// the legacy stream at all; the static rows written during the capture must read back intact.
TEST_CASE("the loader never uses the legacy default stream: its table clear is ordered on the compute stream",
          "[gpu][loader]") {
  Harness h;
  cudaStream_t compute{}, capturing{};
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&capturing) == cudaSuccess);  // blocking: the legacy stream would wait for it
  REQUIRE(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  LoaderOptions options;
  options.static_entries = 2;
  std::optional<DoubleBufferLoader> loader;
  std::string error;
  try {
    loader.emplace(LoaderShape{Harness::kLayers, Harness::kExperts, Harness::kLimit}, h.store, h.arena.span(),
                   compute, options);
    for (std::uint32_t l = 0; l < Harness::kLayers; ++l) {
      std::vector<ExpertLocation> entries(2);
      for (int c = 0; c < 2; ++c)
        for (int j = 0; j < 3; ++j) entries[c].page[j] = static_cast<std::int32_t>(100 * l + 10 * c + j);
      loader->set_static_entries(l, entries);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  cudaGraph_t graph{};
  const cudaError_t ended = cudaStreamEndCapture(capturing, &graph);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  INFO(error);
  REQUIRE(error.empty());
  CHECK(ended == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  const std::size_t stride = loader->row_stride();
  std::vector<ExpertLocation> table(Harness::kLayers * stride);
  REQUIRE(cudaMemcpy(table.data(), loader->device_table(), table.size() * sizeof(ExpertLocation),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  int wrong = 0, not_absent = 0;
  for (std::uint32_t l = 0; l < Harness::kLayers; ++l) {
    for (std::uint32_t e = 0; e < Harness::kExperts; ++e) not_absent += !table[l * stride + e].absent();
    for (int c = 0; c < 2; ++c) {
      const ExpertLocation& x = table[l * stride + Harness::kExperts + c];
      for (int j = 0; j < 3; ++j) wrong += x.page[j] != static_cast<std::int32_t>(100 * l + 10 * c + j);
      wrong += x.buffer_slot != -1;
    }
  }
  CHECK(wrong == 0);
  CHECK(not_absent == 0);
  loader.reset();
  REQUIRE(cudaStreamDestroy(capturing) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
}

TEST_CASE("the paged MoE kernel reads experts through the loader like the contiguous layout",
          "[gpu][loader][moe]") {
  // PagedMoe<Paged> reads resident experts from pool pages, restored ones from their reserved pages and
  // misses from the load buffer, through the loader's page table; PagedMoe<Contiguous> reads a [E][3][F*H]
  // copy of the same layer. Both run the same instructions, so their outputs must agree, forward after
  // forward, with poisoned destinations and a delayed copy stream.
  using kernels::Contiguous;
  using kernels::MoeShape;
  using kernels::Paged;
  using kernels::PagedMoe;
  Harness h;
  constexpr int T = 600, K = 4, kRouted = 6, H = 256, F = 128;
  static_assert(std::uint64_t(H) * F * 2 == Harness::kMatrix);
  const int forwards = env_int("AMOEBA_LOADER_FORWARDS", 200) / 4;
  DoubleBufferLoader loader(LoaderShape{Harness::kLayers, Harness::kExperts, Harness::kLimit}, h.store,
                            h.arena.span(), h.compute, LoaderOptions{true, 200});

  // Contiguous twin of every layer, uploaded once from the master copy.
  const std::uint64_t layer_bytes = Harness::kExperts * 3 * Harness::kMatrix;
  std::byte* contiguous = nullptr;
  REQUIRE(cudaMalloc(&contiguous, Harness::kLayers * layer_bytes) == cudaSuccess);
  REQUIRE(cudaMemcpy(contiguous, h.store.expert({0, 0}), Harness::kLayers * layer_bytes,
                     cudaMemcpyHostToDevice) == cudaSuccess);

  // Odd forwards run 24 tokens (decode path), even ones 600 (grouped GEMM path); buffers sized for 600.
  MoeShape shape{T, H, F, static_cast<int>(Harness::kExperts), K, 0};
  std::vector<__nv_bfloat16> x(T * H);
  std::vector<std::int32_t> ids(T * K);
  std::vector<float> wts(T * K);
  __nv_bfloat16 *d_x, *d_out_paged, *d_out_contig;
  std::int32_t* d_ids;
  float* d_w;
  REQUIRE(cudaMalloc(&d_x, x.size() * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_out_paged, Harness::kLayers * T * H * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_out_contig, Harness::kLayers * T * H * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_ids, Harness::kLayers * ids.size() * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_w, Harness::kLayers * wts.size() * 4) == cudaSuccess);
  PagedMoe<Paged> paged;
  PagedMoe<Contiguous> contig;
  typename PagedMoe<Contiguous>::Arguments ca{};
  ca.shape = shape;  // the largest token count sizes the workspace
  const std::size_t ws_bytes = PagedMoe<Contiguous>::workspace_size(ca);
  REQUIRE(ws_bytes == PagedMoe<Paged>::workspace_size(typename PagedMoe<Paged>::Arguments{shape}));
  void* ws = nullptr;
  REQUIRE(cudaMalloc(&ws, 2 * ws_bytes) == cudaSuccess);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : x) v = __float2bfloat16(normal(h.rng));
  REQUIRE(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);

  std::uint64_t differing = 0, nonfinite = 0, compared = 0;
  double worst = 0;
  std::vector<__nv_bfloat16> a(Harness::kLayers * T * H), b(a.size());
  for (int f = 0; f < forwards; ++f) {
    const std::uint64_t shortfall = (f / 5) % 2 == 0 ? h.rng() % 10 : 0;
    shape.num_tokens = f % 2 ? 24 : T;
    ChangeList changes = h.adjuster.adjust(AdjustSignal{shortfall, h.pool.available<ExpertPage>()}, h.pool);
    REQUIRE_FALSE(loader.begin_forward(changes, h.adjuster.residency(), h.pool).has_value());
    std::vector<std::vector<std::uint32_t>> routed(Harness::kLayers);
    for (std::uint32_t l = 0; l < Harness::kLayers; ++l) {
      std::vector<std::uint32_t> all(Harness::kExperts);
      std::iota(all.begin(), all.end(), 0u);
      std::shuffle(all.begin(), all.end(), h.rng);
      routed[l].assign(all.begin(), all.begin() + kRouted);
      for (int t = 0; t < T; ++t) {
        std::vector<std::uint32_t> pick = routed[l];
        std::shuffle(pick.begin(), pick.end(), h.rng);
        float sum = 0;
        for (int j = 0; j < K; ++j) {
          ids[t * K + j] = static_cast<std::int32_t>(pick[j]);
          sum += wts[t * K + j] = 0.1f + std::uniform_real_distribution<float>(0.f, 1.f)(h.rng);
        }
        for (int j = 0; j < K; ++j) wts[t * K + j] /= sum;
      }
      REQUIRE(cudaMemcpyAsync(d_ids + l * ids.size(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice,
                              h.compute) == cudaSuccess);
      REQUIRE(cudaMemcpyAsync(d_w + l * wts.size(), wts.data(), wts.size() * 4, cudaMemcpyHostToDevice,
                              h.compute) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(h.compute) == cudaSuccess);  // ids/wts host buffers are reused
    }
    REQUIRE(cudaMemsetAsync(d_out_paged, 0xff, a.size() * 2, h.compute) == cudaSuccess);  // poison outputs
    REQUIRE(cudaMemsetAsync(d_out_contig, 0xff, a.size() * 2, h.compute) == cudaSuccess);
    REQUIRE_FALSE(loader.prefetch(0, h.predict(routed[0])).has_value());
    for (std::uint32_t l = 0; l < Harness::kLayers; ++l) {
      auto w = loader.prepare_layer(l, routed[l]);
      REQUIRE(w.has_value());
      if (l + 1 < Harness::kLayers)
        REQUIRE_FALSE(loader.prefetch(l + 1, h.predict(routed[l + 1])).has_value());
      typename PagedMoe<Paged>::Arguments pa{};
      pa.shape = shape;
      ca.shape = shape;
      pa.input = d_x;
      pa.topk_ids = d_ids + l * ids.size();
      pa.topk_weights = d_w + l * wts.size();
      pa.output = d_out_paged + l * T * H;
      pa.weights = Paged::Arguments{w->pool_base, w->load_buffer, w->locations};
      auto st = paged.run(pa, ws, ws_bytes, h.compute);
      INFO(st.message);
      REQUIRE(st.ok);
      ca.input = d_x;
      ca.topk_ids = pa.topk_ids;
      ca.topk_weights = pa.topk_weights;
      ca.output = d_out_contig + l * T * H;
      ca.weights =
          Contiguous::Arguments{reinterpret_cast<const __nv_bfloat16*>(contiguous + l * layer_bytes)};
      st = contig.run(ca, static_cast<std::byte*>(ws) + ws_bytes, ws_bytes, h.compute);
      INFO(st.message);
      REQUIRE(st.ok);
      loader.layer_done(l);
    }
    loader.end_forward();
    REQUIRE_FALSE(h.adjuster.commit(changes, h.pool).has_value());
    h.scribble_free_pages();
    REQUIRE(cudaMemcpyAsync(a.data(), d_out_paged, a.size() * 2, cudaMemcpyDeviceToHost, h.compute) ==
            cudaSuccess);
    REQUIRE(cudaMemcpyAsync(b.data(), d_out_contig, b.size() * 2, cudaMemcpyDeviceToHost, h.compute) ==
            cudaSuccess);
    REQUIRE(cudaStreamSynchronize(h.compute) == cudaSuccess);
    double num = 0, den = 0;
    for (std::uint32_t l = 0; l < Harness::kLayers; ++l)
      for (std::size_t i = std::size_t(l) * T * H;
           i < std::size_t(l) * T * H + std::size_t(shape.num_tokens) * H; ++i) {
        const float pa_ = __bfloat162float(a[i]), pb = __bfloat162float(b[i]);
        if (!std::isfinite(pa_) || !std::isfinite(pb)) ++nonfinite;
        differing += std::memcmp(&a[i], &b[i], 2) != 0;
        num += double(pa_ - pb) * (pa_ - pb);
        den += double(pb) * pb;
        ++compared;
      }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  INFO("forwards " << forwards << ", values compared " << compared << ", bitwise different " << differing
                   << ", worst relative error " << worst << ", misses " << loader.stats().on_demand_misses
                   << ", restores " << loader.stats().restores);
  CHECK(loader.stats().on_demand_misses > 0);
  REQUIRE(nonfinite == 0);
  REQUIRE(worst <= 1e-3);
  CHECK(differing == 0);  // same instructions, same order: expected bit-identical
  for (void* p : {static_cast<void*>(contiguous), static_cast<void*>(d_x), static_cast<void*>(d_out_paged),
                  static_cast<void*>(d_out_contig), static_cast<void*>(d_ids), static_cast<void*>(d_w), ws})
    cudaFree(p);
}
