// Page kinds of the unified pool and the tier each belongs to (DESIGN §3.1).
//
//   large  = lcm(expert page, SSM page)              -- the global pool's unit
//   middle = expert pages (one weight matrix of one expert) and SSM-state pages
//   small  = KV-cache pages and conv-state pages, cut from an expert page
//
// A pool instance names the kinds it manages as template parameters, e.g. TieredPagePool<ExpertPage, KvPage>
// for an attention-only MoE model and TieredPagePool<ExpertPage, SsmPage, KvPage, ConvPage> for a hybrid one.
// The tier structure is compile time; the byte sizes come from the model at run time.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

namespace amoeba {

enum class Tier : std::uint8_t { kLarge, kMiddle, kSmall };

// A page kind: a tag type with its tier and a name used in statistics and error messages.
template <class K>
concept page_kind = requires {
  { K::tier } -> std::convertible_to<Tier>;
  { K::name } -> std::convertible_to<std::string_view>;
}
&&(K::tier != Tier::kLarge);

struct ExpertPage {
  static constexpr Tier tier = Tier::kMiddle;
  static constexpr std::string_view name = "expert";
};
struct SsmPage {
  static constexpr Tier tier = Tier::kMiddle;
  static constexpr std::string_view name = "ssm";
};
struct KvPage {
  static constexpr Tier tier = Tier::kSmall;
  static constexpr std::string_view name = "kv";
};
struct ConvPage {
  static constexpr Tier tier = Tier::kSmall;
  static constexpr std::string_view name = "conv";
};
static_assert(page_kind<ExpertPage> && page_kind<SsmPage> && page_kind<KvPage> && page_kind<ConvPage>);

// Who holds a page. Request ids, (layer, expert, matrix) triples, reservations: the pool stores the value and
// reports it; it gives it no meaning. kFreeOwner is reserved.
using OwnerId = std::uint64_t;
inline constexpr OwnerId kFreeOwner = ~OwnerId{0};

// A page: its kind (index into the pool's kind list) and its index in units of that kind's page size, so that
// its byte offset in the arena is index * page_bytes(kind) -- the paper's B_P + p * f * d for expert pages.
struct PageHandle {
  std::uint32_t index = 0;
  std::uint8_t kind = 0;
  friend constexpr bool operator==(PageHandle, PageHandle) = default;
  friend constexpr auto operator<=>(PageHandle, PageHandle) = default;
};

}  // namespace amoeba
