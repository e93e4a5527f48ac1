// Shape of one MoE layer and the status type the kernels and the CPU reference report errors with.
// Host-only (no CUDA header): the reference, the CPU tests and the device adapter all share it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace amoeba::kernels {

// Result of a check: ok, or which field holds which value and which rule it breaks.
struct Status {
  bool ok = true;
  std::string field;
  std::string message;

  static Status success() { return {}; }
  static Status error(std::string field_name, long long value, std::string rule) {
    return {false, field_name, field_name + " = " + std::to_string(value) + ": " + std::move(rule)};
  }
  static Status error(std::string field_name, std::string text) {
    return {false, field_name, field_name + ": " + std::move(text)};
  }
  explicit operator bool() const { return ok; }
};

// One MoE layer. A shared expert of intermediate size m·F is stored as m "shared chunks": virtual experts
// with ids E..E+m-1, each three F×H pages like a routed expert (W1 rows, W3 rows and W2 columns [c·F,
// (c+1)·F) of the dense expert). SiLU(gate)·up is elementwise over F and the down projection sums over F, so
// the sum of the m chunks is exactly the dense shared expert. Every token uses every chunk with its shared
// weight (1 by default; Qwen1.5-MoE's sigmoid shared gate can be passed per token).
struct MoeShape {
  int num_tokens = 0;         // T
  int hidden = 0;             // H
  int intermediate = 0;       // F, per routed expert and per shared chunk
  int num_experts = 0;        // E, routed experts
  int top_k = 0;              // k
  int num_shared_chunks = 0;  // m, 0 when the model has no shared expert

  int total_experts() const { return num_experts + num_shared_chunks; }
  int slots_per_token() const { return top_k + num_shared_chunks; }
  long long num_slots() const { return static_cast<long long>(num_tokens) * slots_per_token(); }
  long long matrix_elems() const { return static_cast<long long>(hidden) * intermediate; }
  long long matrix_bytes() const { return matrix_elems() * 2; }
};

// The paged MoE kernel's row blocks (PagedMoe::can_implement): H and F must be multiples of this, which the
// engine checks before it sets up a GPU (a tensor-parallel rank's F is the model's / tp).
inline constexpr int kMoeRowBlock = 128;

// Rules shared by every consumer of a shape; the kernels add their own tiling rules on top.
inline Status validate(const MoeShape& s) {
  if (s.num_tokens < 0) return Status::error("num_tokens", s.num_tokens, "must be >= 0");
  if (s.hidden <= 0) return Status::error("hidden", s.hidden, "must be > 0");
  if (s.intermediate <= 0) return Status::error("intermediate", s.intermediate, "must be > 0");
  if (s.num_experts <= 0) return Status::error("num_experts", s.num_experts, "must be > 0");
  if (s.top_k <= 0 || s.top_k > s.num_experts)
    return Status::error("top_k", s.top_k, "must be in [1, num_experts]");
  if (s.num_shared_chunks < 0) return Status::error("num_shared_chunks", s.num_shared_chunks, "must be >= 0");
  return Status::success();
}

}  // namespace amoeba::kernels
