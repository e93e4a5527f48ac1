// CPU tests of the double-precision MoE reference: bf16 conversion, agreement with an independent naive
// computation (dense shared expert, unsplit), and algebraic properties.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/moe_reference.hpp"

namespace {

using namespace amoeba::reference;

struct Model {
  MoeShape shape;
  std::vector<std::vector<std::uint16_t>> w1, w3, w2;  // per expert (routed then shared chunks)
  std::vector<ExpertMatrices> experts;
  void bind() {
    experts.clear();
    for (std::size_t e = 0; e < w1.size(); ++e) experts.push_back({w1[e].data(), w3[e].data(), w2[e].data()});
  }
};

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<std::uint16_t> v(n);
  for (auto& b : v) b = float_to_bf16(d(rng));
  return v;
}

Model random_model(MoeShape s, unsigned seed) {
  std::mt19937 rng(seed);
  Model m{s, {}, {}, {}, {}};
  const std::size_t elems = static_cast<std::size_t>(s.matrix_elems());
  for (int e = 0; e < s.total_experts(); ++e) {
    m.w1.push_back(random_bf16(elems, rng, 0.5f));
    m.w3.push_back(random_bf16(elems, rng, 0.5f));
    m.w2.push_back(random_bf16(elems, rng, 0.5f));
  }
  m.bind();
  return m;
}

struct Routing {
  std::vector<std::uint16_t> x;
  std::vector<std::int32_t> ids;
  std::vector<float> w, shared;
};

Routing random_routing(const MoeShape& s, unsigned seed) {
  std::mt19937 rng(seed);
  Routing r;
  r.x = random_bf16(static_cast<std::size_t>(s.num_tokens) * s.hidden, rng, 1.0f);
  std::uniform_int_distribution<int> pick(0, s.num_experts - 1);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int t = 0; t < s.num_tokens; ++t) {
    for (int j = 0; j < s.top_k; ++j) {
      r.ids.push_back(pick(rng));
      r.w.push_back(u(rng));
    }
    r.shared.push_back(u(rng));
  }
  return r;
}

std::vector<double> run(const Model& m, const Routing& r, bool shared_weights = true) {
  MoeReferenceInputs in{
      m.shape,  r.x, r.ids, r.w, shared_weights ? std::span<const float>(r.shared) : std::span<const float>(),
      m.experts};
  const Status st = check(in);
  INFO(st.message);
  REQUIRE(st.ok);
  std::vector<double> out(static_cast<std::size_t>(m.shape.num_tokens) * m.shape.hidden);
  moe_reference(in, out);
  return out;
}

double f(std::uint16_t b) {
  return bf16_to_float(b);
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even and round-trips", "[moe_reference]") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(-2.5f)) == -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  CHECK(float_to_bf16(0.0f) == 0);
}

TEST_CASE("reference matches an independent naive computation with a dense shared expert",
          "[moe_reference]") {
  // E=5 routed experts, k=2, H=12, F=8, shared expert of intermediate 2·F given densely and split into 2
  // chunks.
  const MoeShape s{4, 12, 8, 5, 2, 2};
  std::mt19937 rng(3);
  const int H = s.hidden, F = s.intermediate, FS = 2 * F;
  std::vector<std::uint16_t> sw1 = random_bf16(static_cast<std::size_t>(FS) * H, rng, 0.5f);
  std::vector<std::uint16_t> sw3 = random_bf16(static_cast<std::size_t>(FS) * H, rng, 0.5f);
  std::vector<std::uint16_t> sw2 = random_bf16(static_cast<std::size_t>(H) * FS, rng, 0.5f);  // H×2F
  Model m = random_model(MoeShape{s.num_tokens, H, F, s.num_experts, s.top_k, 0}, 9);
  m.shape = s;
  for (int c = 0; c < 2; ++c) {  // chunk c: W1/W3 rows [cF, (c+1)F), W2 columns [cF, (c+1)F)
    m.w1.emplace_back(sw1.begin() + static_cast<long>(c) * F * H,
                      sw1.begin() + static_cast<long>(c + 1) * F * H);
    m.w3.emplace_back(sw3.begin() + static_cast<long>(c) * F * H,
                      sw3.begin() + static_cast<long>(c + 1) * F * H);
    std::vector<std::uint16_t> down(static_cast<std::size_t>(H) * F);
    for (int h = 0; h < H; ++h)
      for (int fi = 0; fi < F; ++fi)
        down[static_cast<std::size_t>(h) * F + fi] = sw2[static_cast<std::size_t>(h) * FS + c * F + fi];
    m.w2.push_back(down);
  }
  m.bind();
  Routing r = random_routing(s, 4);
  const std::vector<double> out = run(m, r);

  // Naive: per token, y = Σ_j w_j·W2_e(silu(W1_e x)·(W3_e x)) + shared_w · dense shared expert.
  auto expert = [&](const std::uint16_t* w1, const std::uint16_t* w3, const std::uint16_t* w2, int inter,
                    const std::uint16_t* x, std::vector<double>& y, double weight) {
    std::vector<double> a(static_cast<std::size_t>(inter));
    for (int i = 0; i < inter; ++i) {
      double g = 0, u = 0;
      for (int h = 0; h < H; ++h) {
        g += f(w1[static_cast<std::size_t>(i) * H + h]) * f(x[h]);
        u += f(w3[static_cast<std::size_t>(i) * H + h]) * f(x[h]);
      }
      a[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int h = 0; h < H; ++h) {
      double d = 0;
      for (int i = 0; i < inter; ++i) d += f(w2[static_cast<std::size_t>(h) * inter + i]) * a[i];
      y[h] += weight * d;
    }
  };
  for (int t = 0; t < s.num_tokens; ++t) {
    std::vector<double> y(static_cast<std::size_t>(H), 0.0);
    const std::uint16_t* x = r.x.data() + static_cast<std::size_t>(t) * H;
    for (int j = 0; j < s.top_k; ++j) {
      const int e = r.ids[static_cast<std::size_t>(t) * s.top_k + j];
      expert(m.w1[e].data(), m.w3[e].data(), m.w2[e].data(), F, x, y,
             r.w[static_cast<std::size_t>(t) * s.top_k + j]);
    }
    expert(sw1.data(), sw3.data(), sw2.data(), FS, x, y, r.shared[t]);
    for (int h = 0; h < H; ++h)
      CHECK(out[static_cast<std::size_t>(t) * H + h] == Approx(y[h]).epsilon(1e-12).margin(1e-12));
  }
}

TEST_CASE("identical experts with weights summing to 1 equal one expert", "[moe_reference]") {
  MoeShape s{3, 16, 8, 4, 3, 0};
  Model m = random_model(s, 5);
  for (int e = 1; e < 4; ++e) m.w1[e] = m.w1[0], m.w3[e] = m.w3[0], m.w2[e] = m.w2[0];
  m.bind();
  Routing r = random_routing(s, 6);
  for (int t = 0; t < 3; ++t) {
    r.ids[3 * t] = 0, r.ids[3 * t + 1] = 2, r.ids[3 * t + 2] = 3;
    r.w[3 * t] = 0.25f, r.w[3 * t + 1] = 0.125f, r.w[3 * t + 2] = 0.625f;  // exact in float
  }
  const auto mixed = run(m, r);
  MoeShape one = s;
  one.top_k = 1;
  Routing r1 = r;
  r1.ids.assign(3, 1);
  r1.w.assign(3, 1.0f);
  Model m1 = m;
  m1.shape = one;
  m1.bind();
  const auto single = run(m1, r1);
  for (std::size_t i = 0; i < single.size(); ++i)
    CHECK(mixed[i] == Approx(single[i]).epsilon(1e-12).margin(1e-12));
}

TEST_CASE("output is linear in the routing weights, invalid ids contribute nothing", "[moe_reference]") {
  MoeShape s{5, 16, 8, 6, 2, 0};
  Model m = random_model(s, 7);
  Routing r = random_routing(s, 8);
  const auto base = run(m, r);
  Routing r2 = r;
  for (float& w : r2.w) w *= 2.0f;
  const auto doubled = run(m, r2);
  for (std::size_t i = 0; i < base.size(); ++i)
    CHECK(doubled[i] == Approx(2 * base[i]).epsilon(1e-12).margin(1e-12));

  Routing r3 = r;
  for (int t = 0; t < 5; ++t) r3.ids[2 * t + 1] = (t % 2) ? -1 : 6;  // out of [0, E)
  Routing r4 = r;
  for (int t = 0; t < 5; ++t) r4.w[2 * t + 1] = 0.0f;
  const auto dropped = run(m, r3), zeroed = run(m, r4);
  for (std::size_t i = 0; i < base.size(); ++i) CHECK(dropped[i] == zeroed[i]);
}

TEST_CASE("shared chunks default to weight 1", "[moe_reference]") {
  MoeShape s{2, 16, 8, 3, 1, 2};
  Model m = random_model(s, 9);
  Routing r = random_routing(s, 10);
  r.shared.assign(2, 1.0f);
  const auto explicit_one = run(m, r, true), implicit = run(m, r, false);
  for (std::size_t i = 0; i < implicit.size(); ++i) CHECK(explicit_one[i] == implicit[i]);
}

TEST_CASE("check() names the field and the rule", "[moe_reference]") {
  MoeShape s{2, 16, 8, 3, 1, 0};
  Model m = random_model(s, 1);
  Routing r = random_routing(s, 2);
  r.x.pop_back();
  MoeReferenceInputs in{s, r.x, r.ids, r.w, {}, m.experts};
  const Status st = check(in);
  CHECK_FALSE(st.ok);
  CHECK(st.field == "input.size");
  s.top_k = 4;
  in.shape = s;
  CHECK(check(in).field == "top_k");
}
