// Bad configuration: one negative test per rule, each checking the field, the value and the rule in the
// message.
#include <catch2/catch.hpp>

#include <string>

#include "amoeba/pool.hpp"

using namespace amoeba;

namespace {
template <class Pool>
ConfigError error_of(ArenaSpan arena, typename Pool::Layout layout) {
  try {
    Pool::validate(arena, layout);
  } catch (const ConfigError& e) {
    return e;
  }
  FAIL("configuration was accepted");
  throw;  // unreachable
}
}  // namespace

TEST_CASE("zero page size", "[pool][config]") {
  auto e = error_of<MoePool>({nullptr, 1 << 20}, {PageSpec{65536}, PageSpec{0}});
  CHECK(e.field() == "pool.kv.page_bytes");
  CHECK(e.value() == "0");
  CHECK(std::string(e.what()).find("greater than zero") != std::string::npos);
}

TEST_CASE("page size not a multiple of 16", "[pool][config]") {
  auto e = error_of<MoePool>({nullptr, 1 << 20}, {PageSpec{65544 + 4}, PageSpec{4096}});
  CHECK(e.field() == "pool.expert.page_bytes");
  CHECK(e.value() == "65548");
  CHECK(e.rule().find("multiple of 16") != std::string::npos);
}

TEST_CASE("payload larger than the page", "[pool][config]") {
  auto e = error_of<MoePool>({nullptr, 1 << 20}, {PageSpec{65536}, PageSpec{4096, 5000}});
  CHECK(e.field() == "pool.kv.payload_bytes");
  CHECK(e.value() == "5000");
}

TEST_CASE("small page that does not divide the expert page", "[pool][config]") {
  // DeepSeek-V2-Lite: 16 tokens of a 576-value MLA latent = 18,432 B; expert page 2^19 * 11 B.
  constexpr std::uint64_t kExpert = 1408ull * 2048 * 2;
  auto e = error_of<MoePool>({nullptr, 4 * kExpert}, {PageSpec{kExpert}, PageSpec{18432}});
  CHECK(e.field() == "pool.kv.page_bytes");
  CHECK(e.value() == "18432");
  CHECK(e.rule().find("must divide the expert page") != std::string::npos);
  CHECK(e.rule().find("5767168") != std::string::npos);
  // The documented fix: round up to the smallest divisor and count the padding.
  const auto rounded = smallest_divisor_at_least(kExpert, 18432);
  CHECK(rounded == 22528);  // 11 * 2^11
  MoePool pool({nullptr, 4 * kExpert}, {PageSpec{kExpert}, PageSpec{rounded, 18432}});
  auto p = pool.allocate<KvPage>(1);
  REQUIRE(p.has_value());
  CHECK(pool.stats().padding_of<KvPage>() == 22528 - 18432);
}

TEST_CASE("arena smaller than one large page", "[pool][config]") {
  auto e = error_of<HybridMoePool>({nullptr, 100000},
                                   {PageSpec{98304}, PageSpec{65536}, PageSpec{4096}, PageSpec{2048}});
  CHECK(e.field() == "arena.bytes");
  CHECK(e.value() == "100000");
  CHECK(e.rule().find("196608") != std::string::npos);  // lcm(96 KiB, 64 KiB)
}

TEST_CASE("misaligned arena base", "[pool][config]") {
  alignas(256) static std::byte buf[8192 + 256];
  auto e = error_of<MoePool>({buf + 16, 8192}, {PageSpec{4096}, PageSpec{1024}});
  CHECK(e.field() == "arena.base");
  CHECK(e.rule().find("256-byte aligned") != std::string::npos);
}

TEST_CASE("too many pages for 32-bit indices", "[pool][config]") {
  auto e = error_of<MoePool>({nullptr, 1ull << 40}, {PageSpec{1 << 20}, PageSpec{16}});
  CHECK(e.field() == "pool.kv.page_bytes");
  CHECK(e.rule().find("2^32") != std::string::npos);
}

TEST_CASE("the constructor validates too", "[pool][config]") {
  CHECK_THROWS_AS(MoePool({nullptr, 1000}, {PageSpec{4096}, PageSpec{1024}}), ConfigError);
  CHECK_NOTHROW(MoePool({nullptr, 4096}, {PageSpec{4096}, PageSpec{1024}}));
}

TEST_CASE("smallest_divisor_at_least", "[pool][config]") {
  CHECK(smallest_divisor_at_least(4096, 1000) == 1024);
  CHECK(smallest_divisor_at_least(4096, 1024) == 1024);
  CHECK(smallest_divisor_at_least(4096, 5000) == 0);
  CHECK(smallest_divisor_at_least(48, 17, 16) == 48);
  CHECK(smallest_divisor_at_least(0, 17) == 0);
}
