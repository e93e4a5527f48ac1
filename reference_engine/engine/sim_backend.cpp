// The simulated step; see sim_backend.hpp for the cost model.
#include "engine/sim_backend.hpp"

#include <algorithm>

namespace amoeba::engine {

SimBackend::SimBackend(const ModelSpec& model, const GpuProfile& gpu, const CostModelParams& cost,
                       const PredictorParams& predictor, std::uint32_t load_buffer_experts,
                       std::uint64_t seed)
    : model_(model),
      gpu_(gpu),
      cost_(cost),
      predictor_(predictor),
      buffer_experts_(load_buffer_experts),
      rng_(seed, 31),
      predicted_(model.num_experts) {}

double SimBackend::roofline(double bytes, double flops, double mem_eff, double comp_eff) const noexcept {
  return std::max(bytes / (gpu_.hbm_bandwidth * mem_eff), flops / (gpu_.bf16_flops * comp_eff)) +
         cost_.per_layer_overhead_s;
}

double SimBackend::attention_time(std::uint32_t layer, const StepPlan& plan) const {
  const double tokens = double(plan.tokens);
  const double params = double(model_.attention_params(layer));
  double bytes = 2.0 * params, flops = 2.0 * tokens * params;
  if (model_.has_full_attention(layer)) {
    const double kv = double(model_.kv_bytes_per_token_layer());
    const double hd = model_.attention == AttentionKind::kMla
                          ? double(model_.kv_lora_rank + model_.qk_rope_head_dim)
                          : double(model_.head_dim);
    for (const ScheduledSeq& b : plan.batch) {
      const double ctx = double(b.context_before) + double(b.new_tokens);
      bytes += ctx * kv;
      flops += 4.0 * double(b.new_tokens) * (double(b.context_before) + double(b.new_tokens) / 2.0) *
               model_.num_heads * hd;
    }
  } else {
    bytes += 2.0 * double(model_.ssm_state_bytes() + model_.conv_state_bytes()) * double(plan.batch.size());
    const auto& l = *model_.linear;
    flops += 4.0 * tokens * l.num_value_heads * l.key_head_dim * l.value_head_dim;
  }
  return roofline(bytes, flops, cost_.attention_memory_efficiency, cost_.attention_compute_efficiency);
}

double SimBackend::moe_time(std::uint64_t tokens, std::uint64_t distinct_experts) const {
  const double t = double(tokens), h = model_.hidden_size;
  const double shared = 3.0 * h * model_.shared_expert_intermediate_size * model_.num_shared_experts;
  const double bytes =
      double(distinct_experts) * double(model_.expert_bytes()) + 2.0 * shared + 2.0 * h * model_.num_experts;
  const double flops = 2.0 * t * model_.top_k * 3.0 * model_.moe_intermediate_size * h + 2.0 * t * shared;
  return roofline(bytes, flops, cost_.moe_memory_efficiency, cost_.moe_compute_efficiency);
}

double SimBackend::copy_time(std::uint64_t experts) const {
  if (experts == 0) return 0;
  return double(experts * cost_.copies_per_expert) * gpu_.h2d_copy_latency_s +
         double(experts * model_.expert_bytes()) / (gpu_.h2d_bandwidth * cost_.h2d_bandwidth_scale);
}

void SimBackend::forward(const StepPlan& plan, const std::vector<LayerExperts>& layers, ForwardStats& st) {
  st = ForwardStats{};
  const std::uint32_t experts = model_.num_experts;
  const double h = model_.hidden_size;
  double t = cost_.step_overhead_s, copy_free = t;
  st.compute_s = cost_.step_overhead_s;

  // Queue of MoE layer m: restores, then predicted offloaded experts (at most a load buffer's worth).
  auto issue_prefetch = [&](std::uint32_t m, double at) {
    const LayerExperts& le = layers[m];
    std::uint64_t n = 0, predicted_n = 0;
    predict_layer(predictor_, le.touched, le.resident, experts, rng_, predicted_.data());
    for (std::uint32_t e = 0; e < experts; ++e) {
      if (le.restoring[e]) {
        ++n;
        predicted_[e] = 0;
      } else if (predicted_[e]) {
        if (predicted_n < buffer_experts_) {
          ++predicted_n;
          if (!le.touched[e]) ++st.wasted_prefetches;
        } else {
          predicted_[e] = 0;
        }
      }
    }
    n += predicted_n;
    const double d = copy_time(n);
    copy_free = std::max(copy_free, at) + d;
    st.copy_s += d;
    st.h2d_bytes += n * model_.expert_bytes();
    return copy_free;
  };

  std::uint32_t m = 0;  // next MoE layer
  const std::uint32_t moe_layers = model_.moe_layers();
  double ready = moe_layers > 0 ? issue_prefetch(0, t) : t;
  std::vector<std::uint8_t> fetched(experts);
  for (std::uint32_t layer = 0; layer < model_.num_layers; ++layer) {
    const bool is_moe = layer >= model_.first_dense_layers;
    const double attn_start = is_moe ? std::max(t, ready) : t;
    st.stall_s += attn_start - t;
    const double ta = attention_time(layer, plan);
    const double attn_end = attn_start + ta;
    st.compute_s += ta;
    if (!is_moe) {
      const double p = 3.0 * h * model_.dense_intermediate_size;
      const double td = roofline(2.0 * p, 2.0 * double(plan.tokens) * p, cost_.dense_memory_efficiency,
                                 cost_.dense_compute_efficiency);
      t = attn_end + td;
      st.compute_s += td;
      continue;
    }
    // This layer's fetched set was decided when its queue was issued (predicted_ holds it until the next
    // issue below overwrites it).
    const LayerExperts& le = layers[m];
    std::copy(predicted_.begin(), predicted_.end(), fetched.begin());
    std::uint64_t distinct = 0, misses = 0;
    for (std::uint32_t e = 0; e < experts; ++e) {
      if (!le.touched[e]) continue;
      ++distinct;
      if (le.resident[e]) {
        ++st.expert_hits;
      } else if (le.restoring[e] || fetched[e]) {
        ++st.expert_prefetched;
      } else {
        ++misses;
      }
    }
    st.expert_touches += distinct;
    st.expert_misses += misses;
    double moe_ready = attn_end;
    if (misses > 0) {  // on-demand loads, after the router has run
      const double d = copy_time(misses);
      copy_free = std::max(copy_free, attn_end) + d;
      st.copy_s += d;
      st.h2d_bytes += misses * model_.expert_bytes();
      moe_ready = copy_free;
    }
    if (m + 1 < moe_layers) ready = issue_prefetch(m + 1, attn_end);
    st.stall_s += moe_ready - attn_end;
    const double tm = moe_time(plan.tokens, distinct);
    t = moe_ready + tm;
    st.compute_s += tm;
    ++m;
  }
  const double lm = double(model_.vocab_size) * h;
  const double tl = roofline(2.0 * lm, 2.0 * double(plan.decode_seqs) * lm, cost_.dense_memory_efficiency,
                             cost_.dense_compute_efficiency);
  t += tl;
  st.compute_s += tl;
  st.step_s = t;
}

}  // namespace amoeba::engine
