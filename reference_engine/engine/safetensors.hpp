// Safetensors files (the format Hugging Face checkpoints ship in), read on the host without any GPU:
//   8 bytes      N, the header length, little-endian unsigned;
//   N bytes      a JSON object {"<tensor name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin,
//   end]},
//                ..., "__metadata__": {string: string}} (optional metadata);
//   the rest     the byte buffer; offsets are relative to its start.
// open() checks everything it can without reading tensor data: the header length against the file size, each
// entry's dtype, shape and offsets (end - begin = elements x dtype size), that the entries tile the buffer
// without overlaps or holes, and that the file holds the whole buffer (a truncated shard is refused with the
// byte counts). Errors are ConfigError naming the file, the tensor and the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace amoeba::engine {

enum class TensorDtype : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8E4M3,
  kF8E5M2
};
const char* to_string(TensorDtype d) noexcept;
std::size_t dtype_bytes(TensorDtype d) noexcept;

struct TensorInfo {
  std::string name;
  TensorDtype dtype = TensorDtype::kBF16;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data buffer
  std::uint64_t elements() const noexcept;
  std::uint64_t bytes() const noexcept { return end - begin; }
};

class SafetensorsFile {
 public:
  // Reads and checks the header; throws ConfigError (file unreadable, malformed, truncated).
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const noexcept { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  std::uint64_t data_offset() const noexcept { return data_offset_; }  // 8 + N
  // Copies tensor `name`'s bytes into `out` (out.size() must equal its byte count). Throws ConfigError.
  void read(const std::string& name, std::span<std::byte> out) const;
  // Copies out.size() bytes of tensor `name` from byte `offset` of the tensor. Throws ConfigError when the
  // range leaves the tensor. Safe to call from several threads (each call opens the file).
  void read_range(const std::string& name, std::uint64_t offset, std::span<std::byte> out) const;

  // The header (and nothing else) of a file holding `tensors` with their data laid out in the given order,
  // for writers; each TensorInfo's offsets are set.
  static std::string make_header(std::vector<TensorInfo>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

 private:
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_offset_ = 0;
};

// The largest header accepted (the format's reference implementation uses 100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100ull << 20;

}  // namespace amoeba::engine
