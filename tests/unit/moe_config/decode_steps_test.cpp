// CPU tests of the decode GEMV's step geometry (kernels/moe/decode_steps.hpp), against a shadow of what the
// kernel must read: for every K and warp count the kernel meets, every weight byte of a row is read exactly
// once, by loads whose token values match it (for int4 pairs by sectors after the swap between threads q and
// q ^ 2), each k-step's values inside one scale group; and with whole lines, the first instruction of every
// pair (its loads by sectors, or its L1 prefetch) touches all four sectors of its 128-byte line.
#include <catch2/catch.hpp>

#include <map>
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

TEST_CASE("quantized decode steps: every k-step once, in one group, whole lines per pair",
          "[kernels][decode]") {
  for (int values_per_byte : {1, 2}) {  // int8, int4
    const int step_values = 64 * values_per_byte, group = 128;
    for (int warps : {1, 2, 4, 8}) {
      for (int lines : {0, 1, 2}) {
        // K: multiples of the k-step (odd and even step counts, fewer steps than warps), and model shapes.
        std::vector<int> ks;
        for (int steps = 1; steps <= 40; ++steps) ks.push_back(steps * step_values);
        for (int k : {1408, 2048, 768, 4096, 14336})
          if (k % step_values == 0) ks.push_back(k);
        for (int K : ks) {
          const int steps = K / step_values;
          INFO("int" << 8 / values_per_byte << " K=" << K << " warps=" << warps << " lines=" << lines);
          std::vector<int> step_seen(steps, 0);
          std::vector<int> byte_reads(K / values_per_byte, 0);
          for (int w = 0; w < warps; ++w) {
            const int n = quant_warp_steps(steps, warps, w, lines);
            // Whole lines: the bytes each thread loads, by (local pair, half), to check the int4 swap.
            std::map<std::pair<int, int>, long long> loaded;  // (q, i) -> byte
            for (int i = 0; i < n; ++i) {
              std::set<long long> sectors, touched;
              std::set<int> groups;
              int s = -1;
              const bool opens_pair = lines != 0 && i % 2 == 0 && i + 1 < n;
              for (int q = 0; q < 4; ++q) {
                const QuantStep st = quant_step(i, steps, warps, w, q, lines, values_per_byte);
                s = st.s;
                // lines = 2: the pair's first step prefetches the line holding both steps' bytes.
                if (lines == 2 && opens_pair) {
                  REQUIRE(st.touch >= 0);
                  touched.insert(st.touch / 32);
                  CHECK(st.touch / 128 == st.byte / 128);
                  CHECK(quant_step(i + 1, steps, warps, w, q, lines, values_per_byte).byte / 128 ==
                        st.byte / 128);
                } else {
                  CHECK(st.touch == -1);
                }
                REQUIRE(st.s >= 0);
                REQUIRE(st.s < steps);
                REQUIRE(st.byte % 16 == 0);
                for (int b = 0; b < 16; ++b) ++byte_reads[st.byte + b];
                sectors.insert(st.byte / 32);
                loaded[{q, i}] = st.byte;
                // The k-step's values (16 bytes' worth) in the scale group of its k-step.
                groups.insert(st.k / group);
                groups.insert((st.k + 16 * values_per_byte - 1) / group);
              }
              ++step_seen[s];
              CHECK(groups.size() == 1);
              CHECK(*groups.begin() == s * step_values / group);
              CHECK(quant_step(i, steps, warps, w, 0, lines, values_per_byte).group(values_per_byte) ==
                    *groups.begin());
              if (opens_pair && lines == 1)
                CHECK(sectors.size() == 4);  // the first instruction: the whole line
              if (opens_pair && lines == 2) CHECK(touched.size() == 4);  // the prefetch: the whole line
            }
            // What each thread's values are: without a swap its own load (k = byte · values_per_byte); int4
            // pairs after the swap the 16 bytes int4_holder names.
            for (int i = 0; i < n; ++i)
              for (int q = 0; q < 4; ++q) {
                const QuantStep st = quant_step(i, steps, warps, w, q, lines, values_per_byte);
                const bool full_pair = lines == 1 && (i % 2 == 1 || i + 1 < n);
                long long held = st.byte;
                if (full_pair && values_per_byte == 2) {
                  const Holder h = int4_holder(q, i % 2);
                  held = loaded.at({h.thread, i - i % 2 + h.half});
                }
                CHECK(st.k == held * values_per_byte);
              }
          }
          for (int s = 0; s < steps; ++s) REQUIRE(step_seen[s] == 1);
          for (int b : byte_reads) REQUIRE(b == 1);
        }
      }
    }
  }
}

TEST_CASE("int4 swap: each pair's half is a permutation of the loads", "[kernels][decode]") {
  std::set<std::pair<int, int>> held;
  for (int q = 0; q < 4; ++q)
    for (int u = 0; u < 2; ++u) {
      const Holder h = int4_holder(q, u);
      CHECK((h.thread == q || h.thread == (q ^ 2)));  // a partner is q ^ 2 (one __shfl_xor_sync)
      held.insert({h.thread, h.half});
      // Each thread sends one half and keeps one: what it keeps is its own.
      if (h.thread == q) CHECK(h.half == (q < 2 ? 0 : 1));
    }
  CHECK(held.size() == 8);
}
