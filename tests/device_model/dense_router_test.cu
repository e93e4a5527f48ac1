// The decoder's dense GEMM (model/dense_gemm.cuh), router, shared gate and row gather (model/router.cuh) on
// random bf16 data with the shapes of Qwen1.5-MoE and Qwen3-30B-A3B.
//  - GEMM: against the host reference's `linear` (double accumulation, bias added, one rounding). Float32
//    accumulation agrees within one bf16 ulp except where cancellation leaves a result far smaller than its
//    terms; those elements must still lie within the float32 accumulation bound, and must stay rare.
//  - Router: against a host model of the kernel that sums in the kernel's order, so the probabilities differ
//    only through expf vs std::exp. Logits keep |l| >= 1/64, so distinct bf16 logits differ in probability
//    by far more than that and the picks must agree exactly; equal logits tie exactly on both sides.
//  - Argument checks return a Status before anything is launched: those cases need no GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16_values.hpp"
#include "device_array.cuh"
#include "engine/decoder_ops.hpp"
#include "model/dense_gemm.cuh"
#include "model/router.cuh"

namespace {

using amoeba::bf16;
using amoeba::kernels::Status;
namespace dec = amoeba::kernels::decoder;
using amoeba::test::check_cuda;
using amoeba::test::Dev;
using amoeba::test::random_bf16;
using amoeba::test::ulps;
namespace ops = amoeba::engine::ops;

dec::bf16* dev(const Dev<bf16>& d, std::size_t at = 0) {
  return reinterpret_cast<dec::bf16*>(d.p + at);
}

// The spacing of bf16 values at v (8 significant bits).
double bf16_ulp(double v) {
  if (v == 0 || std::fabs(v) < 0x1p-126) return 0x1p-133;
  return std::ldexp(1.0, std::ilogb(v) - 7);
}

// ---- GEMM reference

// dot[m][n] = sum_k x[m][k] w[n][k] in double (bf16 products are exact in double; four partial sums only
// change the last bits of a double).
std::vector<double> reference_dot(const std::vector<bf16>& x, const std::vector<bf16>& w, int M, int N,
                                  int K) {
  std::vector<double> xd(std::size_t(M) * K), wd(std::size_t(N) * K);
  for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = x[i].to_float();
  for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = w[i].to_float();
  std::vector<double> dot(std::size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const double* a = &xd[std::size_t(m) * K];
      const double* b = &wd[std::size_t(n) * K];
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int k = 0; k < K; k += 4) {
        s0 += a[k] * b[k];
        s1 += a[k + 1] * b[k + 1];
        s2 += a[k + 2] * b[k + 2];
        s3 += a[k + 3] * b[k + 3];
      }
      dot[std::size_t(m) * N + n] = (s0 + s1) + (s2 + s3);
    }
  return dot;
}

struct GemmErrors {
  int max_ulps = 0;
  std::size_t one_ulp = 0;  // elements one ulp from the reference's rounding
  std::size_t beyond = 0;   // further, but within the float32 accumulation bound (cancellation)
  std::string first_bad;    // an element outside both: the test fails
};

// y [M][N] from the GPU against bf16(dot + bias) as the reference's `linear` rounds it.
GemmErrors compare_gemm(const std::vector<bf16>& y, const std::vector<double>& dot,
                        const std::vector<bf16>& x, const std::vector<bf16>& w, const std::vector<bf16>* bias,
                        int M, int N, int K) {
  GemmErrors e;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const std::size_t i = std::size_t(m) * N + n;
      double want = dot[i];
      if (bias != nullptr) want += (*bias)[n].to_float();
      const bf16 ref = bf16::from_float(ops::round_bf16(want));
      const bf16 got = y[i];
      const int u = ulps(got, ref);
      e.max_ulps = std::max(e.max_ulps, u);
      if (u <= 1) {
        e.one_ulp += u == 1;
        continue;
      }
      // Float32 accumulation (tensor-core products are exact, sums rounded) errs by a small multiple of
      // 2^-24 * sum |x w|; 2^-17 leaves room for K up to a few thousand. A wrong layout or bias errs by
      // about sum |x w| / sqrt(K), far beyond it.
      double sum_abs = bias != nullptr ? std::fabs((*bias)[n].to_float()) : 0.0;
      for (int k = 0; k < K; ++k)
        sum_abs +=
            std::fabs(double(x[std::size_t(m) * K + k].to_float()) * w[std::size_t(n) * K + k].to_float());
      const double g = got.to_float();
      const double tol = 0.5 * std::max(bf16_ulp(g), bf16_ulp(want)) + 0x1p-17 * sum_abs;
      if (std::isfinite(g) && std::fabs(g - want) <= tol) {
        ++e.beyond;
      } else if (e.first_bad.empty()) {
        e.first_bad = "y[" + std::to_string(m) + "][" + std::to_string(n) + "] = " + std::to_string(g) +
                      ", reference " + std::to_string(want) + " (" + std::to_string(u) + " ulps)";
      }
    }
  return e;
}

// Random operands of y[M][N] = x[M][K] · w[N][K]^T + b for M up to max_m, on the host and the device, and
// their exact dot products.
struct GemmOperands {
  std::vector<bf16> x, w, b;
  std::vector<double> dot;
  Dev<bf16> dx, dw, db, dy;
  GemmOperands(int max_m, int K, int N, std::uint64_t seed)
      : x(random_bf16(std::size_t(max_m) * K, 2.0f, seed)),
        w(random_bf16(std::size_t(N) * K, 0.1f, seed + 1)),
        b(random_bf16(std::size_t(N), 1.0f, seed + 2)),
        dot(reference_dot(x, w, max_m, N, K)),
        dx(x.size()),
        dw(w.size()),
        db(b.size()),
        dy(std::size_t(max_m) * N) {
    dx.put(x);
    dw.put(w);
    db.put(b);
  }
};

// ---- Router model

struct Routing {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

// router_topk_kernel's arithmetic on the host: max, exp(l - max), the sum in the kernel's order (lane l sums
// experts l, l + 32, ... in order; then an xor butterfly over the 32 lane sums), p = e / z, a stable sort by
// p descending, the top-k sum in pick order, bf16 weights.
Routing host_router(const std::vector<bf16>& logits, int T, int E, int k, bool renormalize) {
  Routing r{std::vector<std::int32_t>(std::size_t(T) * k), std::vector<float>(std::size_t(T) * k)};
  std::vector<float> p(E);
  std::vector<int> idx(E);
  for (int t = 0; t < T; ++t) {
    const bf16* row = &logits[std::size_t(t) * E];
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, row[e].to_float());
    std::array<float, 32> lane{};
    for (int l = 0; l < 32; ++l) {
      float s = 0.0f;
      for (int e = l; e < E; e += 32) s += (p[e] = std::exp(row[e].to_float() - mx));
      lane[l] = s;
    }
    for (int o = 16; o > 0; o >>= 1) {
      std::array<float, 32> next{};
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
      lane = next;
    }
    const float z = lane[0];
    for (float& v : p) v /= z;
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += p[idx[j]];
    for (int j = 0; j < k; ++j) {
      r.ids[std::size_t(t) * k + j] = idx[j];
      r.weights[std::size_t(t) * k + j] =
          bf16::from_float(renormalize ? p[idx[j]] / sum : p[idx[j]]).to_float();
    }
  }
  return r;
}

// Runs router_topk and checks it against host_router: ids exact, weights within one bf16 ulp. Returns how
// many weights were one ulp apart.
std::size_t check_router(const std::vector<bf16>& logits, int T, int E, int k, bool renormalize) {
  INFO("T " << T << ", E " << E << ", k " << k << (renormalize ? ", renormalized" : ""));
  REQUIRE(logits.size() == std::size_t(T) * E);
  Dev<bf16> dl(logits.size());
  Dev<std::int32_t> did(std::size_t(T) * k);
  Dev<float> dw(std::size_t(T) * k);
  dl.put(logits);
  did.poison();
  dw.poison();
  const Status st = dec::router_topk(dev(dl), T, E, k, renormalize, did.p, dw.p, nullptr);
  INFO(st.message);
  REQUIRE(st.ok);
  check_cuda(cudaDeviceSynchronize());
  const auto ids = did.get(std::size_t(T) * k);
  const auto wts = dw.get(std::size_t(T) * k);
  const Routing want = host_router(logits, T, E, k, renormalize);
  std::size_t off = 0;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const std::size_t i = std::size_t(t) * k + j;
      INFO("token " << t << ", pick " << j);
      REQUIRE(ids[i] == want.ids[i]);
      REQUIRE(std::isfinite(wts[i]));
      REQUIRE(bf16::from_float(wts[i]).to_float() == wts[i]);  // a bf16 value
      const int u = ulps(bf16::from_float(wts[i]), bf16::from_float(want.weights[i]));
      REQUIRE(u <= 1);
      off += u == 1;
    }
  return off;
}

// Random logits in (-8, 8) with |l| >= 1/64 (values nearer 0 become +-1/64: exact ties, not near ones).
std::vector<bf16> router_logits(std::size_t n, std::uint64_t seed) {
  auto v = random_bf16(n, 8.0f, seed);
  for (bf16& x : v)
    if (std::fabs(x.to_float()) < 1.0f / 64)
      x = bf16::from_float(std::signbit(x.to_float()) ? -1.0f / 64 : 1.0f / 64);
  return v;
}

const dec::bf16* fake(std::uintptr_t address) {
  return reinterpret_cast<const dec::bf16*>(address);  // never dereferenced: the checks fail first
}

}  // namespace

TEST_CASE("DenseGemm: bf16(x w^T + bias) within one bf16 ulp of the double reference on the models' shapes",
          "[gpu][decoder][dense]") {
  Dev<unsigned char> workspace(dec::DenseGemm::kWorkspaceBytes);
  dec::DenseGemm gemm(workspace.p, workspace.n);
  INFO(gemm.status().message);
  REQUIRE(gemm.status().ok);
  struct Case {
    int K, N;
    std::vector<int> Ms;
    const char* what;
  };
  const std::vector<Case> cases{
      {2048, 2048, {1, 7, 33, 64, 300}, "Qwen1.5-MoE q/k/v/o"},
      {2048, 4096, {1, 7, 64}, "Qwen3-30B-A3B q_proj (32 heads of 128)"},
      {4096, 2048, {1, 7, 64}, "Qwen3-30B-A3B o_proj"},
      {2048, 512, {1, 7, 64, 300}, "Qwen3-30B-A3B k/v (4 heads of 128)"},
      {2048, 128, {1, 7, 64, 300}, "Qwen3-30B-A3B router (128 experts)"},
      {2048, 60, {1, 7, 33, 64, 300}, "Qwen1.5-MoE router (60 experts)"},
      {2048, 1, {1, 7, 33, 64, 300}, "Qwen1.5-MoE shared expert gate"},
      {5632, 2048, {1, 7}, "Qwen1.5-MoE shared expert down_proj"},
  };
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    GemmOperands op(*std::max_element(c.Ms.begin(), c.Ms.end()), c.K, c.N, seed);
    seed += 3;
    const auto &x = op.x, &w = op.w, &b = op.b;
    const std::vector<double>& dot = op.dot;
    Dev<bf16>&dx = op.dx, &dw = op.dw, &db = op.db, &dy = op.dy;
    for (const int M : c.Ms)
      for (const bool with_bias : {false, true}) {
        if (with_bias && c.N % 8 != 0) {  // refused: see DenseGemm::can_implement
          CHECK(gemm.run(dev(dx), M, c.K, dev(dw), c.N, dev(db), dev(dy), nullptr).field == "N");
          continue;
        }
        INFO(c.what << ": M " << M << ", K " << c.K << ", N " << c.N << (with_bias ? ", bias" : ""));
        dy.poison();
        const Status st =
            gemm.run(dev(dx), M, c.K, dev(dw), c.N, with_bias ? dev(db) : nullptr, dev(dy), nullptr);
        INFO(st.message);
        REQUIRE(st.ok);
        check_cuda(cudaDeviceSynchronize());
        const auto y = dy.get(std::size_t(M) * c.N);
        const GemmErrors e = compare_gemm(y, dot, x, w, with_bias ? &b : nullptr, M, c.N, c.K);
        std::printf(
            "gemm M %4d K %4d N %4d %s: max %d ulp, %zu of %zu one ulp off, %zu beyond (cancellation)\n", M,
            c.K, c.N, with_bias ? "bias   " : "no bias", e.max_ulps, e.one_ulp, y.size(), e.beyond);
        INFO(e.first_bad);
        REQUIRE(e.first_bad.empty());
        CHECK(e.beyond <= y.size() / 1000 + 2);
      }
  }
  // One plan per (plan_rows(M), N, K, bias) seen (every M here is its own bucket), plus one per M whose
  // bucket's algorithm could not serve it (measured on the H200: one, of 52 plans).
  std::size_t plans = 0;
  for (const Case& c : cases) plans += (c.N % 8 == 0 ? 2 : 1) * c.Ms.size();
  std::printf("DenseGemm on the models' shapes: %zu plans, %llu exact fallbacks\n", gemm.cached_plans(),
              static_cast<unsigned long long>(gemm.exact_fallbacks()));
  CHECK(gemm.cached_plans() == plans + gemm.exact_fallbacks());
  CHECK(gemm.exact_fallbacks() <= plans / 10);
}

TEST_CASE("DenseGemm: prepare() builds every bucket's plan, a bucket's algorithm serves each of its sizes",
          "[gpu][decoder][dense]") {
  using G = dec::DenseGemm;
  STATIC_REQUIRE(G::plan_rows(1) == 1);
  STATIC_REQUIRE(G::plan_rows(64) == 64);
  STATIC_REQUIRE(G::plan_rows(65) == 72);  // eighths of 64
  STATIC_REQUIRE(G::plan_rows(128) == 128);
  STATIC_REQUIRE(G::plan_rows(300) == 320);    // eighths of 256
  STATIC_REQUIRE(G::plan_rows(1025) == 1152);  // eighths of 1024
  for (int M = 1; M <= 20000; ++M) {
    const int r = G::plan_rows(M);
    if (r < M || r > M + M / 8 || G::plan_rows(r) != r) FAIL("plan_rows(" << M << ") = " << r);
  }
  Dev<unsigned char> workspace(G::kWorkspaceBytes);
  G gemm(workspace.p, workspace.n);
  REQUIRE(gemm.status().ok);
  const int K = 2048, N = 2048 + 2 * 256, max_m = 2048;  // Qwen1.5 q/k/v with biases, a 2048-token step
  const auto x = random_bf16(std::size_t(max_m) * K, 2.0f, 31), w = random_bf16(std::size_t(N) * K, 0.1f, 32);
  const auto b = random_bf16(N, 1.0f, 33);
  Dev<bf16> dx(x.size()), dw(w.size()), db(b.size()), dy(std::size_t(max_m) * N);
  dx.put(x);
  dw.put(w);
  db.put(b);
  REQUIRE(gemm.prepare(max_m, N, K, dev(db)).ok);
  std::size_t buckets = 0;
  for (int M = 1; M <= max_m; M = G::plan_rows(M) + 1) ++buckets;
  CHECK(buckets == 64 + 8 * 5);  // exact to 64, then eight per octave up to 2048
  const std::vector<int> rows = G::bucket_rows(max_m);
  CHECK(rows.size() == buckets);
  CHECK(rows.front() == 1);
  CHECK(rows.back() == 2048);
  CHECK(std::is_sorted(rows.begin(), rows.end()));
  CHECK(gemm.cached_plans() == buckets);
  CHECK(gemm.prepare(0, N, K, nullptr).field == "max_M");
  const std::vector<double> dot = reference_dot(x, w, max_m, N, K);
  // Sizes at both ends of buckets, and a full one: no new plan, results as exact as before.
  for (const int M : {65, 71, 72, 100, 300, 513, 1000, 1025, 1152, 2047, 2048}) {
    INFO("M " << M << " (plan rows " << G::plan_rows(M) << ")");
    dy.poison();
    const Status st = gemm.run(dev(dx), M, K, dev(dw), N, dev(db), dev(dy), nullptr);
    INFO(st.message);
    REQUIRE(st.ok);
    check_cuda(cudaDeviceSynchronize());
    const auto y = dy.get(std::size_t(M) * N);
    const GemmErrors e = compare_gemm(y, dot, x, w, &b, M, N, K);
    INFO(e.first_bad);
    REQUIRE(e.first_bad.empty());
    CHECK(e.beyond <= y.size() / 1000 + 2);
  }
  std::printf("DenseGemm buckets: %zu plans for M <= %d, %llu exact fallbacks\n", gemm.cached_plans(), max_m,
              static_cast<unsigned long long>(gemm.exact_fallbacks()));
  CHECK(gemm.cached_plans() == buckets + gemm.exact_fallbacks());
}

TEST_CASE("DenseGemm: tune() keeps the fastest of cuBLASLt's candidates, run() then stays within one ulp",
          "[gpu][decoder][dense]") {
  using G = dec::DenseGemm;
  Dev<unsigned char> workspace(G::kWorkspaceBytes);
  G gemm(workspace.p, workspace.n);
  REQUIRE(gemm.status().ok);
  struct Case {
    int K, N;
    bool bias;
    const char* what;
  };
  // The engine's router GEMM carries the shared expert's gate as one more column (N = E + 1).
  const std::vector<Case> cases{{2048, 61, false, "Qwen1.5-MoE router + shared gate"},
                                {2048, 6144, true, "Qwen1.5-MoE q/k/v with biases"},
                                {2048, 2048, false, "Qwen1.5-MoE o_proj"}};
  const int max_m = 64;
  std::uint64_t seed = 300;
  for (const Case& c : cases) {
    GemmOperands op(max_m, c.K, c.N, seed);
    seed += 3;
    const auto &x = op.x, &w = op.w, &b = op.b;
    const std::vector<double>& dot = op.dot;
    Dev<bf16>&dx = op.dx, &dw = op.dw, &db = op.db, &dy = op.dy;
    const dec::bf16* bias = c.bias ? dev(db) : nullptr;
    for (const int M : {1, 8, 9, 11, 64}) {
      INFO(c.what << ": M " << M);
      std::vector<float> us;
      int chosen = -1;
      const Status st = gemm.tune(dev(dx), M, c.K, dev(dw), c.N, bias, dev(dy), nullptr, 8, 10, &us, &chosen);
      INFO(st.message);
      REQUIRE(st.ok);
      REQUIRE(!us.empty());
      REQUIRE(chosen >= 0);
      REQUIRE(chosen < int(us.size()));
      CHECK(us[chosen] == *std::min_element(us.begin(), us.end()));
      CHECK(std::isfinite(us[chosen]));
      std::printf("tune %-34s M %2d: %zu candidates, first %.1f us, chosen #%d %.1f us\n", c.what, M,
                  us.size(), us[0], chosen, us[chosen]);
      dy.poison();
      REQUIRE(gemm.run(dev(dx), M, c.K, dev(dw), c.N, bias, dev(dy), nullptr).ok);
      check_cuda(cudaDeviceSynchronize());
      const auto y = dy.get(std::size_t(M) * c.N);
      const GemmErrors e = compare_gemm(y, dot, x, w, c.bias ? &b : nullptr, M, c.N, c.K);
      INFO(e.first_bad);
      REQUIRE(e.first_bad.empty());
      CHECK(e.beyond <= y.size() / 1000 + 2);
    }
  }
  // Refused before anything runs: M off a bucket, no candidates, no repetitions.
  Dev<bf16> dx(72 * 256), dw(64 * 256), dy(72 * 64);
  CHECK(gemm.tune(dev(dx), 65, 256, dev(dw), 64, nullptr, dev(dy), nullptr).field == "M");
  CHECK(gemm.tune(dev(dx), 8, 256, dev(dw), 64, nullptr, dev(dy), nullptr, 0).field == "candidates");
  CHECK(gemm.tune(dev(dx), 8, 256, dev(dw), 64, nullptr, dev(dy), nullptr, 8, 0).field == "reps");
}

TEST_CASE("DenseGemm: tune_once() times a shape once per process, every DenseGemm then computes it alike",
          "[gpu][decoder][dense]") {
  using G = dec::DenseGemm;
  // A shape no other case of this process tunes once (the record is process-wide).
  const int K = 1536, N = 72;
  const int max_m = 12;
  const auto x = random_bf16(std::size_t(max_m) * K, 2.0f, 400);
  const auto w = random_bf16(std::size_t(N) * K, 0.1f, 401);
  const std::vector<double> dot = reference_dot(x, w, max_m, N, K);
  Dev<bf16> dx(x.size()), dw(w.size()), dy1(std::size_t(max_m) * N), dy2(std::size_t(max_m) * N);
  dx.put(x);
  dw.put(w);
  Dev<unsigned char> ws1(G::kWorkspaceBytes), ws2(G::kWorkspaceBytes);
  G first(ws1.p, ws1.n), second(ws2.p, ws2.n);
  REQUIRE(first.status().ok);
  REQUIRE(second.status().ok);
  // `second` builds its plan before `first` records a choice: tune_once must still hand it the record.
  REQUIRE(second.run(dev(dx), 9, K, dev(dw), N, nullptr, dev(dy2), nullptr).ok);
  for (const int M : {1, 9, 12}) {
    INFO("M " << M);
    int chosen1 = -1, chosen2 = -1;
    bool timed1 = false, timed2 = true;
    REQUIRE(
        first.tune_once(dev(dx), M, K, dev(dw), N, nullptr, dev(dy1), nullptr, 8, 5, &chosen1, &timed1).ok);
    REQUIRE(
        second.tune_once(dev(dx), M, K, dev(dw), N, nullptr, dev(dy2), nullptr, 8, 5, &chosen2, &timed2).ok);
    CHECK(timed1);
    CHECK_FALSE(timed2);
    CHECK(chosen1 >= 0);
    CHECK(chosen2 == chosen1);
    // Once more on the first: recorded, not timed again.
    bool timed3 = true;
    REQUIRE(
        first.tune_once(dev(dx), M, K, dev(dw), N, nullptr, dev(dy1), nullptr, 8, 5, nullptr, &timed3).ok);
    CHECK_FALSE(timed3);
    dy1.poison();
    dy2.poison();
    REQUIRE(first.run(dev(dx), M, K, dev(dw), N, nullptr, dev(dy1), nullptr).ok);
    REQUIRE(second.run(dev(dx), M, K, dev(dw), N, nullptr, dev(dy2), nullptr).ok);
    check_cuda(cudaDeviceSynchronize());
    const auto y1 = dy1.get(std::size_t(M) * N), y2 = dy2.get(std::size_t(M) * N);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < y1.size(); ++i) differ += y1[i].bits != y2[i].bits;
    CHECK(differ == 0);  // one algorithm: bit for bit
    const GemmErrors e = compare_gemm(y1, dot, x, w, nullptr, M, N, K);
    INFO(e.first_bad);
    REQUIRE(e.first_bad.empty());
  }
  // The argument rules come first: nothing timed, nothing recorded.
  bool timed = true;
  CHECK(
      first.tune_once(dev(dx), 65, K, dev(dw), N, nullptr, dev(dy1), nullptr, 8, 5, nullptr, &timed).field ==
      "M");
  CHECK_FALSE(timed);
  CHECK(first.tune_once(dev(dx), 8, K + 4, dev(dw), N, nullptr, dev(dy1), nullptr).field == "K");
}

TEST_CASE("DenseGemm: a cached plan serves 16-byte (not 256-byte) aligned pointers, M = 0 does nothing",
          "[gpu][decoder][dense]") {
  Dev<unsigned char> workspace(dec::DenseGemm::kWorkspaceBytes);
  dec::DenseGemm gemm(workspace.p, workspace.n);
  REQUIRE(gemm.status().ok);
  const int M = 5, K = 256, N = 208;
  const auto x = random_bf16(std::size_t(M) * K, 2.0f, 7), w = random_bf16(std::size_t(N) * K, 0.1f, 8);
  const auto b = random_bf16(N, 1.0f, 9);
  const std::vector<double> dot = reference_dot(x, w, M, N, K);
  // Each array at offset 0 (256-byte aligned) or 8 elements (16 bytes), written before each run: the two
  // placements overlap in one buffer.
  Dev<bf16> dx(x.size() + 8), dw(w.size() + 8), db(b.size() + 8), dy(std::size_t(M) * N + 8);
  for (const std::size_t at : {std::size_t(0), std::size_t(8), std::size_t(0)}) {
    INFO("offset " << at);
    dx.put(x, at);
    dw.put(w, at);
    db.put(b, at);
    dy.poison();
    const Status st = gemm.run(dev(dx, at), M, K, dev(dw, at), N, dev(db, at), dev(dy, at), nullptr);
    INFO(st.message);
    REQUIRE(st.ok);
    check_cuda(cudaDeviceSynchronize());
    const GemmErrors e = compare_gemm(dy.get(std::size_t(M) * N, at), dot, x, w, &b, M, N, K);
    INFO(e.first_bad);
    REQUIRE(e.first_bad.empty());
    CHECK(gemm.cached_plans() == 1);
  }
  CHECK(gemm.run(nullptr, 0, K, nullptr, N, nullptr, nullptr, nullptr).ok);
  CHECK(gemm.cached_plans() == 1);
  // Bad arguments are refused before cuBLASLt is called.
  const Status misaligned = gemm.run(dev(dx, 1), M, K, dev(dw), N, nullptr, dev(dy), nullptr);
  CHECK(misaligned.field == "x");
  const Status odd_k = gemm.run(dev(dx), M, 100, dev(dw), N, nullptr, dev(dy), nullptr);
  CHECK(odd_k.field == "K");
  CHECK(gemm.cached_plans() == 1);
}

TEST_CASE("router_topk: softmax, top-k and weights match the host model, both normalizations",
          "[gpu][decoder][router]") {
  struct Case {
    int T, E, k;
  };
  // Qwen1.5-MoE (60 experts, top 4), Qwen3-30B-A3B (128, top 8), the limits, and E not a multiple of 32.
  const std::vector<Case> cases{{1, 60, 4},   {7, 60, 4},     {300, 60, 4},   {1, 128, 8},
                                {33, 128, 8}, {5000, 128, 8}, {64, 1024, 16}, {9, 1, 1},
                                {17, 33, 3},  {100, 256, 16}, {50, 200, 5},   {20, 1000, 1}};
  std::uint64_t seed = 500;
  std::size_t off = 0, total = 0;
  for (const Case& c : cases) {
    const auto logits = router_logits(std::size_t(c.T) * c.E, seed++);
    for (const bool renormalize : {false, true}) {
      off += check_router(logits, c.T, c.E, c.k, renormalize);
      total += std::size_t(c.T) * c.k;
    }
  }
  std::printf("router: %zu of %zu weights one bf16 ulp from the host model\n", off, total);
  CHECK(off <= total / 100);
}

TEST_CASE("router_topk: equal probabilities pick the lowest indices first", "[gpu][decoder][router]") {
  SECTION("60 experts, top 4") {
    const int E = 60, k = 4, T = 4;
    std::vector<bf16> logits(std::size_t(T) * E);
    std::mt19937_64 g(3);
    std::uniform_real_distribution<float> low(-8.0f, -2.0f);
    for (bf16& v : logits) v = bf16::from_float(low(g));
    auto set = [&](int t, std::initializer_list<int> es, float v) {
      for (int e : es) logits[std::size_t(t) * E + e] = bf16::from_float(v);
    };
    for (int e = 0; e < E; ++e) set(0, {e}, 0.0f);  // all equal
    set(1, {50, 7, 33, 12, 39}, 3.0f);              // five equal maxima, four picked
    set(2, {40, 8}, 3.0f);                          // the same lane (8), two slots
    set(2, {35, 3}, 2.0f);
    for (int e = 0; e < E; ++e) set(3, {e}, -1.5f);
    set(3, {59}, 1.0f);
    const std::vector<std::vector<std::int32_t>> expect{
        {0, 1, 2, 3}, {7, 12, 33, 39}, {8, 40, 3, 35}, {59, 0, 1, 2}};
    for (const bool renormalize : {false, true}) {
      check_router(logits, T, E, k, renormalize);
      Dev<bf16> dl(logits.size());
      Dev<std::int32_t> did(std::size_t(T) * k);
      Dev<float> dw(std::size_t(T) * k);
      dl.put(logits);
      did.poison();
      REQUIRE(dec::router_topk(dev(dl), T, E, k, renormalize, did.p, dw.p, nullptr).ok);
      check_cuda(cudaDeviceSynchronize());
      const auto ids = did.get(std::size_t(T) * k);
      const auto wts = dw.get(std::size_t(T) * k);
      for (int t = 0; t < T; ++t)
        CHECK(std::vector<std::int32_t>(ids.begin() + t * k, ids.begin() + (t + 1) * k) == expect[t]);
      // Token 0: p = 1/60 for every expert; renormalized, 1/4 each.
      for (int j = 0; j < k; ++j)
        CHECK(wts[j] == (renormalize ? 0.25f : bf16::from_float(1.0f / 60).to_float()));
    }
  }
  SECTION("128 and 1024 experts: ties across lanes and slots") {
    std::vector<bf16> all_equal(128, bf16::from_float(1.0f));
    check_router(all_equal, 1, 128, 8, true);
    const int E = 1024, k = 16;
    auto logits = router_logits(E, 11);
    for (bf16& v : logits) v = bf16::from_float(std::min(v.to_float(), 2.0f));
    for (int e : {1000, 968, 40, 8}) logits[e] = bf16::from_float(5.0f);
    for (int e = 1; e < E; e += 32) logits[e] = bf16::from_float(4.0f);  // lane 1, every slot: 32 ties
    check_router(logits, 1, E, k, false);
    Dev<bf16> dl(E);
    Dev<std::int32_t> did(k);
    Dev<float> dw(k);
    dl.put(logits);
    REQUIRE(dec::router_topk(dev(dl), 1, E, k, false, did.p, dw.p, nullptr).ok);
    check_cuda(cudaDeviceSynchronize());
    const std::vector<std::int32_t> expect{8,   40,  968, 1000, 1,   33,  65,  97,
                                           129, 161, 193, 225,  257, 289, 321, 353};
    CHECK(did.get(k) == expect);
  }
}

TEST_CASE("shared_gate: bf16(sigmoid(g)) within one bf16 ulp of the reference", "[gpu][decoder][router]") {
  auto logits = random_bf16(1000, 10.0f, 21);
  const std::vector<float> special{0.0f, 1.0f, -1.0f, 8.0f, -8.0f, 20.0f, -20.0f, 0.5f};
  for (std::size_t i = 0; i < special.size(); ++i) logits[i] = bf16::from_float(special[i]);
  const int T = int(logits.size());
  Dev<bf16> dl(logits.size());
  Dev<float> dout(logits.size());
  dl.put(logits);
  dout.poison();
  const Status st = dec::shared_gate(dev(dl), T, dout.p, nullptr);
  INFO(st.message);
  REQUIRE(st.ok);
  check_cuda(cudaDeviceSynchronize());
  const auto out = dout.get(logits.size());
  std::size_t off = 0;
  for (int t = 0; t < T; ++t) {
    // The reference decoder's gate: r(1 / (1 + exp(-g))) in double.
    const float want = ops::round_bf16(1.0 / (1.0 + std::exp(-double(logits[t].to_float()))));
    INFO("g = " << logits[t].to_float() << ": " << out[t] << " vs " << want);
    const int u = ulps(bf16::from_float(out[t]), bf16::from_float(want));
    REQUIRE(u <= 1);
    off += u == 1;
  }
  CHECK(off <= logits.size() / 50);
}

TEST_CASE("gather_rows: exact rows, 16-byte and element copies", "[gpu][decoder][router]") {
  const int src_rows = 64;
  const std::vector<std::int32_t> rows{63, 0, 5, 5, 17};
  for (const int dim : {2048, 24, 13}) {
    for (const std::size_t dst_at : {std::size_t(0), std::size_t(1)}) {  // 1: dst not 16-byte aligned
      INFO("dim " << dim << ", dst offset " << dst_at);
      const auto src = random_bf16(std::size_t(src_rows) * dim, 3.0f, 31);
      Dev<bf16> ds(src.size()), dd(rows.size() * dim + dst_at);
      Dev<std::int32_t> dr(rows.size());
      ds.put(src);
      dr.put(rows);
      dd.poison();
      const Status st = dec::gather_rows(dev(ds), dr.p, int(rows.size()), dim, dev(dd, dst_at), nullptr);
      INFO(st.message);
      REQUIRE(st.ok);
      check_cuda(cudaDeviceSynchronize());
      const auto out = dd.get(rows.size() * dim, dst_at);
      for (std::size_t r = 0; r < rows.size(); ++r)
        for (int d = 0; d < dim; ++d)
          REQUIRE(out[r * dim + d].bits == src[std::size_t(rows[r]) * dim + d].bits);
    }
  }
}

TEST_CASE("dense GEMM, router, shared gate and gather: bad arguments name the field, nothing is launched",
          "[decoder][status]") {
  const auto* a = fake(256);    // 16-byte aligned, never read
  const auto* odd = fake(258);  // 2 bytes off
  auto* y = const_cast<dec::bf16*>(fake(512));
  using G = dec::DenseGemm;
  CHECK(G::can_implement(a, 4, 64, a, 8, nullptr, y).ok);
  CHECK(G::can_implement(a, 4, 64, a, 1, nullptr, y).ok);      // any N without a bias
  CHECK(G::can_implement(a, 4, 64, a, 1, a, y).field == "N");  // with a bias, a multiple of 8
  CHECK(G::can_implement(nullptr, 0, 64, nullptr, 8, nullptr, nullptr).ok);
  CHECK(G::can_implement(a, -1, 64, a, 8, nullptr, y).field == "M");
  CHECK(G::can_implement(a, 4, 0, a, 8, nullptr, y).field == "K");
  CHECK(G::can_implement(a, 4, 60, a, 8, nullptr, y).field == "K");
  CHECK(G::can_implement(a, 4, 64, a, 0, nullptr, y).field == "N");
  CHECK(G::can_implement(nullptr, 4, 64, a, 8, nullptr, y).field == "x");
  CHECK(G::can_implement(a, 4, 64, nullptr, 8, nullptr, y).field == "w");
  CHECK(G::can_implement(a, 4, 64, a, 8, nullptr, nullptr).field == "y");
  CHECK(G::can_implement(odd, 4, 64, a, 8, nullptr, y).field == "x");
  CHECK(G::can_implement(a, 4, 64, odd, 8, nullptr, y).field == "w");
  CHECK(G::can_implement(a, 4, 64, a, 8, nullptr, const_cast<dec::bf16*>(odd)).field == "y");
  CHECK(G::can_implement(a, 4, 64, a, 8, odd, y).field == "bias");
  const Status msg = G::can_implement(a, 4, 60, a, 8, nullptr, y);
  CHECK(msg.message == "K = 60: must be a multiple of 8 (16-byte rows of x and w)");
  // A workspace the constructor refuses: run() reports it (after the argument checks), no handle is made.
  G bad(reinterpret_cast<void*>(std::uintptr_t{512 + 16}), 1024);
  CHECK(bad.status().field == "workspace");
  CHECK(bad.run(a, 4, 64, a, 8, nullptr, y, nullptr).field == "workspace");
  CHECK(bad.run(a, 4, 63, a, 8, nullptr, y, nullptr).field == "K");
  CHECK(G(nullptr, 1024).status().field == "workspace");

  std::int32_t* ids = reinterpret_cast<std::int32_t*>(std::uintptr_t{1024});
  float* wts = reinterpret_cast<float*>(std::uintptr_t{2048});
  CHECK(dec::router_topk(a, -1, 60, 4, false, ids, wts, nullptr).field == "T");
  CHECK(dec::router_topk(a, 3, 0, 1, false, ids, wts, nullptr).field == "E");
  CHECK(dec::router_topk(a, 3, 1025, 4, false, ids, wts, nullptr).field == "E");
  CHECK(dec::router_topk(a, 3, 60, 0, false, ids, wts, nullptr).field == "k");
  CHECK(dec::router_topk(a, 3, 60, 17, false, ids, wts, nullptr).field == "k");
  CHECK(dec::router_topk(a, 3, 4, 5, false, ids, wts, nullptr).field == "k");
  CHECK(dec::router_topk(nullptr, 3, 60, 4, false, ids, wts, nullptr).field == "logits");
  CHECK(dec::router_topk(a, 3, 60, 4, false, nullptr, wts, nullptr).field == "ids");
  CHECK(dec::router_topk(a, 3, 60, 4, false, ids, nullptr, nullptr).field == "weights");
  CHECK(dec::router_topk(nullptr, 0, 60, 4, true, nullptr, nullptr, nullptr).ok);
  CHECK(dec::router_topk_can_implement(a, 3, 1024, 16, ids, wts).ok);

  CHECK(dec::shared_gate(a, -1, wts, nullptr).field == "T");
  CHECK(dec::shared_gate(nullptr, 3, wts, nullptr).field == "logits");
  CHECK(dec::shared_gate(a, 3, nullptr, nullptr).field == "out");
  CHECK(dec::shared_gate(nullptr, 0, nullptr, nullptr).ok);

  CHECK(dec::gather_rows(a, ids, -1, 8, y, nullptr).field == "count");
  CHECK(dec::gather_rows(a, ids, 2, 0, y, nullptr).field == "dim");
  CHECK(dec::gather_rows(nullptr, ids, 2, 8, y, nullptr).field == "src");
  CHECK(dec::gather_rows(a, nullptr, 2, 8, y, nullptr).field == "rows");
  CHECK(dec::gather_rows(a, ids, 2, 8, nullptr, nullptr).field == "dst");
  CHECK(dec::gather_rows(nullptr, nullptr, 0, 8, nullptr, nullptr).ok);
}
