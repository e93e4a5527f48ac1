// GPU profiles (memory, HBM bandwidth, bf16 tensor rate, pinned host-to-device bandwidth and per-copy
// latency; for a machine of N identical GPUs, the interconnect its tensor-parallel all-reduces cross) and the
// simulator's cost-model parameters. Both are JSON files under reference_engine/data/,
// compiled into the binary; each number's source is recorded in the file itself (`sources`). A GPU
// calibration run writes a cost-model file of the same format (CostModelParams), read with --cost-model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace amoeba::engine {

// One GPU, or N identical GPUs serving one model with tensor parallelism. A multi-GPU file names its per-GPU
// profile (`base`) and adds the count and the interconnect:
//   {"name": "2x-rtx5090", "base": "rtx5090", "gpus": 2,
//    "interconnect": {"description": "...", "allreduce_bus_bandwidth_gbs": 20, "allreduce_latency_us": 15},
//    "sources": {...}}
// Memory, bandwidths and rates stay per GPU: each GPU has its own PCIe link to the host.
struct GpuProfile {
  std::string name, description, base;
  std::uint64_t memory_bytes = 0;
  double hbm_bandwidth = 0;  // bytes/s
  double bf16_flops = 0;     // FLOP/s (dense)
  double h2d_bandwidth = 0;  // bytes/s, pinned, large copies
  double h2d_copy_latency_s = 0;
  std::uint64_t cuda_context_bytes = 0;
  std::uint32_t gpus = 1;  // tensor-parallel degree
  // All-reduce over the N GPUs (NCCL ring): time = latency + 2 (N - 1) / N x bytes / bus bandwidth (busbw).
  std::string interconnect;
  double allreduce_bus_bandwidth = 0;  // bytes/s
  double allreduce_latency_s = 0;
  std::vector<std::pair<std::string, std::string>> sources;  // field -> where the number comes from

  // Time of one all-reduce of `bytes` over the GPUs; 0 on one GPU.
  double allreduce_time(double bytes) const noexcept {
    if (gpus <= 1) return 0;
    return allreduce_latency_s + 2.0 * double(gpus - 1) / double(gpus) * bytes / allreduce_bus_bandwidth;
  }
};

GpuProfile parse_gpu(std::string_view json_text, const std::string& what);
const std::vector<GpuProfile>& gpu_catalog();
// A catalog name or a path to a .json file; unknown names throw ConfigError listing the known ones.
GpuProfile find_gpu(const std::string& name_or_path);

// How the MoE kernel finds expert weights. kPaged: the paged kernel reads experts in place, from their pages
// or a load-buffer slot (DESIGN §3.5). kGather: a kernel that needs one contiguous expert tensor; before each
// MoE layer every expert it routes to is first copied from its pages into a contiguous workspace (the unified
// pool without the paged kernel: the paper's ablation step "+ adjuster" before "+ paged kernel").
enum class MoeKernel : std::uint8_t { kPaged, kGather };
std::string_view to_string(MoeKernel k) noexcept;
// "paged" or "gather"; anything else throws ConfigError(field, value, rule).
MoeKernel moe_kernel_from_string(const std::string& s, const std::string& field);

// How far a fitted cost model is from the measurements it was fitted to, for one phase (calibration.hpp):
// |predicted / measured - 1| over the phase's samples. Written by a calibration, carried by the JSON file
// ("residuals"), not used by the simulator.
struct CostModelResidual {
  std::string phase;  // attention, moe, dense, step, copy
  std::uint64_t samples = 0;
  double median_abs_rel_error = 0, p90_abs_rel_error = 0;
  friend bool operator==(const CostModelResidual&, const CostModelResidual&) = default;
};

// Efficiency factors and overheads of the simulated step (see sim_backend.hpp for the formulas).
struct CostModelParams {
  std::string name = "default", source;
  bool calibrated = false;
  double moe_memory_efficiency = 0.70, moe_compute_efficiency = 0.50;
  double dense_memory_efficiency = 0.80, dense_compute_efficiency = 0.60;
  double attention_memory_efficiency = 0.60, attention_compute_efficiency = 0.40;
  double per_layer_overhead_s = 30e-6;
  double step_overhead_s = 1e-3;
  double h2d_bandwidth_scale = 1.0;     // measured / profile bandwidth, written by calibration
  double h2d_copy_latency_scale = 1.0;  // measured / profile per-copy latency, written by calibration
  // What a roofline cannot say about a kernel at a given size (a path switch, tile occupancy, extra
  // launches): a factor on a phase's roofline time (not on the per-layer overhead), piecewise linear in
  // log2(tokens) between knots and constant beyond the first and last (token_scale_at). Empty: 1 everywhere.
  // Fitted by a calibration (calibration.hpp), optional in the file.
  //   moe_token_scale          keyed by the step's tokens (every precision: a quantized fit's scales and
  //                            table are fitted on top of it);
  //   attention_prefill_scale  keyed by the step's prefill tokens (sequences adding more than one token);
  //                            a step without prefill is not scaled.
  struct TokenScale {
    double tokens = 1, scale = 1;
    friend bool operator==(const TokenScale&, const TokenScale&) = default;
  };
  std::vector<TokenScale> moe_token_scale, attention_prefill_scale;
  // The MoE kernel on quantized experts: multipliers on moe_{memory,compute}_efficiency (dequantisation in
  // the kernel's inner loop), and its own token-scale table, a factor on top of moe_token_scale (the
  // quantized kernel chooses other tiles: its time grows with tokens unlike bf16's; file keys
  // int8_moe_token_scale, int4_moe_token_scale, optional). bf16 is 1 by definition. Uncalibrated until
  // measured from the kernel.
  struct PrecisionScale {
    double memory = 1.0, compute = 1.0;
    std::vector<TokenScale> token_scale;
  };
  PrecisionScale int8{0.95, 0.85, {}}, int4{0.90, 0.75, {}};
  std::vector<CostModelResidual> residuals;  // empty unless calibrated (optional in the file)
};

// The factor of a token-scale table at `tokens` (see CostModelParams): 1 for an empty table or tokens <= 0.
double token_scale_at(const std::vector<CostModelParams::TokenScale>& table, double tokens) noexcept;
// Limits of a table in a cost-model file: at most kMaxTokenScaleKnots knots, tokens >= 1 strictly increasing,
// scales in [kMinTokenScale, kMaxTokenScale].
inline constexpr std::size_t kMaxTokenScaleKnots = 64;
inline constexpr double kMinTokenScale = 0.05, kMaxTokenScale = 20.0;

CostModelParams parse_cost_model(std::string_view json_text, const std::string& what);
// A built-in profile by name (builtin_cost_model_names()), or a path to a cost-model JSON file.
CostModelParams find_cost_model(const std::string& name_or_path);
// The names of the built-in profiles (reference_engine/data/cost_models/), in the order they are embedded;
// parsed once.
const std::vector<std::string>& builtin_cost_model_names();
// The JSON text of a cost model (what a calibration run writes).
std::string cost_model_to_json(const CostModelParams& p);

}  // namespace amoeba::engine
