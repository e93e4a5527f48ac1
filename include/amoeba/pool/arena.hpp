// Arenas: the one block of bytes a TieredPagePool manages. The pool only needs a base pointer and a size
// (ArenaSpan); who owns the memory is the caller's business: HostArena here (tests, simulator), a device
// allocation in the CUDA backend. The pool never dereferences the base pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace amoeba {

// A non-owning byte range. base may be null for bookkeeping-only pools (the simulator).
struct ArenaSpan {
  std::byte* base = nullptr;
  std::uint64_t bytes = 0;
};

// Owning, page-aligned host memory (4 KiB alignment, size rounded up to it).
class HostArena {
 public:
  explicit HostArena(std::uint64_t bytes) : bytes_(bytes) {
    const std::uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<std::byte*>(p));
  }
  ArenaSpan span() const noexcept { return {data_.get(), bytes_}; }
  std::byte* data() const noexcept { return data_.get(); }
  std::uint64_t size() const noexcept { return bytes_; }

 private:
  static constexpr std::uint64_t kAlign = 4096;
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::uint64_t bytes_;
};

}  // namespace amoeba
