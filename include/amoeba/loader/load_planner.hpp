// LoadPlanner: the host half of the DoubleBufferLoader (DESIGN §3.4). It decides, layer by layer during one
// forward pass, which expert copies to issue and where the MoE kernel reads each expert from; the CUDA half
// (kernels/loader/double_buffer_loader.cuh) only executes these decisions with one copy stream and events.
// Keeping the decisions here, CUDA-free, lets the protocol be tested on any machine.
//
// Per forward:
//   begin_forward(changes, residency, pool)  checks the ChangeList with the adjuster's own validation
//                                            (validate_changes): a bad list is a ChangeError, nothing starts;
//   plan_prefetch(l, predicted)              layer l's queue: its restores first (straight into their
//                                            reserved pages), then predicted experts (into load
//                                            buffer l % 2), deduplicated, at most `buffer_slots` of them;
//   plan_demand(l, routed)                   experts the router picked that are neither resident, restored
//                                            nor buffered: loaded on demand before the MoE runs (free slots
//                                            first, then slots of predicted experts the router did not pick);
//   locations(l, out)                        where each expert of l is read from: pages (resident experts and
//                                            this layer's restores -- call it after waiting for l's copies),
//                                            a buffer slot, or absent;
//   end_forward()                            the experts whose entries go absent now (evictions); the caller
//                                            then commits the ChangeList, which returns their pages.
// Evicted experts stay readable through the whole forward (deferred free). Failed calls change nothing.
// Every backend runs its forward through this plan (DESIGN §3.7): the CUDA loader issues these copies, the
// simulator prices them, so there is one prefetch rule. A restore is three copies (its reserved pages need
// not be adjacent), an expert into a buffer slot one (W1, W3, W2 are contiguous on both sides): see
// ExpertCopy::copy_calls(). buffer_slots may be 0 (nothing may be offloaded; every miss is kTooManyMisses).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/adjust/validate_changes.hpp"
#include "amoeba/core/errors.hpp"
#include "amoeba/core/expected.hpp"
#include "amoeba/engine/expert_location.hpp"
#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba {

enum class CopyTarget : std::uint8_t { kReservedPages, kBufferSlot };

// One expert to copy from the host store.
struct ExpertCopy {
  ExpertKey expert;
  CopyTarget target = CopyTarget::kBufferSlot;
  ExpertPages pages{};      // kReservedPages: the reserved W1, W3, W2 pages
  std::uint32_t slot = 0;   // kBufferSlot: slot in buffer `buffer`
  std::uint8_t buffer = 0;  // layer % 2
  bool on_demand = false;   // a miss found after routing (the layer waits for it)

  // Host-to-device copy calls this copy takes: one per reserved page, one for a whole buffered expert.
  constexpr std::uint32_t copy_calls() const noexcept {
    return target == CopyTarget::kReservedPages ? std::uint32_t(kMatricesPerExpert) : 1u;
  }
  friend constexpr bool operator==(const ExpertCopy&, const ExpertCopy&) = default;
};

// Errors of the per-layer calls. A bad ChangeList is reported by begin_forward() as a ChangeError, from the
// same validation that Adjuster::commit() runs (amoeba/adjust/validate_changes.hpp).
enum class LoaderErrorCode : std::uint8_t {
  kOutOfRange,     // layer or expert outside the model
  kTooManyMisses,  // more experts to load on demand than the load buffer holds
  kNoForward,      // a layer call outside begin_forward/end_forward
  kOutOfOrder,     // layers must be prepared in order, each finished (layer_done) before layer + 2 loads
};

struct LoaderError {
  LoaderErrorCode code = LoaderErrorCode::kOutOfRange;
  ExpertKey expert;
  std::string message;
};

struct LoaderShape {
  std::uint32_t layers = 0;
  std::uint32_t experts = 0;       // routed experts per layer
  std::uint32_t buffer_slots = 0;  // experts per load buffer = expert_offload_limit
};

struct LoadStats {
  std::uint64_t copies = 0;               // experts copied (restores + prefetches + on-demand)
  std::uint64_t restores = 0;             // of which into reserved pages
  std::uint64_t prefetches = 0;           // of which predicted
  std::uint64_t on_demand_misses = 0;     // of which on demand
  std::uint64_t prefetch_hits = 0;        // routed experts found in the buffer, put there by prediction
  std::uint64_t prefetch_wasted = 0;      // predicted experts the router did not pick
  std::uint64_t predictions_dropped = 0;  // predicted experts beyond the buffer's capacity
};

class LoadPlanner {
 public:
  explicit LoadPlanner(LoaderShape shape) : shape_(shape) {
    if (shape.layers == 0) throw_config_error("loader.layers", shape.layers, "must be greater than zero");
    if (shape.experts == 0) throw_config_error("loader.experts", shape.experts, "must be greater than zero");
    if (shape.buffer_slots > shape.experts)
      throw_config_error("loader.buffer_slots", shape.buffer_slots,
                         "must not exceed the experts per layer (" + std::to_string(shape.experts) + ")");
    restores_by_layer_.resize(shape.layers);
    restores_issued_.assign(shape.layers, 0);
    for (auto& b : buffers_) b.slots.assign(shape.buffer_slots, Slot{});
  }

  const LoaderShape& shape() const noexcept { return shape_; }
  const LoadStats& stats() const noexcept { return stats_; }
  bool in_forward() const noexcept { return residency_ != nullptr; }

  // Checks `changes` (validate_changes, ChangeCheck::kApply: the rules Adjuster::commit() applies) and starts
  // a forward. On error nothing changes. `pool` needs owner_of(PageHandle). Throws ConfigError when the
  // residency table's shape is not the planner's (a wiring bug, not a bad list).
  template <class Pool>
  std::optional<ChangeError> begin_forward(const ChangeList& changes, const ResidencyTable& residency,
                                           const Pool& pool) {
    if (residency.layers() != shape_.layers || residency.experts_per_layer() != shape_.experts)
      throw_config_error(
          "loader.residency",
          std::to_string(residency.layers()) + "x" + std::to_string(residency.experts_per_layer()),
          "must match the loader's shape (" + std::to_string(shape_.layers) + "x" +
              std::to_string(shape_.experts) + ")");
    if (auto e =
            validate_changes(changes, residency, pool, "loader: begin_forward", ChangeCheck::kApply, seen_))
      return e;
    residency_ = &residency;
    for (auto& v : restores_by_layer_) v.clear();
    std::fill(restores_issued_.begin(), restores_issued_.end(), 0);
    for (const Restore& r : changes.restores) restores_by_layer_[r.expert.layer].push_back(r);
    evictions_.clear();
    for (const Eviction& e : changes.evictions) evictions_.push_back(e.expert);
    for (auto& b : buffers_) b.layer = kNone;
    return std::nullopt;
  }

  // Layer `layer`'s prefetch queue: restores first, then `predicted` experts that are neither resident,
  // restored nor already queued, up to the buffer's capacity (the rest are dropped and counted).
  Expected<std::vector<ExpertCopy>, LoaderError> plan_prefetch(std::uint32_t layer,
                                                               std::span<const std::uint32_t> predicted) {
    if (auto e = check_layer(layer)) return Unexpected{*e};
    for (std::uint32_t x : predicted)
      if (x >= shape_.experts)
        return Unexpected{*error(LoaderErrorCode::kOutOfRange, {layer, x}, "prediction")};
    std::vector<ExpertCopy> out = take_restores(layer);
    Buffer& b = buffer_for(layer);
    for (std::uint32_t x : predicted) {
      if (!needs_load(layer, x) || b.find(x) >= 0) continue;
      const int s = b.free_slot();
      if (s < 0) {
        ++stats_.predictions_dropped;
        continue;
      }
      b.slots[s] = Slot{static_cast<std::int32_t>(x), true, false};
      out.push_back(ExpertCopy{{layer, x},
                               CopyTarget::kBufferSlot,
                               {},
                               static_cast<std::uint32_t>(s),
                               static_cast<std::uint8_t>(layer % 2),
                               false});
      ++stats_.prefetches;
    }
    stats_.copies += out.size();
    return out;
  }

  // Copies needed before layer `layer`'s MoE runs, given the experts its router picked: restores not yet
  // issued and on-demand loads of misses. kTooManyMisses (nothing planned, nothing changed) if the misses do
  // not fit in the buffer even after reusing slots of predicted experts the router did not pick.
  Expected<std::vector<ExpertCopy>, LoaderError> plan_demand(std::uint32_t layer,
                                                             std::span<const std::uint32_t> routed) {
    if (auto e = check_layer(layer)) return Unexpected{*e};
    for (std::uint32_t x : routed)
      if (x >= shape_.experts) return Unexpected{*error(LoaderErrorCode::kOutOfRange, {layer, x}, "routing")};
    Buffer& b = buffer_for(layer);
    std::vector<std::uint32_t>& misses = misses_;
    std::vector<std::uint8_t>& routed_slot = routed_slot_;
    misses.clear();
    routed_slot.assign(b.slots.size(), 0);
    for (std::uint32_t x : routed) {
      if (!needs_load(layer, x)) continue;
      if (const int s = b.find(x); s >= 0) {
        routed_slot[s] = 1;
        continue;
      }
      if (std::find(misses.begin(), misses.end(), x) == misses.end()) misses.push_back(x);
    }
    // Slots usable for misses: free ones, then those of predicted experts nobody routed to.
    std::vector<std::uint32_t>& usable = usable_;
    usable.clear();
    for (std::uint32_t s = 0; s < b.slots.size(); ++s)
      if (b.slots[s].expert < 0) usable.push_back(s);
    for (std::uint32_t s = 0; s < b.slots.size(); ++s)
      if (b.slots[s].expert >= 0 && !routed_slot[s]) usable.push_back(s);
    if (misses.size() > usable.size()) {
      std::ostringstream os;
      os << misses.size() << " experts missed but the load buffer has " << usable.size() << " usable of "
         << b.slots.size() << " slots (expert_offload_limit too small for this layer's offloaded experts)";
      return Unexpected{*error(LoaderErrorCode::kTooManyMisses, {layer, misses.front()}, os.str())};
    }
    // Commit: count hits/wasted, then place misses.
    for (std::uint32_t s = 0; s < b.slots.size(); ++s) {
      if (b.slots[s].expert < 0 || !b.slots[s].predicted || b.slots[s].counted) continue;
      if (routed_slot[s])
        ++stats_.prefetch_hits;
      else
        ++stats_.prefetch_wasted;
      b.slots[s].counted = true;
    }
    std::vector<ExpertCopy> out = take_restores(layer);
    for (std::size_t i = 0; i < misses.size(); ++i) {
      const std::uint32_t s = usable[i];
      b.slots[s] = Slot{static_cast<std::int32_t>(misses[i]), false, true};
      out.push_back(ExpertCopy{
          {layer, misses[i]}, CopyTarget::kBufferSlot, {}, s, static_cast<std::uint8_t>(layer % 2), true});
    }
    stats_.on_demand_misses += misses.size();
    stats_.copies += out.size();
    return out;
  }

  // Where each expert of `layer` is read from in this forward (out.size() == experts). Resident experts --
  // evicted ones included, they stay usable until the forward ends -- and this layer's restores by page,
  // buffered experts by slot, others absent.
  void locations(std::uint32_t layer, std::span<ExpertLocation> out) const {
    for (std::uint32_t x = 0; x < shape_.experts && x < out.size(); ++x) {
      ExpertLocation r;
      if (auto p = residency_ ? residency_->pages_of({layer, x}) : std::nullopt) set_pages(r, *p);
      out[x] = r;
    }
    if (!residency_) return;
    for (const Restore& rs : restores_by_layer_[layer]) set_pages(out[rs.expert.expert], rs.pages);
    const Buffer& b = buffers_[layer % 2];
    if (b.layer != layer) return;
    for (std::uint32_t s = 0; s < b.slots.size(); ++s)
      if (b.slots[s].expert >= 0) out[b.slots[s].expert].buffer_slot = static_cast<std::int32_t>(s);
  }

  // Ends the forward: the evicted experts, whose page-table entries must go absent before the caller commits
  // the ChangeList (which returns their pages to the pool).
  std::vector<ExpertKey> end_forward() {
    residency_ = nullptr;
    std::vector<ExpertKey> out;
    out.swap(evictions_);
    return out;
  }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  struct Slot {
    std::int32_t expert = -1;
    bool predicted = false;
    bool counted = false;  // hit/waste already counted
  };
  struct Buffer {
    std::uint32_t layer = kNone;  // whose experts it holds
    std::vector<Slot> slots;
    int find(std::uint32_t x) const {
      for (std::size_t s = 0; s < slots.size(); ++s)
        if (slots[s].expert == static_cast<std::int32_t>(x)) return static_cast<int>(s);
      return -1;
    }
    int free_slot() const {
      for (std::size_t s = 0; s < slots.size(); ++s)
        if (slots[s].expert < 0) return static_cast<int>(s);
      return -1;
    }
  };

  static void set_pages(ExpertLocation& r, const ExpertPages& p) {
    for (std::size_t j = 0; j < kMatricesPerExpert; ++j)
      r.page[j] = static_cast<std::int32_t>(p.pages[j].index);
    r.buffer_slot = -1;
  }
  std::optional<LoaderError> error(LoaderErrorCode c, ExpertKey k, std::string what) const {
    std::ostringstream os;
    os << "loader: " << what << ": " << k;
    return LoaderError{c, k, os.str()};
  }
  std::optional<LoaderError> check_layer(std::uint32_t layer) const {
    if (!residency_) return error(LoaderErrorCode::kNoForward, {layer, 0}, "layer call outside a forward");
    if (layer >= shape_.layers) return error(LoaderErrorCode::kOutOfRange, {layer, 0}, "layer");
    return std::nullopt;
  }
  // Buffer layer % 2, emptied when it still holds layer - 2's experts.
  Buffer& buffer_for(std::uint32_t layer) {
    Buffer& b = buffers_[layer % 2];
    if (b.layer != layer) {
      b.layer = layer;
      std::fill(b.slots.begin(), b.slots.end(), Slot{});
    }
    return b;
  }
  bool is_restoring(std::uint32_t layer, std::uint32_t x) const {
    for (const Restore& r : restores_by_layer_[layer])
      if (r.expert.expert == x) return true;
    return false;
  }
  bool needs_load(std::uint32_t layer, std::uint32_t x) const {
    return !residency_->is_resident({layer, x}) && !is_restoring(layer, x);
  }
  std::vector<ExpertCopy> take_restores(std::uint32_t layer) {
    std::vector<ExpertCopy> out;
    if (restores_issued_[layer]) return out;
    restores_issued_[layer] = 1;
    for (const Restore& r : restores_by_layer_[layer])
      out.push_back(ExpertCopy{r.expert, CopyTarget::kReservedPages, r.pages, 0, 0, false});
    stats_.restores += out.size();
    return out;
  }

  LoaderShape shape_;
  const ResidencyTable* residency_ = nullptr;
  std::vector<std::vector<Restore>> restores_by_layer_;
  std::vector<std::uint8_t> restores_issued_;
  std::vector<ExpertKey> evictions_;
  std::vector<std::uint8_t> seen_;              // validate_changes scratch
  std::vector<std::uint32_t> misses_, usable_;  // plan_demand scratch
  std::vector<std::uint8_t> routed_slot_;
  Buffer buffers_[2];
  LoadStats stats_;
};

}  // namespace amoeba
