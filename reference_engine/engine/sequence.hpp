// Sequence: one request's state in the engine (nano-vllm's `sequence.py`): how many of its tokens have KV
// computed, how many output tokens it has produced, the pool pages it holds, and its timestamps.
//
// Token accounting follows vLLM v1: num_tokens() = prompt + generated; a step schedules `new` tokens of it
// (a prefill chunk, or 1 for decode); after the step computed += new, and when computed reaches num_tokens()
// the step sampled one output token. Preemption is by recompute: all KV is dropped, computed = 0, and the
// sequence rejoins the front of the waiting queue (its generated tokens are recomputed as prompt).
#pragma once

#include <cstdint>
#include <vector>

#include "amoeba/pool/page_kinds.hpp"
#include "engine/workload.hpp"

namespace amoeba::engine {

enum class SeqStatus : std::uint8_t { kNotArrived, kWaiting, kRunning, kFinished };

struct Sequence {
  std::uint64_t id = 0;
  double arrival_s = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t output_tokens = 0;  // target
  std::uint32_t generated = 0;
  std::uint32_t computed = 0;
  std::uint32_t blocks = 0;             // 16-token KV blocks held (each = one KV page per attention layer)
  std::vector<PageHandle> kv_pages;     // blocks x attention layers
  std::vector<PageHandle> state_pages;  // SSM and conv pages (hybrid models), held while running
  SeqStatus status = SeqStatus::kNotArrived;
  std::uint32_t preemptions = 0;
  double first_token_s = -1;
  double finish_s = -1;

  explicit Sequence(const Request& r)
      : id(r.id), arrival_s(r.arrival_s), prompt_tokens(r.prompt_tokens), output_tokens(r.output_tokens) {}
  std::uint32_t num_tokens() const noexcept { return prompt_tokens + generated; }
  bool in_prefill() const noexcept { return computed + 1 < num_tokens(); }
};

}  // namespace amoeba::engine
