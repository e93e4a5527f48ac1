// CPU tests of the decode GEMV's step geometry (kernels/moe/decode_steps.hpp), against a shadow of what the
// kernel must read: for every K and warp count the kernel meets, every weight byte of a row is read exactly
// once, by loads whose token values match it, each quantized k-step's values inside one scale group; and for
// bf16, the first step of every pair touches all four sectors of its 128-byte line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "moe/decode_steps.hpp"

using namespace amoeba::kernels::decode;

namespace {

// bf16 K (values) that a decode tile of `warps` warps accepts: multiples of 32·warps.
std::vector<int> bf16_ks(int warps) {
  std::vector<int> ks;
  for (int k = 32 * warps; k <= 3072; k += 32 * warps) ks.push_back(k);
  for (int k : {1408, 2048, 4096, 5632, 14336})
    if (k % (32 * warps) == 0) ks.push_back(k);
  return ks;
}

}  // namespace

TEST_CASE("bf16 decode steps: warps split K at lines and pairs read whole lines", "[kernels][decode]") {
  for (int warps : {1, 2, 4, 8}) {
    for (int K : bf16_ks(warps)) {
      INFO("K=" << K << " warps=" << warps);
      std::vector<int> reads(K, 0);  // per value
      int max_steps = 0, min_steps = 1 << 30;
      for (int w = 0; w < warps; ++w) {
        const KRange r = warp_k_range(K, warps, w);
        REQUIRE(r.begin <= r.end);
        CHECK(r.begin % 64 == 0);  // a warp starts on a line
        if (w + 1 < warps) CHECK(r.end % 64 == 0);
        CHECK((r.end - r.begin) % 32 == 0);
        const int steps = (r.end - r.begin) / 32;
        max_steps = std::max(max_steps, steps);
        min_steps = std::min(min_steps, steps);
        for (int s = 0; s < steps; ++s) {
          std::set<int> sectors;
          for (int q = 0; q < 4; ++q) {
            const int k = r.begin + bf16_k(s, steps, q);
            REQUIRE(k >= r.begin);
            REQUIRE(k + 8 <= r.end);
            for (int v = 0; v < 8; ++v) ++reads[k + v];
            sectors.insert(2 * k / 32);  // the 32-byte sector of the load (2 bytes per value)
            CHECK(2 * k % 16 == 0);      // a 16-byte aligned load
          }
          // The first step of a pair touches the line's four sectors; a lone last step half a line.
          if ((s | 1) < steps && s % 2 == 0) {
            CHECK(sectors.size() == 4);
            CHECK(*sectors.rbegin() - *sectors.begin() == 3);
          }
        }
      }
      for (int v = 0; v < K; ++v) REQUIRE(reads[v] == 1);
      // As even as whole lines allow: the warps' steps differ by at most one line (two steps) plus a half.
      CHECK(max_steps - min_steps <= 3);
    }
  }
}

TEST_CASE("bf16 preloaded rows: a quarter-warp's shared-memory loads meet every bank once",
          "[kernels][decode]") {
  // A preloading down block reads its rows from shared memory at preload_pitch, each thread (g, q) 16 bytes
  // of rows g and g + 8 at its bf16_k. The 8 lanes of a quarter-warp (one shared-memory phase) must cover
  // the 32 four-byte banks once: 8 distinct 16-byte slots modulo 128 bytes.
  for (int K : bf16_ks(4)) {
    if (K % 64 != 0) continue;  // the decode tiles' K: multiples of 128 (can_implement)
    INFO("K=" << K);
    const long long pitch = preload_pitch(K);
    CHECK(pitch >= 2LL * K);
    const int steps = K / 32;  // one warp's range of the whole row: the worst case for the pairs' offsets
    for (int s = 0; s < steps; ++s)
      for (int hi = 0; hi < 2; ++hi)
        for (int phase = 0; phase < 4; ++phase) {
          std::set<long long> slots;
          for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
            const int g = lane / 4, q = lane % 4;
            slots.insert(((g + 8 * hi) * pitch + 2LL * bf16_k(s, steps, q)) % 128 / 16);
          }
          CHECK(slots.size() == 8);
        }
  }
}

TEST_CASE("quantized decode steps: every k-step once, round robin, in one group", "[kernels][decode]") {
  for (int values_per_byte : {1, 2}) {  // int8, int4
    const int step_values = 64 * values_per_byte, group = 128;
    for (int warps : {1, 2, 4, 8}) {
      // K: multiples of the k-step (fewer steps than warps too), and model shapes.
      std::vector<int> ks;
      for (int steps = 1; steps <= 40; ++steps) ks.push_back(steps * step_values);
      for (int k : {1408, 2048, 768, 4096, 14336})
        if (k % step_values == 0) ks.push_back(k);
      for (int K : ks) {
        const int steps = K / step_values;
        INFO("int" << 8 / values_per_byte << " K=" << K << " warps=" << warps);
        std::vector<int> step_seen(steps, 0);
        std::vector<int> byte_reads(K / values_per_byte, 0);
        int max_steps = 0, min_steps = 1 << 30;
        for (int w = 0; w < warps; ++w) {
          const int n = quant_warp_steps(steps, warps, w);
          max_steps = std::max(max_steps, n);
          min_steps = std::min(min_steps, n);
          for (int i = 0; i < n; ++i) {
            std::set<int> groups;
            int s = -1;
            for (int q = 0; q < 4; ++q) {
              const QuantStep st = quant_step(i, warps, w, q, values_per_byte);
              s = st.s;
              CHECK(st.s == w + warps * i);  // round robin
              REQUIRE(st.s >= 0);
              REQUIRE(st.s < steps);
              REQUIRE(st.byte % 16 == 0);
              for (int b = 0; b < 16; ++b) ++byte_reads[st.byte + b];
              // The thread's values are its own load's, all in the scale group of its k-step.
              CHECK(st.k == st.byte * values_per_byte);
              groups.insert(st.k / group);
              groups.insert((st.k + 16 * values_per_byte - 1) / group);
            }
            ++step_seen[s];
            CHECK(groups.size() == 1);
            CHECK(*groups.begin() == s * step_values / group);
            CHECK(quant_step(i, warps, w, 0, values_per_byte).group(values_per_byte) == *groups.begin());
          }
        }
        for (int s = 0; s < steps; ++s) REQUIRE(step_seen[s] == 1);
        for (int b : byte_reads) REQUIRE(b == 1);
        CHECK(max_steps - min_steps <= 1);
      }
    }
  }
}
