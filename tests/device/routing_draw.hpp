// Top-k routing for the device tests and paged_moe_bench, drawn on the host (no CUDA: tests/unit/routing_draw
// checks it on any machine). Four routers:
//  - uniform: each token's k experts uniformly without replacement (the benchmark's default since its first
//    version; the sequence for a seed is unchanged);
//  - hot:     uniform, except every other token has one given expert among its k (one expert far over a
//  tile);
//  - zipf:    expert popularity ∝ 1 / rank^s over a fixed random ranking of the experts (the same for every
//    seed, as a trained router favours the same experts step after step), each token's k drawn without
//    replacement in proportion to it (Gumbel top-k). s = 0 is uniform; trained MoE routers are skewed, and a
//    kernel choice that reads an expert once per 8 tokens pays for it only when some experts get many tokens;
//  - balanced: every expert gets T·k / E tokens, rounded down or up (token t takes the k experts at positions
//    t·k .. t·k + k − 1, mod E, of a seed-shuffled order), as a router trained with a perfect load-balancing
//    loss would: no expert has a partly filled last tile beyond what T·k / E itself leaves.
// Weights: positive, summing to 1 per token; a per-token shared weight in (0, 1) (a sigmoid gate's range).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace amoeba::testing {

struct Router {
  enum class Kind { kUniform, kHot, kZipf, kBalanced };
  Kind kind = Kind::kUniform;
  int hot_expert = -1;  // kHot
  double zipf_s = 0.0;  // kZipf, >= 0

  // "uniform", "hot:E", "zipf:S" or "balanced" (the benchmark's --router).
  static Router parse(const std::string& v) {
    Router r;
    const auto colon = v.find(':');
    const std::string name = v.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : v.substr(colon + 1);
    try {
      if (name == "uniform" && arg.empty()) return r;
      if (name == "balanced" && colon == std::string::npos) {
        r.kind = Kind::kBalanced;
        return r;
      }
      if (name == "hot" && !arg.empty()) {
        r.kind = Kind::kHot;
        r.hot_expert = std::stoi(arg);
        if (r.hot_expert >= 0) return r;
      }
      if (name == "zipf" && !arg.empty()) {
        r.kind = Kind::kZipf;
        r.zipf_s = std::stod(arg);
        if (r.zipf_s >= 0 && std::isfinite(r.zipf_s)) return r;
      }
    } catch (const std::exception&) {
    }
    throw std::invalid_argument(
        "--router: '" + v +
        "' is not uniform, hot:E (E >= 0, an expert id), zipf:S (S >= 0, finite) or balanced");
  }
  std::string name() const {
    switch (kind) {
      case Kind::kHot:
        return "hot:" + std::to_string(hot_expert);
      case Kind::kZipf: {
        std::string s = std::to_string(zipf_s);
        s.erase(s.find_last_not_of('0') + 1);
        if (s.back() == '.') s.pop_back();
        return "zipf:" + s;
      }
      case Kind::kBalanced:
        return "balanced";
      case Kind::kUniform:
        break;
    }
    return "uniform";
  }
};

struct DrawnRouting {
  std::vector<std::int32_t> ids;  // [T, k]
  std::vector<float> weights;     // [T, k]
  std::vector<float> shared;      // [T]
  int distinct_experts = 0;       // routed experts with at least one token
};

// The fixed popularity ranking of a zipf router: rank_of[e] = e's rank (0 = most popular).
inline std::vector<int> zipf_ranking(int num_experts) {
  std::vector<int> rank_of(num_experts);
  std::iota(rank_of.begin(), rank_of.end(), 0);
  std::mt19937_64 rng(0x5eedULL + static_cast<std::uint64_t>(num_experts));
  std::shuffle(rank_of.begin(), rank_of.end(), rng);
  return rank_of;
}

inline DrawnRouting draw_routing(int num_experts, int top_k, int tokens, std::uint64_t seed,
                                 const Router& router = {}) {
  if (num_experts <= 0 || top_k <= 0 || top_k > num_experts || tokens < 0)
    throw std::invalid_argument("draw_routing: need 0 < top_k <= num_experts and tokens >= 0");
  if (router.kind == Router::Kind::kHot && router.hot_expert >= num_experts)
    throw std::invalid_argument("--router hot:" + std::to_string(router.hot_expert) + ": the model has " +
                                std::to_string(num_experts) + " experts");
  DrawnRouting r;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(0.05f, 1.0f);
  std::vector<int> perm(num_experts);
  std::vector<char> used(num_experts, 0);
  r.ids.resize(static_cast<std::size_t>(tokens) * top_k);
  r.weights.resize(r.ids.size());
  r.shared.resize(tokens);
  // zipf: log-popularity per expert, and per token the Gumbel-perturbed keys (the k largest are a draw
  // without replacement in proportion to the popularity).
  std::vector<double> log_pop, key;
  if (router.kind == Router::Kind::kZipf) {
    const std::vector<int> rank_of = zipf_ranking(num_experts);
    log_pop.resize(num_experts);
    for (int e = 0; e < num_experts; ++e) log_pop[e] = -router.zipf_s * std::log(1.0 + rank_of[e]);
    key.resize(num_experts);
  }
  std::uniform_real_distribution<double> open01(std::nextafter(0.0, 1.0), 1.0);
  // balanced: the seed's cyclic order of the experts.
  std::vector<int> order;
  if (router.kind == Router::Kind::kBalanced) {
    order.resize(num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
  }
  // uniform and hot draw each token's experts by swaps into perm's first k; zipf and balanced set them at the
  // top of the token loop.
  const bool swaps = router.kind == Router::Kind::kUniform || router.kind == Router::Kind::kHot;
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    const bool hot = router.kind == Router::Kind::kHot && t % 2 == 0;
    if (hot) std::swap(perm[0], perm[router.hot_expert]);
    if (router.kind == Router::Kind::kBalanced)
      for (int j = 0; j < top_k; ++j)
        perm[j] = order[(static_cast<std::size_t>(t) * top_k + j) % static_cast<std::size_t>(num_experts)];
    if (router.kind == Router::Kind::kZipf) {
      for (int e = 0; e < num_experts; ++e) key[e] = log_pop[e] - std::log(-std::log(open01(rng)));
      std::partial_sort(perm.begin(), perm.begin() + top_k, perm.end(),
                        [&](int a, int b) { return key[a] > key[b]; });
    }
    float sum = 0;
    for (int j = 0; j < top_k; ++j) {
      if (swaps && !(hot && j == 0)) {
        std::uniform_int_distribution<int> pick(j, num_experts - 1);
        std::swap(perm[j], perm[pick(rng)]);
      }
      r.ids[static_cast<std::size_t>(t) * top_k + j] = perm[j];
      used[perm[j]] = 1;
      sum += (r.weights[static_cast<std::size_t>(t) * top_k + j] = uni(rng));
    }
    for (int j = 0; j < top_k; ++j) r.weights[static_cast<std::size_t>(t) * top_k + j] /= sum;
    r.shared[t] = uni(rng);
  }
  r.distinct_experts = static_cast<int>(std::count(used.begin(), used.end(), 1));
  return r;
}

}  // namespace amoeba::testing
