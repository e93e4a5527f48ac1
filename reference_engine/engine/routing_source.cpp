// The engine's routing sources; see routing_source.hpp.
#include "engine/routing_source.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

SyntheticRouting::SyntheticRouting(RoutingModel model) : model_(std::move(model)) {
  experts_.reserve(std::size_t(model_.layers()) * model_.experts());
  offsets_.reserve(model_.layers() + 1);
}

void SyntheticRouting::begin_step(const StepBatch& batch) {
  model_.step(batch.tokens, touched_);
  const std::uint32_t e = model_.experts();
  experts_.clear();
  offsets_.assign(1, 0);
  for (std::uint32_t l = 0; l < model_.layers(); ++l) {
    const std::uint8_t* t = &touched_[std::size_t(l) * e];
    layer_.clear();
    for (std::uint32_t x = 0; x < e; ++x)
      if (t[x]) layer_.push_back(x);
    make_routable(layer_, batch.tokens, model_.top_k(), model_.live_probability(l));
    experts_.insert(experts_.end(), layer_.begin(), layer_.end());
    offsets_.push_back(static_cast<std::uint32_t>(experts_.size()));
  }
}

std::span<const std::uint32_t> SyntheticRouting::layer_experts(std::uint32_t layer) const {
  return std::span<const std::uint32_t>(experts_).subspan(offsets_[layer],
                                                          offsets_[layer + 1] - offsets_[layer]);
}

RecordedRouting::RecordedRouting(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k,
                                 std::vector<RecordedStep> steps, bool wrap)
    : layers_(layers),
      experts_(experts),
      top_k_(top_k),
      steps_(std::move(steps)),
      wrap_(wrap),
      popularity_(std::size_t(layers) * experts, 0.0) {
  if (top_k == 0) throw_config_error("routing.top_k", 0, "must be at least 1 (experts per token)");
  if (steps_.empty()) throw_config_error("routing.steps", 0, "must hold at least one step");
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    RecordedStep& s = steps_[i];
    const std::string field = "routing.steps[" + std::to_string(i) + "]";
    if (s.size() != layers)
      throw_config_error(field, s.size(), "must list " + std::to_string(layers) + " MoE layers");
    for (std::size_t l = 0; l < s.size(); ++l) {
      for (std::uint32_t x : s[l])
        if (x >= experts)
          throw_config_error(field + "[" + std::to_string(l) + "]", x,
                             "expert ids must be below " + std::to_string(experts));
      std::sort(s[l].begin(), s[l].end());
      s[l].erase(std::unique(s[l].begin(), s[l].end()), s[l].end());
      for (std::uint32_t x : s[l]) popularity_[std::size_t(l) * experts + x] += 1.0;
    }
  }
}

void RecordedRouting::begin_step(const StepBatch& batch) {
  if (replayed_ >= steps_.size() && !wrap_)
    throw_config_error(
        "routing.steps", steps_.size(),
        "the recorded routing ends before the run (step " + std::to_string(replayed_ + 1) + ")");
  current_ = replayed_ % steps_.size();
  ++replayed_;
  // Sets a top-k router could not produce for this step's tokens are made routable into experts_now_;
  // the others are read from the record as they are (offsets_now_ empty: every layer as recorded).
  const RoutableRange r = routable_range(batch.tokens, top_k_, experts_);
  const RecordedStep& s = steps_[current_];
  bool all_routable = true;
  for (const auto& set : s) all_routable = all_routable && set.size() >= r.min && set.size() <= r.max;
  experts_now_.clear();
  offsets_now_.clear();
  if (all_routable) return;
  offsets_now_.push_back(0);
  std::vector<std::uint32_t> set;
  for (std::uint32_t l = 0; l < layers_; ++l) {
    set = s[l];
    make_routable(set, batch.tokens, top_k_,
                  std::span<const double>(popularity_).subspan(std::size_t(l) * experts_, experts_));
    experts_now_.insert(experts_now_.end(), set.begin(), set.end());
    offsets_now_.push_back(static_cast<std::uint32_t>(experts_now_.size()));
  }
}

std::span<const std::uint32_t> RecordedRouting::layer_experts(std::uint32_t layer) const {
  if (!offsets_now_.empty())
    return std::span<const std::uint32_t>(experts_now_)
        .subspan(offsets_now_[layer], offsets_now_[layer + 1] - offsets_now_[layer]);
  return steps_[current_][layer];
}

ModelRouting::ModelRouting(std::uint32_t layers, std::uint32_t experts) : layers_(layers), experts_(experts) {
  if (layers == 0) throw_config_error("routing.layers", 0, "must be at least 1 (MoE layers of the model)");
  if (experts == 0) throw_config_error("routing.experts", 0, "must be at least 1 (routed experts per layer)");
}

std::span<const std::uint32_t> ModelRouting::layer_experts(std::uint32_t layer) const {
  throw std::logic_error("ModelRouting::layer_experts(" + std::to_string(layer) +
                         "): the model's router decides inside the forward; read StepResult::routed_at");
}

}  // namespace amoeba::engine
