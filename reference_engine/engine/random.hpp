// A small, fully specified random number generator (xoshiro256** seeded through splitmix64) and the few
// distributions the workloads need. The standard library's distributions are implementation-defined, so they
// would break "same seed -> byte-identical results" across standard libraries; these are not.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace amoeba::engine {

class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::uint64_t stream = 0) noexcept {
    std::uint64_t x = seed ^ (stream * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    for (auto& s : s_) s = splitmix(x);
  }
  std::uint64_t next() noexcept {
    const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  // Uniform in [0, 1).
  double uniform() noexcept { return double(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1].
  double uniform_pos() noexcept { return double((next() >> 11) + 1) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) noexcept { return n == 0 ? 0 : next() % n; }
  double normal() noexcept {  // Box-Muller, one value per call
    return std::sqrt(-2.0 * std::log(uniform_pos())) * std::cos(2.0 * std::numbers::pi * uniform());
  }
  double exponential(double mean) noexcept { return -mean * std::log(uniform_pos()); }
  // Gamma(shape, scale), Marsaglia-Tsang.
  double gamma(double shape, double scale) noexcept {
    if (shape < 1.0) return gamma(shape + 1.0, scale) * std::pow(uniform_pos(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform_pos();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
    }
  }
  bool bernoulli(double p) noexcept { return uniform() < p; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& x) noexcept {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t s_[4]{};
};

}  // namespace amoeba::engine
