// CPU tests of where the TMA grouped GEMM finds expert matrices in its tensor maps
// (kernels/moe/tensor_rows.hpp): the region a matrix lies in and its tensor row, for a pool with and without
// a load buffer on either side of it or inside it, against a shadow computation over randomized layouts; and
// which matrix strides keep every matrix on a tensor row (PagedMoe::config falls back to the two-block kernel
// otherwise).
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <utility>

#include "moe/quant_layout.hpp"
#include "moe/tensor_rows.hpp"

using amoeba::kernels::tensor_rows::locate;
using amoeba::kernels::tensor_rows::on_rows;

namespace {

constexpr int kH = 2048, kF = 1408;  // Qwen1.5-MoE
constexpr std::uintptr_t kStride = 2ull * kH * kF;

// The byte address the map would read for row 0 of the matrix.
std::uintptr_t address(const amoeba::kernels::tensor_rows::Location& at, std::uintptr_t r0, std::uintptr_t r1,
                       int k) {
  return (at.map == 0 ? r0 : r1) + static_cast<std::uintptr_t>(at.row) * 2 * static_cast<std::uintptr_t>(k);
}

}  // namespace

TEST_CASE("a pool alone: page p of the pool is tensor row p·stride / 2K of map 0", "[kernels][tensor_rows]") {
  const std::uintptr_t pool = 0x7f0000000000ull;
  for (long long page : {0LL, 1LL, 2LL, 4095LL, 100000LL})
    for (int k : {kH, kF}) {
      const std::uintptr_t m = pool + static_cast<std::uintptr_t>(page) * kStride;
      const auto at = locate(m, pool, 0, 2LL * k);
      CHECK(at.map == 0);
      CHECK(at.row == page * static_cast<long long>(kStride) / (2LL * k));
      CHECK(address(at, pool, 0, k) == m);
    }
}

TEST_CASE("pool and load buffer: each matrix is read through its own region's map",
          "[kernels][tensor_rows]") {
  const std::uintptr_t low = 0x7f0000000000ull, high = 0x7f8000000000ull;
  for (const bool buffer_above : {true, false}) {
    const std::uintptr_t pool = buffer_above ? low : high, buffer = buffer_above ? high : low;
    INFO("buffer " << (buffer_above ? "above" : "below") << " the pool");
    for (long long i : {0LL, 1LL, 7LL, 299LL}) {
      const std::uintptr_t in_pool = pool + static_cast<std::uintptr_t>(i) * kStride;
      const std::uintptr_t in_buffer =
          buffer + static_cast<std::uintptr_t>(3 * i + 2) * kStride;  // slot i, W2
      for (int k : {kH, kF}) {
        const auto p = locate(in_pool, pool, buffer, 2LL * k);
        const auto b = locate(in_buffer, pool, buffer, 2LL * k);
        CHECK(p.map == 0);
        CHECK(b.map == 1);
        CHECK(p.row == i * static_cast<long long>(kStride) / (2LL * k));
        CHECK(b.row == (3 * i + 2) * static_cast<long long>(kStride) / (2LL * k));
        CHECK(address(p, pool, buffer, k) == in_pool);
        CHECK(address(b, pool, buffer, k) == in_buffer);
      }
    }
  }
}

TEST_CASE("randomized layouts: the map's address is the matrix's whenever offsets are whole rows",
          "[kernels][tensor_rows]") {
  std::mt19937_64 rng(20261202);
  std::uniform_int_distribution<long long> pages(0, 1 << 20);
  for (int trial = 0; trial < 20000; ++trial) {
    const int k = trial % 2 == 0 ? kH : kF;
    const std::uintptr_t r0 = 0x7e0000000000ull + 256 * static_cast<std::uintptr_t>(pages(rng));
    // A buffer above, below or inside the first region (a buffer cut from the pool's own allocation), a whole
    // number of matrices away from it, or none.
    const int where = trial % 4;
    const std::uintptr_t r1 = where == 3   ? 0
                              : where == 0 ? r0 + static_cast<std::uintptr_t>(pages(rng) + 1) * kStride
                              : where == 1
                                  ? r0 - static_cast<std::uintptr_t>(pages(rng) + 1) * kStride
                                  : r0 + static_cast<std::uintptr_t>(pages(rng) % 1000 + 1) * kStride;
    const bool from_second = r1 != 0 && trial % 3 == 0;
    const std::uintptr_t base = from_second ? r1 : r0;
    const std::uintptr_t m = base + static_cast<std::uintptr_t>(pages(rng)) * kStride;
    const auto at = locate(m, r0, r1, 2LL * k);
    INFO("trial " << trial << " where " << where);
    REQUIRE(address(at, r0, r1, k) == m);
    // The region chosen is the highest base at or below the matrix (shadow rule).
    const bool second = r1 != 0 && m >= r1 && !(r0 <= m && r0 > r1);
    CHECK(at.map == (second ? 1 : 0));
  }
}

TEST_CASE("matrix strides that keep every matrix on a tensor row", "[kernels][tensor_rows]") {
  CHECK(on_rows(2LL * kH * kF, 2 * kH, 2 * kF));                // bf16 pages, tight
  CHECK(on_rows(4LL * kH * kF, 2 * kH, 2 * kF));                // padded by whole rows of both
  CHECK_FALSE(on_rows(2LL * kH * kF + 16, 2 * kH, 2 * kF));     // padded off a row
  CHECK_FALSE(on_rows(2LL * kH * (kF + 128), 2 * kH, 2 * kF));  // a multiple of 2H, not of 2F
  CHECK(on_rows(2LL * 4096 * 14336, 2 * 4096, 2 * 14336));      // Mixtral
  CHECK_FALSE(on_rows(0, 2 * kH, 2 * kF));
  CHECK_FALSE(on_rows(2LL * kH * kF, 0, 2 * kF));
  static_assert(on_rows(2LL * 2048 * 768, 2 * 2048, 2 * 768));  // constexpr: Qwen3
}

TEST_CASE("packed int8 / int4 pages of the catalog's models start on rows of their packed pitch",
          "[kernels][tensor_rows]") {
  using namespace amoeba::kernels::quant;
  // (F, H): Qwen1.5-MoE, Qwen3-30B-A3B, Mixtral-8x7B. Weights N·K·bits/8 plus scales N·K/64 bytes: a whole
  // number of K·bits/8-byte rows whenever N is a multiple of 64.
  for (const auto& [f, h] : {std::pair{1408, 2048}, std::pair{768, 2048}, std::pair{14336, 4096}})
    for (const Bits bits : {Bits::kInt8, Bits::kInt4}) {
      const ExpertLayout l = expert_layout(f, h, bits);
      const long long page = static_cast<long long>(l.matrix_bytes());
      const long long up = static_cast<long long>(l.w13.row_bytes()),
                      down = static_cast<long long>(l.w2.row_bytes());
      INFO("F " << f << " H " << h << " int" << bit_count(bits));
      CHECK(on_rows(page, up, down));
      CHECK(on_rows(3 * page, up, down));         // a load-buffer slot's three matrices
      CHECK_FALSE(on_rows(page + 16, up, down));  // padded off a row (pages nesting KV pages)
    }
}
