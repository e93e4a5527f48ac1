// GPU profiles (memory, HBM bandwidth, bf16 tensor rate, pinned host-to-device bandwidth and per-copy
// latency) and the simulator's cost-model parameters. Both are JSON files under reference_engine/data/,
// compiled into the binary; each number's source is recorded in the file itself (`sources`). A GPU
// calibration run writes a cost-model file of the same format (CostModelParams), read with --cost-model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace amoeba::engine {

struct GpuProfile {
  std::string name, description;
  std::uint64_t memory_bytes = 0;
  double hbm_bandwidth = 0;  // bytes/s
  double bf16_flops = 0;     // FLOP/s (dense)
  double h2d_bandwidth = 0;  // bytes/s, pinned, large copies
  double h2d_copy_latency_s = 0;
  std::uint64_t cuda_context_bytes = 0;
  std::vector<std::pair<std::string, std::string>> sources;  // field -> where the number comes from
};

GpuProfile parse_gpu(std::string_view json_text, const std::string& what);
const std::vector<GpuProfile>& gpu_catalog();
// A catalog name or a path to a .json file; unknown names throw ConfigError listing the known ones.
GpuProfile find_gpu(const std::string& name_or_path);

// Efficiency factors and overheads of the simulated step (see sim_backend.hpp for the formulas).
struct CostModelParams {
  std::string name = "default", source;
  bool calibrated = false;
  double moe_memory_efficiency = 0.70, moe_compute_efficiency = 0.50;
  double dense_memory_efficiency = 0.80, dense_compute_efficiency = 0.60;
  double attention_memory_efficiency = 0.60, attention_compute_efficiency = 0.40;
  double per_layer_overhead_s = 30e-6;
  double step_overhead_s = 1e-3;
  double h2d_bandwidth_scale = 1.0;  // measured / profile bandwidth, written by calibration
};

CostModelParams parse_cost_model(std::string_view json_text, const std::string& what);
// The built-in default, or a path to a cost-model JSON file.
CostModelParams find_cost_model(const std::string& name_or_path);
// The JSON text of a cost model (what a calibration run writes).
std::string cost_model_to_json(const CostModelParams& p);

}  // namespace amoeba::engine
