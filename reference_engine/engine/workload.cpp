// Workload generation and trace files; see workload.hpp.
#include "engine/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/json_fields.hpp"
#include "engine/random.hpp"

namespace amoeba::engine {

std::vector<Request> generate_sharegpt_like(const ShareGptLikeParams& p) {
  constexpr double kPromptMu = 5.15, kPromptSigma = 1.1, kOutputMu = 4.85, kOutputSigma = 1.0;
  Rng lengths(p.seed, 1), arrivals(p.seed, 2);
  std::vector<Request> out;
  out.reserve(p.requests);
  double t = 0;
  for (std::uint64_t i = 0; i < p.requests; ++i) {
    std::uint32_t prompt = 0, output = 0;
    for (;;) {  // rejection: vLLM's ShareGPT filter
      const double lp = std::floor(std::exp(kPromptMu + kPromptSigma * lengths.normal()));
      const double lo = std::floor(std::exp(kOutputMu + kOutputSigma * lengths.normal()));
      if (lp < p.min_tokens || lo < p.min_tokens || lp > p.max_prompt || lp + lo > p.max_total) continue;
      prompt = static_cast<std::uint32_t>(lp);
      output = static_cast<std::uint32_t>(lo);
      break;
    }
    if (i > 0) t += arrivals.gamma(p.burstiness, 1.0 / (p.rate * p.burstiness));
    if (!(t <= kMaxArrivalS))
      throw_config_error("--rate", p.rate,
                         "request " + std::to_string(i) + " of " + std::to_string(p.requests) +
                             " would arrive after " + std::to_string(t) +
                             " s; arrivals must stay <= 1e9 s (time precision): raise the rate or lower "
                             "--requests");
    const double t_us = std::round(t * 1e6) / 1e6;
    out.push_back(Request{i, t_us, prompt, output});
  }
  return out;
}

std::vector<Request> parse_trace(std::string_view text, const std::string& what, const TraceLimits& limits) {
  if (limits.max_total_tokens < 2)
    throw_config_error("max_model_len", limits.max_total_tokens,
                       "must be at least 2 (one prompt and one output token)");
  std::vector<Request> out;
  std::size_t line_no = 0, pos = 0;
  double last_arrival = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = what + ":" + std::to_string(line_no);
    const nlohmann::json j = parse_json_text(line, where);
    const JsonObject o(j, where);
    o.reject_unknown({"arrival_s", "prompt_tokens", "output_tokens"});
    Request r;
    r.id = out.size();
    if (out.size() >= limits.max_requests)
      throw ConfigError(what, "line " + std::to_string(line_no),
                        "holds more than " + std::to_string(limits.max_requests) + " requests");
    r.arrival_s = o.get_double("arrival_s", 0.0, kMaxArrivalS);
    if (r.arrival_s < last_arrival)
      throw_config_error(
          where + ".arrival_s", r.arrival_s,
          "must not be earlier than the previous request's (" + std::to_string(last_arrival) + ")");
    last_arrival = r.arrival_s;
    r.prompt_tokens = static_cast<std::uint32_t>(o.get_uint("prompt_tokens", 1, limits.max_total_tokens - 1));
    r.output_tokens = static_cast<std::uint32_t>(o.get_uint("output_tokens", 1, limits.max_total_tokens - 1));
    if (std::uint64_t(r.prompt_tokens) + r.output_tokens > limits.max_total_tokens)
      throw_config_error(where + ".output_tokens", r.output_tokens,
                         "prompt_tokens + output_tokens must be <= max_model_len (" +
                             std::to_string(limits.max_total_tokens) + ")");
    out.push_back(r);
  }
  if (out.empty())
    throw ConfigError(what, "(no requests)",
                      "a trace needs at least one request line (the file is empty or blank)");
  return out;
}

std::vector<Request> read_trace(const std::string& path, const TraceLimits& limits, const std::string& what) {
  return parse_trace(read_text_file(path, what), path, limits);
}

std::string trace_to_jsonl(const std::vector<Request>& trace) {
  std::string s;
  s.reserve(trace.size() * 64);
  char buf[128];
  for (const Request& r : trace) {
    std::snprintf(buf, sizeof buf, "{\"arrival_s\": %.6f, \"prompt_tokens\": %u, \"output_tokens\": %u}\n",
                  r.arrival_s, r.prompt_tokens, r.output_tokens);
    s += buf;
  }
  return s;
}

TraceSummary summarize(const std::vector<Request>& trace) {
  TraceSummary s;
  s.requests = trace.size();
  if (trace.empty()) return s;
  std::vector<std::uint32_t> p, o;
  double sp = 0, so = 0;
  for (const Request& r : trace) {
    p.push_back(r.prompt_tokens);
    o.push_back(r.output_tokens);
    sp += r.prompt_tokens;
    so += r.output_tokens;
  }
  s.duration_s = trace.back().arrival_s - trace.front().arrival_s;
  s.rate = s.duration_s > 0 ? double(trace.size() - 1) / s.duration_s : 0;
  s.mean_prompt = sp / double(trace.size());
  s.mean_output = so / double(trace.size());
  std::sort(p.begin(), p.end());
  std::sort(o.begin(), o.end());
  s.max_prompt = p.back();
  s.max_output = o.back();
  s.p50_prompt = p[p.size() / 2];
  s.p50_output = o[o.size() / 2];
  return s;
}

}  // namespace amoeba::engine
