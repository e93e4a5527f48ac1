// Shared by the attention device tests and benchmark: one pool arena of KV pages on the GPU, every byte NaN
// until a sequence's token is written, sequences given pages from a shuffled order, random bf16 K/V/Q, and
// the step's KvPageTable built from a StepBatch exactly as the engine builds it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "amoeba/engine/kv_page_table.hpp"
#include "amoeba/engine/step.hpp"
#include "attention/paged_attention.cuh"

namespace amoeba::testing {

inline void attn_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define AMOEBA_ATTN_CHECK(expr) ::amoeba::testing::attn_check((expr), #expr)

// Owning device or pinned-host bytes.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t n) : n_(n) {
    if (n > 0) AMOEBA_ATTN_CHECK(cudaMalloc(&p_, n));
  }
  DeviceBytes(DeviceBytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBytes& operator=(DeviceBytes&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  std::size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};
class PinnedBytes {
 public:
  PinnedBytes() = default;
  explicit PinnedBytes(std::size_t n) : n_(n) {
    if (n > 0) AMOEBA_ATTN_CHECK(cudaHostAlloc(&p_, n, cudaHostAllocDefault));
  }
  PinnedBytes(PinnedBytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedBytes& operator=(PinnedBytes&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  ~PinnedBytes() {
    if (p_) cudaFreeHost(p_);
  }
  void* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
constexpr std::uint16_t kNaNBits = 0xFFFF;  // what cudaMemset(0xFF) leaves: a quiet NaN in bf16

// Uniform bf16 values in [-scale, scale), never all zero.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float scale) {
    return (static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f) * scale;
  }
  std::uint16_t bf16(float scale) { return bf16_bits(uniform(scale)); }
};

// Copies staging page i to arena page ids[i] (16 bytes per thread). Static: every test file has its own copy.
static __global__ void scatter_pages_kernel(const uint4* staging, const std::int32_t* ids, std::size_t pages,
                                            std::uint64_t page_words, uint4* arena) {
  for (std::size_t p = blockIdx.x; p < pages; p += gridDim.x) {
    const uint4* src = staging + p * page_words;
    uint4* dst = arena + static_cast<std::uint64_t>(ids[p]) * page_words;
    for (std::uint64_t w = threadIdx.x; w < page_words; w += blockDim.x) dst[w] = src[w];
  }
}

struct SeqSpec {
  std::uint32_t context_before = 0;
  std::uint32_t new_tokens = 1;
};

// One step's batch on one arena: pages, K/V data (kept on the host for the reference), Q, and the table.
struct AttentionBatch {
  kernels::PoolKvCache kv;
  std::uint32_t qo_heads = 0, layers = 0;
  std::vector<SeqSpec> specs;
  std::vector<std::vector<PageHandle>> pages;    // per sequence, block-major x layers (the StepBatch layout)
  std::vector<std::vector<std::uint16_t>> k, v;  // [seq * layers + layer][token][kv head][dim], bf16 bits
  std::vector<std::uint16_t> q;                  // [tokens][qo_heads][dim]
  StepBatch step;
  KvPageTable table;
  DeviceBytes d_words, d_q, d_o;
  std::size_t used_pages = 0;

  std::uint32_t tokens() const { return table.host_view().tokens; }
  std::uint64_t kv_bytes_read() const {  // K+V bytes of one layer that attention must read
    std::uint64_t t = 0;
    for (const SeqSpec& s : specs) t += s.context_before + s.new_tokens;
    return t * 2 * kv.kv_heads * kv.head_dim * sizeof(__nv_bfloat16);
  }
};

// An arena of `arena_pages` KV pages, every byte NaN. Pages are handed out in a shuffled order drawn from
// [first_page, arena_pages).
class KvArena {
 public:
  KvArena(std::uint32_t kv_heads, std::uint32_t head_dim, std::uint64_t page_bytes, std::uint64_t arena_pages,
          std::uint64_t seed, std::uint64_t first_page = 0)
      : arena_(page_bytes * arena_pages), rng_(seed) {
    kv_.arena = arena_.get();
    kv_.page_bytes = page_bytes;
    kv_.tokens_per_page = 16;
    kv_.kv_heads = kv_heads;
    kv_.head_dim = head_dim;
    AMOEBA_ATTN_CHECK(cudaMemset(arena_.get(), 0xFF, arena_.size()));
    free_.resize(arena_pages - first_page);
    std::iota(free_.begin(), free_.end(), static_cast<std::uint32_t>(first_page));
    std::shuffle(free_.begin(), free_.end(), std::mt19937_64(seed));
  }
  const kernels::PoolKvCache& kv() const { return kv_; }
  std::uint64_t pages_left() const { return free_.size() - next_; }

  // Builds a batch of `specs` over `layers` attention layers: allocates pages, writes random K/V for every
  // token of every sequence (the rest of each page stays NaN), random Q, the table and its device copy.
  AttentionBatch make_batch(std::uint32_t qo_heads, std::uint32_t layers, const std::vector<SeqSpec>& specs,
                            float q_scale = 2.0f) {
    AttentionBatch b;
    b.kv = kv_;
    b.qo_heads = qo_heads;
    b.layers = layers;
    b.specs = specs;
    const std::uint32_t tpp = kv_.tokens_per_page, kvh = kv_.kv_heads, d = kv_.head_dim;
    const std::uint64_t page_bytes = kv_.page_bytes;
    const std::uint64_t block = kv_.block_elems();
    std::size_t total_pages = 0;
    for (const SeqSpec& s : specs) total_pages += (s.context_before + s.new_tokens + tpp - 1) / tpp * layers;
    if (total_pages > pages_left()) throw std::runtime_error("KvArena: not enough pages for the batch");
    std::vector<std::uint16_t> staging(total_pages * page_bytes / 2, kNaNBits);
    std::vector<std::int32_t> ids;
    ids.reserve(total_pages);
    b.pages.resize(specs.size());
    b.k.resize(specs.size() * layers);
    b.v.resize(specs.size() * layers);
    std::uint32_t tokens = 0;
    for (std::size_t s = 0; s < specs.size(); ++s) {
      const std::uint32_t ctx = specs[s].context_before + specs[s].new_tokens;
      const std::uint32_t blocks = (ctx + tpp - 1) / tpp;
      for (std::uint32_t i = 0; i < blocks * layers; ++i) {
        const std::uint32_t id = free_[next_++];
        b.pages[s].push_back(PageHandle{id, 0});
      }
      for (std::uint32_t a = 0; a < layers; ++a) {
        auto& K = b.k[s * layers + a];
        auto& V = b.v[s * layers + a];
        K.resize(std::size_t{ctx} * kvh * d);
        V.resize(K.size());
        for (auto& x : K) x = rng_.bf16(1.0f);
        for (auto& x : V) x = rng_.bf16(1.0f);
      }
      // Staging slots follow the page list order of this sequence; tokens past ctx stay NaN.
      for (std::uint32_t bl = 0; bl < blocks; ++bl)
        for (std::uint32_t a = 0; a < layers; ++a) {
          const std::size_t slot = ids.size();
          ids.push_back(static_cast<std::int32_t>(b.pages[s][std::size_t{bl} * layers + a].index));
          std::uint16_t* page = staging.data() + slot * (page_bytes / 2);
          const auto& K = b.k[s * layers + a];
          const auto& V = b.v[s * layers + a];
          for (std::uint32_t t = bl * tpp; t < std::min(ctx, (bl + 1) * tpp); ++t) {
            const std::size_t src = std::size_t{t} * kvh * d;
            const std::size_t dst = std::size_t{t - bl * tpp} * kvh * d;
            std::memcpy(page + dst, K.data() + src, std::size_t{kvh} * d * 2);
            std::memcpy(page + block + dst, V.data() + src, std::size_t{kvh} * d * 2);
          }
        }
      tokens += specs[s].new_tokens;
    }
    b.used_pages = ids.size();
    if (!ids.empty()) {
      DeviceBytes d_staging(staging.size() * 2), d_ids(ids.size() * 4);
      AMOEBA_ATTN_CHECK(
          cudaMemcpy(d_staging.get(), staging.data(), d_staging.size(), cudaMemcpyHostToDevice));
      AMOEBA_ATTN_CHECK(cudaMemcpy(d_ids.get(), ids.data(), d_ids.size(), cudaMemcpyHostToDevice));
      scatter_pages_kernel<<<1024, 256>>>(d_staging.get<uint4>(), d_ids.get<std::int32_t>(), ids.size(),
                                          page_bytes / 16, static_cast<uint4*>(kv_.arena));
      AMOEBA_ATTN_CHECK(cudaGetLastError());
      AMOEBA_ATTN_CHECK(cudaDeviceSynchronize());
    }

    b.q.resize(std::size_t{tokens} * qo_heads * d);
    for (auto& x : b.q) x = rng_.bf16(q_scale);
    b.d_q = DeviceBytes(b.q.size() * 2);
    b.d_o = DeviceBytes(b.q.size() * 2);
    AMOEBA_ATTN_CHECK(cudaMemcpy(b.d_q.get(), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice));

    b.step.attention_layers = layers;
    b.step.tokens_per_kv_page = tpp;
    for (std::size_t s = 0; s < specs.size(); ++s) {
      SequenceStep x;
      x.request = s;
      x.context_before = specs[s].context_before;
      x.new_tokens = specs[s].new_tokens;
      x.samples = true;
      x.kv_pages = b.pages[s];
      b.step.seqs.push_back(x);
      b.step.tokens += x.new_tokens;
    }
    if (auto err = b.table.assign(b.step)) throw std::runtime_error("KvPageTable::assign: " + *err);
    b.d_words = DeviceBytes(b.table.words().size() * 4);
    AMOEBA_ATTN_CHECK(
        cudaMemcpy(b.d_words.get(), b.table.words().data(), b.d_words.size(), cudaMemcpyHostToDevice));
    return b;
  }

 private:
  DeviceBytes arena_;
  kernels::PoolKvCache kv_;
  std::vector<std::uint32_t> free_;
  std::size_t next_ = 0;
  Rng rng_;
};

// Arguments for `layer` of batch `b`, reading the device copy of its table.
template <std::uint32_t HeadDim>
typename kernels::PagedAttention<HeadDim>::Arguments attention_args(const AttentionBatch& b,
                                                                    std::uint32_t layer,
                                                                    kernels::AttentionSchedule schedule) {
  typename kernels::PagedAttention<HeadDim>::Arguments a;
  a.kv = b.kv;
  a.qo_heads = b.qo_heads;
  a.q = b.d_q.get<const kernels::bf16>();
  a.o = b.d_o.get<kernels::bf16>();
  a.table = b.table.view(b.d_words.get<const std::int32_t>());
  a.layer = layer;
  a.schedule = schedule;
  return a;
}

}  // namespace amoeba::testing
