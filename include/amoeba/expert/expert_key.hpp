// Names for experts and their pages: which (layer, expert) an entry is about, the three weight matrices of
// one expert (paper: each expert = 3 expert pages, W1 gate, W3 up, W2 down), and the owner ids the pool
// records for expert pages.
//
// Owner-id encoding (the pool stores an OwnerId per page and gives it no meaning):
//   bit 63            kExpertOwnerTag: set for every expert page; clear for request owners (plain request
//   ids) bit 62            kReservedBit: the page is reserved for a restore that has not been committed yet
//   bits 26..49       layer   (24 bits)
//   bits 2..25        expert  (24 bits)
//   bits 0..1         matrix  (0 = W1, 1 = W3, 2 = W2)
// Bits 50..61 are zero, so no expert owner equals kFreeOwner (all ones). Request ids must be below 2^63.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>

#include "amoeba/engine/expert_location.hpp"
#include "amoeba/pool/page_kinds.hpp"

namespace amoeba {

// One expert of one layer.
struct ExpertKey {
  std::uint32_t layer = 0;
  std::uint32_t expert = 0;
  friend constexpr bool operator==(ExpertKey, ExpertKey) = default;
  friend constexpr auto operator<=>(ExpertKey, ExpertKey) = default;
};

inline std::ostream& operator<<(std::ostream& os, ExpertKey k) {
  return os << "(layer " << k.layer << ", expert " << k.expert << ')';
}

// ExpertMatrix and kMatricesPerExpert come from amoeba/engine/expert_location.hpp (shared with the kernels).
inline constexpr std::array<ExpertMatrix, kMatricesPerExpert> kExpertMatrices{
    ExpertMatrix::kW1, ExpertMatrix::kW3, ExpertMatrix::kW2};

// The pages of one expert, indexed by ExpertMatrix.
struct ExpertPages {
  std::array<PageHandle, kMatricesPerExpert> pages{};
  constexpr PageHandle& operator[](ExpertMatrix m) noexcept { return pages[static_cast<std::size_t>(m)]; }
  constexpr const PageHandle& operator[](ExpertMatrix m) const noexcept {
    return pages[static_cast<std::size_t>(m)];
  }
  friend constexpr bool operator==(const ExpertPages&, const ExpertPages&) = default;
};

// ---- owner ids
inline constexpr OwnerId kExpertOwnerTag = OwnerId{1} << 63;
inline constexpr OwnerId kReservedBit = OwnerId{1} << 62;
inline constexpr std::uint32_t kMaxLayers = 1u << 24;           // layers must be below this
inline constexpr std::uint32_t kMaxExpertsPerLayer = 1u << 24;  // experts per layer must be below this
inline constexpr OwnerId kMaxRequestOwner = kExpertOwnerTag - 1;

// Owner id of one matrix page of an expert; `reserved` marks a page held for a pending restore.
constexpr OwnerId expert_owner(ExpertKey k, ExpertMatrix m, bool reserved = false) noexcept {
  return kExpertOwnerTag | (reserved ? kReservedBit : OwnerId{0}) |
         (OwnerId(k.layer & (kMaxLayers - 1)) << 26) | (OwnerId(k.expert & (kMaxExpertsPerLayer - 1)) << 2) |
         OwnerId(static_cast<std::uint8_t>(m));
}

// Owner id of a request's pages (KV, SSM, conv). Precondition: id <= kMaxRequestOwner.
constexpr OwnerId request_owner(std::uint64_t request_id) noexcept {
  return request_id;
}

constexpr bool is_expert_owner(OwnerId o) noexcept {
  return o != kFreeOwner && (o & kExpertOwnerTag) != 0;
}
constexpr bool is_request_owner(OwnerId o) noexcept {
  return (o & kExpertOwnerTag) == 0;
}

struct ExpertOwner {
  ExpertKey expert;
  ExpertMatrix matrix = ExpertMatrix::kW1;
  bool reserved = false;
  friend constexpr bool operator==(const ExpertOwner&, const ExpertOwner&) = default;
};

// Decodes an expert owner id; nothing for request owners, kFreeOwner and ids that no expert_owner() returns.
constexpr std::optional<ExpertOwner> decode_expert_owner(OwnerId o) noexcept {
  if (!is_expert_owner(o)) return std::nullopt;
  if ((o >> 50 & 0xfff) != 0 || (o & 3) == 3) return std::nullopt;
  ExpertOwner r;
  r.expert.layer = static_cast<std::uint32_t>(o >> 26 & (kMaxLayers - 1));
  r.expert.expert = static_cast<std::uint32_t>(o >> 2 & (kMaxExpertsPerLayer - 1));
  r.matrix = static_cast<ExpertMatrix>(o & 3);
  r.reserved = (o & kReservedBit) != 0;
  return r;
}

static_assert(decode_expert_owner(expert_owner({47, 127}, ExpertMatrix::kW2, true)) ==
              ExpertOwner{{47, 127}, ExpertMatrix::kW2, true});
static_assert(expert_owner({kMaxLayers - 1, kMaxExpertsPerLayer - 1}, ExpertMatrix::kW2, true) != kFreeOwner);
static_assert(!decode_expert_owner(request_owner(12345)).has_value());

}  // namespace amoeba
