// Compile-time checks of the pool's public types.
#include <type_traits>

#include "amoeba/core/bf16.hpp"
#include "amoeba/pool.hpp"

namespace {
using namespace amoeba;

struct NotAKind {};
struct LargeKind {  // the large tier is the pool's own: no kind may claim it
  static constexpr Tier tier = Tier::kLarge;
  static constexpr std::string_view name = "large";
};
static_assert(page_kind<ExpertPage> && page_kind<SsmPage> && page_kind<KvPage> && page_kind<ConvPage>);
static_assert(!page_kind<NotAKind>);
static_assert(!page_kind<LargeKind>);

static_assert(MoePool::kind_index<ExpertPage> == 0 && MoePool::kind_index<KvPage> == 1);
static_assert(HybridMoePool::kind_index<ConvPage> == 3);
static_assert(HybridMoePool::kCarrier == 0);
static_assert(TieredPagePool<KvPage, SsmPage>::kCarrier == 1);  // the first middle kind carries small pages

// Kernels receive views by value.
static_assert(std::is_trivially_copyable_v<ExpertMatrixView<bf16>>);
static_assert(std::is_trivially_copyable_v<KvPageView<bf16>>);
static_assert(std::is_trivially_copyable_v<PageHandle>);
static_assert(std::is_standard_layout_v<KvPageView<bf16>>);

// large page = lcm of middle pages
static_assert(HybridMoePool::large_page_bytes({PageSpec{98304}, PageSpec{65536}, PageSpec{4096},
                                               PageSpec{2048}}) == 196608);
static_assert(MoePool::large_page_bytes({PageSpec{5767168}, PageSpec{131072}}) == 5767168);
static_assert(smallest_divisor_at_least(5767168, 18432) == 22528);
}  // namespace
