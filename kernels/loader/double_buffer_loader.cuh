// DoubleBufferLoader: experts cross PCIe on one copy stream while the compute stream runs (DESIGN §3.4).
//
// Memory: the unified pool's device arena (owned by the caller; restores are written straight into their
// reserved pages), two load buffers of `buffer_slots` (= expert_offload_limit) experts each, alternating by
// layer, and a device page table [layers][experts] of ExpertLocation that the paged MoE kernel reads.
//
// Protocol (who waits on what; docs/loader.md has the timeline):
//   begin_forward(changes)   validates the ChangeList (LoadPlanner, the adjuster's validation) -- nothing is
//                            issued on error;
//   prefetch(l, predicted)   copy stream: [wait computed(l-2) if l's buffer is reused] restores of l
//                            into their reserved pages, then predicted experts into buffer l%2;
//   prepare_layer(l, routed, routed_ready)
//                            copy stream: [wait routed_ready: the GPU has computed l's routing] on-demand
//                            loads of misses, then records copied(l);
//                            compute stream: waits copied(l), then a tiny kernel writes l's page-table row
//                            (restored experts flip to their pages here: after their copy, before l runs);
//                            returns the pointers the MoE kernel of layer l takes;
//   layer_done(l)            compute stream records computed(l): buffer l%2 may be refilled for l+2 after it;
//   end_forward()            waits for the compute stream, turns evicted experts' entries absent (page table
//                            first), returns them; the caller then commits the ChangeList, which returns
//                            their pages to the pool -- so a page freed by eviction is never handed out
//                            mid-forward.
// The page-table row is written by a kernel on the compute stream rather than by a host-to-device copy,
// because copies in one direction serialize on one copy engine and the row would queue behind the next
// layer's experts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "amoeba/core/expected.hpp"
#include "amoeba/loader/load_planner.hpp"
#include "amoeba/pool/arena.hpp"
#include "loader/cuda_check.cuh"
#include "loader/device_memory.cuh"
#include "moe/addressing.cuh"

namespace amoeba::kernels {

namespace detail {
// One page-table row update, passed by value: up to kRowChunk entries per launch.
inline constexpr int kRowChunk = 240;  // 240 * 16 B + header < 4 KiB of kernel parameters
struct RowWrite {
  ExpertLocation* dst;
  int count;
  ExpertLocation entries[kRowChunk];
};
__global__ void write_row_kernel(const __grid_constant__ RowWrite w) {
  for (int i = threadIdx.x; i < w.count; i += blockDim.x) w.dst[i] = w.entries[i];
}
// Test hook: holds the copy stream for `ns` nanoseconds so that races with the compute stream show up.
__global__ void spin_kernel(std::uint64_t ns) {
  std::uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
}  // namespace detail

struct LoaderOptions {
  bool poison_before_copy = false;  // tests: memset each destination to 0xFF on the copy stream first
  std::uint32_t copy_delay_us = 0;  // tests: a spin kernel delays the copy stream before each layer's copies
  // Entries after the routed experts in every page-table row, for experts that never move (the shared
  // experts' chunks, read by PagedMoe as experts E .. E + m - 1): set once with set_static_entries().
  std::uint32_t static_entries = 0;
};

// What the MoE kernel of one layer takes (kernels::Paged::Arguments fields).
struct LayerWeights {
  const bf16* pool_base = nullptr;
  const bf16* load_buffer = nullptr;
  const ExpertLocation* locations = nullptr;  // [experts]
};

struct LoaderDeviceStats {
  std::uint64_t bytes_h2d = 0;
  std::uint64_t copy_calls = 0;            // cudaMemcpyAsync calls issued
  std::vector<double> stall_ms_per_layer;  // compute stream waiting for copies, summed over forwards
  std::uint64_t forwards = 0;
};

class DoubleBufferLoader {
 public:
  DoubleBufferLoader(LoaderShape shape, const PinnedExpertStore& store, ArenaSpan pool_arena,
                     cudaStream_t compute, LoaderOptions options = {})
      : planner_(shape), store_(store), pool_(pool_arena), compute_(compute), options_(options) {
    if (store.layers() != shape.layers || store.experts() != shape.experts)
      throw_config_error("loader.shape", std::to_string(shape.layers) + "x" + std::to_string(shape.experts),
                         "must match the expert store (" + std::to_string(store.layers()) + "x" +
                             std::to_string(store.experts()) + ")");
    if (pool_arena.base == nullptr)
      throw_config_error("loader.pool_arena.base", "null", "must be device memory");
    const std::uint64_t buffer_bytes = std::uint64_t(shape.buffer_slots) * store.expert_bytes();
    for (auto& b : buffers_) {
      void* p = nullptr;
      AMOEBA_CUDA_CHECK(cudaMalloc(&p, buffer_bytes));
      b = static_cast<std::byte*>(p);
    }
    const std::size_t entries = std::size_t(shape.layers) * row_stride();
    void* t = nullptr;
    AMOEBA_CUDA_CHECK(cudaMalloc(&t, entries * sizeof(ExpertLocation)));
    table_ = static_cast<ExpertLocation*>(t);
    // All absent (-1), on the compute stream like every later write of the table: a clear on the legacy
    // default stream is not ordered with a non-blocking compute stream, and behind busy legacy-stream work it
    // landed after set_static_entries' rows and wiped them (an engine's shared experts then read page -1).
    AMOEBA_CUDA_CHECK(cudaMemsetAsync(table_, 0xff, entries * sizeof(ExpertLocation), compute_));
    AMOEBA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    auto make = [&](std::vector<cudaEvent_t>& v, unsigned flags) {
      v.resize(shape.layers);
      for (auto& e : v) AMOEBA_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    };
    make(copied_, cudaEventDisableTiming);
    make(computed_, cudaEventDisableTiming);
    make(stall_begin_, cudaEventDefault);
    make(stall_end_, cudaEventDefault);
    computed_recorded_.assign(shape.layers, 0);
    stall_recorded_.assign(shape.layers, 0);
    row_.resize(shape.experts);
    stats_.stall_ms_per_layer.assign(shape.layers, 0.0);
  }
  ~DoubleBufferLoader() {
    if (copy_) cudaStreamSynchronize(copy_);
    for (auto* v : {&copied_, &computed_, &stall_begin_, &stall_end_})
      for (auto e : *v) cudaEventDestroy(e);
    if (copy_) cudaStreamDestroy(copy_);
    for (auto* b : buffers_) cudaFree(b);
    cudaFree(table_);
  }
  DoubleBufferLoader(const DoubleBufferLoader&) = delete;
  DoubleBufferLoader& operator=(const DoubleBufferLoader&) = delete;

  const LoadPlanner& planner() const noexcept { return planner_; }
  const LoadStats& stats() const noexcept { return planner_.stats(); }
  const LoaderDeviceStats& device_stats() const noexcept { return stats_; }
  cudaStream_t copy_stream() const noexcept { return copy_; }
  const ExpertLocation* device_table() const noexcept { return table_; }

  // Validates `changes` (the adjuster's own validation, through the planner) and starts a forward.
  template <class Pool>
  std::optional<ChangeError> begin_forward(const ChangeList& changes, const ResidencyTable& residency,
                                           const Pool& pool) {
    if (auto e = planner_.begin_forward(changes, residency, pool)) return e;
    std::fill(computed_recorded_.begin(), computed_recorded_.end(), 0);
    std::fill(stall_recorded_.begin(), stall_recorded_.end(), 0);
    return std::nullopt;
  }

  // Queues layer `layer`'s restores and predicted experts on the copy stream. Call it while layer - 1
  // computes.
  std::optional<LoaderError> prefetch(std::uint32_t layer, std::span<const std::uint32_t> predicted) {
    if (auto e = check_order(layer)) return e;
    auto plan = planner_.plan_prefetch(layer, predicted);
    if (!plan) return plan.error();
    issue(layer, *plan);
    return std::nullopt;
  }

  // Loads layer `layer`'s misses, makes the compute stream wait for every copy of the layer, and writes its
  // page-table row. On error (too many misses) nothing is issued. `routed_ready`, when given, is an event the
  // compute stream records once it has computed the layer's routing: the misses' copies wait for it. Without
  // it they start as soon as the copy stream is free, which a caller that learnt `routed` from the GPU (after
  // a readback) gets anyway, but a caller that knows the routing beforehand (synthetic routing) would turn
  // into a perfect prefetch that no router allows.
  Expected<LayerWeights, LoaderError> prepare_layer(std::uint32_t layer,
                                                    std::span<const std::uint32_t> routed,
                                                    cudaEvent_t routed_ready = nullptr) {
    if (auto e = check_order(layer)) return Unexpected{*e};
    auto plan = planner_.plan_demand(layer, routed);
    if (!plan) return Unexpected{plan.error()};
    if (routed_ready && !plan->empty()) AMOEBA_CUDA_CHECK(cudaStreamWaitEvent(copy_, routed_ready, 0));
    issue(layer, *plan);
    AMOEBA_CUDA_CHECK(cudaEventRecord(copied_[layer], copy_));
    AMOEBA_CUDA_CHECK(cudaEventRecord(stall_begin_[layer], compute_));
    AMOEBA_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_[layer], 0));
    AMOEBA_CUDA_CHECK(cudaEventRecord(stall_end_[layer], compute_));
    stall_recorded_[layer] = 1;
    planner_.locations(layer, row_);
    write_row(layer, row_.data(), planner_.shape().experts);
    return LayerWeights{reinterpret_cast<const bf16*>(pool_.base),
                        reinterpret_cast<const bf16*>(buffers_[layer % 2]), row(layer)};
  }

  // The compute stream has queued everything that reads layer `layer`'s load buffer.
  void layer_done(std::uint32_t layer) {
    AMOEBA_CUDA_CHECK(cudaEventRecord(computed_[layer], compute_));
    computed_recorded_[layer] = 1;
  }

  // Ends the forward: waits for the compute stream, marks evicted experts absent in the device page table,
  // and returns them. Commit the ChangeList (pages back to the pool) only after this returns.
  std::vector<ExpertKey> end_forward() {
    AMOEBA_CUDA_CHECK(cudaStreamSynchronize(compute_));
    AMOEBA_CUDA_CHECK(cudaStreamSynchronize(copy_));
    const std::uint32_t layers = planner_.shape().layers;
    for (std::uint32_t l = 0; l < layers; ++l) {
      if (!stall_recorded_[l]) continue;
      float ms = 0.f;
      AMOEBA_CUDA_CHECK(cudaEventElapsedTime(&ms, stall_begin_[l], stall_end_[l]));
      stats_.stall_ms_per_layer[l] += ms;
    }
    ++stats_.forwards;
    // Queued on the compute stream, so every later kernel sees the entries absent before the pages they named
    // can be reused; the row is a kernel parameter, so nothing on the host must outlive the launch.
    std::vector<ExpertKey> evicted = planner_.end_forward();
    for (ExpertKey k : evicted) write_row(k.layer, nullptr, 1, k.expert);
    return evicted;
  }

  const ExpertLocation* row(std::uint32_t layer) const noexcept {
    return table_ + std::size_t(layer) * row_stride();
  }
  // Entries per page-table row: the routed experts, then options.static_entries.
  std::uint32_t row_stride() const noexcept { return planner_.shape().experts + options_.static_entries; }

  // Writes layer `layer`'s static entries (experts E .. E + entries.size() - 1) on the compute stream.
  void set_static_entries(std::uint32_t layer, std::span<const ExpertLocation> entries) {
    if (layer >= planner_.shape().layers || entries.size() != options_.static_entries)
      throw_config_error("loader.static_entries", entries.size(),
                         "must be options.static_entries (" + std::to_string(options_.static_entries) +
                             ") entries of an existing layer");
    write_row(layer, entries.data(), options_.static_entries, planner_.shape().experts);
  }

 private:
  // Loading into buffer layer % 2 is safe only once layer - 2, its last reader, has been queued (layer_done).
  std::optional<LoaderError> check_order(std::uint32_t layer) const {
    if (layer >= 2 && layer < computed_recorded_.size() && planner_.in_forward() &&
        !computed_recorded_[layer - 2])
      return LoaderError{LoaderErrorCode::kOutOfOrder,
                         {layer, 0},
                         "loader: layer " + std::to_string(layer) + " loads before layer_done(" +
                             std::to_string(layer - 2) + ") was called"};
    return std::nullopt;
  }
  void issue(std::uint32_t layer, const std::vector<ExpertCopy>& copies) {
    if (copies.empty()) return;
    bool into_buffer = false;
    for (const ExpertCopy& c : copies) into_buffer |= c.target == CopyTarget::kBufferSlot;
    // Buffer layer % 2 was last read by layer - 2 in this forward: wait until that layer has been computed.
    if (into_buffer && layer >= 2) AMOEBA_CUDA_CHECK(cudaStreamWaitEvent(copy_, computed_[layer - 2], 0));
    if (options_.copy_delay_us) {
      detail::spin_kernel<<<1, 1, 0, copy_>>>(std::uint64_t(options_.copy_delay_us) * 1000);
      AMOEBA_CUDA_CHECK(cudaGetLastError());
    }
    // Only the matrices' payload crosses PCIe: a padded page's tail is never read.
    const std::uint64_t mb = store_.matrix_bytes(), payload = store_.payload_bytes();
    for (const ExpertCopy& c : copies) {
      if (c.target == CopyTarget::kBufferSlot) {
        std::byte* dst = buffers_[c.buffer] + std::uint64_t(c.slot) * 3 * mb;
        copy(dst, store_.expert(c.expert),
             2 * mb + payload);  // W1, W3, W2 contiguous on both sides: one copy
      } else {
        for (ExpertMatrix m : kExpertMatrices)
          copy(pool_.base + std::uint64_t(c.pages[m].index) * mb, store_.matrix(c.expert, m), payload);
      }
    }
  }
  void copy(std::byte* dst, const std::byte* src, std::uint64_t bytes) {
    if (options_.poison_before_copy) AMOEBA_CUDA_CHECK(cudaMemsetAsync(dst, 0xff, bytes, copy_));
    AMOEBA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_));
    stats_.bytes_h2d += bytes;
    ++stats_.copy_calls;
  }
  // Writes entries [first, first + n) of `layer`'s row on the compute stream; entries == nullptr: absent.
  void write_row(std::uint32_t layer, const ExpertLocation* entries, std::uint32_t n,
                 std::uint32_t first = 0) {
    for (std::uint32_t base = 0; base < n; base += detail::kRowChunk) {
      detail::RowWrite w;
      w.dst = table_ + std::size_t(layer) * row_stride() + first + base;
      w.count = static_cast<int>(std::min<std::uint32_t>(detail::kRowChunk, n - base));
      for (int i = 0; i < w.count; ++i) w.entries[i] = entries ? entries[base + i] : ExpertLocation{};
      detail::write_row_kernel<<<1, 256, 0, compute_>>>(w);
      AMOEBA_CUDA_CHECK(cudaGetLastError());
    }
  }

  LoadPlanner planner_;
  const PinnedExpertStore& store_;
  ArenaSpan pool_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  LoaderOptions options_;
  std::byte* buffers_[2] = {nullptr, nullptr};
  ExpertLocation* table_ = nullptr;
  std::vector<cudaEvent_t> copied_, computed_, stall_begin_, stall_end_;
  std::vector<std::uint8_t> computed_recorded_, stall_recorded_;
  std::vector<ExpertLocation> row_;
  LoaderDeviceStats stats_;
};

}  // namespace amoeba::kernels
