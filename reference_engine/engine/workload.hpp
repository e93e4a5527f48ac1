// Request workloads: a ShareGPT-like generator and JSONL trace files.
//
// Generator. Prompt and output lengths are log-normal (prompt: mu 5.15, sigma 1.1; output: mu 4.85,
// sigma 1.0), filtered as vLLM's benchmark filters ShareGPT (prompt <= 1024, prompt + output <= 2048, both
// >= 4 tokens); after the filter the means are ~232 prompt and ~200 output tokens (the ShareGPT figures the
// paper's setting implies). Arrivals: inter-arrival times Gamma(shape = burstiness, scale = 1 / (rate x
// burstiness)) as vLLM's benchmark_serving draws them: burstiness 1 is a Poisson process, < 1 burstier.
// Arrival times are rounded to microseconds so that a trace written and read back replays identically.
//
// Time precision: every arrival, generated or read, must be <= kMaxArrivalS (10^9 s, ~32 years). Times are
// doubles in seconds; up to 10^9 s one step of a double is < 0.12 us, so TTFT and TPOT keep sub-microsecond
// precision. Beyond it they would not (at 10^13 s a double cannot tell two times 1 ms apart).
//
// Trace files: one request per line, `{"arrival_s": float, "prompt_tokens": int, "output_tokens": int}`;
// blank lines are skipped; arrivals must not decrease. Every bad line is an error naming the file, the line,
// the field, the value and the rule.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace amoeba::engine {

inline constexpr double kMaxArrivalS = 1e9;

struct Request {
  std::uint64_t id = 0;
  double arrival_s = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t output_tokens = 0;
  friend bool operator==(const Request&, const Request&) = default;
};

struct ShareGptLikeParams {
  double rate = 10.0;       // requests per second
  double burstiness = 1.0;  // gamma shape of inter-arrival times; 1 = Poisson
  std::uint64_t requests = 1000;
  std::uint64_t seed = 0;
  std::uint32_t max_prompt = 1024, max_total = 2048, min_tokens = 4;  // vLLM's ShareGPT filter
};

// Throws ConfigError naming --rate when the last arrival passes kMaxArrivalS (a slow rate with many
// requests).
std::vector<Request> generate_sharegpt_like(const ShareGptLikeParams& p);

// Limits a trace must respect: the engine's max_model_len (>= 2: one prompt and one output token) and the
// largest request count a run accepts.
struct TraceLimits {
  std::uint32_t max_total_tokens = 2048;
  std::uint64_t max_requests = 10'000'000;
};

// Parses JSONL text; `what` (usually the file name) prefixes the field in errors: "t.jsonl:3.prompt_tokens".
std::vector<Request> parse_trace(std::string_view text, const std::string& what, const TraceLimits& limits);
// `what` names the file's flag in errors about the file itself (a directory, unreadable, too large).
std::vector<Request> read_trace(const std::string& path, const TraceLimits& limits,
                                const std::string& what = "--trace");
std::string trace_to_jsonl(const std::vector<Request>& trace);

struct TraceSummary {
  std::uint64_t requests = 0;
  double duration_s = 0, rate = 0;
  double mean_prompt = 0, mean_output = 0;
  std::uint32_t max_prompt = 0, max_output = 0, p50_prompt = 0, p50_output = 0;
};
TraceSummary summarize(const std::vector<Request>& trace);

}  // namespace amoeba::engine
