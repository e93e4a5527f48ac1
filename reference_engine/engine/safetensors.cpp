// Safetensors reading and header writing; see safetensors.hpp.
#include "engine/safetensors.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

namespace {
struct DtypeName {
  TensorDtype dtype;
  const char* name;
  std::size_t bytes;
};
constexpr std::array<DtypeName, 15> kDtypes{{{TensorDtype::kBool, "BOOL", 1},
                                             {TensorDtype::kU8, "U8", 1},
                                             {TensorDtype::kI8, "I8", 1},
                                             {TensorDtype::kI16, "I16", 2},
                                             {TensorDtype::kU16, "U16", 2},
                                             {TensorDtype::kF16, "F16", 2},
                                             {TensorDtype::kBF16, "BF16", 2},
                                             {TensorDtype::kI32, "I32", 4},
                                             {TensorDtype::kU32, "U32", 4},
                                             {TensorDtype::kF32, "F32", 4},
                                             {TensorDtype::kF64, "F64", 8},
                                             {TensorDtype::kI64, "I64", 8},
                                             {TensorDtype::kU64, "U64", 8},
                                             {TensorDtype::kF8E4M3, "F8_E4M3", 1},
                                             {TensorDtype::kF8E5M2, "F8_E5M2", 1}}};

}  // namespace

const char* to_string(TensorDtype d) noexcept {
  for (const DtypeName& x : kDtypes)
    if (x.dtype == d) return x.name;
  return "?";
}

std::size_t dtype_bytes(TensorDtype d) noexcept {
  for (const DtypeName& x : kDtypes)
    if (x.dtype == d) return x.bytes;
  return 0;
}

std::uint64_t TensorInfo::elements() const noexcept {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ConfigError("safetensors", path, "is a directory, not a file");
  const std::uintmax_t file_size = fs::file_size(path, ec);
  if (ec) throw ConfigError("safetensors", path, "cannot be read: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("safetensors", path, "cannot be opened for reading");
  if (file_size < 8)
    throw ConfigError(path, fmt::format("{} bytes", file_size), "is too short for a safetensors header");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len_bytes[i];
  if (n > kMaxSafetensorsHeader)
    throw ConfigError(path + ": header length", std::to_string(n),
                      fmt::format("must be at most {} bytes", kMaxSafetensorsHeader));
  if (n > file_size - 8)
    throw ConfigError(
        path + ": header length", std::to_string(n),
        fmt::format("exceeds the file ({} bytes after the length): truncated shard?", file_size - 8));
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) throw ConfigError("safetensors", path, "could not read its header");
  const nlohmann::json j = parse_json_text(text, path + ": header");
  if (!j.is_object()) throw ConfigError(path + ": header", j.type_name(), "must be a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  f.data_offset_ = 8 + n;
  const std::uint64_t data_bytes = file_size - f.data_offset_;
  std::vector<const TensorInfo*> by_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string at = path + ": " + quote_text(it.key());
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw ConfigError(at, quote_json(*it), "must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw ConfigError(at + "." + m.key(), quote_json(*m), "must be a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    if (!e.is_object())
      throw ConfigError(at, quote_json(e), "must be an object with dtype, shape, data_offsets");
    for (auto k = e.begin(); k != e.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        throw ConfigError(at + "." + k.key(), quote_json(*k), "is not a safetensors field");
    TensorInfo t;
    t.name = it.key();
    const auto dt = e.find("dtype");
    if (dt == e.end() || !dt->is_string())
      throw ConfigError(at + ".dtype", dt == e.end() ? "(missing)" : quote_json(*dt),
                        "must be a dtype string");
    const auto known = std::find_if(kDtypes.begin(), kDtypes.end(),
                                    [&](const DtypeName& x) { return dt->get<std::string>() == x.name; });
    if (known == kDtypes.end())
      throw ConfigError(at + ".dtype", quote_json(*dt), "is not a safetensors dtype");
    t.dtype = known->dtype;
    const auto sh = e.find("shape");
    if (sh == e.end() || !sh->is_array() || sh->size() > 8)
      throw ConfigError(at + ".shape", sh == e.end() ? "(missing)" : quote_json(*sh),
                        "must be an array of at most 8 dimensions");
    std::uint64_t elems = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40))
        throw ConfigError(at + ".shape", quote_json(*sh), "dimensions must be integers in [0, 2^40]");
      t.shape.push_back(d.get<std::uint64_t>());
      elems = t.shape.back() == 0 ? 0 : std::min<std::uint64_t>(elems * t.shape.back(), 1ull << 62);
    }
    const auto off = e.find("data_offsets");
    if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw ConfigError(at + ".data_offsets", off == e.end() ? "(missing)" : quote_json(*off),
                        "must be [begin, end], two byte offsets");
    t.begin = (*off)[0].get<std::uint64_t>();
    t.end = (*off)[1].get<std::uint64_t>();
    if (t.begin > t.end)
      throw ConfigError(at + ".data_offsets", quote_json(*off), "begin must not exceed end");
    if (t.end - t.begin != elems * known->bytes)
      throw ConfigError(at + ".data_offsets", quote_json(*off),
                        fmt::format("span {} bytes, but {} {} elements take {}", t.end - t.begin, elems,
                                    known->name, elems * known->bytes));
    if (t.end > data_bytes)
      throw ConfigError(at + ".data_offsets", quote_json(*off),
                        fmt::format("end past the file's data ({} bytes): truncated shard?", data_bytes));
    f.tensors_.emplace(t.name, std::move(t));
  }
  for (const auto& [name, t] : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->begin != covered)
      throw ConfigError(path + ": " + t->name + ".data_offsets", fmt::format("[{}, {}]", t->begin, t->end),
                        t->begin < covered
                            ? fmt::format("overlaps the tensor before it (which ends at {})", covered)
                            : fmt::format("leaves a hole after byte {}", covered));
    covered = t->end;
  }
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::read(const std::string& name, std::span<std::byte> out) const {
  const TensorInfo* t = find(name);
  if (!t) throw ConfigError(path_, name, "no such tensor in this file");
  if (out.size() != t->bytes())
    throw ConfigError(path_ + ": " + name, fmt::format("{} bytes", t->bytes()),
                      fmt::format("does not fit the {}-byte destination", out.size()));
  read_range(name, 0, out);
}

void SafetensorsFile::read_range(const std::string& name, std::uint64_t offset,
                                 std::span<std::byte> out) const {
  const TensorInfo* t = find(name);
  if (!t) throw ConfigError(path_, name, "no such tensor in this file");
  if (offset > t->bytes() || out.size() > t->bytes() - offset)
    throw ConfigError(path_ + ": " + name, fmt::format("bytes [{}, {})", offset, offset + out.size()),
                      fmt::format("lie outside the tensor's {} bytes", t->bytes()));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset_ + t->begin + offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!in) throw ConfigError(path_ + ": " + name, "read failed", "the file changed or is unreadable");
}

std::string SafetensorsFile::make_header(std::vector<TensorInfo>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (TensorInfo& t : tensors) {
    t.begin = at;
    t.end = at + t.elements() * dtype_bytes(t.dtype);
    at = t.end;
    j[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string h = j.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // data starts 8-byte aligned, as the reference writer does
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h;
}

}  // namespace amoeba::engine
