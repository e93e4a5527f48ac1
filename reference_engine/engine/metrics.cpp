// Metrics; see metrics.hpp.
#include "engine/metrics.hpp"

#include <algorithm>

namespace amoeba::engine {

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  p.count = v.size();
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double pos = q * double(v.size() - 1);
    const std::size_t i = static_cast<std::size_t>(pos);
    const double f = pos - double(i);
    return i + 1 < v.size() ? v[i] + f * (v[i + 1] - v[i]) : v[i];
  };
  p.p10 = at(0.10);
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  double s = 0;
  for (double x : v) s += x;
  p.mean = s / double(v.size());
  return p;
}

void summarize_requests(const std::vector<Sequence>& seqs, RunResult& r) {
  std::vector<double> ttft, tpot;
  r.total_requests = seqs.size();
  double first_arrival = seqs.empty() ? 0 : seqs.front().arrival_s;
  for (const Sequence& s : seqs) {
    first_arrival = std::min(first_arrival, s.arrival_s);
    r.preemptions += s.preemptions;
    if (s.status != SeqStatus::kFinished) continue;
    ++r.completed_requests;
    r.output_tokens += s.generated;
    r.makespan_s = std::max(r.makespan_s, s.finish_s);
    ttft.push_back((s.first_token_s - s.arrival_s) * 1e3);
    if (s.generated > 1) tpot.push_back((s.finish_s - s.first_token_s) * 1e3 / double(s.generated - 1));
  }
  const double span = r.makespan_s - first_arrival;
  r.throughput_tok_s = span > 0 ? double(r.output_tokens) / span : 0;
  r.throughput_req_s = span > 0 ? double(r.completed_requests) / span : 0;
  r.ttft_ms = percentiles(std::move(ttft));
  r.tpot_ms = percentiles(std::move(tpot));
}

}  // namespace amoeba::engine
