// ChangeList: the adjuster's decision for one step (DESIGN §3.3), a plain value the backend applies.
//
//   evictions: experts leaving the GPU, with the pages they hold now. Deferred-free rule: an evicted expert
//              stays usable until the current forward pass ends; only Adjuster::commit() (called after that
//              forward) changes the residency table and returns its pages to the pool, so pages freed by an
//              eviction can be handed out only after that forward.
//   restores:  experts coming back, with three expert pages (W1, W3, W2) already reserved in the pool at
//              decision time (owner = expert_owner(expert, matrix, reserved = true)). The loader writes the
//              weights straight into them, ahead of predicted experts in the next layer's prefetch queue; the
//              page table points at them only after the copy has completed. commit() makes them resident;
//              Adjuster::cancel() releases the reservation of a restore that will not happen.
// A request that waited for pages freed by evictions is considered again by the next step's scheduler (the
// paper is silent on this; it follows from the deferred-free rule).
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/expert/expert_key.hpp"

namespace amoeba {

// What the adjuster is told each step, after the scheduler has run.
struct AdjustSignal {
  std::uint64_t shortfall_pages = 0;    // R_b: expert pages the scheduler is short (0 when nothing waits)
  std::uint64_t free_expert_pages = 0;  // F_b: expert pages free after the scheduler
  friend constexpr bool operator==(const AdjustSignal&, const AdjustSignal&) = default;
};

// How many experts a capacity rule asks to evict and to restore this step (the adjuster may do fewer: layers
// at their offload limit, nothing left to restore, the pool short of pages for a restore).
struct CapacityDecision {
  std::uint32_t evict = 0;
  std::uint32_t restore = 0;
  friend constexpr bool operator==(const CapacityDecision&, const CapacityDecision&) = default;
};

// kPressure: chosen to give pages to the KV cache (or keep a spare). kSwap: chosen to make room in a layer at
// its fixed capacity for an admitted expert (LRU/LFU caches).
enum class EvictionCause : std::uint8_t { kPressure, kSwap };

struct Eviction {
  ExpertKey expert;
  ExpertPages pages;  // the pages it holds; returned to the pool at commit
  EvictionCause cause = EvictionCause::kPressure;
  friend constexpr bool operator==(const Eviction&, const Eviction&) = default;
};

struct Restore {
  ExpertKey expert;
  ExpertPages pages;  // reserved at decision time
  friend constexpr bool operator==(const Restore&, const Restore&) = default;
};

struct ChangeList {
  AdjustSignal signal;        // the inputs of the decision
  CapacityDecision decision;  // what the capacity rule asked for
  std::vector<Eviction> evictions;
  std::vector<Restore> restores;

  bool empty() const noexcept { return evictions.empty() && restores.empty(); }
  // Expert pages that commit() returns to the pool / that are reserved now.
  std::uint64_t pages_released_at_commit() const noexcept { return evictions.size() * kMatricesPerExpert; }
  std::uint64_t pages_reserved() const noexcept { return restores.size() * kMatricesPerExpert; }
};

inline std::ostream& operator<<(std::ostream& os, const ChangeList& c) {
  os << "ChangeList{R_b=" << c.signal.shortfall_pages << " F_b=" << c.signal.free_expert_pages
     << " asked evict " << c.decision.evict << " restore ";
  if (c.decision.restore == ~std::uint32_t{0})
    os << "any";  // e.g. a cache admitting every miss
  else
    os << c.decision.restore;
  os << "; evict [";
  for (std::size_t i = 0; i < c.evictions.size(); ++i)
    os << (i ? " " : "") << c.evictions[i].expert.layer << ':' << c.evictions[i].expert.expert
       << (c.evictions[i].cause == EvictionCause::kSwap ? "(swap)" : "");
  os << "]; restore [";
  for (std::size_t i = 0; i < c.restores.size(); ++i)
    os << (i ? " " : "") << c.restores[i].expert.layer << ':' << c.restores[i].expert.expert;
  return os << "]}";
}
inline std::string to_string(const ChangeList& c) {
  std::ostringstream os;
  os << c;
  return os.str();
}

// Why commit() or cancel() rejected a change list. Nothing changed when one is returned.
enum class ChangeErrorCode : std::uint8_t {
  kOutOfRange,       // an expert outside the table's layers/experts
  kDuplicate,        // an expert named twice in one list
  kNotResident,      // an eviction names an expert that is not resident
  kAlreadyResident,  // a restore names an expert that is already resident
  kPagesMismatch,    // an eviction's pages are not the pages the table holds for it (or not owned by it)
  kNotReserved,      // a restore's pages are not reserved for it in the pool
  kNotFound,         // cancel of a restore the list does not contain
};

constexpr std::string_view to_string(ChangeErrorCode c) noexcept {
  switch (c) {
    case ChangeErrorCode::kOutOfRange:
      return "expert out of range";
    case ChangeErrorCode::kDuplicate:
      return "expert named twice in one change list";
    case ChangeErrorCode::kNotResident:
      return "eviction of an expert that is not resident";
    case ChangeErrorCode::kAlreadyResident:
      return "restore of an expert that is already resident";
    case ChangeErrorCode::kPagesMismatch:
      return "eviction pages differ from the pages the expert holds";
    case ChangeErrorCode::kNotReserved:
      return "restore pages are not reserved for this expert in the pool";
    case ChangeErrorCode::kNotFound:
      return "no restore of this expert in the change list";
  }
  return "?";
}

struct ChangeError {
  ChangeErrorCode code = ChangeErrorCode::kOutOfRange;
  ExpertKey expert;
  std::string message;  // e.g. "commit: eviction of an expert that is not resident: (layer 3, expert 7)"
};

}  // namespace amoeba
