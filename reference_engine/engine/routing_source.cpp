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
    for (std::uint32_t x = 0; x < e; ++x)
      if (t[x]) experts_.push_back(x);
    offsets_.push_back(static_cast<std::uint32_t>(experts_.size()));
  }
}

std::span<const std::uint32_t> SyntheticRouting::layer_experts(std::uint32_t layer) const {
  return std::span<const std::uint32_t>(experts_).subspan(offsets_[layer],
                                                          offsets_[layer + 1] - offsets_[layer]);
}

RecordedRouting::RecordedRouting(std::uint32_t layers, std::uint32_t experts, std::vector<RecordedStep> steps,
                                 bool wrap)
    : layers_(layers), experts_(experts), steps_(std::move(steps)), wrap_(wrap) {
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
    }
  }
}

void RecordedRouting::begin_step(const StepBatch&) {
  if (replayed_ >= steps_.size() && !wrap_)
    throw_config_error(
        "routing.steps", steps_.size(),
        "the recorded routing ends before the run (step " + std::to_string(replayed_ + 1) + ")");
  current_ = replayed_ % steps_.size();
  ++replayed_;
}

std::span<const std::uint32_t> RecordedRouting::layer_experts(std::uint32_t layer) const {
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
