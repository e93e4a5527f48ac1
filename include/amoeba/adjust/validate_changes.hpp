// The one validation of a ChangeList (DESIGN §3.7): Adjuster::commit() and cancel() run it before they change
// anything, and LoadPlanner::begin_forward() runs it before a backend issues a single copy, so every backend
// rejects exactly the lists the adjuster would reject, with the same ChangeError.
//
// Rules, checked in this order (restores first, then evictions; the first violation is returned):
//   restore:  the expert is inside the table (kOutOfRange), named once in the list (kDuplicate), not resident
//             (kAlreadyResident), and each of its three pages is reserved for it in the pool (kNotReserved);
//   eviction: inside the table, named once in the whole list; with ChangeCheck::kApply also resident
//             (kNotResident), with the pages the table holds for it, each owned by it in the pool
//             (kPagesMismatch). kCancel skips those: a cancelled eviction does not happen.
// Complexity: O(entries); `seen` is scratch of one byte per (layer, expert), all zero before and after.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba {

enum class ChangeCheck : std::uint8_t {
  kApply,   // commit, or a forward about to run the list: every entry fully checked
  kCancel,  // cancel: restores fully; evictions only in range and named once
};

inline ChangeError change_error(ChangeErrorCode c, ExpertKey k, std::string_view op) {
  std::string msg = std::string(op) + ": " + std::string(to_string(c)) + ": (layer " +
                    std::to_string(k.layer) + ", expert " + std::to_string(k.expert) + ")";
  return ChangeError{c, k, std::move(msg)};
}

// One restore: in range, not resident, its pages reserved for it. `pool` needs owner_of(PageHandle).
template <class Pool>
std::optional<ChangeError> check_restore(const Restore& r, const ResidencyTable& table, const Pool& pool,
                                         std::string_view op) {
  if (!table.contains(r.expert)) return change_error(ChangeErrorCode::kOutOfRange, r.expert, op);
  if (table.is_resident(r.expert)) return change_error(ChangeErrorCode::kAlreadyResident, r.expert, op);
  for (ExpertMatrix m : kExpertMatrices)
    if (pool.owner_of(r.pages[m]) != std::optional<OwnerId>(expert_owner(r.expert, m, /*reserved=*/true)))
      return change_error(ChangeErrorCode::kNotReserved, r.expert, op);
  return std::nullopt;
}

template <class Pool>
std::optional<ChangeError> validate_changes(const ChangeList& c, const ResidencyTable& table,
                                            const Pool& pool, std::string_view op, ChangeCheck check,
                                            std::vector<std::uint8_t>& seen) {
  const std::size_t experts = table.experts_per_layer();
  if (seen.size() < std::size_t(table.layers()) * experts)
    seen.resize(std::size_t(table.layers()) * experts, 0);
  std::optional<ChangeError> err;
  auto mark = [&](ExpertKey k) {
    std::uint8_t& s = seen[std::size_t(k.layer) * experts + k.expert];
    if (s) return false;
    s = 1;
    return true;
  };
  for (const Restore& r : c.restores) {
    if (!table.contains(r.expert)) {
      err = change_error(ChangeErrorCode::kOutOfRange, r.expert, op);
      break;
    }
    if (!mark(r.expert)) {
      err = change_error(ChangeErrorCode::kDuplicate, r.expert, op);
      break;
    }
    if ((err = check_restore(r, table, pool, op))) break;
  }
  for (std::size_t i = 0; !err && i < c.evictions.size(); ++i) {
    const Eviction& ev = c.evictions[i];
    if (!table.contains(ev.expert)) {
      err = change_error(ChangeErrorCode::kOutOfRange, ev.expert, op);
      break;
    }
    if (!mark(ev.expert)) {
      err = change_error(ChangeErrorCode::kDuplicate, ev.expert, op);
      break;
    }
    if (check == ChangeCheck::kCancel) continue;
    if (!table.is_resident(ev.expert)) {
      err = change_error(ChangeErrorCode::kNotResident, ev.expert, op);
      break;
    }
    if (*table.pages_of(ev.expert) != ev.pages) {
      err = change_error(ChangeErrorCode::kPagesMismatch, ev.expert, op);
      break;
    }
    for (ExpertMatrix m : kExpertMatrices)
      if (pool.owner_of(ev.pages[m]) != std::optional<OwnerId>(expert_owner(ev.expert, m))) {
        err = change_error(ChangeErrorCode::kPagesMismatch, ev.expert, op);
        break;
      }
  }
  // Back to all zero without a list of what was marked (this runs twice per step): every entry in range,
  // marked or not, is reset.
  auto unmark = [&](ExpertKey k) {
    if (table.contains(k)) seen[std::size_t(k.layer) * experts + k.expert] = 0;
  };
  for (const Restore& r : c.restores) unmark(r.expert);
  for (const Eviction& ev : c.evictions) unmark(ev.expert);
  return err;
}

}  // namespace amoeba
