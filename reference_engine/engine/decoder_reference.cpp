// The host reference decoder; see decoder_reference.hpp.
#include "engine/decoder_reference.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "amoeba/core/errors.hpp"
#include "engine/decoder_ops.hpp"

namespace amoeba::engine {

namespace {
using ops::round_bf16;
float r(double x) {
  return round_bf16(x);
}
}  // namespace

DecoderReference::DecoderReference(const Checkpoint& ck, std::uint64_t max_bytes)
    : cfg_(ck.config), layout_(ck.layout) {
  const auto tensors = expected_tensors(cfg_, layout_);
  std::uint64_t total = 0;
  for (const ExpectedTensor& t : tensors) total += ck.tensor(t.name).bytes();
  if (total > max_bytes)
    throw ConfigError("reference weights", fmt::format("{} bytes", total),
                      fmt::format("the host reference holds at most {} bytes (a small model)", max_bytes));
  for (const ExpectedTensor& t : tensors) {
    std::vector<bf16>& buf = weights_[t.name];
    buf.resize(ck.tensor(t.name).elements());
    ck.shard(t.name).read(t.name, std::as_writable_bytes(std::span<bf16>(buf)));
  }
  for (std::uint32_t j = 0; j < cfg_.head_dim / 2; ++j)
    inv_freq_.push_back(ops::rope_inv_freq(cfg_.rope_theta, j, cfg_.head_dim));
  k_cache_.resize(cfg_.num_layers);
  v_cache_.resize(cfg_.num_layers);
  routing_.resize(cfg_.num_layers);
}

const std::vector<bf16>& DecoderReference::w(const std::string& name) const {
  return weights_.at(name);
}

const bf16* DecoderReference::expert(std::uint32_t layer, std::uint32_t e, ExpertMatrix m) const {
  if (layout_ == ExpertLayout::kPerExpert) return w(expert_tensor_name(layer, e, m)).data();
  const std::size_t matrix = std::size_t(cfg_.moe_intermediate_size) * cfg_.hidden_size;
  const std::string p = fmt::format("model.layers.{}.mlp.experts.", layer);
  if (m == ExpertMatrix::kW2) return w(p + "down_proj").data() + e * matrix;
  return w(p + "gate_up_proj").data() + (2 * std::size_t(e) + (m == ExpertMatrix::kW3 ? 1 : 0)) * matrix;
}

DecoderReference::Vec DecoderReference::linear(const Vec& x, std::uint32_t rows, std::uint32_t in,
                                               const bf16* weight, std::uint32_t out,
                                               const bf16* bias) const {
  Vec y(std::size_t(rows) * out);
  for (std::uint32_t i = 0; i < rows; ++i)
    for (std::uint32_t o = 0; o < out; ++o) {
      const float* xi = &x[std::size_t(i) * in];
      const bf16* wo = weight + std::size_t(o) * in;
      double acc = 0;
      for (std::uint32_t k = 0; k < in; ++k) acc += double(xi[k]) * double(wo[k].to_float());
      if (bias) acc += bias[o].to_float();
      y[std::size_t(i) * out + o] = r(acc);
    }
  return y;
}

DecoderReference::Vec DecoderReference::rms_norm(const Vec& x, std::uint32_t rows, std::uint32_t dim,
                                                 const bf16* weight) const {
  Vec y(x.size());
  for (std::uint32_t i = 0; i < rows; ++i)
    ops::rms_norm_row(&x[std::size_t(i) * dim], dim, weight, cfg_.rms_norm_eps, &y[std::size_t(i) * dim]);
  return y;
}

DecoderReference::Vec DecoderReference::expert_mlp(const Vec& x, std::uint32_t rows, const bf16* w1,
                                                   const bf16* w3, const bf16* w2, std::uint32_t f) const {
  const std::uint32_t h = cfg_.hidden_size;
  const Vec g = linear(x, rows, h, w1, f), u = linear(x, rows, h, w3, f);
  Vec m(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) m[i] = ops::silu_mul(g[i], u[i]);
  return linear(m, rows, f, w2, h);
}

DecoderReference::Vec DecoderReference::forward(std::span<const std::int32_t> tokens, std::uint32_t pos) {
  const std::uint32_t n = static_cast<std::uint32_t>(tokens.size()), h = cfg_.hidden_size, hd = cfg_.head_dim;
  const std::uint32_t heads = cfg_.num_heads, kvh = cfg_.num_kv_heads, group = heads / kvh;
  const std::uint32_t qd = heads * hd, kvd = kvh * hd;
  const bf16* embed = w("model.embed_tokens.weight").data();
  Vec x(std::size_t(n) * h);
  for (std::uint32_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || std::uint32_t(tokens[i]) >= cfg_.vocab_size)
      throw_config_error("reference.token", tokens[i],
                         fmt::format("must be below vocab_size {}", cfg_.vocab_size));
    for (std::uint32_t d = 0; d < h; ++d)
      x[std::size_t(i) * h + d] = embed[std::size_t(tokens[i]) * h + d].to_float();
  }
  auto rope = [&](Vec& v, std::uint32_t nheads) {
    Vec out(v.size());
    for (std::uint32_t i = 0; i < n; ++i)
      for (std::uint32_t hh = 0; hh < nheads; ++hh) {
        const std::size_t o = (std::size_t(i) * nheads + hh) * hd;
        ops::rope_head(&v[o], hd, pos + i, inv_freq_.data(), &out[o]);
      }
    v = std::move(out);
  };
  for (std::uint32_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const Vec hn = rms_norm(x, n, h, w(p + "input_layernorm.weight").data());
    auto bias = [&](const char* name) { return cfg_.qkv_bias ? w(p + name).data() : nullptr; };
    Vec q = linear(hn, n, h, w(p + "self_attn.q_proj.weight").data(), qd, bias("self_attn.q_proj.bias"));
    Vec k = linear(hn, n, h, w(p + "self_attn.k_proj.weight").data(), kvd, bias("self_attn.k_proj.bias"));
    const Vec v =
        linear(hn, n, h, w(p + "self_attn.v_proj.weight").data(), kvd, bias("self_attn.v_proj.bias"));
    if (cfg_.qk_norm) {
      q = rms_norm(q, n * heads, hd, w(p + "self_attn.q_norm.weight").data());
      k = rms_norm(k, n * kvh, hd, w(p + "self_attn.k_norm.weight").data());
    }
    rope(q, heads);
    rope(k, kvh);
    Vec& kc = k_cache_[l];
    Vec& vc = v_cache_[l];
    kc.resize(std::size_t(pos) * kvd);
    vc.resize(std::size_t(pos) * kvd);
    kc.insert(kc.end(), k.begin(), k.end());
    vc.insert(vc.end(), v.begin(), v.end());
    Vec attn(std::size_t(n) * qd);
    const double scale = 1.0 / std::sqrt(double(hd));
    std::vector<double> s;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t visible = pos + i + 1;  // causal: keys at positions <= this token's
      s.resize(visible);
      for (std::uint32_t hq = 0; hq < heads; ++hq) {
        const std::uint32_t g = hq / group;
        const float* qi = &q[(std::size_t(i) * heads + hq) * hd];
        double mx = -1e300;
        for (std::uint32_t j = 0; j < visible; ++j) {
          const float* kj = &kc[(std::size_t(j) * kvh + g) * hd];
          double dot = 0;
          for (std::uint32_t d = 0; d < hd; ++d) dot += double(qi[d]) * kj[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (std::uint32_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (std::uint32_t j = 0; j < visible; ++j) acc += s[j] * vc[(std::size_t(j) * kvh + g) * hd + d];
          attn[(std::size_t(i) * heads + hq) * hd + d] = r(acc / z);
        }
      }
    }
    const Vec o = linear(attn, n, qd, w(p + "self_attn.o_proj.weight").data(), h);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = ops::add(x[i], o[i]);
    const Vec h2 = rms_norm(x, n, h, w(p + "post_attention_layernorm.weight").data());
    Vec mlp(x.size(), 0.0f);
    if (!cfg_.is_moe_layer(l)) {
      mlp = expert_mlp(h2, n, w(p + "mlp.gate_proj.weight").data(), w(p + "mlp.up_proj.weight").data(),
                       w(p + "mlp.down_proj.weight").data(), cfg_.intermediate_size);
    } else {
      const std::uint32_t ne = cfg_.num_experts, k_top = cfg_.top_k;
      const Vec logits = linear(h2, n, h, w(p + "mlp.gate.weight").data(), ne);
      std::vector<std::vector<std::uint32_t>> chosen(n);
      std::vector<std::vector<float>> weight(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        std::vector<float> prob(ne);
        float mx = -INFINITY, z = 0;
        for (std::uint32_t e = 0; e < ne; ++e) mx = std::max(mx, logits[std::size_t(i) * ne + e]);
        for (std::uint32_t e = 0; e < ne; ++e) z += prob[e] = std::exp(logits[std::size_t(i) * ne + e] - mx);
        for (float& pr : prob) pr /= z;
        std::vector<std::uint32_t> idx(ne);
        std::iota(idx.begin(), idx.end(), 0u);
        std::stable_sort(idx.begin(), idx.end(),
                         [&](std::uint32_t a, std::uint32_t b) { return prob[a] > prob[b]; });
        idx.resize(k_top);
        float sum = 0;
        for (std::uint32_t e : idx) sum += prob[e];
        for (std::uint32_t e : idx) weight[i].push_back(r(cfg_.norm_topk_prob ? prob[e] / sum : prob[e]));
        chosen[i] = idx;
      }
      routing_[l] = chosen;
      for (std::uint32_t e = 0; e < ne; ++e) {  // transformers accumulates expert by expert, in bf16
        std::vector<std::uint32_t> rows;
        std::vector<float> wts;
        for (std::uint32_t i = 0; i < n; ++i)
          for (std::uint32_t j = 0; j < k_top; ++j)
            if (chosen[i][j] == e) {
              rows.push_back(i);
              wts.push_back(weight[i][j]);
            }
        if (rows.empty()) continue;
        Vec xin(rows.size() * h);
        for (std::size_t t = 0; t < rows.size(); ++t)
          std::copy_n(&h2[std::size_t(rows[t]) * h], h, &xin[t * h]);
        const Vec y = expert_mlp(xin, static_cast<std::uint32_t>(rows.size()),
                                 expert(l, e, ExpertMatrix::kW1), expert(l, e, ExpertMatrix::kW3),
                                 expert(l, e, ExpertMatrix::kW2), cfg_.moe_intermediate_size);
        for (std::size_t t = 0; t < rows.size(); ++t)
          for (std::uint32_t d = 0; d < h; ++d) {
            float& acc = mlp[std::size_t(rows[t]) * h + d];
            acc = r(double(acc) + double(r(double(y[t * h + d]) * wts[t])));
          }
      }
      if (cfg_.shared_expert_intermediate_size > 0) {
        const Vec sh = expert_mlp(h2, n, w(p + "mlp.shared_expert.gate_proj.weight").data(),
                                  w(p + "mlp.shared_expert.up_proj.weight").data(),
                                  w(p + "mlp.shared_expert.down_proj.weight").data(),
                                  cfg_.shared_expert_intermediate_size);
        const Vec g = linear(h2, n, h, w(p + "mlp.shared_expert_gate.weight").data(), 1);
        for (std::uint32_t i = 0; i < n; ++i) {
          const float gate = r(1.0 / (1.0 + std::exp(-double(g[i]))));
          for (std::uint32_t d = 0; d < h; ++d) {
            float& acc = mlp[std::size_t(i) * h + d];
            acc = r(double(acc) + double(r(double(gate) * sh[std::size_t(i) * h + d])));
          }
        }
      }
    }
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = ops::add(x[i], mlp[i]);
  }
  const Vec last(x.end() - h, x.end());
  const Vec normed = rms_norm(last, 1, h, w("model.norm.weight").data());
  const bf16* head = w(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight").data();
  return linear(normed, 1, h, head, cfg_.vocab_size);
}

std::vector<float> DecoderReference::feed(std::span<const std::int32_t> tokens) {
  if (tokens.empty()) throw_config_error("reference.tokens", 0, "must hold at least one token");
  Vec logits = forward(tokens, position_);
  position_ += static_cast<std::uint32_t>(tokens.size());
  return logits;
}

std::vector<DecoderReference::Step> DecoderReference::generate_forced(std::span<const std::int32_t> prompt,
                                                                      std::span<const std::int32_t> teacher) {
  if (prompt.empty()) throw_config_error("reference.prompt", 0, "must hold at least one token");
  std::vector<Step> out;
  reset();
  std::vector<std::int32_t> next(prompt.begin(), prompt.end());
  for (std::size_t s = 0; s < teacher.size(); ++s) {
    Step st;
    st.logits = feed(next);
    st.token =
        static_cast<std::int32_t>(std::max_element(st.logits.begin(), st.logits.end()) - st.logits.begin());
    next.assign(1, teacher[s]);
    out.push_back(std::move(st));
  }
  return out;
}

std::vector<DecoderReference::Step> DecoderReference::generate(std::span<const std::int32_t> prompt,
                                                               std::uint32_t new_tokens) {
  if (prompt.empty()) throw_config_error("reference.prompt", 0, "must hold at least one token");
  std::vector<Step> out;
  reset();
  std::vector<std::int32_t> next(prompt.begin(), prompt.end());
  for (std::uint32_t s = 0; s < new_tokens; ++s) {
    Vec logits = feed(next);
    Step st;
    st.token = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    st.logits = std::move(logits);
    next.assign(1, st.token);
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace amoeba::engine
