// The device engine tests' comparison of two greedy runs step by step: each step's logits within
// kLogitTolerance x the reference's largest |logit| + kLogitFloor (bf16 accuracy through two layers of the
// tests' weights: see cuda_reference_test.cpp), and the token wherever the reference's top-1 margin is clear
// of twice that tolerance. Both sides are vectors of steps with `logits` (std::vector<float>) and `token`.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace amoeba::test {

inline constexpr double kLogitTolerance = 0.08, kLogitFloor = 0.01;

// Checks every step (Catch CHECKs, labelled with `name` and the step); returns the worst max |dlogit| /
// max |logit| over the steps.
template <class Ref, class Got>
double check_logits_match(const std::string& name, const std::vector<Ref>& ref, const std::vector<Got>& got) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t s = 0; s < got.size(); ++s) {
    const std::vector<float>& a = ref[s].logits;
    const std::vector<float>& b = got[s].logits;
    REQUIRE(b.size() == a.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, double(std::abs(a[i] - b[i])));
      scale = std::max(scale, double(std::abs(a[i])));
    }
    worst = std::max(worst, diff / scale);
    INFO(name << " step " << s << ": max |dlogit| " << diff << ", max |logit| " << scale);
    const double tolerance = kLogitTolerance * scale + kLogitFloor;
    CHECK(diff <= tolerance);
    std::vector<float> sorted = a;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > 2 * tolerance) CHECK(got[s].token == ref[s].token);
  }
  return worst;
}

}  // namespace amoeba::test
