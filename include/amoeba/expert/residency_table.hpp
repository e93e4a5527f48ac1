// ResidencyTable: which experts are resident on the GPU, on which three expert pages (W1, W3, W2), and which
// are offloaded to host memory. The adjuster reads it to decide; a device page table (expert -> page ids for
// the paged MoE kernel) is built from it; only committed changes (Adjuster::commit) modify it.
//
// Besides the per-expert entries it keeps, per layer, a bitmap of residency in *rank order* (the ranking it
// was built with; identity order when none), so that the boundary of a layer's resident prefix -- its hottest
// offloaded expert and its coldest resident one, which the paper's nominations need -- is found in O(E / 64)
// word operations instead of a scan over the experts.
//
// Every query is O(1) except the rank searches (O(E / 64)). Mutations are checked: a failed one changes
// nothing.
#pragma once

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_key.hpp"
#include "amoeba/expert/expert_ranker.hpp"

namespace amoeba {

class ResidencyTable {
 public:
  // Rank order = expert-id order. Every expert starts offloaded.
  ResidencyTable(std::uint32_t layers, std::uint32_t experts_per_layer)
      : ResidencyTable(ExpertRanker::uniform(layers, experts_per_layer)) {}
  // Rank order taken from `ranker` (copied; the table does not keep a reference).
  explicit ResidencyTable(const ExpertRanker& ranker)
      : layers_(ranker.layers()), experts_(ranker.experts_per_layer()), words_((experts_ + 63) / 64) {
    const std::size_t n = std::size_t(layers_) * experts_;
    resident_.assign(n, 0);
    pages_.assign(n, ExpertPages{});
    rank_.resize(n);
    order_.resize(n);
    for (std::uint32_t l = 0; l < layers_; ++l)
      for (std::uint32_t r = 0; r < experts_; ++r) {
        const std::uint32_t e = ranker.expert_at(l, r);
        order_[std::size_t(l) * experts_ + r] = e;
        rank_[std::size_t(l) * experts_ + e] = r;
      }
    by_rank_.assign(std::size_t(layers_) * words_, 0);
    count_.assign(layers_, 0);
  }

  std::uint32_t layers() const noexcept { return layers_; }
  std::uint32_t experts_per_layer() const noexcept { return experts_; }
  bool contains(ExpertKey k) const noexcept { return k.layer < layers_ && k.expert < experts_; }

  // Precondition for the queries below: contains(k).
  bool is_resident(ExpertKey k) const noexcept { return resident_[idx(k)] != 0; }
  // The pages of a resident expert; nothing for an offloaded one.
  std::optional<ExpertPages> pages_of(ExpertKey k) const noexcept {
    if (!is_resident(k)) return std::nullopt;
    return pages_[idx(k)];
  }
  std::uint32_t resident_count(std::uint32_t layer) const noexcept { return count_[layer]; }
  std::uint32_t offloaded_count(std::uint32_t layer) const noexcept { return experts_ - count_[layer]; }
  std::uint64_t resident_total() const noexcept { return total_; }
  // Increases on every successful mutation (a device page table built at version v is stale when it differs).
  std::uint64_t version() const noexcept { return version_; }

  // ---- rank order (the ranking given at construction)
  std::uint32_t rank_of(ExpertKey k) const noexcept { return rank_[idx(k)]; }
  std::uint32_t expert_at_rank(std::uint32_t layer, std::uint32_t rank) const noexcept {
    return order_[std::size_t(layer) * experts_ + rank];
  }
  // The hottest offloaded expert of `layer` with rank >= from_rank, as a rank. O(E / 64).
  std::optional<std::uint32_t> first_offloaded_rank(std::uint32_t layer, std::uint32_t from_rank = 0) const {
    const std::uint64_t* w = &by_rank_[std::size_t(layer) * words_];
    for (std::uint32_t i = from_rank / 64; i < words_ && from_rank < experts_; ++i) {
      std::uint64_t free_bits = ~w[i];
      if (i == from_rank / 64) free_bits &= ~std::uint64_t{0} << (from_rank % 64);
      if (free_bits != 0) {
        const std::uint32_t r = i * 64 + static_cast<std::uint32_t>(std::countr_zero(free_bits));
        return r < experts_ ? std::optional<std::uint32_t>(r) : std::nullopt;
      }
    }
    return std::nullopt;
  }
  // The coldest resident expert of `layer` with rank < below_rank, as a rank. O(E / 64).
  std::optional<std::uint32_t> last_resident_rank(std::uint32_t layer,
                                                  std::uint32_t below_rank = ~std::uint32_t{0}) const {
    if (below_rank > experts_) below_rank = experts_;
    const std::uint64_t* w = &by_rank_[std::size_t(layer) * words_];
    for (std::uint32_t i = (below_rank + 63) / 64; i-- > 0;) {
      std::uint64_t bits = w[i];
      const std::uint32_t top = below_rank - i * 64;  // bits at positions >= top are excluded
      if (top < 64) bits &= (std::uint64_t{1} << top) - 1;
      if (bits != 0) return i * 64 + 63 - static_cast<std::uint32_t>(std::countl_zero(bits));
    }
    return std::nullopt;
  }

  // ---- mutations (used by the adjuster's commit and by initial placement)
  // Marks `k` resident on `pages`. False (nothing changes) if k is out of range or already resident.
  [[nodiscard]] bool mark_resident(ExpertKey k, const ExpertPages& pages) {
    if (!contains(k) || is_resident(k)) return false;
    resident_[idx(k)] = 1;
    pages_[idx(k)] = pages;
    set_bit(k, true);
    ++count_[k.layer];
    ++total_;
    ++version_;
    return true;
  }
  // Marks `k` offloaded and returns the pages it held; nothing (and no change) if it was not resident.
  std::optional<ExpertPages> mark_offloaded(ExpertKey k) {
    if (!contains(k) || !is_resident(k)) return std::nullopt;
    resident_[idx(k)] = 0;
    const ExpertPages p = pages_[idx(k)];
    pages_[idx(k)] = ExpertPages{};
    set_bit(k, false);
    --count_[k.layer];
    --total_;
    ++version_;
    return p;
  }

  // Calls f(ExpertKey, const ExpertPages&) for every resident expert, layer by layer, in expert-id order.
  template <class F>
  void for_each_resident(F&& f) const {
    for (std::uint32_t l = 0; l < layers_; ++l)
      for (std::uint32_t e = 0; e < experts_; ++e)
        if (resident_[std::size_t(l) * experts_ + e])
          f(ExpertKey{l, e}, pages_[std::size_t(l) * experts_ + e]);
  }

 private:
  std::size_t idx(ExpertKey k) const noexcept {
    assert(contains(k));
    return std::size_t(k.layer) * experts_ + k.expert;
  }
  void set_bit(ExpertKey k, bool on) noexcept {
    const std::uint32_t r = rank_[idx(k)];
    std::uint64_t& w = by_rank_[std::size_t(k.layer) * words_ + r / 64];
    const std::uint64_t bit = std::uint64_t{1} << (r % 64);
    w = on ? (w | bit) : (w & ~bit);
  }

  std::uint32_t layers_ = 0, experts_ = 0, words_ = 0;
  std::vector<std::uint8_t> resident_;
  std::vector<ExpertPages> pages_;
  std::vector<std::uint32_t> rank_, order_;
  std::vector<std::uint64_t> by_rank_;
  std::vector<std::uint32_t> count_;
  std::uint64_t total_ = 0, version_ = 0;
};

}  // namespace amoeba
