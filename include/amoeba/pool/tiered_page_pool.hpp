// TieredPagePool: one byte arena shared by expert weights, SSM state, KV cache and conv state (DESIGN §3.1).
//
// Three tiers:
//   large  = lcm of the middle page sizes; the global pool hands out whole large pages;
//   middle = expert pages (one weight matrix of one expert) and SSM-state pages, cut from a large page;
//   small  = KV and conv-state pages, cut from an expert page (the "carrier", the first middle kind listed).
// Allocation splits downward on demand: a small page comes from a free small slot; otherwise a free expert
// page is split; otherwise a large page is cut into expert pages and one of those is split. A large page is
// never cut straight into small pages. Freeing merges upward: an expert page whose small pages are all free
// is whole again; a large page whose middle pages are all free returns to the global pool.
//
// Request affinity: `allocate(kind, owner, near)` takes a page of the same carrier as `near` (typically the
// request's previous KV page) when one is free, so a request's pages are freed together and their expert page
// heals. Without a usable hint the order is: a partly used carrier that is "open" (its first owner has
// started to free pages), then a fresh carrier split for this owner ("claimed"), then a slot in a carrier
// claimed by someone else. Free small pages inside partly used expert pages are "trapped" (usable by small
// pages only).
//
// The pool is bookkeeping over offsets: it never touches the arena's bytes, so the arena may be host memory
// (tests, simulator) or device memory owned elsewhere (a base pointer and a byte size). Every operation is
// O(1) except cutting/merging a large page (O(middle pages per large page)) and check_invariants()
// (O(pages)). A shortfall is a value (Expected<..., Shortfall>); a failed call changes nothing. Bad
// configuration throws ConfigError naming the field, the value and the rule.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "amoeba/core/errors.hpp"
#include "amoeba/core/expected.hpp"
#include "amoeba/pool/arena.hpp"
#include "amoeba/pool/page_kinds.hpp"

namespace amoeba {

// Why an allocation failed. kExhausted: no free bytes the kind could use; kFragmented: enough free bytes
// exist but only as pages of other kinds or trapped small pages (e.g. an expert page asked for while the free
// space is KV slots inside partly used expert pages).
enum class ShortfallReason : std::uint8_t { kExhausted, kFragmented, kInvalidOwner };

struct Shortfall {
  ShortfallReason reason = ShortfallReason::kExhausted;
  std::uint64_t requested_pages = 0;
  std::uint64_t available_pages = 0;  // pages of that kind that could have been handed out
};

// Result of operations on an existing page.
enum class PageStatus : std::uint8_t { kOk, kOutOfRange, kNotOwned, kBadValue };

constexpr std::string_view to_string(PageStatus s) noexcept {
  switch (s) {
    case PageStatus::kOk:
      return "ok";
    case PageStatus::kOutOfRange:
      return "page index out of range";
    case PageStatus::kNotOwned:
      return "page is not currently handed out";
    case PageStatus::kBadValue:
      return "value out of range";
  }
  return "?";
}

// Byte size of one page kind. payload_bytes <= bytes is what the data needs (0 means "all of it"); the rest
// is padding that a page size rounded up to a divisor of its parent costs (see smallest_divisor_at_least).
struct PageSpec {
  std::uint64_t bytes = 0;
  std::uint64_t payload_bytes = 0;
  constexpr std::uint64_t payload() const noexcept { return payload_bytes == 0 ? bytes : payload_bytes; }
};

// The smallest divisor of `parent` that is >= `size` and a multiple of `align`: how a small page that divides
// no expert page (DeepSeek-V2-Lite's MLA latent, 18,432 B per 16 tokens) is rounded up. Returns 0 if none
// exists.
constexpr std::uint64_t smallest_divisor_at_least(std::uint64_t parent, std::uint64_t size,
                                                  std::uint64_t align = 16) noexcept {
  if (parent == 0 || size == 0 || align == 0) return 0;
  for (std::uint64_t d = (size + align - 1) / align * align; d <= parent; d += align)
    if (parent % d == 0) return d;
  return 0;
}

template <page_kind... Kinds>
class TieredPagePool {
 public:
  static constexpr std::size_t kKinds = sizeof...(Kinds);
  static_assert(kKinds > 0 && kKinds < 255, "TieredPagePool needs between 1 and 254 page kinds");

 private:
  static constexpr std::array<Tier, kKinds> kTiers{Kinds::tier...};
  static constexpr std::array<std::string_view, kKinds> kNames{Kinds::name...};
  static constexpr std::size_t first_middle() {
    for (std::size_t i = 0; i < kKinds; ++i)
      if (kTiers[i] == Tier::kMiddle) return i;
    return kKinds;
  }
  template <class K, class... Ks>
  static constexpr std::size_t count_of() {
    return (std::size_t{0} + ... + std::size_t(std::is_same_v<K, Ks>));
  }

 public:
  static_assert(first_middle() < kKinds, "TieredPagePool needs at least one middle-tier kind (ExpertPage)");
  static_assert(((count_of<Kinds, Kinds...>() == 1) && ...), "each page kind may be listed once");

  // Index of kind K in Kinds... (compile time).
  template <class K>
  static constexpr std::uint8_t kind_index = [] {
    static_assert(count_of<K, Kinds...>() == 1, "kind is not managed by this pool");
    constexpr bool same[] = {std::is_same_v<K, Kinds>...};
    std::uint8_t i = 0;
    while (!same[i]) ++i;
    return i;
  }();
  // The middle kind small pages are cut from (the first middle kind listed; ExpertPage by convention).
  static constexpr std::uint8_t kCarrier = static_cast<std::uint8_t>(first_middle());

  static constexpr Tier tier_of(std::size_t kind) noexcept { return kTiers[kind]; }
  static constexpr std::string_view name_of(std::size_t kind) noexcept { return kNames[kind]; }

  using Layout = std::array<PageSpec, kKinds>;

  struct Stats {
    std::uint64_t arena_bytes = 0;
    std::uint64_t large_page_bytes = 0;
    std::uint64_t unused_tail_bytes = 0;  // arena bytes past the last whole large page
    std::uint32_t large_pages_total = 0;
    std::uint32_t large_pages_free = 0;
    std::uint32_t large_pages_in_use = 0;
    std::array<std::uint64_t, kKinds>
        free_pages{};  // already cut and free (middle: whole free pages; small: slots)
    std::array<std::uint64_t, kKinds> used_pages{};  // handed out
    std::array<std::uint64_t, kKinds>
        available_pages{};  // what allocate() could hand out now, splits included
    std::array<std::uint64_t, kKinds> tail_waste_bytes{};  // payload bytes not used (set_used_bytes)
    std::array<std::uint64_t, kKinds> padding_bytes{};     // (bytes - payload) over handed-out pages
    std::uint64_t trapped_bytes = 0;                       // free small pages inside partly used expert pages
    bool fully_merged = false;

    template <class K>
    std::uint64_t free_of() const {
      return free_pages[kind_index<K>];
    }
    template <class K>
    std::uint64_t used_of() const {
      return used_pages[kind_index<K>];
    }
    template <class K>
    std::uint64_t available_of() const {
      return available_pages[kind_index<K>];
    }
    template <class K>
    std::uint64_t tail_waste_of() const {
      return tail_waste_bytes[kind_index<K>];
    }
    template <class K>
    std::uint64_t padding_of() const {
      return padding_bytes[kind_index<K>];
    }
  };

  // Validates the layout against the arena (throws ConfigError) and sets up the bookkeeping. `arena.base` may
  // be null for pure bookkeeping (simulator); views then cannot be made.
  TieredPagePool(ArenaSpan arena, const Layout& layout) : arena_(arena), layout_(layout) {
    validate(arena, layout);
    large_bytes_ = large_page_bytes(layout);
    large_count_ = static_cast<std::uint32_t>(arena.bytes / large_bytes_);
    large_mode_.assign(large_count_, kLargeFree);
    large_used_.assign(large_count_, 0);
    large_free_bits_.assign((large_count_ + 63) / 64, 0);
    for (std::uint32_t l = 0; l < large_count_; ++l) push_large(l);
    const std::uint64_t usable = std::uint64_t(large_count_) * large_bytes_;
    for (std::size_t k = 0; k < kKinds; ++k) {
      Kind& d = kinds_[k];
      d.bytes = layout[k].bytes;
      d.payload = layout[k].payload();
      d.count = static_cast<std::uint32_t>(usable / d.bytes);
      d.owner.assign(d.count, kFreeOwner);
      d.used_bytes.assign(d.count, 0);
      if (kTiers[k] == Tier::kMiddle) {
        d.per_large = static_cast<std::uint32_t>(large_bytes_ / d.bytes);
        d.state.assign(d.count, kAbsent);
        d.prev.assign(d.count, kNil);
        d.next.assign(d.count, kNil);
      } else {
        d.per_carrier = static_cast<std::uint32_t>(layout[kCarrier].bytes / d.bytes);
        d.slot_next.assign(d.count, kNil);
      }
    }
    carriers_.assign(kinds_[kCarrier].count, Carrier{});
  }

  TieredPagePool(const TieredPagePool&) = delete;
  TieredPagePool& operator=(const TieredPagePool&) = delete;
  TieredPagePool(TieredPagePool&&) noexcept = default;
  TieredPagePool& operator=(TieredPagePool&&) noexcept = default;

  // Throws ConfigError if `layout` cannot manage `arena`. Rules, one per check:
  //   pool.<kind>.page_bytes > 0, a multiple of 16 (vector loads), payload <= page_bytes;
  //   every small page divides the carrier (expert) page it is cut from;
  //   arena.bytes holds at least one large page; arena.base is 256-byte aligned; page indices fit 32 bits.
  static void validate(ArenaSpan arena, const Layout& layout) {
    for (std::size_t k = 0; k < kKinds; ++k) {
      const std::string f = "pool." + std::string(kNames[k]);
      if (layout[k].bytes == 0) throw_config_error(f + ".page_bytes", 0, "must be greater than zero");
      if (layout[k].bytes % 16 != 0)
        throw_config_error(f + ".page_bytes", layout[k].bytes, "must be a multiple of 16 bytes");
      if (layout[k].payload_bytes > layout[k].bytes)
        throw_config_error(f + ".payload_bytes", layout[k].payload_bytes,
                           "must not exceed page_bytes (" + std::to_string(layout[k].bytes) + ")");
    }
    const std::uint64_t carrier = layout[kCarrier].bytes;
    for (std::size_t k = 0; k < kKinds; ++k)
      if (kTiers[k] == Tier::kSmall && carrier % layout[k].bytes != 0)
        throw_config_error("pool." + std::string(kNames[k]) + ".page_bytes", layout[k].bytes,
                           "must divide the " + std::string(kNames[kCarrier]) + " page it is cut from (" +
                               std::to_string(carrier) +
                               " bytes); round it up with smallest_divisor_at_least");
    const std::uint64_t large = large_page_bytes(layout);
    if (large == 0)
      throw_config_error("pool.large_page_bytes", "lcm of middle pages",
                         "overflows 64 bits; middle pages too unlike");
    if (arena.bytes < large)
      throw_config_error("arena.bytes", arena.bytes,
                         "must hold at least one large page (" + std::to_string(large) + " bytes)");
    if (reinterpret_cast<std::uintptr_t>(arena.base) % 256 != 0)
      throw_config_error("arena.base", reinterpret_cast<std::uintptr_t>(arena.base),
                         "must be 256-byte aligned");
    for (std::size_t k = 0; k < kKinds; ++k)
      if (arena.bytes / layout[k].bytes >= kNil)
        throw_config_error("pool." + std::string(kNames[k]) + ".page_bytes", layout[k].bytes,
                           "gives more than 2^32-2 pages over arena.bytes = " + std::to_string(arena.bytes));
  }

  // lcm of the middle page sizes (0 if it overflows).
  static constexpr std::uint64_t large_page_bytes(const Layout& layout) noexcept {
    std::uint64_t l = 1;
    for (std::size_t k = 0; k < kKinds; ++k) {
      if (kTiers[k] != Tier::kMiddle || layout[k].bytes == 0) continue;
      const std::uint64_t g = std::gcd(l, layout[k].bytes);
      const std::uint64_t m = l / g;
      if (m > std::numeric_limits<std::uint64_t>::max() / layout[k].bytes) return 0;
      l = m * layout[k].bytes;
    }
    return l;
  }

  // ---- allocation
  // --------------------------------------------------------------------------------------------

  // One page of `kind` for `owner`. For small kinds, `near` (a page of the same kind, usually the requester's
  // previous one) makes the pool prefer a slot of the same carrier page.
  Expected<PageHandle, Shortfall> allocate(std::uint8_t kind, OwnerId owner,
                                           std::optional<PageHandle> near = std::nullopt) {
    assert(kind < kKinds);
    if (owner == kFreeOwner) return Unexpected{Shortfall{ShortfallReason::kInvalidOwner, 1, 0}};
    const std::uint32_t idx = kTiers[kind] == Tier::kMiddle ? take_middle(kind) : take_small(kind, near);
    if (idx == kNil) return Unexpected{shortfall(kind, 1)};
    hand_out(kind, idx, owner);
    return PageHandle{idx, kind};
  }
  template <class K>
  Expected<PageHandle, Shortfall> allocate(OwnerId owner, std::optional<PageHandle> near = std::nullopt) {
    return allocate(kind_index<K>, owner, near);
  }

  // n pages of `kind` for `owner`, all or nothing; appended to `out` on success. Small pages chain their
  // affinity (each next page prefers the previous page's carrier).
  std::optional<Shortfall> allocate_n(std::uint8_t kind, std::uint64_t n, OwnerId owner,
                                      std::vector<PageHandle>& out,
                                      std::optional<PageHandle> near = std::nullopt) {
    if (owner == kFreeOwner) return Shortfall{ShortfallReason::kInvalidOwner, n, 0};
    if (available(kind) < n) return shortfall(kind, n);
    if (out.capacity() < out.size() + n)
      out.reserve(std::max<std::size_t>(out.size() + n, 2 * out.capacity()));
    if (kTiers[kind] == Tier::kSmall) {  // fast path: fill one carrier at a time
      Kind& d = kinds_[kind];
      while (n > 0) {
        const std::uint32_t c = pick_carrier(kind, near);
        assert(c != kNil && "available() promised these pages");
        Carrier& cr = carriers_[c];
        const std::uint32_t take =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(n, d.per_carrier - cr.used));
        for (std::uint32_t i = 0; i < take; ++i) {
          const std::uint32_t idx = take_slot(d, cr, c);
          hand_out(kind, idx, owner);
          out.push_back(PageHandle{idx, kind});
        }
        n -= take;
        near = out.back();
      }
      return std::nullopt;
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      auto p = allocate(kind, owner, near);
      assert(p.has_value() && "available() promised these pages");
      near = *p;
      out.push_back(*p);
    }
    return std::nullopt;
  }
  template <class K>
  std::optional<Shortfall> allocate_n(std::uint64_t n, OwnerId owner, std::vector<PageHandle>& out,
                                      std::optional<PageHandle> near = std::nullopt) {
    return allocate_n(kind_index<K>, n, owner, out, near);
  }

  // n pages of middle kind `kind` for `owner` at adjacent addresses when such a run is free (the three
  // matrices of one expert side by side: the paged MoE kernel reads W1 and W3 in lockstep, and measured 1-3%
  // slower on the H200 when they sat far apart, docs/kernel.md), otherwise wherever allocate_n puts them. All
  // or nothing. Adjacent runs are found when the kind's page is the large page (models without SSM state).
  std::optional<Shortfall> allocate_adjacent(std::uint8_t kind, std::uint64_t n, OwnerId owner,
                                             std::vector<PageHandle>& out) {
    if (owner == kFreeOwner) return Shortfall{ShortfallReason::kInvalidOwner, n, 0};
    Kind& d = kinds_[kind];
    if (kTiers[kind] == Tier::kMiddle && d.per_large == 1 && n >= 1 && n <= 64) {
      if (const std::uint32_t start = find_large_run(static_cast<std::uint32_t>(n)); start != kNil) {
        for (std::uint32_t l = start; l < start + n; ++l) {
          take_large(l);
          large_mode_[l] = kind;
          large_used_[l] = 1;
          hand_out(kind, l, owner);  // per_large == 1: middle page index == large page index
          out.push_back(PageHandle{l, kind});
        }
        return std::nullopt;
      }
    }
    return allocate_n(kind, n, owner, out);
  }
  template <class K>
  std::optional<Shortfall> allocate_adjacent(std::uint64_t n, OwnerId owner, std::vector<PageHandle>& out) {
    return allocate_adjacent(kind_index<K>, n, owner, out);
  }

  // Returns a handed-out page. kNotOwned for a free page (double free) or one never handed out; nothing
  // changes.
  [[nodiscard]] PageStatus free(PageHandle p) {
    if (PageStatus s = check_owned(p); s != PageStatus::kOk) return s;
    Kind& d = kinds_[p.kind];
    d.tail_waste -= d.payload - d.used_bytes[p.index];
    d.owner[p.index] = kFreeOwner;
    --d.used;
    if (kTiers[p.kind] == Tier::kMiddle) {
      release_middle(p.kind, p.index);
    } else {
      release_small(p.kind, p.index);
    }
    return PageStatus::kOk;
  }

  // Hands a page to another owner (a reserved restore page becoming resident, say).
  [[nodiscard]] PageStatus set_owner(PageHandle p, OwnerId owner) {
    if (PageStatus s = check_owned(p); s != PageStatus::kOk) return s;
    if (owner == kFreeOwner) return PageStatus::kBadValue;
    kinds_[p.kind].owner[p.index] = owner;
    return PageStatus::kOk;
  }

  // Records how many payload bytes of a page hold data (a request's last KV page is partly filled): the rest
  // is counted as tail waste. Pages start full.
  [[nodiscard]] PageStatus set_used_bytes(PageHandle p, std::uint64_t bytes) {
    if (PageStatus s = check_owned(p); s != PageStatus::kOk) return s;
    Kind& d = kinds_[p.kind];
    if (bytes > d.payload) return PageStatus::kBadValue;
    d.tail_waste = d.tail_waste + (d.payload - bytes) - (d.payload - d.used_bytes[p.index]);
    d.used_bytes[p.index] = static_cast<std::uint32_t>(bytes);
    return PageStatus::kOk;
  }

  // ---- queries
  // -----------------------------------------------------------------------------------------------

  std::optional<OwnerId> owner_of(PageHandle p) const {
    if (p.kind >= kKinds || p.index >= kinds_[p.kind].count) return std::nullopt;
    const OwnerId o = kinds_[p.kind].owner[p.index];
    return o == kFreeOwner ? std::nullopt : std::optional<OwnerId>(o);
  }
  std::uint64_t offset_of(PageHandle p) const noexcept {
    return std::uint64_t(p.index) * kinds_[p.kind].bytes;
  }
  std::byte* address_of(PageHandle p) const noexcept { return arena_.base + offset_of(p); }

  // Pages of `kind` that allocate() could hand out now, splitting free parents as needed.
  std::uint64_t available(std::uint8_t kind) const noexcept {
    const Kind& d = kinds_[kind];
    const std::uint64_t free_large = large_free_count_;
    if (kTiers[kind] == Tier::kMiddle) return d.free_count + free_large * d.per_large;
    const Kind& c = kinds_[kCarrier];
    return d.free_small + (c.free_count + free_large * c.per_large) * d.per_carrier;
  }
  template <class K>
  std::uint64_t available() const noexcept {
    return available(kind_index<K>);
  }

  std::uint64_t page_bytes(std::uint8_t kind) const noexcept { return kinds_[kind].bytes; }
  template <class K>
  std::uint64_t page_bytes() const noexcept {
    return page_bytes(kind_index<K>);
  }
  std::uint32_t page_count(std::uint8_t kind) const noexcept { return kinds_[kind].count; }
  std::uint64_t large_page_bytes() const noexcept { return large_bytes_; }
  std::uint32_t large_page_count() const noexcept { return large_count_; }
  ArenaSpan arena() const noexcept { return arena_; }
  const Layout& layout() const noexcept { return layout_; }
  bool fully_merged() const noexcept { return large_free_count_ == large_count_; }

  Stats stats() const {
    Stats s;
    s.arena_bytes = arena_.bytes;
    s.large_page_bytes = large_bytes_;
    s.unused_tail_bytes = arena_.bytes - std::uint64_t(large_count_) * large_bytes_;
    s.large_pages_total = large_count_;
    s.large_pages_free = large_free_count_;
    s.large_pages_in_use = large_count_ - s.large_pages_free;
    for (std::size_t k = 0; k < kKinds; ++k) {
      const Kind& d = kinds_[k];
      s.free_pages[k] = kTiers[k] == Tier::kMiddle ? d.free_count : d.free_small;
      s.used_pages[k] = d.used;
      s.available_pages[k] = available(static_cast<std::uint8_t>(k));
      s.tail_waste_bytes[k] = d.tail_waste;
      s.padding_bytes[k] = std::uint64_t(d.used) * (d.bytes - d.payload);
      if (kTiers[k] == Tier::kSmall) s.trapped_bytes += d.free_small * d.bytes;
    }
    s.fully_merged = fully_merged();
    return s;
  }

  // Walks the whole structure; returns a description of the first broken invariant, or nothing. Checks: every
  // page is in exactly one state; no page is owned twice or owned under a parent that is not cut for its
  // kind; free lists hold exactly the free pages; counters match; no fully free parent is left unmerged.
  std::optional<std::string> check_invariants() const {
    auto fail = [](std::string what) { return std::optional<std::string>(std::move(what)); };
    std::uint32_t free_large = 0;
    for (std::uint32_t l = 0; l < large_count_; ++l) {
      free_large += is_large_free(l);
      if (is_large_free(l) != (large_mode_[l] == kLargeFree))
        return fail("large page " + std::to_string(l) + ": free-set membership disagrees with its mode");
      if (is_large_free(l) && l / 64 < large_hint_) return fail("large free hint skips a free page");
    }
    if (free_large != large_free_count_) return fail("large free count disagrees with the free set");
    if (large_count_ % 64 != 0 && (large_free_bits_.back() >> (large_count_ % 64)) != 0)
      return fail("free bit set past the last large page");
    for (std::size_t m = 0; m < kKinds; ++m) {
      if (kTiers[m] != Tier::kMiddle) continue;
      const Kind& d = kinds_[m];
      std::vector<std::uint8_t> listed(d.count, 0);
      std::uint64_t n = 0;
      for (std::uint32_t i = d.free_head, prev = kNil; i != kNil; prev = i, i = d.next[i]) {
        if (i >= d.count || listed[i] || d.prev[i] != prev)
          return fail(std::string(kNames[m]) + " free list broken");
        listed[i] = 1;
        if (++n > d.count) return fail(std::string(kNames[m]) + " free list loops");
      }
      if (n != d.free_count) return fail(std::string(kNames[m]) + " free_count disagrees with its free list");
      std::uint64_t used = 0;
      for (std::uint32_t i = 0; i < d.count; ++i) {
        const std::uint32_t l = large_of(m, i);
        const bool cut = large_mode_[l] == m;
        if (!cut && d.state[i] != kAbsent)
          return fail(std::string(kNames[m]) + " page under an uncut large page");
        if (cut && d.state[i] == kAbsent)
          return fail(std::string(kNames[m]) + " page missing in a cut large page");
        if (bool(listed[i]) != (d.state[i] == kFree))
          return fail(std::string(kNames[m]) + " free page not listed");
        if ((d.owner[i] != kFreeOwner) != (d.state[i] == kOwned))
          return fail(std::string(kNames[m]) + " page " + std::to_string(i) + ": owner disagrees with state");
        used += d.state[i] == kOwned;
        if (d.state[i] == kSplit && m != kCarrier) return fail("a non-carrier middle page is split");
      }
      if (used != d.used) return fail(std::string(kNames[m]) + " used count disagrees with owners");
    }
    for (std::uint32_t l = 0; l < large_count_; ++l) {
      if (large_mode_[l] == kLargeFree) continue;
      const Kind& d = kinds_[large_mode_[l]];
      std::uint32_t busy = 0;
      for (std::uint32_t i = l * d.per_large; i < (l + 1) * d.per_large; ++i) busy += d.state[i] != kFree;
      if (busy != large_used_[l]) return fail("large page " + std::to_string(l) + ": used count wrong");
      if (busy == 0) return fail("large page " + std::to_string(l) + " is all free but not merged");
    }
    const Kind& c = kinds_[kCarrier];
    for (std::size_t s = 0; s < kKinds; ++s) {
      if (kTiers[s] != Tier::kSmall) continue;
      const Kind& d = kinds_[s];
      std::uint64_t free_small = 0, used = 0, partial = 0;
      std::vector<std::uint8_t> in_partial(c.count, 0);
      for (int list = 0; list < 2; ++list)
        for (std::uint32_t ci = d.partial_head[list], prev = kNil; ci != kNil;
             prev = ci, ci = carriers_[ci].pnext) {
          if (ci >= c.count || in_partial[ci] || carriers_[ci].pprev != prev)
            return fail("partial list broken");
          if (carriers_[ci].claimed != bool(list)) return fail("carrier in the wrong partial list");
          in_partial[ci] = 1;
          if (++partial > c.count) return fail("partial list loops");
        }
      for (std::uint32_t ci = 0; ci < c.count; ++ci) {
        const Carrier& cr = carriers_[ci];
        const bool mine = c.state[ci] == kSplit && cr.split_kind == s;
        std::uint32_t owned = 0;
        for (std::uint32_t j = ci * d.per_carrier; j < (ci + 1) * d.per_carrier; ++j)
          owned += d.owner[j] != kFreeOwner;
        if (!mine) {
          if (owned) return fail(std::string(kNames[s]) + " page owned inside a carrier not split for it");
          if (in_partial[ci]) return fail("carrier in a partial list it was not split for");
          continue;
        }
        if (owned != cr.used || owned == 0)
          return fail("carrier " + std::to_string(ci) + ": used count wrong or 0");
        std::vector<std::uint8_t> listed(d.per_carrier, 0);
        std::uint32_t listed_n = 0;
        for (std::uint32_t j = cr.free_head; j != kNil; j = d.slot_next[j]) {
          const std::uint32_t slot = j - ci * d.per_carrier;
          if (slot >= cr.bump || listed[slot] || d.owner[j] != kFreeOwner)
            return fail("carrier free-slot list broken");
          listed[slot] = 1;
          ++listed_n;
        }
        if (listed_n + (d.per_carrier - cr.bump) != d.per_carrier - cr.used)
          return fail("carrier " + std::to_string(ci) + ": free slots miscounted");
        if (bool(in_partial[ci]) != (cr.used < d.per_carrier)) return fail("partial-list membership wrong");
        free_small += d.per_carrier - cr.used;
        used += owned;
      }
      if (free_small != d.free_small) return fail(std::string(kNames[s]) + " free_small counter wrong");
      if (used != d.used) return fail(std::string(kNames[s]) + " used counter wrong");
    }
    return std::nullopt;
  }

 private:
  static constexpr std::uint32_t kNil = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::uint8_t kLargeFree = 0xff;
  enum : std::uint8_t { kAbsent = 0, kFree = 1, kOwned = 2, kSplit = 3 };

  struct Kind {
    std::uint64_t bytes = 0, payload = 0;
    std::uint32_t count = 0;
    std::vector<OwnerId> owner;
    std::vector<std::uint32_t> used_bytes;
    std::uint64_t used = 0, tail_waste = 0;
    // middle kinds
    std::uint32_t per_large = 0;
    std::vector<std::uint8_t> state;
    std::vector<std::uint32_t> prev, next;
    std::uint32_t free_head = kNil;
    std::uint64_t free_count = 0;
    // small kinds
    std::uint32_t per_carrier = 0;
    std::vector<std::uint32_t> slot_next;
    std::uint32_t partial_head[2] = {kNil, kNil};  // carriers with free slots: [0] open, [1] claimed
    std::uint64_t free_small = 0;
  };
  struct Carrier {
    std::uint32_t used = 0, bump = 0, free_head = kNil, pprev = kNil, pnext = kNil;
    std::uint8_t split_kind = 0;
    bool claimed = false;  // split for one owner, who has not freed a page of it yet
  };

  std::uint32_t large_of(std::size_t middle, std::uint32_t i) const noexcept {
    return i / kinds_[middle].per_large;
  }

  PageStatus check_owned(PageHandle p) const noexcept {
    if (p.kind >= kKinds || p.index >= kinds_[p.kind].count) return PageStatus::kOutOfRange;
    if (kinds_[p.kind].owner[p.index] == kFreeOwner) return PageStatus::kNotOwned;
    return PageStatus::kOk;
  }

  Shortfall shortfall(std::uint8_t kind, std::uint64_t n) const noexcept {
    std::uint64_t free_bytes = std::uint64_t(large_free_count_) * large_bytes_;
    for (std::size_t k = 0; k < kKinds; ++k)
      free_bytes +=
          (kTiers[k] == Tier::kMiddle ? kinds_[k].free_count : kinds_[k].free_small) * kinds_[k].bytes;
    return Shortfall{free_bytes > 0 ? ShortfallReason::kFragmented : ShortfallReason::kExhausted, n,
                     available(kind)};
  }

  void hand_out(std::uint8_t kind, std::uint32_t idx, OwnerId owner) noexcept {
    Kind& d = kinds_[kind];
    d.owner[idx] = owner;
    d.used_bytes[idx] = static_cast<std::uint32_t>(d.payload);
    ++d.used;
    if (kTiers[kind] == Tier::kMiddle) d.state[idx] = kOwned;
  }

  // -- large tier
  bool is_large_free(std::uint32_t l) const noexcept { return (large_free_bits_[l / 64] >> (l % 64)) & 1; }
  void push_large(std::uint32_t l) noexcept {
    large_free_bits_[l / 64] |= std::uint64_t{1} << (l % 64);
    ++large_free_count_;
    if (l / 64 < large_hint_) large_hint_ = l / 64;
  }
  void take_large(std::uint32_t l) noexcept {
    large_free_bits_[l / 64] &= ~(std::uint64_t{1} << (l % 64));
    --large_free_count_;
  }
  std::uint32_t pop_large() noexcept {
    if (large_free_count_ == 0) return kNil;
    while (large_free_bits_[large_hint_] == 0) ++large_hint_;
    const std::uint32_t l =
        large_hint_ * 64 + static_cast<std::uint32_t>(std::countr_zero(large_free_bits_[large_hint_]));
    take_large(l);
    return l;
  }
  // First index of n adjacent free large pages (1 <= n <= 64) among the kRunSearchWords * 64 pages from the
  // lowest free one, or kNil. The window bounds the cost (a decision restores up to 5 experts per step).
  static constexpr std::uint32_t kRunSearchWords = 8;
  std::uint32_t find_large_run(std::uint32_t n) const noexcept {
    std::uint32_t carry = 0;  // free pages ending at the top of the previous word
    const std::size_t end = std::min<std::size_t>(large_free_bits_.size(), large_hint_ + kRunSearchWords);
    for (std::uint32_t w = large_hint_; w < end; ++w) {
      const std::uint64_t x = large_free_bits_[w];
      if (carry > 0 && carry + static_cast<std::uint32_t>(std::countr_one(x)) >= n) return w * 64 - carry;
      std::uint64_t m = x;
      for (std::uint32_t i = 1; i < n && m; ++i) m &= x >> i;
      if (m) return w * 64 + static_cast<std::uint32_t>(std::countr_zero(m));
      carry = x == ~std::uint64_t{0} ? carry + 64 : static_cast<std::uint32_t>(std::countl_one(x));
    }
    return kNil;
  }

  // -- middle tier
  void push_free(Kind& d, std::uint32_t i) noexcept {
    d.state[i] = kFree;
    d.prev[i] = kNil;
    d.next[i] = d.free_head;
    if (d.free_head != kNil) d.prev[d.free_head] = i;
    d.free_head = i;
    ++d.free_count;
  }
  void unlink_free(Kind& d, std::uint32_t i) noexcept {
    if (d.prev[i] != kNil)
      d.next[d.prev[i]] = d.next[i];
    else
      d.free_head = d.next[i];
    if (d.next[i] != kNil) d.prev[d.next[i]] = d.prev[i];
    d.prev[i] = d.next[i] = kNil;
    --d.free_count;
  }
  // Takes a free middle page of kind m (cutting a large page if none is free); its state is left for the
  // caller.
  std::uint32_t take_middle(std::size_t m) noexcept {
    Kind& d = kinds_[m];
    if (d.free_head == kNil) {
      const std::uint32_t l = pop_large();
      if (l == kNil) return kNil;
      large_mode_[l] = static_cast<std::uint8_t>(m);
      for (std::uint32_t i = (l + 1) * d.per_large; i-- > l * d.per_large;) push_free(d, i);
    }
    const std::uint32_t i = d.free_head;
    unlink_free(d, i);
    d.state[i] = kOwned;  // provisional; split carriers overwrite it
    ++large_used_[large_of(m, i)];
    return i;
  }
  void release_middle(std::size_t m, std::uint32_t i) noexcept {
    Kind& d = kinds_[m];
    push_free(d, i);
    const std::uint32_t l = large_of(m, i);
    if (--large_used_[l] != 0) return;
    for (std::uint32_t j = l * d.per_large; j < (l + 1) * d.per_large; ++j) {
      unlink_free(d, j);
      d.state[j] = kAbsent;
    }
    large_mode_[l] = kLargeFree;
    push_large(l);
  }

  // -- small tier
  void link_partial(Kind& d, std::uint32_t c) noexcept {
    Carrier& cr = carriers_[c];
    std::uint32_t& head = d.partial_head[cr.claimed];
    cr.pprev = kNil;
    cr.pnext = head;
    if (head != kNil) carriers_[head].pprev = c;
    head = c;
  }
  void unlink_partial(Kind& d, std::uint32_t c) noexcept {
    Carrier& cr = carriers_[c];
    if (cr.pprev != kNil)
      carriers_[cr.pprev].pnext = cr.pnext;
    else
      d.partial_head[cr.claimed] = cr.pnext;
    if (cr.pnext != kNil) carriers_[cr.pnext].pprev = cr.pprev;
    cr.pprev = cr.pnext = kNil;
  }
  std::uint32_t take_small(std::uint8_t s, std::optional<PageHandle> near) noexcept {
    const std::uint32_t c = pick_carrier(s, near);
    if (c == kNil) return kNil;
    return take_slot(kinds_[s], carriers_[c], c);
  }
  // The carrier the next small page of kind s comes from (splitting a fresh one if that is the choice), or
  // kNil.
  std::uint32_t pick_carrier(std::uint8_t s, std::optional<PageHandle> near) noexcept {
    Kind& d = kinds_[s];
    std::uint32_t c = kNil;
    if (near && near->kind == s && near->index < d.count) {  // affinity: same carrier as `near`
      const std::uint32_t nc = near->index / d.per_carrier;
      if (kinds_[kCarrier].state[nc] == kSplit && carriers_[nc].split_kind == s &&
          carriers_[nc].used < d.per_carrier)
        c = nc;
    }
    if (c == kNil) c = d.partial_head[0];  // trapped space nobody is growing into: usable by small pages only
    if (c == kNil) {
      c = take_middle(kCarrier);
      if (c != kNil) {
        kinds_[kCarrier].state[c] = kSplit;
        carriers_[c] = Carrier{0, 0, kNil, kNil, kNil, s, true};
        link_partial(d, c);
        d.free_small += d.per_carrier;
      }
    }
    if (c == kNil) c = d.partial_head[1];  // last resort: a slot of a carrier another owner claimed
    return c;
  }
  // Takes a free slot of carrier c (which has one); leaves the page's owner to the caller.
  std::uint32_t take_slot(Kind& d, Carrier& cr, std::uint32_t c) noexcept {
    std::uint32_t idx;
    if (cr.free_head != kNil) {
      idx = cr.free_head;
      cr.free_head = d.slot_next[idx];
    } else {
      idx = c * d.per_carrier + cr.bump++;
    }
    --d.free_small;
    if (++cr.used == d.per_carrier) unlink_partial(d, c);
    return idx;
  }
  void release_small(std::uint8_t s, std::uint32_t idx) noexcept {
    Kind& d = kinds_[s];
    const std::uint32_t c = idx / d.per_carrier;
    Carrier& cr = carriers_[c];
    if (cr.used < d.per_carrier) unlink_partial(d, c);
    cr.claimed = false;  // its owner has started to give pages back: open to others
    d.slot_next[idx] = cr.free_head;
    cr.free_head = idx;
    ++d.free_small;
    if (--cr.used != 0) {
      link_partial(d, c);
      return;
    }
    // every slot free: the expert page is whole again
    d.free_small -= d.per_carrier;
    cr = Carrier{};
    release_middle(kCarrier, c);
  }

  ArenaSpan arena_;
  Layout layout_;
  std::uint64_t large_bytes_ = 0;
  std::uint32_t large_count_ = 0;
  std::vector<std::uint8_t> large_mode_;   // kLargeFree or the middle kind it is cut into
  std::vector<std::uint32_t> large_used_;  // middle pages of it not free
  // Free large pages as a bit set, lowest address handed out first (so experts placed together sit together
  // and runs of adjacent pages can be found); no bit is set in the words below large_hint_.
  std::vector<std::uint64_t> large_free_bits_;
  std::uint32_t large_free_count_ = 0;
  std::uint32_t large_hint_ = 0;
  std::array<Kind, kKinds> kinds_{};
  std::vector<Carrier> carriers_;
};

// The pools of the models the project ships.
using MoePool = TieredPagePool<ExpertPage, KvPage>;
using HybridMoePool = TieredPagePool<ExpertPage, SsmPage, KvPage, ConvPage>;

}  // namespace amoeba
