// Synthetic routing and predictors; see routing.hpp.
#include "engine/routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

std::string to_string(PredictorKind k) {
  switch (k) {
    case PredictorKind::kNone:
      return "none";
    case PredictorKind::kCrossLayer:
      return "cross-layer";
    case PredictorKind::kOracle:
      return "oracle";
  }
  return "?";
}

PredictorKind predictor_from_string(const std::string& s) {
  if (s == "none") return PredictorKind::kNone;
  if (s == "cross-layer") return PredictorKind::kCrossLayer;
  if (s == "oracle") return PredictorKind::kOracle;
  throw ConfigError("predictor", s, "must be one of none, cross-layer, oracle");
}

RoutableRange routable_range(std::uint64_t tokens, std::uint32_t top_k, std::uint32_t experts) noexcept {
  if (tokens == 0) return {};
  const std::uint64_t e = experts, k = top_k;
  // T k without overflow: any T k >= E is capped at E.
  const std::uint64_t max = k == 0 ? 0 : (tokens >= (e + k - 1) / k ? e : tokens * k);
  return {std::min(k, e), max};
}

void make_routable(std::vector<std::uint32_t>& set, std::uint64_t tokens, std::uint32_t top_k,
                   std::span<const double> popularity) {
  const auto experts = static_cast<std::uint32_t>(popularity.size());
  const RoutableRange r = routable_range(tokens, top_k, experts);
  if (set.size() >= r.min && set.size() <= r.max) return;
  auto more_popular = [&](std::uint32_t a, std::uint32_t b) {
    return popularity[a] > popularity[b] || (popularity[a] == popularity[b] && a < b);
  };
  if (set.size() > r.max) {  // keep the r.max most popular
    std::partial_sort(set.begin(), set.begin() + std::ptrdiff_t(r.max), set.end(), more_popular);
    set.resize(r.max);
  } else {  // add the most popular experts the set lacks
    std::vector<std::uint8_t> in(experts, 0);
    for (std::uint32_t e : set) in[e] = 1;
    std::vector<std::uint32_t> missing;
    missing.reserve(experts - set.size());
    for (std::uint32_t e = 0; e < experts; ++e)
      if (!in[e]) missing.push_back(e);
    const std::size_t add = r.min - set.size();
    std::partial_sort(missing.begin(), missing.begin() + std::ptrdiff_t(add), missing.end(), more_popular);
    set.insert(set.end(), missing.begin(), missing.begin() + std::ptrdiff_t(add));
  }
  std::sort(set.begin(), set.end());
}

namespace {
void partial_shuffle(std::vector<std::uint32_t>& perm, double fraction, Rng& rng) {
  const auto n = perm.size();
  std::vector<std::size_t> pos;
  for (std::size_t i = 0; i < n; ++i)
    if (rng.bernoulli(fraction)) pos.push_back(i);
  for (std::size_t i = pos.size(); i > 1; --i) std::swap(perm[pos[i - 1]], perm[pos[rng.below(i)]]);
}
// Bounds on redrawing a collided top-k pick in calibration_counts (then one exact draw, O(E)).
constexpr double kMaxExpectedDraws = 64;
constexpr std::uint32_t kMaxDraws = 4096;

// One of `experts` experts drawn with probability proportional to w[e] among those not in `picked` (some
// remain).
std::uint32_t draw_excluding(const double* w, std::uint32_t experts, const std::vector<std::uint32_t>& picked,
                             Rng& rng) {
  auto is_picked = [&](std::uint32_t e) {
    return std::find(picked.begin(), picked.end(), e) != picked.end();
  };
  double total = 0;  // summed from the weights, not the cdf: tail experts lost to its rounding still count
  for (std::uint32_t e = 0; e < experts; ++e)
    if (!is_picked(e)) total += w[e];
  double u = rng.uniform() * total;
  std::uint32_t last = experts;
  for (std::uint32_t e = 0; e < experts; ++e) {
    if (is_picked(e)) continue;
    last = e;
    if (u < w[e]) return e;
    u -= w[e];
  }
  return last;  // u ran past the end by rounding
}

}  // namespace

RoutingModel::RoutingModel(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k,
                           const RoutingParams& p, std::uint64_t seed)
    : layers_(layers),
      experts_(experts),
      top_k_(top_k),
      p_(p),
      calib_w_(std::size_t(layers) * experts),
      live_w_(std::size_t(layers) * experts),
      x_(std::size_t(layers) * experts, 0.0),
      log_miss_(std::size_t(layers) * experts, 0.0),
      live_p_(std::size_t(layers) * experts, 0.0),
      rng_(seed, 17),
      seed_(seed) {
  Rng setup(seed, 11), drift(seed, 13);      // drift has its own stream: the calibration ranking ignores it
  std::vector<std::uint32_t> perm(experts);  // perm[rank] = expert
  std::iota(perm.begin(), perm.end(), 0u);
  for (std::size_t i = experts; i > 1; --i) std::swap(perm[i - 1], perm[setup.below(i)]);
  for (std::uint32_t l = 0; l < layers; ++l) {
    if (l > 0) partial_shuffle(perm, 1.0 - p.cross_layer_correlation, setup);
    std::vector<std::uint32_t> live = perm;
    partial_shuffle(live, p.drift, drift);
    double z = 0;
    for (std::uint32_t r = 0; r < experts; ++r) z += 1.0 / std::pow(double(r + 1), p.skew);
    for (std::uint32_t r = 0; r < experts; ++r) {
      const double w = 1.0 / std::pow(double(r + 1), p.skew);
      calib_w_[std::size_t(l) * experts + perm[r]] = w / z;
      live_w_[std::size_t(l) * experts + live[r]] = w;
    }
  }
}

std::vector<double> RoutingModel::calibration_counts(std::uint64_t tokens) const {
  Rng rng(seed_, 23);
  std::vector<double> counts(calib_w_.size(), 0.0);
  std::vector<double> cdf(experts_), w(experts_);
  std::vector<std::uint32_t> picked;
  const bool rejection = 2 * top_k_ <= experts_;  // distinct draws by rejection when collisions are rare
  for (std::uint32_t l = 0; l < layers_; ++l) {
    const double* base = &calib_w_[std::size_t(l) * experts_];
    double acc = 0;
    for (std::uint32_t e = 0; e < experts_; ++e) cdf[e] = acc += base[e];
    for (std::uint64_t t = 0; t < tokens; ++t) {
      if (rejection) {  // top-k without replacement: O(k log E) per token while collisions are rare
        picked.clear();
        double picked_mass = 0;  // of the cdf steps already picked: what a redraw hits again
        while (picked.size() < top_k_) {
          // Redrawing until a new expert comes up takes 1 / (1 - picked_mass) draws on average: endless once
          // the picked experts hold all the cdf's mass (skew 8: the 4th expert has ~1e-5 of it; tail experts
          // below the cdf's rounding have none). Past kMaxExpectedDraws, or after kMaxDraws unlucky draws,
          // the next expert is drawn exactly from the remaining weights instead: the same distribution (a
          // redraw conditioned on a new expert), so draws that needed neither are unchanged.
          std::uint32_t e = experts_;
          if ((acc - picked_mass) * kMaxExpectedDraws > acc) {
            for (std::uint32_t d = 0; d < kMaxDraws; ++d) {
              const double u = rng.uniform() * acc;
              auto x = static_cast<std::uint32_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
              if (x >= experts_) x = experts_ - 1;
              if (std::find(picked.begin(), picked.end(), x) == picked.end()) {
                e = x;
                break;
              }
            }
          }
          if (e == experts_) e = draw_excluding(base, experts_, picked, rng);
          picked.push_back(e);
          picked_mass += cdf[e] - (e > 0 ? cdf[e - 1] : 0.0);
        }
        for (std::uint32_t e : picked) counts[std::size_t(l) * experts_ + e] += 1.0;
        continue;
      }
      std::copy(base, base + experts_, w.begin());
      double total = acc;
      for (std::uint32_t k = 0; k < top_k_; ++k) {  // O(k E): only for k close to E
        double u = rng.uniform() * total;
        std::uint32_t e = 0;
        for (; e + 1 < experts_; ++e) {
          if (u < w[e]) break;
          u -= w[e];
        }
        while (w[e] == 0.0 && e > 0) --e;
        counts[std::size_t(l) * experts_ + e] += 1.0;
        total -= w[e];
        w[e] = 0.0;
      }
    }
  }
  return counts;
}

void RoutingModel::refresh() {
  const double a = p_.locality, b = std::sqrt(std::max(0.0, 1.0 - a * a)) * p_.temporal_sigma;
  std::vector<double> w(experts_);
  for (std::uint32_t l = 0; l < layers_; ++l) {
    const std::size_t o = std::size_t(l) * experts_;
    double z = 0;
    for (std::uint32_t e = 0; e < experts_; ++e) {
      double& x = x_[o + e];
      if (b > 0) x = a * x + b * rng_.normal();
      w[e] = live_w_[o + e] * std::exp(x);
      z += w[e];
    }
    for (std::uint32_t e = 0; e < experts_; ++e) {
      const double pe = w[e] / z;
      live_p_[o + e] = pe;
      log_miss_[o + e] = pe >= 1.0 ? -1e300 : std::log1p(-pe);
    }
  }
}

void RoutingModel::step(std::uint64_t tokens, std::vector<std::uint8_t>& touched) {
  if (steps_++ % std::max<std::uint32_t>(1, p_.temporal_period) == 0) refresh();
  touched.resize(live_w_.size());
  const double picks = double(tokens) * top_k_;
  for (std::size_t i = 0; i < log_miss_.size(); ++i) {
    const double lm = picks * log_miss_[i];  // log P(no pick of this expert)
    touched[i] = lm < -40.0 ? 1 : static_cast<std::uint8_t>(rng_.uniform() >= std::exp(lm));
  }
}

void predict_layer(const PredictorParams& p, const std::uint8_t* touched, const std::uint8_t* resident,
                   std::uint32_t experts, Rng& rng, std::uint8_t* predicted) {
  std::fill(predicted, predicted + experts, std::uint8_t{0});
  if (p.kind == PredictorKind::kNone) return;
  std::uint32_t wrong = 0;
  for (std::uint32_t e = 0; e < experts; ++e) {
    if (!touched[e] || resident[e]) continue;
    if (p.kind == PredictorKind::kOracle || rng.bernoulli(p.accuracy))
      predicted[e] = 1;
    else
      ++wrong;
  }
  for (std::uint32_t e = 0; e < experts && wrong > 0; ++e) {  // a mispredicted expert takes its place
    if (touched[e] || resident[e] || predicted[e]) continue;
    predicted[e] = 1;
    --wrong;
  }
}

}  // namespace amoeba::engine
