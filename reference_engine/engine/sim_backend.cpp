// The simulated forward; see sim_backend.hpp for the cost model.
#include "engine/sim_backend.hpp"

#include <algorithm>
#include <stdexcept>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

SimBackend::SimBackend(const ModelSpec& model, const GpuProfile& gpu, const CostModelParams& cost,
                       const PredictorParams& predictor, std::uint32_t load_buffer_experts,
                       std::uint64_t seed, MoeKernel kernel)
    : model_(model),
      gpu_(gpu),
      cost_(cost),
      predictor_(predictor),
      kernel_(kernel),
      moe_memory_efficiency_(cost.moe_memory_efficiency),
      moe_compute_efficiency_(cost.moe_compute_efficiency),
      planner_(LoaderShape{model.moe_layers(), model.num_experts, load_buffer_experts}),
      rng_(seed, 31),
      touched_(model.num_experts),
      resident_(model.num_experts),
      predicted_flags_(model.num_experts),
      routed_flags_(model.num_experts) {
  const CostModelParams::PrecisionScale& scale = moe_precision_scale(cost, model.expert_precision);
  moe_memory_efficiency_ *= scale.memory;
  moe_compute_efficiency_ *= scale.compute;
}

RooflineWork attention_work(const ModelSpec& model, std::uint32_t layer, const StepBatch& batch) {
  const double tokens = double(batch.tokens);
  const double params = double(model.attention_params(layer));
  double bytes = 2.0 * params, flops = 2.0 * tokens * params;
  if (model.has_full_attention(layer)) {
    const double kv = double(model.kv_bytes_per_token_layer());
    const double hd = model.attention == AttentionKind::kMla
                          ? double(model.kv_lora_rank + model.qk_rope_head_dim)
                          : double(model.head_dim);
    for (const SequenceStep& b : batch.seqs) {
      const double ctx = double(b.context_after());
      bytes += ctx * kv;
      flops += 4.0 * double(b.new_tokens) * (double(b.context_before) + double(b.new_tokens) / 2.0) *
               model.num_heads * hd;
    }
  } else {
    bytes += 2.0 * double(model.ssm_state_bytes() + model.conv_state_bytes()) * double(batch.size());
    const auto& l = *model.linear;
    flops += 4.0 * tokens * l.num_value_heads * l.key_head_dim * l.value_head_dim;
  }
  return {bytes, flops};
}

RooflineWork moe_work(const ModelSpec& model, std::uint64_t tokens, std::uint64_t distinct_experts) {
  const double t = double(tokens), h = model.hidden_size;
  const double shared = 3.0 * h * model.shared_expert_intermediate_size * model.num_shared_experts;
  const double bytes = double(distinct_experts) * double(model.expert_transfer_bytes()) + 2.0 * shared +
                       2.0 * h * model.num_experts;
  const double flops = 2.0 * t * model.top_k * 3.0 * model.moe_intermediate_size * h + 2.0 * t * shared;
  return {bytes, flops};
}

RooflineWork dense_ffn_work(const ModelSpec& model, std::uint64_t tokens) {
  const double p = 3.0 * double(model.hidden_size) * model.dense_intermediate_size;
  return {2.0 * p, 2.0 * double(tokens) * p};
}

RooflineWork lm_head_work(const ModelSpec& model, std::uint64_t sampling_seqs) {
  const double lm = double(model.vocab_size) * double(model.hidden_size);
  return {2.0 * lm, 2.0 * double(sampling_seqs) * lm};
}

std::uint64_t prefill_tokens(const StepBatch& batch) noexcept {
  std::uint64_t n = 0;
  for (const SequenceStep& b : batch.seqs)
    if (b.new_tokens > 1) n += b.new_tokens;
  return n;
}

double roofline_time(RooflineWork w, const GpuProfile& gpu, double mem_eff, double comp_eff, double overhead,
                     double scale) noexcept {
  return std::max(w.bytes / (gpu.hbm_bandwidth * mem_eff), w.flops / (gpu.bf16_flops * comp_eff)) * scale +
         overhead;
}

double copy_time(const GpuProfile& gpu, const CostModelParams& cost, double calls, double bytes) noexcept {
  return calls * gpu.h2d_copy_latency_s * cost.h2d_copy_latency_scale +
         bytes / (gpu.h2d_bandwidth * cost.h2d_bandwidth_scale);
}

const CostModelParams::PrecisionScale& moe_precision_scale(const CostModelParams& cost,
                                                           ExpertPrecision p) noexcept {
  static const CostModelParams::PrecisionScale kBf16{};
  if (p == ExpertPrecision::kInt8) return cost.int8;
  if (p == ExpertPrecision::kInt4) return cost.int4;
  return kBf16;
}

double moe_token_factor(const CostModelParams& cost, ExpertPrecision p, double tokens) noexcept {
  const double base = token_scale_at(cost.moe_token_scale, tokens);
  if (p == ExpertPrecision::kBf16) return base;
  return base * token_scale_at(moe_precision_scale(cost, p).token_scale, tokens);
}

double SimBackend::roofline(RooflineWork w, double mem_eff, double comp_eff, double scale) const noexcept {
  return roofline_time(w, gpu_, mem_eff, comp_eff, cost_.per_layer_overhead_s, scale);
}

double SimBackend::attention_time(std::uint32_t layer, const StepBatch& batch) const {
  return attention_time(layer, batch,
                        token_scale_at(cost_.attention_prefill_scale, double(prefill_tokens(batch))));
}

double SimBackend::attention_time(std::uint32_t layer, const StepBatch& batch, double prefill_scale) const {
  return roofline(attention_work(model_, layer, batch), cost_.attention_memory_efficiency,
                  cost_.attention_compute_efficiency, prefill_scale);
}

double SimBackend::moe_time(std::uint64_t tokens, std::uint64_t distinct_experts) const {
  return roofline(moe_work(model_, tokens, distinct_experts), moe_memory_efficiency_, moe_compute_efficiency_,
                  moe_token_factor(cost_, model_.expert_precision, double(tokens)));
}

double SimBackend::allreduce_time(std::uint64_t tokens) const noexcept {
  return gpu_.allreduce_time(double(tokens) * model_.hidden_size * 2.0);
}

double SimBackend::gather_time(std::uint64_t experts) const noexcept {
  if (kernel_ == MoeKernel::kPaged || experts == 0) return 0;
  return 2.0 * double(experts) * double(model_.expert_transfer_bytes()) /
             (gpu_.hbm_bandwidth * cost_.dense_memory_efficiency) +
         cost_.per_layer_overhead_s;
}

double SimBackend::copy_time(std::uint64_t calls, std::uint64_t bytes) const {
  if (calls == 0) return 0;
  return engine::copy_time(gpu_, cost_, double(calls), double(bytes));
}

void SimBackend::simulate(const StepBatch& batch, const ResidencyTable& residency, RoutingSource& routing,
                          StepResult& out) {
  if (routing.kind() == RoutingKind::kModel)
    throw ConfigError("routing", std::string(to_string(routing.kind())),
                      "the simulator has no router: use synthetic or recorded routing");
  out.clear();
  const std::uint32_t experts = model_.num_experts;
  const std::uint32_t moe_layers = model_.moe_layers();
  const std::uint64_t expert_bytes = model_.expert_transfer_bytes();
  const bool tensor_parallel = gpu_.gpus > 1;
  const double allreduce = tensor_parallel ? allreduce_time(batch.tokens) : 0.0;
  double t = cost_.step_overhead_s, copy_free = t;
  out.compute_s = cost_.step_overhead_s;

  copies_.clear();
  auto price = [&](std::uint32_t layer, bool after_routing, const std::vector<ExpertCopy>& copies,
                   double at) {
    std::uint64_t calls = 0;
    for (const ExpertCopy& c : copies) {
      copies_.push_back(CopyRecord{layer, after_routing, c});
      calls += c.copy_calls();
      if (c.target == CopyTarget::kReservedPages)
        ++out.restores_copied;
      else if (c.on_demand)
        ++out.on_demand;
      else
        ++out.prefetches;
    }
    const std::uint64_t bytes = copies.size() * expert_bytes;
    const double d = copy_time(calls, bytes);
    copy_free = std::max(copy_free, at) + d;
    out.copy_s += d;
    out.copy_calls += calls;
    out.h2d_bytes += bytes;
    return copy_free;
  };
  // MoE layer m's prefetch queue, issued at `at`: the predictor names experts (it may peek at the routing
  // source, which knows the step's choices), the planner turns them into copies. Returns when they complete.
  auto issue_prefetch = [&](std::uint32_t m, double at) {
    std::fill(touched_.begin(), touched_.end(), std::uint8_t{0});
    for (std::uint32_t e : routing.layer_experts(m)) touched_[e] = 1;
    for (std::uint32_t e = 0; e < experts; ++e) resident_[e] = residency.is_resident({m, e});
    predict_layer(predictor_, touched_.data(), resident_.data(), experts, rng_, predicted_flags_.data());
    predicted_.clear();
    for (std::uint32_t e = 0; e < experts; ++e)
      if (predicted_flags_[e]) predicted_.push_back(e);
    auto plan = planner_.plan_prefetch(m, predicted_);
    if (!plan) throw std::logic_error("sim backend: " + plan.error().message);
    buffered_.clear();
    for (const ExpertCopy& c : *plan)
      if (c.target == CopyTarget::kBufferSlot) buffered_.push_back(c.expert.expert);
    return price(m, false, *plan, at);
  };

  // Tensor parallelism: one all-reduce on the compute stream after `clock`'s phase (nothing on one GPU).
  auto all_reduce = [&](double& clock) {
    if (!tensor_parallel) return;
    clock += allreduce;
    out.compute_s += allreduce;
    out.allreduce_s += allreduce;
  };
  const double prefill_scale = token_scale_at(cost_.attention_prefill_scale, double(prefill_tokens(batch)));
  std::uint32_t m = 0;  // next MoE layer
  double ready = moe_layers > 0 ? issue_prefetch(0, t) : t;
  for (std::uint32_t layer = 0; layer < model_.num_layers; ++layer) {
    const bool is_moe = layer >= model_.first_dense_layers;
    const double ta = attention_time(layer, batch, prefill_scale);
    double attn_end = t + ta;
    out.attention_s += ta;
    out.compute_s += ta;
    all_reduce(attn_end);  // attention's output projection is row-parallel: all-reduce before the FFN
    if (!is_moe) {
      const double td = roofline(dense_ffn_work(model_, batch.tokens), cost_.dense_memory_efficiency,
                                 cost_.dense_compute_efficiency);
      t = attn_end + td;
      out.dense_s += td;
      out.compute_s += td;
      all_reduce(t);
      continue;
    }
    const std::span<const std::uint32_t> routed = routing.layer_experts(m);
    out.add_routed(routed);
    for (std::uint32_t e : routed) routed_flags_[e] = 1;
    for (std::uint32_t e : buffered_) out.wasted_prefetches += routed_flags_[e] == 0;
    auto demand = planner_.plan_demand(m, routed);
    if (!demand) throw std::logic_error("sim backend: " + demand.error().message);
    std::uint64_t misses = 0;
    for (const ExpertCopy& c : *demand) misses += c.on_demand;
    std::uint64_t hits = 0;
    for (std::uint32_t e : routed) {
      hits += residency.is_resident({m, e});
      routed_flags_[e] = 0;
    }
    out.expert_touches += routed.size();
    out.expert_hits += hits;
    out.expert_misses += misses;
    out.expert_prefetched += routed.size() - hits - misses;
    // The MoE waits for every copy of this layer: its prefetch queue and the misses queued after routing.
    double moe_ready = std::max(attn_end, ready);
    if (!demand->empty()) moe_ready = std::max(moe_ready, price(m, true, *demand, attn_end));
    if (m + 1 < moe_layers) ready = issue_prefetch(m + 1, attn_end);
    out.stall_s += moe_ready - attn_end;
    double tm = moe_time(batch.tokens, routed.size());
    if (kernel_ == MoeKernel::kGather) tm += gather_time(routed.size());
    t = moe_ready + tm;
    out.moe_s += tm;
    out.compute_s += tm;
    all_reduce(t);  // the experts' down projection is row-parallel too
    ++m;
  }
  const double tl = roofline(lm_head_work(model_, batch.sampling_seqs), cost_.dense_memory_efficiency,
                             cost_.dense_compute_efficiency);
  t += tl;
  out.dense_s += tl;
  out.compute_s += tl;
  out.step_s = t;
}

}  // namespace amoeba::engine
