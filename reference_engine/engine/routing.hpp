// Synthetic expert routing: which experts each layer's tokens pick, for the offline ranking sample and for
// the live run, and the prefetch predictors.
//
// Model (per MoE layer l, expert e):
//   base popularity  w[l][e] = 1 / (rank + 1)^skew, rank = pi_l(e)   (per-layer popularity skew);
//   cross-layer correlation: pi_{l+1} is pi_l with a fraction (1 - cross_layer_correlation) of its positions
//     reshuffled, so hot experts of adjacent layers line up;
//   temporal locality: live weights are w * exp(x), x an AR(1) process per expert, updated every
//     `temporal_period` steps: x' = locality * x + sqrt(1 - locality^2) * temporal_sigma * N(0, 1), so what
//     was hot stays hot a while (the period keeps the per-step cost at one exp and one draw per expert);
//   drift: the live ranking is the calibration ranking with a fraction `drift` of each layer's positions
//     reshuffled (live traffic departing from the sample the offline ranking was built from).
// A step with T tokens touches expert e with probability 1 - (1 - p_e)^(T k), p_e the normalised live weight
// (independent draws per expert; exact top-k draws are used for the offline sample).
//
// Routable sets: independent draws can touch fewer than k experts or more than T k, which no top-k router
// produces (T tokens pick k distinct experts each). make_routable() brings a drawn set into
// [min(k, E), min(T k, E)] by popularity: a set short of k gains the most popular experts it lacks, a set
// above T k keeps its T k most popular; a set already within the bounds is left as it is. Equal popularity
// goes to the lower expert id, and the rule draws nothing from a random stream, so every later draw of a
// seed is what it was. The routing sources apply it (routing_source.hpp), so the
// simulator and a GPU backend, which realises a set by giving token t experts set[(t k + j) mod |set|],
// route to the same experts.
//
// Predictors for the next layer's experts (DESIGN §3.4): none; cross-layer with a given accuracy (each expert
// the router will pick and that is not resident is predicted with probability `accuracy`; each one missed
// costs one wrong, wasted prediction when a non-needed offloaded expert exists); oracle (exactly the needed
// ones).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model.hpp"
#include "engine/random.hpp"

namespace amoeba::engine {

struct RoutingParams {
  double skew = 0.6;
  double cross_layer_correlation = 0.5;
  double locality = 0.9;
  double temporal_sigma = 0.3;
  double drift = 0.0;
  std::uint64_t calibration_tokens = 8192;
  std::uint32_t temporal_period = 8;  // steps between updates of the temporal state
};

enum class PredictorKind : std::uint8_t { kNone, kCrossLayer, kOracle };
struct PredictorParams {
  PredictorKind kind = PredictorKind::kCrossLayer;
  double accuracy = 0.9;
};
std::string to_string(PredictorKind k);
PredictorKind predictor_from_string(const std::string& s);  // throws ConfigError

// The distinct-expert counts a top-k router can route `tokens` tokens to, among `experts` experts:
// [min(k, E), min(T k, E)]; [0, 0] when tokens is 0 (nothing is routed).
struct RoutableRange {
  std::uint64_t min = 0, max = 0;
};
RoutableRange routable_range(std::uint64_t tokens, std::uint32_t top_k, std::uint32_t experts) noexcept;

// Brings `set` (distinct expert ids below popularity.size(), ascending) into routable_range(tokens, top_k,
// popularity.size()) by popularity (larger = more popular; ties: the lower id): adds the most popular
// missing experts, or keeps the most popular ones. The identity on a set within the range; the result is
// ascending.
void make_routable(std::vector<std::uint32_t>& set, std::uint64_t tokens, std::uint32_t top_k,
                   std::span<const double> popularity);

class RoutingModel {
 public:
  RoutingModel(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k, const RoutingParams& p,
               std::uint64_t seed);

  std::uint32_t layers() const noexcept { return layers_; }
  std::uint32_t experts() const noexcept { return experts_; }
  std::uint32_t top_k() const noexcept { return top_k_; }

  // Offline sample: routed-token counts per [layer * experts + expert] over `tokens` tokens drawn (top-k
  // without replacement) from the calibration distribution (no drift, no temporal noise).
  std::vector<double> calibration_counts(std::uint64_t tokens) const;

  // Advances the temporal state by one step and marks the experts a batch of `tokens` tokens touches:
  // touched[layer * experts + expert] = 1.
  void step(std::uint64_t tokens, std::vector<std::uint8_t>& touched);

  // The live probability of each expert of `layer` at the last step() (one token's pick): the popularity
  // make_routable() orders by. All zero before the first step().
  std::span<const double> live_probability(std::uint32_t layer) const noexcept {
    return std::span<const double>(live_p_).subspan(std::size_t(layer) * experts_, experts_);
  }

 private:
  std::uint32_t layers_, experts_, top_k_;
  RoutingParams p_;
  std::vector<double> calib_w_;   // normalised per layer
  std::vector<double> live_w_;    // unnormalised base weights of the live (possibly drifted) ranking
  std::vector<double> x_;         // temporal AR state
  std::vector<double> log_miss_;  // log(1 - p_e) of the current live distribution
  std::vector<double> live_p_;    // p_e of the current live distribution
  std::uint64_t steps_ = 0;
  void refresh();
  Rng rng_;
  std::uint64_t seed_;
};

// Fills `predicted` (same layout as a layer's slice of `touched`) for one layer: which offloaded experts the
// predictor asks the loader to fetch. `resident[e]` marks experts already in GPU pages.
void predict_layer(const PredictorParams& p, const std::uint8_t* touched, const std::uint8_t* resident,
                   std::uint32_t experts, Rng& rng, std::uint8_t* predicted);

}  // namespace amoeba::engine
