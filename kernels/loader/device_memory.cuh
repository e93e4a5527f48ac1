// Owners of the loader's memory: DeviceArena (one cudaMalloc for the whole unified pool; its ArenaSpan is
// what TieredPagePool manages) and PinnedExpertStore (the master copy of every expert in pinned host memory,
// W1, W3, W2 of one expert back to back, filled from a weight source). Pinned memory matters: pageable host
// memory copies at ~16 GB/s on the H200's link, pinned at ~54 GB/s (GPU_NOTES.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_key.hpp"
#include "amoeba/pool/arena.hpp"
#include "loader/cuda_check.cuh"

namespace amoeba::kernels {

class DeviceArena {
 public:
  explicit DeviceArena(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) throw_config_error("device_arena.bytes", bytes, "must be greater than zero");
    void* p = nullptr;
    AMOEBA_CUDA_CHECK(cudaMalloc(&p, bytes));  // cudaMalloc aligns to >= 256 bytes, as the pool requires
    base_ = static_cast<std::byte*>(p);
  }
  ~DeviceArena() {
    if (base_) cudaFree(base_);
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  ArenaSpan span() const noexcept { return {base_, bytes_}; }
  std::byte* data() const noexcept { return base_; }
  std::uint64_t size() const noexcept { return bytes_; }

 private:
  std::byte* base_ = nullptr;
  std::uint64_t bytes_ = 0;
};

class PinnedExpertStore {
 public:
  // Fills the bytes of one expert ([W1 | W3 | W2], 3 * matrix_bytes) for `key`.
  using WeightSource = std::function<void(ExpertKey key, std::byte* dst, std::uint64_t bytes)>;

  // `payload_bytes` (0: matrix_bytes): the leading bytes of each matrix that hold data; a store laid out in
  // padded pool pages (quantized experts) has the rest as padding, which the loader does not copy.
  PinnedExpertStore(std::uint32_t layers, std::uint32_t experts, std::uint64_t matrix_bytes,
                    std::uint64_t payload_bytes = 0)
      : layers_(layers),
        experts_(experts),
        matrix_bytes_(matrix_bytes),
        payload_bytes_(payload_bytes == 0 ? matrix_bytes : payload_bytes) {
    if (layers == 0) throw_config_error("expert_store.layers", layers, "must be greater than zero");
    if (experts == 0) throw_config_error("expert_store.experts", experts, "must be greater than zero");
    if (matrix_bytes == 0 || matrix_bytes % 16 != 0)
      throw_config_error("expert_store.matrix_bytes", matrix_bytes, "must be a positive multiple of 16");
    if (payload_bytes_ > matrix_bytes_ || payload_bytes_ % 16 != 0)
      throw_config_error(
          "expert_store.payload_bytes", payload_bytes,
          "must be 0 or a multiple of 16 <= matrix_bytes (" + std::to_string(matrix_bytes) + ")");
    void* p = nullptr;
    AMOEBA_CUDA_CHECK(cudaHostAlloc(&p, bytes(), cudaHostAllocDefault));
    data_ = static_cast<std::byte*>(p);
  }
  ~PinnedExpertStore() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedExpertStore(const PinnedExpertStore&) = delete;
  PinnedExpertStore& operator=(const PinnedExpertStore&) = delete;

  std::uint32_t layers() const noexcept { return layers_; }
  std::uint32_t experts() const noexcept { return experts_; }
  std::uint64_t matrix_bytes() const noexcept { return matrix_bytes_; }
  std::uint64_t payload_bytes() const noexcept { return payload_bytes_; }
  std::uint64_t expert_bytes() const noexcept { return 3 * matrix_bytes_; }
  std::uint64_t bytes() const noexcept { return std::uint64_t(layers_) * experts_ * expert_bytes(); }
  const std::byte* expert(ExpertKey k) const noexcept {
    return data_ + (std::uint64_t(k.layer) * experts_ + k.expert) * expert_bytes();
  }
  const std::byte* matrix(ExpertKey k, ExpertMatrix m) const noexcept {
    return expert(k) + static_cast<std::uint64_t>(m) * matrix_bytes_;
  }

  // Fills every expert from `source`, experts spread over `threads` host threads.
  void fill(const WeightSource& source,
            unsigned threads = std::max(1u, std::thread::hardware_concurrency())) {
    const std::uint64_t n = std::uint64_t(layers_) * experts_;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (std::uint64_t i = t; i < n; i += threads) {
          const ExpertKey k{static_cast<std::uint32_t>(i / experts_),
                            static_cast<std::uint32_t>(i % experts_)};
          source(k, data_ + i * expert_bytes(), expert_bytes());
        }
      });
    for (auto& th : pool) th.join();
  }

  // Random bf16 weights in [-1, 1), deterministic per (seed, expert): the model's real shapes, no real
  // values.
  static WeightSource random_bf16(std::uint64_t seed) {
    return [seed](ExpertKey k, std::byte* dst, std::uint64_t n) {
      std::uint64_t s = seed ^ (std::uint64_t(k.layer) << 32 | k.expert) * 0x9E3779B97F4A7C15ull;
      for (std::uint64_t i = 0; i + 2 <= n; i += 2) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        // bf16 with exponent 126 or 125 ([-1, -0.25] or [0.25, 1)), never NaN/Inf, never all zero
        const std::uint16_t v =
            static_cast<std::uint16_t>(((s >> 48) & 0x807f) | (((s >> 40) & 1) ? 0x3f00 : 0x3e80));
        std::memcpy(dst + i, &v, 2);
      }
    };
  }

 private:
  std::uint32_t layers_, experts_;
  std::uint64_t matrix_bytes_, payload_bytes_;
  std::byte* data_ = nullptr;
};

}  // namespace amoeba::kernels
