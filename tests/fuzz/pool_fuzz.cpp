// libFuzzer target over operation bytes: each 9-byte record is one pool operation (choice byte + 8 argument
// bytes) applied to a small hybrid pool and checked against the shadow model; any disagreement, broken
// invariant or unmerged drain aborts. Without libFuzzer (gcc builds) the same harness runs as a ctest over
// random buffers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "amoeba/pool.hpp"
#include "support/pool_shadow.hpp"

namespace {
[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "pool_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace amoeba;
  // expert 12 KiB, SSM 8 KiB -> large 24 KiB; KV 1 KiB, conv 512 B: every tier and both small kinds.
  HybridMoePool pool(ArenaSpan{nullptr, 6 * 24576},
                     {PageSpec{12288}, PageSpec{8192}, PageSpec{1024}, PageSpec{512}});
  testing::PoolShadow<HybridMoePool> shadow(pool);
  for (std::size_t i = 0; i + 9 <= size; i += 9) {
    std::uint64_t arg;
    std::memcpy(&arg, data + i + 1, 8);
    if (auto e = shadow.step(data[i], arg)) die("shadow", *e);
    if (auto e = pool.check_invariants()) die("invariant", *e);
  }
  if (auto e = shadow.drain()) die("drain", *e);
  return 0;
}

#ifndef AMOEBA_LIBFUZZER
int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 2000;
  std::mt19937_64 rng(12345);
  std::vector<std::uint8_t> buf;
  for (int r = 0; r < runs; ++r) {
    buf.resize(rng() % 4096);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("pool_fuzz: %d random inputs, no failure\n", runs);
  return 0;
}
#endif
