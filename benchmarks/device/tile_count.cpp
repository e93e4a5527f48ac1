// The 128-token work tiles of the TMA grouped GEMM under the uniform and the balanced router, over
// paged_moe_bench's 8 rotating routing sets (seed 7919·T + i): Σ_e ⌈count_e / 128⌉ over the routed experts
// plus ⌈T / 128⌉ per shared chunk, and how many of the uniform router's routed tiles hold at most 64 tokens
// (an expert's last, partly filled tile, where the bf16 TMA kernel's second consumer warpgroup idles and the
// quantized one still multiplies all 128 token rows). Host only, no GPU:
//   g++ -std=c++20 -O2 -Itests/device benchmarks/device/tile_count.cpp -o /tmp/tile_count && /tmp/tile_count
#include <cstdio>
#include <vector>

#include "routing_draw.hpp"

using namespace amoeba::testing;

int main() {
  struct Model {
    const char* name;
    int experts, top_k, shared_chunks;
  };
  const Model models[] = {{"qwen1.5+shared", 60, 4, 4}, {"qwen3", 128, 8, 0}, {"mixtral", 8, 2, 0}};
  for (const Model& m : models)
    for (int tokens : {1024, 4096, 16384}) {
      double tiles[2] = {0, 0}, half_tiles = 0;
      for (int r = 0; r < 2; ++r) {
        const Router router = r == 0 ? Router{} : Router::parse("balanced");
        for (int i = 0; i < 8; ++i) {
          const auto draw = draw_routing(m.experts, m.top_k, tokens, 7919ULL * tokens + i, router);
          std::vector<int> count(m.experts, 0);
          for (int e : draw.ids) ++count[e];
          long n = 0;
          for (int c : count) {
            n += (c + 127) / 128;
            if (r == 0 && c % 128 > 0 && c % 128 <= 64) half_tiles += 1 / 8.0;
          }
          n += static_cast<long>(m.shared_chunks) * ((tokens + 127) / 128);
          tiles[r] += n / 8.0;
        }
      }
      std::printf(
          "%-15s T=%5d  tiles uniform %7.1f  balanced %7.1f  balanced/uniform %.3f  uniform <= 64 tokens "
          "%5.1f\n",
          m.name, tokens, tiles[0], tiles[1], tiles[1] / tiles[0], half_tiles);
    }
}
