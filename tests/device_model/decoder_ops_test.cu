// The decoder's small GPU operations against the host formulas the reference decoder is built from
// (engine/decoder_ops.hpp), on random bf16 data with the shapes of Qwen1.5-MoE and Qwen3-30B-A3B. Elementwise
// operations whose float math is the same on both sides must agree bit for bit; those that differ in a float
// reduction order (RMSNorm's sum of squares) or in a transcendental (cosf/sinf, expf: the device's differ
// from the host's by an ulp or two of float) may differ by one bf16 ulp in a small fraction of elements.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "bf16_values.hpp"
#include "device_array.cuh"
#include "engine/decoder_ops.hpp"
#include "model/decoder_ops.cuh"

namespace {

using namespace amoeba;
namespace dec = amoeba::kernels::decoder;
using amoeba::test::check_cuda;
using amoeba::test::Dev;
using amoeba::test::random_bf16;
using amoeba::test::ulps;

}  // namespace

TEST_CASE("RMSNorm, RoPE, SiLU x up, residual add, embedding and argmax match the host formulas",
          "[gpu][decoder]") {
  for (const auto [rows, dim, heads, head_dim] :
       {std::array<int, 4>{7, 2048, 16, 128}, {33, 2048, 32, 128}}) {
    INFO("rows " << rows << ", heads " << heads);
    // RMSNorm
    const auto x = random_bf16(std::size_t(rows) * dim, 3.0f, 1), w = random_bf16(dim, 1.5f, 2);
    Dev<bf16> dx(x.size()), dw(w.size()), dy(x.size());
    dx.put(x);
    dw.put(w);
    dec::rms_norm_kernel<<<rows, 256>>>(reinterpret_cast<const dec::bf16*>(dx.p),
                                        reinterpret_cast<const dec::bf16*>(dw.p),
                                        reinterpret_cast<dec::bf16*>(dy.p), dim, 1e-6f);
    check_cuda(cudaDeviceSynchronize());
    const auto y = dy.get();
    std::size_t off_by_one = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> xf(dim), yf(dim);
      for (int d = 0; d < dim; ++d) xf[d] = x[std::size_t(r) * dim + d].to_float();
      engine::ops::rms_norm_row(xf.data(), dim, w.data(), 1e-6, yf.data());
      for (int d = 0; d < dim; ++d) {
        const int u = ulps(y[std::size_t(r) * dim + d], bf16::from_float(yf[d]));
        REQUIRE(u <= 2);
        off_by_one += u > 0;
      }
    }
    CHECK(off_by_one <= std::size_t(rows) * dim / 50);  // at most 2% of elements one ulp apart
    // RoPE at positions 0 .. 4095
    const int tokens = rows;
    const auto q = random_bf16(std::size_t(tokens) * heads * head_dim, 2.0f, 3);
    std::vector<std::int32_t> pos(tokens);
    for (int t = 0; t < tokens; ++t) pos[t] = (t * 977) % 4096;
    std::vector<float> inv(head_dim / 2);
    for (int j = 0; j < head_dim / 2; ++j) inv[j] = engine::ops::rope_inv_freq(1e6, j, head_dim);
    Dev<bf16> dq(q.size());
    Dev<std::int32_t> dp(pos.size());
    Dev<float> di(inv.size());
    dq.put(q);
    dp.put(pos);
    di.put(inv);
    dec::rope_kernel<<<tokens, 256>>>(reinterpret_cast<dec::bf16*>(dq.p), dp.p, di.p, heads, head_dim);
    check_cuda(cudaDeviceSynchronize());
    const auto qr = dq.get();
    std::size_t rope_off = 0;
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        std::vector<float> src(head_dim), dst(head_dim);
        const std::size_t o = (std::size_t(t) * heads + h) * head_dim;
        for (int d = 0; d < head_dim; ++d) src[d] = q[o + d].to_float();
        engine::ops::rope_head(src.data(), head_dim, pos[t], inv.data(), dst.data());
        for (int d = 0; d < head_dim; ++d) {
          const int u = ulps(qr[o + d], bf16::from_float(dst[d]));
          REQUIRE(u <= 2);
          rope_off += u > 0;
        }
      }
    CHECK(rope_off <= q.size() / 50);
    // SiLU x up and the residual add
    const auto g = random_bf16(x.size(), 6.0f, 4), up = random_bf16(x.size(), 2.0f, 5);
    Dev<bf16> dg(g.size()), du(up.size()), dm(g.size());
    dg.put(g);
    du.put(up);
    dec::silu_mul_kernel<<<132, 256>>>(reinterpret_cast<const dec::bf16*>(dg.p),
                                       reinterpret_cast<const dec::bf16*>(du.p),
                                       reinterpret_cast<dec::bf16*>(dm.p), std::int64_t(g.size()));
    dec::add_kernel<<<132, 256>>>(reinterpret_cast<dec::bf16*>(dx.p),
                                  reinterpret_cast<const dec::bf16*>(du.p), std::int64_t(x.size()));
    check_cuda(cudaDeviceSynchronize());
    const auto m = dm.get(), xs = dx.get();
    std::size_t silu_off = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const int u = ulps(m[i], bf16::from_float(engine::ops::silu_mul(g[i].to_float(), up[i].to_float())));
      REQUIRE(u <= 2);
      silu_off += u > 0;
      REQUIRE(xs[i].bits == bf16::from_float(engine::ops::add(x[i].to_float(), up[i].to_float())).bits);
    }
    CHECK(silu_off <= g.size() / 50);
  }
}

TEST_CASE("embedding gather and argmax: exact, lowest index on a tie", "[gpu][decoder]") {
  const int vocab = 151936, dim = 64, rows = 9;
  auto logits = random_bf16(std::size_t(rows) * vocab, 4.0f, 9);
  // Plant maxima: row r's maximum at (r * 16411) % vocab, and in row 0 a tie at two places (the lower wins).
  std::vector<std::int32_t> expect(rows);
  for (int r = 0; r < rows; ++r) {
    expect[r] = (r * 16411 + 5) % vocab;
    logits[std::size_t(r) * vocab + expect[r]] = bf16::from_float(8.0f);
  }
  logits[std::size_t(0) * vocab + vocab - 1] = bf16::from_float(8.0f);
  logits[std::size_t(1) * vocab + 3] = bf16::from_float(8.0f);  // ties after and before the planted one
  expect[1] = std::min(expect[1], 3);
  Dev<bf16> dl(logits.size());
  Dev<std::int32_t> da(rows);
  dl.put(logits);
  dec::argmax_kernel<<<rows, 256>>>(reinterpret_cast<const dec::bf16*>(dl.p), vocab, da.p);
  const auto table = random_bf16(std::size_t(1000) * dim, 1.0f, 10);
  const std::vector<std::int32_t> ids{999, 0, 17, 17, 500};
  Dev<bf16> dt(table.size()), de(ids.size() * dim);
  Dev<std::int32_t> did(ids.size());
  dt.put(table);
  did.put(ids);
  dec::embed_kernel<<<int(ids.size()), 64>>>(reinterpret_cast<const dec::bf16*>(dt.p), did.p,
                                             reinterpret_cast<dec::bf16*>(de.p), dim);
  check_cuda(cudaDeviceSynchronize());
  CHECK(da.get() == expect);
  const auto e = de.get();
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (int d = 0; d < dim; ++d) REQUIRE(e[r * dim + d].bits == table[std::size_t(ids[r]) * dim + d].bits);
}
