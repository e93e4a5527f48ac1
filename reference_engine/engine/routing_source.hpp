// The engine's RoutingSource models (amoeba/engine/step.hpp):
//   SyntheticRouting  the seeded routing model of routing.hpp: each step marks the experts a batch of
//                     T tokens touches, layer by layer; the same seed gives the same choices everywhere;
//   RecordedRouting   a recorded routing trace replayed step by step (step i of the run reads record i); past
//                     the record's end it either starts again (wrap) or refuses the step with the counts;
// Both hand out routable sets only: every layer's set is brought into [min(k, E), min(T k, E)] for the
// step's T tokens by make_routable (routing.hpp), ordered by the routing model's live popularity
// (synthetic) or by how many of the record's steps route to each expert (recorded; a record made by
// another run, or replayed in a run with other batches, can hold sets a top-k router cannot produce). So
// the simulator and a GPU backend given the same source route to the same experts.
//   ModelRouting      the model's own router, run by a GPU backend inside the forward: it only names the
//                     shape (--routing model); it has no choices to read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "amoeba/engine/step.hpp"
#include "engine/routing.hpp"

namespace amoeba::engine {

class SyntheticRouting final : public RoutingSource {
 public:
  explicit SyntheticRouting(RoutingModel model);

  RoutingKind kind() const noexcept override { return RoutingKind::kSynthetic; }
  std::uint32_t layers() const noexcept override { return model_.layers(); }
  std::uint32_t experts() const noexcept override { return model_.experts(); }
  void begin_step(const StepBatch& batch) override;
  std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const override;

  const RoutingModel& model() const noexcept { return model_; }

 private:
  RoutingModel model_;
  std::vector<std::uint8_t> touched_;  // [layer * experts + expert]
  std::vector<std::uint32_t> experts_, offsets_, layer_;
};

// One recorded step: the distinct experts of every MoE layer.
using RecordedStep = std::vector<std::vector<std::uint32_t>>;

class RecordedRouting final : public RoutingSource {
 public:
  // Throws ConfigError when there is no step, a step has the wrong number of layers or an expert id >=
  // `experts`. `top_k`: the model's experts per token (sets are made routable for it). `wrap`: after the
  // last step, start again from the first.
  RecordedRouting(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k,
                  std::vector<RecordedStep> steps, bool wrap = false);

  RoutingKind kind() const noexcept override { return RoutingKind::kRecorded; }
  std::uint32_t layers() const noexcept override { return layers_; }
  std::uint32_t experts() const noexcept override { return experts_; }
  void begin_step(const StepBatch& batch) override;
  std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const override;
  std::size_t steps_replayed() const noexcept { return replayed_; }
  std::size_t record_steps() const noexcept { return steps_.size(); }

 private:
  std::uint32_t layers_, experts_, top_k_;
  std::vector<RecordedStep> steps_;
  bool wrap_;
  std::size_t replayed_ = 0, current_ = 0;
  std::vector<double> popularity_;  // [layer * experts + expert]: steps of the record routing to it
  // This step's sets where a recorded one had to be made routable (CSR, like SyntheticRouting's).
  std::vector<std::uint32_t> experts_now_, offsets_now_;
};

// Routing decided by the checkpoint's router inside the forward (RoutingKind::kModel). A backend with a
// router reports what it chose in StepResult::routed; a backend without one (the simulator) must refuse it.
class ModelRouting final : public RoutingSource {
 public:
  // Throws ConfigError when a count is 0.
  ModelRouting(std::uint32_t layers, std::uint32_t experts);

  RoutingKind kind() const noexcept override { return RoutingKind::kModel; }
  std::uint32_t layers() const noexcept override { return layers_; }
  std::uint32_t experts() const noexcept override { return experts_; }
  void begin_step(const StepBatch&) override {}
  // Throws std::logic_error: the choices exist only inside the forward (the contract's precondition is
  // kind() != kModel).
  std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const override;

 private:
  std::uint32_t layers_, experts_;
};

}  // namespace amoeba::engine
