// Routing records: the experts each MoE layer's router chose at each forward step of a run, written by
// `amoeba run --record-routing FILE`, replayed by any backend as a RoutingSource (`--routing FILE`), and
// turned by `amoeba rank` into the expert statistics the fixed and elastic policies rank by (`--ranking`),
// as the paper ranks experts offline from sample traffic.
//
// Format: JSON Lines. The first line is a header; then one line per forward step, in order:
//   {"format": "amoeba.routing", "version": 1, "model": "qwen1.5-moe-a2.7b", "moe_layers": 24,
//    "experts": 60, "top_k": 4, "backend": "sim", "routing": "synthetic"}
//   {"step": 0, "tokens": 512, "experts": [[0, 3, 5, ...], ...]}            one array per MoE layer
//   {"step": 1, "tokens": 80, "experts": [[...], ...], "counts": [[12, 4, 9, ...], ...]}
// "experts"[l] lists the distinct experts layer l routed to in that step, ascending. "counts" is optional
// (a real router knows it; the simulator's routing model does not): counts[l][i] >= 1 tokens were routed to
// experts[l][i]. Steps are numbered from 0 without gaps. Every broken rule is a ConfigError naming
// FILE:LINE and the field, the value and the rule.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/engine/step.hpp"
#include "engine/routing_source.hpp"

namespace amoeba::engine {

struct RoutingRecordHeader {
  std::string model;
  std::uint32_t moe_layers = 0, experts = 0, top_k = 0;
  std::string backend;  // what ran the steps: "sim", "cuda", ...
  std::string routing;  // what decided them: "synthetic", "model", "recorded"
};

struct RoutingRecord {
  RoutingRecordHeader header;
  std::vector<std::uint64_t> tokens;                            // per step
  std::vector<RecordedStep> steps;                              // steps[s][layer] = experts, ascending
  std::vector<std::vector<std::vector<std::uint32_t>>> counts;  // empty, or counts[s][layer][i]
};

// Collects the routing of a run, step by step, and renders it in the format above.
class RoutingRecorder {
 public:
  explicit RoutingRecorder(RoutingRecordHeader header);
  // One forward: its batch and what the forward routed (result.routed_at(l) for every MoE layer).
  void add(const StepBatch& batch, const StepResult& result);
  std::size_t steps() const noexcept { return steps_; }
  const std::string& text() const noexcept { return text_; }

 private:
  RoutingRecordHeader header_;
  std::string text_;
  std::size_t steps_ = 0;
};

RoutingRecord parse_routing_record(std::string_view text, const std::string& what);
RoutingRecord read_routing_record(const std::string& path);

// Per-layer routing counts over the whole record: tokens routed to each expert where the record has counts,
// otherwise the number of steps in which the expert was routed to. values[layer][expert].
std::vector<std::vector<double>> routing_counts(const RoutingRecord& r);
// The expert statistics file (amoeba.expert_stats, kind "count"; amoeba/expert/ranker_json.hpp) of a record.
std::string expert_stats_json(const RoutingRecord& r, const std::string& source);

// Throws ConfigError unless `r` was recorded for `moe_layers` x `experts`.
void check_record_shape(const RoutingRecord& r, std::uint32_t moe_layers, std::uint32_t experts,
                        const std::string& what);
// A RoutingSource replaying `r` for a model of `top_k` experts per token (its sets are made routable for
// each step's tokens: routing_source.hpp); past its last step it starts again from the first (a run of
// another policy may take more steps than the run that recorded it). Throws ConfigError when the record's
// shape is not the model's.
std::unique_ptr<RecordedRouting> replay(const RoutingRecord& r, std::uint32_t moe_layers,
                                        std::uint32_t experts, std::uint32_t top_k, const std::string& what);

}  // namespace amoeba::engine
