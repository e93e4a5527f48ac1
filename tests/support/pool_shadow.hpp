// A shadow model of a TieredPagePool for randomized and fuzz tests: it records every handed-out page as a
// byte interval with its owner, checks that a new page overlaps no owned interval and lies inside the arena,
// and drives the pool with operations decoded from a stream of choices. Independent of the pool's internals
// on purpose.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "amoeba/pool/tiered_page_pool.hpp"

namespace amoeba::testing {

template <class Pool>
class PoolShadow {
 public:
  explicit PoolShadow(Pool& pool) : pool_(pool) {}

  // Returns an error description, or nothing. `choice` picks the operation, `arg` its parameters.
  std::optional<std::string> step(std::uint32_t choice, std::uint64_t arg) {
    const std::uint8_t kind = static_cast<std::uint8_t>(arg % Pool::kKinds);
    const OwnerId owner = (arg >> 8) % 64;
    switch (choice % 8) {
      case 0:
      case 1:
      case 2: {  // allocate one, with the owner's last page as affinity hint
        std::optional<PageHandle> near;
        if (auto it = last_.find(owner); it != last_.end() && it->second.kind == kind) near = it->second;
        const std::uint64_t avail = pool_.available(kind);
        auto p = pool_.allocate(kind, owner, near);
        if (bool(p) != (avail > 0)) return "allocate disagrees with available(): " + std::to_string(avail);
        if (p) {
          if (auto e = add(*p, owner)) return e;
        } else if (pool_.available(kind) != avail) {
          return std::string("failed allocate changed available()");
        }
        return std::nullopt;
      }
      case 3: {  // allocate n, all or nothing; adjacent runs requested half of the time
        const std::uint64_t n = 1 + (arg >> 16) % 12;
        std::vector<PageHandle> got;
        const std::uint64_t avail = pool_.available(kind);
        auto err = (arg >> 40) % 2 ? pool_.allocate_adjacent(kind, n, owner, got)
                                   : pool_.allocate_n(kind, n, owner, got);
        if (bool(err) == (avail >= n)) return std::string("allocate_n disagrees with available()");
        if (err && !got.empty()) return std::string("failed allocate_n handed out pages");
        for (auto p : got)
          if (auto e = add(p, owner)) return e;
        return std::nullopt;
      }
      case 4:
      case 5:
      case 6: {  // free a random owned page
        if (keys_.empty()) return std::nullopt;
        const std::size_t i = (arg >> 12) % keys_.size();
        auto it = live_.find(keys_[i]);
        const PageHandle p = it->second.page;
        if (pool_.free(p) != PageStatus::kOk) return std::string("free of an owned page failed");
        if (pool_.owner_of(p).has_value()) return std::string("freed page still has an owner");
        live_.erase(it);
        keys_[i] = keys_.back();
        keys_.pop_back();
        return std::nullopt;
      }
      default: {  // double free / free of a never-owned page must fail and change nothing
        const PageHandle p{static_cast<std::uint32_t>((arg >> 12) % (pool_.page_count(kind) + 1)), kind};
        const bool owned = pool_.owner_of(p).has_value();
        const auto before = pool_.stats().used_pages;
        if (owned) return std::nullopt;
        const PageStatus s = pool_.free(p);
        if (s == PageStatus::kOk) return std::string("free of a page nobody owns succeeded");
        if (pool_.stats().used_pages != before) return std::string("failed free changed the pool");
        return std::nullopt;
      }
    }
  }

  // Frees everything still owned; the pool must then be fully merged and consistent.
  std::optional<std::string> drain() {
    for (auto& [off, e] : live_)
      if (pool_.free(e.page) != PageStatus::kOk) return std::string("drain: free failed");
    live_.clear();
    keys_.clear();
    last_.clear();
    if (!pool_.fully_merged()) return std::string("drained pool is not fully merged");
    return pool_.check_invariants();
  }

  std::size_t live() const { return live_.size(); }
  // Cross-checks per-kind used counts against the shadow.
  std::optional<std::string> check_counts() const {
    std::array<std::uint64_t, Pool::kKinds> used{};
    for (auto& [off, e] : live_) ++used[e.page.kind];
    if (used != pool_.stats().used_pages) return std::string("used page counts disagree with the shadow");
    return std::nullopt;
  }

 private:
  struct Entry {
    std::uint64_t end;
    PageHandle page;
    OwnerId owner;
  };

  std::optional<std::string> add(PageHandle p, OwnerId owner) {
    const std::uint64_t begin = pool_.offset_of(p);
    const std::uint64_t end = begin + pool_.page_bytes(p.kind);
    if (end > pool_.large_page_bytes() * pool_.large_page_count())
      return std::string("page outside the arena");
    auto it = live_.upper_bound(begin);
    if (it != live_.end() && it->first < end)
      return "page overlaps an owned page at offset " + std::to_string(begin);
    if (it != live_.begin() && std::prev(it)->second.end > begin)
      return "page overlaps an owned page at offset " + std::to_string(begin);
    if (pool_.owner_of(p) != owner) return std::string("owner_of disagrees");
    live_.emplace(begin, Entry{end, p, owner});
    keys_.push_back(begin);
    last_[owner] = p;
    return std::nullopt;
  }

  Pool& pool_;
  std::map<std::uint64_t, Entry> live_;  // begin offset -> interval
  std::vector<std::uint64_t> keys_;      // live_'s keys, for picking a random page in O(1)
  std::map<OwnerId, PageHandle> last_;
};

}  // namespace amoeba::testing
