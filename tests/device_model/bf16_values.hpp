// Host-side helpers of the decoder GPU tests: random bf16 inputs and the distance between two bf16 values.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "amoeba/core/bf16.hpp"

namespace amoeba::test {

// n values uniform in [-scale, scale), rounded to bf16, deterministic in `seed`.
inline std::vector<bf16> random_bf16(std::size_t n, float scale, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = bf16::from_float(d(g));
  return v;
}

// Distance in bf16 ulps along the ordered line of bf16 values (a NaN is far from everything).
inline int ulps(bf16 a, bf16 b) {
  auto key = [](bf16 x) { return (x.bits & 0x8000) ? -int(x.bits & 0x7fff) : int(x.bits); };
  return std::abs(key(a) - key(b));
}

}  // namespace amoeba::test
