// The decoder's fused operations against the unfused kernels they replace, on random bf16 data with the
// models' shapes:
//  - add_rms_norm_kernel vs add_kernel then rms_norm_kernel: the residual bit for bit; the norm within one
//    bf16 step where the float sum's other order lands on a rounding boundary (rare);
//  - argmax_rows (many blocks per row) vs argmax_kernel: the same index always, ties across the slices'
//    boundaries, rows of -inf and NaN entries included;
//  - router_topk over the fused router + shared gate GEMM's rows (ld = E + 1, the gate in column E) vs
//    router_topk and shared_gate on the split rows: bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "bf16_values.hpp"
#include "device_array.cuh"
#include "model/decoder_ops.cuh"
#include "model/router.cuh"

namespace {

using amoeba::bf16;
namespace dec = amoeba::kernels::decoder;
using amoeba::test::check_cuda;
using amoeba::test::Dev;
using amoeba::test::random_bf16;
using amoeba::test::ulps;

dec::bf16* dev(const Dev<bf16>& d, std::size_t at = 0) {
  return reinterpret_cast<dec::bf16*>(d.p + at);
}

}  // namespace

TEST_CASE("add_rms_norm: the residual add and RMSNorm of the unfused kernels in one pass",
          "[gpu][decoder][fused]") {
  for (const int dim : {512, 2048, 4096, 8192}) {
    const int rows = 33;
    INFO("dim " << dim);
    const auto x = random_bf16(std::size_t(rows) * dim, 3.0f, 1), y = random_bf16(x.size(), 2.0f, 2);
    const auto w = random_bf16(dim, 1.5f, 3);
    Dev<bf16> dx(x.size()), dx2(x.size()), dy(y.size()), dw(w.size()), dn(x.size()), dn2(x.size());
    dx.put(x);
    dx2.put(x);
    dy.put(y);
    dw.put(w);
    REQUIRE(dec::add_rms_norm_fits(dim, dx.p, dy.p, dw.p, dn.p));
    for (const bool add : {true, false}) {
      INFO("add " << add);
      if (add) {
        dec::add_kernel<<<132, 256>>>(dev(dx), dev(dy), std::int64_t(x.size()));
        dec::add_rms_norm_kernel<true>
            <<<rows, dec::kAddNormThreads>>>(dev(dx2), dev(dy), dev(dw), dev(dn2), dim, 1e-6f);
      } else {
        dec::add_rms_norm_kernel<false>
            <<<rows, dec::kAddNormThreads>>>(dev(dx2), nullptr, dev(dw), dev(dn2), dim, 1e-6f);
      }
      dec::rms_norm_kernel<<<rows, 256>>>(dev(dx), dev(dw), dev(dn), dim, 1e-6f);
      check_cuda(cudaDeviceSynchronize());
      const auto xa = dx.get(), xb = dx2.get(), na = dn.get(), nb = dn2.get();
      std::size_t off = 0;
      for (std::size_t i = 0; i < xa.size(); ++i) {
        REQUIRE(xa[i].bits == xb[i].bits);
        const int u = ulps(na[i], nb[i]);
        REQUIRE(u <= 1);
        off += u > 0;
      }
      CHECK(off <= xa.size() / 100);
    }
  }
  CHECK_FALSE(dec::add_rms_norm_fits(8200, nullptr, nullptr, nullptr, nullptr));
  CHECK_FALSE(dec::add_rms_norm_fits(2044, nullptr, nullptr, nullptr, nullptr));
}

TEST_CASE("argmax_rows: the same index as the one-block argmax, ties across slices, -inf and NaN",
          "[gpu][decoder][fused]") {
  for (const int vocab : {151936, 1000, 40}) {
    INFO("vocab " << vocab);
    const int rows = 12;
    auto logits = random_bf16(std::size_t(rows) * vocab, 4.0f, 7);
    const int per = (vocab + dec::kArgmaxChunks - 1) / dec::kArgmaxChunks;
    auto at = [&](int r, int i) -> bf16& { return logits[std::size_t(r) * vocab + i]; };
    // Row 0: a tie in two slices (the lower index must win); row 1: a tie inside one slice; row 2: the
    // maximum at the last element; row 3: all -inf; row 4: NaN everywhere but one value; row 5: NaNs and a
    // maximum after them; row 6: a tie at both sides of a slice boundary.
    at(0, std::min(vocab - 1, 3 * per + 1)) = bf16::from_float(9.0f);
    at(0, std::min(vocab - 1, per + 2)) = bf16::from_float(9.0f);
    at(1, 5) = bf16::from_float(9.0f);
    at(1, std::min(vocab - 1, 6)) = bf16::from_float(9.0f);
    at(2, vocab - 1) = bf16::from_float(9.0f);
    for (int i = 0; i < vocab; ++i) at(3, i) = bf16::from_float(-std::numeric_limits<float>::infinity());
    for (int i = 0; i < vocab; ++i) at(4, i) = bf16::from_float(std::numeric_limits<float>::quiet_NaN());
    at(4, vocab / 2) = bf16::from_float(-3.0f);
    for (int i = 0; i < vocab / 3; ++i) at(5, i) = bf16::from_float(std::numeric_limits<float>::quiet_NaN());
    at(5, vocab - 2) = bf16::from_float(9.5f);
    if (per < vocab) {
      at(6, per - 1) = bf16::from_float(9.0f);
      at(6, per) = bf16::from_float(9.0f);
    }
    Dev<bf16> dl(logits.size());
    Dev<std::int32_t> da(rows), db(rows);
    Dev<dec::ArgmaxPartial> ws(dec::argmax_workspace_bytes(rows) / sizeof(dec::ArgmaxPartial));
    dl.put(logits);
    dec::argmax_kernel<<<rows, 256>>>(dev(dl), vocab, da.p);
    check_cuda(dec::argmax_rows(dev(dl), rows, vocab, ws.p, db.p, nullptr));
    check_cuda(cudaDeviceSynchronize());
    const auto a = da.get(), b = db.get();
    CHECK(a == b);
    CHECK(b[3] == vocab);
    CHECK(b[4] == vocab / 2);
    CHECK(b[5] == vocab - 2);
  }
}

TEST_CASE("router_topk over the fused router + shared gate rows equals the split kernels",
          "[gpu][decoder][fused]") {
  for (const auto [E, k, renorm] : {std::tuple{60, 4, false}, std::tuple{128, 8, true}}) {
    INFO("E " << E << ", k " << k);
    const int T = 37, ld = E + 1;
    const auto fusedrows = random_bf16(std::size_t(T) * ld, 3.0f, 11);
    std::vector<bf16> split(std::size_t(T) * E), gate(T);
    for (int t = 0; t < T; ++t) {
      for (int e = 0; e < E; ++e) split[std::size_t(t) * E + e] = fusedrows[std::size_t(t) * ld + e];
      gate[t] = fusedrows[std::size_t(t) * ld + E];
    }
    Dev<bf16> df(fusedrows.size()), ds(split.size()), dg(gate.size());
    df.put(fusedrows);
    ds.put(split);
    dg.put(gate);
    Dev<std::int32_t> ia(std::size_t(T) * k), ib(std::size_t(T) * k);
    Dev<float> wa(std::size_t(T) * k), wb(std::size_t(T) * k), ga(T), gb(T), gc(T);
    REQUIRE(dec::router_topk(dev(ds), T, E, k, renorm, ia.p, wa.p, nullptr).ok);
    REQUIRE(dec::shared_gate(dev(dg), T, ga.p, nullptr).ok);
    REQUIRE(dec::router_topk(dev(df), T, E, ld, k, renorm, ib.p, wb.p, gb.p, nullptr).ok);
    REQUIRE(dec::shared_gate(dev(df), T, ld, E, gc.p, nullptr).ok);
    check_cuda(cudaDeviceSynchronize());
    CHECK(ia.get() == ib.get());
    CHECK(wa.get() == wb.get());
    CHECK(ga.get() == gb.get());
    CHECK(ga.get() == gc.get());
    CHECK_FALSE(dec::router_topk(dev(df), T, E, E, k, renorm, ib.p, wb.p, gb.p, nullptr).ok);
    CHECK_FALSE(dec::shared_gate(dev(df), T, E, E, gc.p, nullptr).ok);
  }
}
