// Shared by the device tests and the device benchmark: random bf16 data on the GPU, one model's experts laid
// out both contiguously and on shuffled pool pages (some in a load buffer), and random routing sets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe/addressing.cuh"
#include "moe/moe_shape.hpp"
#include "routing_draw.hpp"

namespace amoeba::testing {

using kernels::bf16;
using kernels::ExpertLocation;
using kernels::MoeShape;

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define AMOEBA_CUDA_CHECK(expr) ::amoeba::testing::cuda_check((expr), #expr)

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n > 0) AMOEBA_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    AMOEBA_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    AMOEBA_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

__device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform values in [-scale, scale) from a counter-based hash: never all zeros, reproducible per seed.
__global__ void fill_uniform_kernel(bf16* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ULL + i);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

inline void fill_uniform(bf16* p, std::size_t n, std::uint64_t seed, float scale) {
  fill_uniform_kernel<<<1024, 256>>>(p, n, seed, scale);
  AMOEBA_CUDA_CHECK(cudaGetLastError());
}

// bf16 0xFFFF is a NaN: every value the kernel fails to write shows up.
inline void poison(bf16* p, std::size_t n) {
  AMOEBA_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(bf16)));
}

struct ModelSpec {
  const char* name;
  int num_experts, top_k, hidden, intermediate, shared_chunks;
};
// Public configs (bf16). Qwen1.5-MoE-A2.7B's shared expert (intermediate 5632 = 4·1408) is 4 shared chunks.
inline constexpr ModelSpec kQwen15{"qwen1.5-moe-a2.7b+shared", 60, 4, 2048, 1408, 4};
inline constexpr ModelSpec kQwen15Routed{"qwen1.5-moe-a2.7b", 60, 4, 2048, 1408, 0};
inline constexpr ModelSpec kQwen3{"qwen3-30b-a3b", 128, 8, 2048, 768, 0};
inline constexpr ModelSpec kMixtral{"mixtral-8x7b", 8, 2, 4096, 14336, 0};
// Shapes with more than 8 slots per token, whose combine sums a token's slots in a second batch of 8:
// Qwen2-57B-A14B (a Qwen2-MoE checkpoint the CUDA backend serves; config.json of Qwen/Qwen2-57B-A14B: H 3584,
// 64 experts of F 2560, k = 8, a shared expert of 20480 = 8 chunks: 16 slots) and the catalog's
// Qwen3-Next-80B-A3B (reference_engine/data/models; k = 10 and its 512-wide shared expert as one chunk: 11
// slots, 513 experts).
inline constexpr ModelSpec kQwen2Large{"qwen2-57b-a14b", 64, 8, 3584, 2560, 8};
inline constexpr ModelSpec kQwen3Next{"qwen3-next-80b-a3b", 512, 10, 2048, 512, 1};

inline MoeShape shape_of(const ModelSpec& m, int tokens) {
  return MoeShape{tokens, m.hidden, m.intermediate, m.num_experts, m.top_k, m.shared_chunks};
}

// One model's expert weights, twice: contiguous [E+m][3][F·H], and the same values in a page pool whose pages
// are shuffled (unused pages hold NaNs), except every `buffer_every`-th expert, which sits in a load-buffer
// slot.
//
// With `aliased` (benchmarks), the paged view instead aliases the contiguous array: pool pages and
// load-buffer slots are shuffled positions of the same allocation, so both views read the same set of bytes
// and a timing difference measures the addressing, not where the allocator happened to place two copies.
// Values then differ between the views (fine for timing, not for comparing outputs).
// Where the aliased paged view puts the matrices (benchmarks): `kShuffled` scatters every matrix over the
// array, `kAdjacent` shuffles whole experts but keeps W1, W3, W2 of one expert adjacent and in order,
// `kIdentity` maps page 3e + j to expert e matrix j (the contiguous layout read through the page table).
enum class Placement { kShuffled, kAdjacent, kIdentity };

class ExpertStore {
 public:
  ExpertStore(const ModelSpec& spec, std::uint64_t seed, int buffer_every = 4, bool aliased = false,
              Placement placement = Placement::kShuffled)
      : spec_(spec) {
    const MoeShape s = shape_of(spec, 0);
    const int experts = s.total_experts();
    elems_ = static_cast<std::size_t>(s.matrix_elems());
    contiguous_ = DeviceBuffer<bf16>(elems_ * 3 * experts);
    // W1/W3 scaled so gate and up are O(1); W2 scaled by 1/sqrt(F).
    for (int e = 0; e < experts; ++e)
      for (int j = 0; j < 3; ++j)
        fill_uniform(matrix(e, j), elems_, seed * 1000003ULL + 3 * e + j,
                     j < 2 ? 1.7f / std::sqrt(static_cast<float>(s.hidden))
                           : 1.7f / std::sqrt(static_cast<float>(s.intermediate)));
    if (aliased) {
      aliased_ = aliased_view(placement, seed, buffer_every);
      num_buffered_ = aliased_.num_buffered();
      return;
    }
    std::mt19937_64 rng(seed);
    std::vector<int> buffered;
    for (int e = 0; e < experts; ++e)
      if (buffer_every > 0 && e % buffer_every == buffer_every - 1) buffered.push_back(e);
    std::shuffle(buffered.begin(), buffered.end(), rng);
    const int pages = 3 * (experts - static_cast<int>(buffered.size())) + 5;
    std::vector<int> page_order(pages);
    std::iota(page_order.begin(), page_order.end(), 0);
    std::shuffle(page_order.begin(), page_order.end(), rng);
    pool_ = DeviceBuffer<bf16>(elems_ * pages);
    poison(pool_.get(), pool_.size());
    load_buffer_ = DeviceBuffer<bf16>(elems_ * 3 * std::max<std::size_t>(1, buffered.size()));
    poison(load_buffer_.get(), load_buffer_.size());
    locations_host_.assign(experts, ExpertLocation{});
    int next_page = 0;
    for (int e = 0; e < experts; ++e) {
      auto it = std::find(buffered.begin(), buffered.end(), e);
      ExpertLocation& loc = locations_host_[e];
      if (it != buffered.end()) {
        loc.buffer_slot = static_cast<int>(it - buffered.begin());
        AMOEBA_CUDA_CHECK(cudaMemcpy(load_buffer_.get() + elems_ * 3 * loc.buffer_slot, matrix(e, 0),
                                     elems_ * 3 * sizeof(bf16), cudaMemcpyDeviceToDevice));
      } else {
        for (int j = 0; j < 3; ++j) {
          loc.page[j] = page_order[next_page++];
          AMOEBA_CUDA_CHECK(cudaMemcpy(pool_.get() + elems_ * loc.page[j], matrix(e, j),
                                       elems_ * sizeof(bf16), cudaMemcpyDeviceToDevice));
        }
      }
    }
    locations_ = DeviceBuffer<ExpertLocation>(experts);
    locations_.upload(locations_host_);
    std::vector<const bf16*> table(3 * experts);
    for (int e = 0; e < experts; ++e)
      for (int j = 0; j < 3; ++j) table[3 * e + j] = matrix(e, j);
    reference_table_ = DeviceBuffer<const bf16*>(table.size());
    reference_table_.upload(table);
    num_buffered_ = static_cast<int>(buffered.size());
  }

  // A paged view of the contiguous array (benchmarks): pool pages and load-buffer slots are positions of the
  // same allocation, placed by `placement` with its own permutation seed; every `buffer_every`-th expert sits
  // in a "load-buffer" slot. Cheap to make: only the location table is new.
  class AliasedView {
   public:
    kernels::Paged::Arguments args() const { return {base_, base_, locations_.get()}; }
    int num_buffered() const { return num_buffered_; }

   private:
    friend class ExpertStore;
    const bf16* base_ = nullptr;
    DeviceBuffer<ExpertLocation> locations_;
    int num_buffered_ = 0;
  };

  AliasedView aliased_view(Placement placement, std::uint64_t seed, int buffer_every) const {
    const int experts = shape_of(spec_, 0).total_experts();
    std::mt19937_64 rng(seed);
    std::vector<int> triples(experts);  // triple t = matrix positions 3t..3t+2 of the contiguous array
    std::iota(triples.begin(), triples.end(), 0);
    if (placement != Placement::kIdentity) std::shuffle(triples.begin(), triples.end(), rng);
    std::vector<ExpertLocation> loc(experts);
    AliasedView v;
    int next_triple = 0;
    if (placement == Placement::kIdentity) buffer_every = 0;
    for (int e = 0; e < experts; ++e)
      if (buffer_every > 0 && e % buffer_every == buffer_every - 1) {
        loc[e].buffer_slot = triples[next_triple++];
        ++v.num_buffered_;
      }
    std::vector<int> pages;
    for (int t = next_triple; t < experts; ++t)
      for (int j = 0; j < 3; ++j) pages.push_back(3 * triples[t] + j);
    if (placement == Placement::kShuffled) std::shuffle(pages.begin(), pages.end(), rng);
    std::size_t next_page = 0;
    for (int e = 0; e < experts; ++e)
      if (loc[e].buffer_slot < 0)
        for (int j = 0; j < 3; ++j) loc[e].page[j] = pages[next_page++];
    v.base_ = contiguous_.get();
    v.locations_ = DeviceBuffer<ExpertLocation>(experts);
    v.locations_.upload(loc);
    return v;
  }

  bf16* matrix(int e, int j) const {
    return contiguous_.get() + elems_ * (3 * static_cast<std::size_t>(e) + j);
  }
  kernels::Contiguous::Arguments contiguous_args() const { return {contiguous_.get()}; }
  kernels::Paged::Arguments paged_args() const {
    if (aliased_.base_ != nullptr) return aliased_.args();
    return {pool_.get(), load_buffer_.get(), locations_.get()};
  }
  const bf16* const* reference_table() const { return reference_table_.get(); }
  const ModelSpec& spec() const { return spec_; }
  int num_buffered() const { return num_buffered_; }
  std::size_t matrix_elems() const { return elems_; }

  // Host copy of one expert's three matrices (W1, W3, W2 back to back), cached.
  const std::vector<std::uint16_t>& host_expert(int e) {
    if (host_.size() <= static_cast<std::size_t>(e)) host_.resize(e + 1);
    if (host_[e].empty()) {
      host_[e].resize(elems_ * 3);
      AMOEBA_CUDA_CHECK(
          cudaMemcpy(host_[e].data(), matrix(e, 0), elems_ * 3 * sizeof(bf16), cudaMemcpyDeviceToHost));
    }
    return host_[e];
  }

 private:
  ModelSpec spec_;
  std::size_t elems_ = 0;
  DeviceBuffer<bf16> contiguous_, pool_, load_buffer_;
  std::vector<ExpertLocation> locations_host_;
  DeviceBuffer<ExpertLocation> locations_;
  DeviceBuffer<const bf16*> reference_table_;
  std::vector<std::vector<std::uint16_t>> host_;
  AliasedView aliased_;
  int num_buffered_ = 0;
};

// Inputs of one layer call: tokens and their routing as routing_draw.hpp draws it (by default each token's k
// distinct experts uniformly, positive weights summing to 1, a per-token shared weight in (0, 1)). With
// `hot_expert` >= 0, every other token (half of them) has that expert among its k: skewed routing, one expert
// far over a tile; `router` names any of the drawn routers (uniform, hot, zipf).
struct RoutingSet {
  int tokens = 0;
  DeviceBuffer<bf16> x;
  DeviceBuffer<std::int32_t> ids;
  DeviceBuffer<float> weights;
  DeviceBuffer<float> shared;
  std::vector<std::int32_t> ids_host;
  std::vector<float> weights_host, shared_host;
  int distinct_experts = 0;
};

inline RoutingSet make_routing(const ModelSpec& m, int tokens, std::uint64_t seed, const Router& router) {
  RoutingSet r;
  r.tokens = tokens;
  r.x = DeviceBuffer<bf16>(static_cast<std::size_t>(tokens) * m.hidden);
  if (tokens > 0) fill_uniform(r.x.get(), r.x.size(), seed ^ 0x5151, 1.0f);
  DrawnRouting d = draw_routing(m.num_experts, m.top_k, tokens, seed, router);
  r.ids_host = std::move(d.ids);
  r.weights_host = std::move(d.weights);
  r.shared_host = std::move(d.shared);
  r.distinct_experts = d.distinct_experts;
  r.ids = DeviceBuffer<std::int32_t>(r.ids_host.size());
  r.weights = DeviceBuffer<float>(r.weights_host.size());
  r.shared = DeviceBuffer<float>(r.shared_host.size());
  if (tokens > 0) {
    r.ids.upload(r.ids_host);
    r.weights.upload(r.weights_host);
    r.shared.upload(r.shared_host);
  }
  return r;
}

inline RoutingSet make_routing(const ModelSpec& m, int tokens, std::uint64_t seed, int hot_expert = -1) {
  Router router;
  if (hot_expert >= 0) router = {Router::Kind::kHot, hot_expert, 0.0};
  return make_routing(m, tokens, seed, router);
}

// A PagedMoe::Arguments of any addressing, configuration and precision for one layer call on `r`: its tokens,
// routing and (when the shape has shared chunks and `shared_weights`) its per-token shared weights.
template <class Arguments>
Arguments layer_arguments(const RoutingSet& r, const MoeShape& shape, decltype(Arguments{}.weights) weights,
                          bf16* output, bool shared_weights = true) {
  Arguments a{};
  a.shape = shape;
  a.input = r.x.get();
  a.topk_ids = r.ids.get();
  a.topk_weights = r.weights.get();
  a.shared_weights = shared_weights && shape.num_shared_chunks > 0 ? r.shared.get() : nullptr;
  a.output = output;
  a.weights = weights;
  return a;
}

}  // namespace amoeba::testing
