// ExpertRanker: the offline "hot expert ranking" (DESIGN §3.2). From routing statistics gathered on a sample
// it holds, for every layer, the probability that each expert is routed to, and the experts of each layer
// sorted by that probability (rank 0 = hottest). Each layer keeps a resident prefix of its ranking; the
// nominators in nominations.hpp walk the rankings to pick experts to restore and to evict.
//
// Sources:
//   - in memory: ExpertRanker::Builder (counts or probabilities), from_probabilities(), uniform();
//   - CSV (this header, no dependencies), format below;
//   - JSON: amoeba/expert/ranker_json.hpp (needs nlohmann-json; kept apart so the core needs no JSON).
//
// CSV format ("amoeba expert statistics", one row per (layer, expert)):
//   # comment lines and blank lines are ignored
//   layer,expert,probability        <- header; the third column is `probability` or `count`
//   0,0,0.125
//   0,1,0.031
//   ...
// Rules (each broken rule throws ConfigError naming "<source>:<line>.<column>", the value and the rule):
//   layer and expert are decimal integers; layers are 0..L-1 and experts 0..E-1 with every (layer, expert)
//   pair present exactly once (L, E >= 1); probability is a finite number in [0, 1]; count is a non-negative
//   integer. Counts become probabilities per layer: p(l, e) = count(l, e) / sum over e of count(l, e) (a
//   layer with all-zero counts gets a uniform 1/E). Probabilities are used as given (with top-k routing they
//   sum to k per layer; only their order within a layer and their size across layers matter).
//
// Ties are broken by expert id: of two experts with equal probability the lower id ranks hotter.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <istream>
#include <limits>
#include <locale>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_key.hpp"

namespace amoeba {

class ExpertRanker {
 public:
  // Collects statistics in memory: routing counts (e.g. from a calibration run) or probabilities.
  class Builder {
   public:
    Builder(std::uint32_t layers, std::uint32_t experts_per_layer)
        : layers_(layers), experts_(experts_per_layer) {
      check_shape(layers, experts_per_layer, "builder");
      counts_.assign(std::size_t(layers) * experts_per_layer, 0);
      probs_.assign(std::size_t(layers) * experts_per_layer, 0.0);
    }
    // Adds `n` routing decisions that picked (layer, expert). Mixing counts and probabilities in one builder
    // throws.
    Builder& add_count(std::uint32_t layer, std::uint32_t expert, std::uint64_t n = 1) {
      at(layer, expert);
      if (has_probs_) throw_config_error("builder.count", n, "cannot mix counts and probabilities");
      has_counts_ = true;
      counts_[std::size_t(layer) * experts_ + expert] += n;
      return *this;
    }
    Builder& add_routing(std::uint32_t layer, std::span<const std::uint32_t> experts) {
      for (std::uint32_t e : experts) add_count(layer, e);
      return *this;
    }
    Builder& set_probability(std::uint32_t layer, std::uint32_t expert, double p) {
      at(layer, expert);
      if (has_counts_) throw_config_error("builder.probability", p, "cannot mix counts and probabilities");
      if (!(p >= 0.0 && p <= 1.0)) throw_config_error("builder.probability", p, "must be in [0, 1]");
      has_probs_ = true;
      probs_[std::size_t(layer) * experts_ + expert] = p;
      return *this;
    }
    ExpertRanker build() const {
      if (!has_counts_) return ExpertRanker(layers_, experts_, probs_);
      std::vector<double> p(counts_.size());
      for (std::uint32_t l = 0; l < layers_; ++l) {
        const auto* c = &counts_[std::size_t(l) * experts_];
        const std::uint64_t total = std::accumulate(c, c + experts_, std::uint64_t{0});
        for (std::uint32_t e = 0; e < experts_; ++e)
          p[std::size_t(l) * experts_ + e] =
              total == 0 ? 1.0 / experts_ : static_cast<double>(c[e]) / static_cast<double>(total);
      }
      return ExpertRanker(layers_, experts_, std::move(p));
    }

   private:
    void at(std::uint32_t layer, std::uint32_t expert) const {
      if (layer >= layers_)
        throw_config_error("builder.layer", layer, "must be below " + std::to_string(layers_));
      if (expert >= experts_)
        throw_config_error("builder.expert", expert, "must be below " + std::to_string(experts_));
    }
    std::uint32_t layers_, experts_;
    std::vector<std::uint64_t> counts_;
    std::vector<double> probs_;
    bool has_counts_ = false, has_probs_ = false;
  };

  // Every expert equally likely: the ranking is expert-id order (for caches that need no statistics).
  static ExpertRanker uniform(std::uint32_t layers, std::uint32_t experts_per_layer) {
    check_shape(layers, experts_per_layer, "uniform");
    return ExpertRanker(
        layers, experts_per_layer,
        std::vector<double>(std::size_t(layers) * experts_per_layer, 1.0 / experts_per_layer));
  }

  // probabilities[layer][expert]; every layer must have the same number of experts. `source` names the input
  // in error messages.
  static ExpertRanker from_probabilities(const std::vector<std::vector<double>>& probabilities,
                                         std::string_view source = "probabilities") {
    const std::string s(source);
    if (probabilities.empty()) throw_config_error(s + ".layers", 0, "must be at least 1");
    const std::size_t e = probabilities[0].size();
    std::vector<double> flat;
    for (std::size_t l = 0; l < probabilities.size(); ++l) {
      if (probabilities[l].size() != e)
        throw_config_error(s + "[" + std::to_string(l) + "]",
                           std::to_string(probabilities[l].size()) + " experts",
                           "every layer must list the same number of experts (" + std::to_string(e) + ")");
      for (std::size_t x = 0; x < e; ++x) {
        const double p = probabilities[l][x];
        if (!(p >= 0.0 && p <= 1.0))
          throw_config_error(s + "[" + std::to_string(l) + "][" + std::to_string(x) + "]", p,
                             "must be a finite number in [0, 1]");
        flat.push_back(p);
      }
    }
    check_shape(probabilities.size(), e, s);
    return ExpertRanker(static_cast<std::uint32_t>(probabilities.size()), static_cast<std::uint32_t>(e),
                        std::move(flat));
  }

  // Reads the CSV format described at the top of this header.
  static ExpertRanker from_csv(std::istream& in, std::string_view source = "csv") {
    const std::string src(source);
    std::string line;
    std::size_t line_no = 0;
    bool header = false, counts = false;
    struct Row {
      std::uint64_t layer, expert;
      double p;
      std::uint64_t count;
      std::size_t line;
    };
    std::vector<Row> rows;
    std::uint64_t max_layer = 0, max_expert = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const std::string_view t = trim(line);
      if (t.empty() || t.front() == '#') continue;
      const std::string where = src + ":" + std::to_string(line_no);
      std::vector<std::string_view> cols = split(t);
      if (!header) {
        if (cols.size() != 3 || trim(cols[0]) != "layer" || trim(cols[1]) != "expert" ||
            (trim(cols[2]) != "probability" && trim(cols[2]) != "count"))
          throw_config_error(where + ".header", t,
                             "must be `layer,expert,probability` or `layer,expert,count`");
        counts = trim(cols[2]) == "count";
        header = true;
        continue;
      }
      if (cols.size() != 3)
        throw_config_error(where + ".columns", cols.size(),
                           "a row must have exactly 3 comma-separated columns");
      Row r{};
      r.line = line_no;
      r.layer = parse_uint(cols[0], where + ".layer", kMaxLayers - 1);
      r.expert = parse_uint(cols[1], where + ".expert", kMaxExpertsPerLayer - 1);
      if (counts)
        r.count = parse_uint(cols[2], where + ".count", std::numeric_limits<std::uint64_t>::max() / 2);
      else
        r.p = parse_probability(cols[2], where + ".probability");
      max_layer = std::max(max_layer, r.layer);
      max_expert = std::max(max_expert, r.expert);
      rows.push_back(r);
    }
    if (!header) throw_config_error(src + ".header", "(missing)", "the file must start with a header row");
    if (rows.empty()) throw_config_error(src + ".rows", 0, "at least one (layer, expert) row is required");
    const std::uint64_t L = max_layer + 1, E = max_expert + 1;
    if (L * E > rows.size() && L * E > (std::uint64_t{1} << 26))  // do not allocate for absurd ids
      throw_config_error(src + ".rows", rows.size(),
                         "every (layer, expert) for layers 0.." + std::to_string(max_layer) +
                             " and experts 0.." + std::to_string(max_expert) + " must appear exactly once");
    std::vector<std::size_t> seen(L * E, 0);
    Builder b(static_cast<std::uint32_t>(L), static_cast<std::uint32_t>(E));
    for (const Row& r : rows) {
      std::size_t& s = seen[r.layer * E + r.expert];
      if (s != 0)
        throw_config_error(src + ":" + std::to_string(r.line) + ".expert",
                           "(" + std::to_string(r.layer) + ", " + std::to_string(r.expert) + ")",
                           "duplicate row; first given on line " + std::to_string(s));
      s = r.line;
      if (counts)
        b.add_count(static_cast<std::uint32_t>(r.layer), static_cast<std::uint32_t>(r.expert), r.count);
      else
        b.set_probability(static_cast<std::uint32_t>(r.layer), static_cast<std::uint32_t>(r.expert), r.p);
    }
    for (std::uint64_t i = 0; i < L * E; ++i)
      if (seen[i] == 0)
        throw_config_error(src + ".rows", "(" + std::to_string(i / E) + ", " + std::to_string(i % E) + ")",
                           "missing row: every (layer, expert) with layer < " + std::to_string(L) +
                               " and expert < " + std::to_string(E) + " must appear exactly once");
    return b.build();
  }
  static ExpertRanker from_csv_string(std::string_view text, std::string_view source = "csv") {
    std::istringstream in{std::string(text)};
    return from_csv(in, source);
  }
  static ExpertRanker from_csv_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw_config_error("stats.path", path, "cannot be opened for reading");
    return from_csv(in, path);
  }

  // ---- queries (all O(1))
  std::uint32_t layers() const noexcept { return layers_; }
  std::uint32_t experts_per_layer() const noexcept { return experts_; }
  double probability(std::uint32_t layer, std::uint32_t expert) const noexcept {
    return prob_[std::size_t(layer) * experts_ + expert];
  }
  double probability(ExpertKey k) const noexcept { return probability(k.layer, k.expert); }
  // 0 = hottest.
  std::uint32_t rank_of(std::uint32_t layer, std::uint32_t expert) const noexcept {
    return rank_[std::size_t(layer) * experts_ + expert];
  }
  std::uint32_t rank_of(ExpertKey k) const noexcept { return rank_of(k.layer, k.expert); }
  std::uint32_t expert_at(std::uint32_t layer, std::uint32_t rank) const noexcept {
    return order_[std::size_t(layer) * experts_ + rank];
  }
  // The experts of `layer`, hottest first.
  std::span<const std::uint32_t> ranking(std::uint32_t layer) const noexcept {
    return {order_.data() + std::size_t(layer) * experts_, experts_};
  }

 private:
  ExpertRanker(std::uint32_t layers, std::uint32_t experts, std::vector<double> prob)
      : layers_(layers), experts_(experts), prob_(std::move(prob)) {
    order_.resize(prob_.size());
    rank_.resize(prob_.size());
    for (std::uint32_t l = 0; l < layers_; ++l) {
      std::uint32_t* o = order_.data() + std::size_t(l) * experts_;
      std::iota(o, o + experts_, 0u);
      const double* p = prob_.data() + std::size_t(l) * experts_;
      std::stable_sort(o, o + experts_, [p](std::uint32_t a, std::uint32_t b) { return p[a] > p[b]; });
      for (std::uint32_t r = 0; r < experts_; ++r) rank_[std::size_t(l) * experts_ + o[r]] = r;
    }
  }

  static void check_shape(std::uint64_t layers, std::uint64_t experts, const std::string& src) {
    if (layers == 0 || layers >= kMaxLayers)
      throw_config_error(src + ".layers", layers, "must be in [1, 2^24)");
    if (experts == 0 || experts >= kMaxExpertsPerLayer)
      throw_config_error(src + ".experts", experts, "must be in [1, 2^24)");
  }
  static std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  }
  static std::vector<std::string_view> split(std::string_view s) {
    std::vector<std::string_view> out;
    for (std::size_t pos = 0;;) {
      const std::size_t c = s.find(',', pos);
      out.push_back(s.substr(pos, c == std::string_view::npos ? std::string_view::npos : c - pos));
      if (c == std::string_view::npos) break;
      pos = c + 1;
    }
    return out;
  }
  static std::uint64_t parse_uint(std::string_view raw, const std::string& field, std::uint64_t max) {
    const std::string_view s = trim(raw);
    if (s.empty()) throw_config_error(field, "(empty)", "must be a non-negative decimal integer");
    std::uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') throw_config_error(field, s, "must be a non-negative decimal integer");
      if (v > (max - static_cast<std::uint64_t>(c - '0')) / 10)
        throw_config_error(field, s, "must not exceed " + std::to_string(max));
      v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
  }
  static double parse_probability(std::string_view raw, const std::string& field) {
    const std::string s(trim(raw));
    std::istringstream is(s);
    is.imbue(std::locale::classic());
    double v = 0;
    if (s.empty() || !(is >> v) || !is.eof())
      throw_config_error(field, s.empty() ? std::string("(empty)") : s, "must be a number");
    if (!(v >= 0.0 && v <= 1.0)) throw_config_error(field, s, "must be a finite number in [0, 1]");
    return v;
  }

  std::uint32_t layers_ = 0, experts_ = 0;
  std::vector<double> prob_;
  std::vector<std::uint32_t> order_;  // [layer][rank] -> expert
  std::vector<std::uint32_t> rank_;   // [layer][expert] -> rank
};

}  // namespace amoeba
