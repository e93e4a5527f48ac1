// Small Hugging Face checkpoints written by the tests themselves (engine/checkpoint.hpp's layout): a
// config.json, bf16 safetensors shards holding every tensor expected_tensors() names, and an index when
// there is more than one shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/safetensors.hpp"

namespace amoeba::engine::checkpoint_files {

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// Writes `tensors` (name -> (dtype, shape)) as one safetensors file whose data byte i is (7i + 3) mod 256.
inline void write_shard(const std::filesystem::path& p, const std::vector<TensorInfo>& in) {
  std::vector<TensorInfo> t = in;
  std::string out = SafetensorsFile::make_header(t);
  const std::uint64_t bytes = t.empty() ? 0 : t.back().end;
  for (std::uint64_t i = 0; i < bytes; ++i) out += static_cast<char>(i * 7 + 3);
  write_file(p, out);
}

// A checkpoint directory of `config`, every expected tensor in bf16 split over `shards` files with an index;
// `edit` may change the tensor list first.
inline std::filesystem::path write_checkpoint(const std::string& name, const char* config, int shards = 1,
                                              const std::function<void(std::vector<TensorInfo>&)>& edit = {},
                                              ExpertLayout layout = ExpertLayout::kPerExpert) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("amoeba_ckpt_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", config);
  std::vector<TensorInfo> all;
  for (const ExpectedTensor& e : expected_tensors(parse_hf_moe_config(config, "config.json"), layout))
    all.push_back(TensorInfo{e.name, TensorDtype::kBF16, e.shape, 0, 0});
  if (edit) edit(all);
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (int s = 0; s < shards; ++s) {
    std::vector<TensorInfo> part;
    for (std::size_t i = std::size_t(s); i < all.size(); i += std::size_t(shards)) part.push_back(all[i]);
    const std::string file =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    write_shard(dir / file, part);
    for (const auto& t : part)
      index += (index.back() == '{' ? "\"" : ", \"") + t.name + "\": \"" + file + "\"";
  }
  if (shards > 1) write_file(dir / "model.safetensors.index.json", index + "}}");
  return dir;
}

}  // namespace amoeba::engine::checkpoint_files
