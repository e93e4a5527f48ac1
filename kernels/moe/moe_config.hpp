// How PagedMoe tiles one call: which collective runs the two GEMM stages and how many tokens a work tile
// holds, chosen from the shape alone by a constexpr table (no run-time tuning state). A configuration is a
// policy type (`moe_config`): PagedMoe<Addressing, Config> takes DefaultMoeConfig unless told otherwise, so a
// benchmark compares configurations by instantiating another type, never by setting a global.
// Host-only (no CUDA header): the table and its examples are checked at compile time on any machine.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>

#include "moe/decode_steps.hpp"
#include "moe/moe_shape.hpp"
#include "moe/quant_layout.hpp"

namespace amoeba::kernels {

// Which collective runs the gate/up and down stages. kAuto lets the configuration choose; kGrouped is the
// wgmma grouped GEMM on sm_90 devices (mma.sync elsewhere); kGroupedMma forces the mma.sync grouped GEMM.
enum class MoePath { kAuto, kDecode, kGrouped, kGroupedMma };

struct MoeConfig {
  MoePath path = MoePath::kDecode;
  int tile_tokens = 8;        // tokens per work tile: 8, 16 or 32 (decode), 64 or 128 (grouped); 32 on the
                              // grouped path: quantized experts on the TMA kernel's small-batch units
                              // (grouped_rows 256, sm_90)
  int decode_warps = 4;       // decode: warps per block, splitting K
  int decode_unroll = 2;      // decode: k-steps of weight loads each thread has in flight
  int decode_prefetch = 128;  // decode: the weight loads' L2 prefetch hint, 128 or 256 bytes
  int grouped_rows = 128;     // sm_90 grouped GEMM: weight rows per block, 128 (the two-block cp.async
                           // kernels) or 256 (the persistent TMA kernels, grouped::gemm_tma_kernel for bf16,
                           // gemm_tma_quant_kernel for int8 / int4 experts); ignored off sm_90
  int decode_stages = 0;  // decode, quantized experts: k-steps each thread keeps in flight through shared
                          // memory (decode::Tile's kStages; unroll 1); 0: none (the register loop)
  bool grouped_dequant = false;  // grouped path, quantized experts, sm_90: dequantise the routed experts into
                                 // a bf16 copy in the workspace, then run the bf16 TMA grouped GEMM on it
                                 // (256-row blocks); needs a configuration type with kDequantWorkspace = true
                                 // (the copy: (E+m)·3·F·H bf16 more workspace)
  bool small_deep = false;       // 64-token grouped tiles (bf16, sm_90): eight stages and one block per SM
                                 // (gemm_wgmma_small_kernel<8, 1>) instead of the configuration type's
                                 // kSmallStages / kSmallBlocks (4 and 2 unless it says otherwise)
  bool decode_preload = false;   // decode, bf16, 8-token tiles: each down block copies its 32 W2 rows into
                                // shared memory before it waits for the gate/up kernel (decode::gemv_kernel's
                                // kPreload), so W2 streams while gate/up runs; 32·(2F + 16) bytes per block.
                                // A call whose down blocks' rows do not all fit the device's shared memory at
                                // once streams instead (PagedMoe::decode_preloads)
  int decode_down_warps = 0;   // decode: warps splitting K in the down stage's blocks (0: decode_warps), so
                               // that a short K (F) is dealt evenly: Qwen3's F = 768 is 6 int4 k-steps,
                               // 2/2/1/1 over 4 warps
  bool decode_splitk = false;  // decode: the split-K decode instead of the decode tiles
                               // (moe/decode_splitk.cuh: no routing; a cluster of 4 blocks per slot and 64
                               // or 128 features of F (the first of the configuration's forms that fits,
                               // splitk_shapes below) runs them through gate/up and W2, and a second launch
                               // sums the fp32 partials); for one token, where
                               // the top-k experts are distinct. A call whose clusters do not all fit the
                               // device at once takes the decode tiles instead (PagedMoe::decode_splits)
  int chunk_spread = 1;        // sm_90 grouped path: the shared chunks' units run spread over the first
                               // chunk_spread × their count of the call's units, among the routed experts'
                               // (moe/unit_order.hpp); 1: first, the tile list's order; at least 1
  friend constexpr bool operator==(const MoeConfig&, const MoeConfig&) = default;
};

// One form of the split-K decode kernel (MoeConfig::decode_splitk, moe/decode_splitk.cuh): `features` of F
// per cluster of 4 blocks (64 or 128, and 256 on bf16 experts: a W2 row slice of whole 16-byte loads that
// divide a warp, inside one scale group on quantized experts) and `h_split` warps per feature group (1, or a
// pair, each over its half of H: a block of 4·h_split warps), taken only by calls of at least `min_clusters`
// of its clusters; `steps`: the W1 / W3 loads each lane keeps in flight, in steps of a warp's 16-byte loads
// along H (0: the kernel's own, splitk::Geometry: 2 on 4 warps, 1 with warp pairs).
struct SplitkShape {
  int features = 0;  // 0: no such form
  int h_split = 1;
  int min_clusters = 0;
  int steps = 0;
  // Quantized experts on 8 features per warp (128 in warp pairs or on 4 warps): the products on mma.sync
  // (each lane's 16-byte loads of two weight rows dequantised straight into A fragments, the token's values
  // as B) instead of scalar fmas, in gate/up and, where a lane's load holds a quarter of a W2 row slice
  // (int4), in the down step (splitk::Geometry::kMma, kMmaDown).
  bool mma = false;
  // The kernel the form runs: the form without its call rule (min_clusters). Two forms with the same
  // kernel_form() instantiate the same kernel.
  constexpr SplitkShape kernel_form() const { return {features, h_split, 0, steps, mma}; }
  friend constexpr bool operator==(const SplitkShape&, const SplitkShape&) = default;
};
// A configuration's forms, in the order a call tries them: PagedMoe takes the first that serves H, whose
// min_clusters the call reaches and whose clusters all fit the device at once (PagedMoe::splitk_choice), the
// decode tiles where none does.
using SplitkShapes = std::array<SplitkShape, 3>;

// The decode tile of the down stage: `c` with its down stage's warps.
constexpr MoeConfig down_tile_config(MoeConfig c) {
  if (c.decode_down_warps != 0) c.decode_warps = c.decode_down_warps;
  c.decode_down_warps = 0;
  return c;
}

// `c` on grouped tiles of `tokens` tokens: small_deep names a variant of the 64-token tiles, so other tiles
// drop it.
constexpr MoeConfig with_grouped_tile(MoeConfig c, int tokens) {
  c.tile_tokens = tokens;
  if (tokens != 64) c.small_deep = false;
  return c;
}

// The work tiles of a decode call whose tiles hold any expert's batch (T <= the tile's tokens): one per
// routed expert it can touch, at most min(T·k, E), and one per shared chunk.
constexpr long long whole_batch_tiles(const MoeShape& s) {
  const long long slots = static_cast<long long>(s.num_tokens) * s.top_k;
  return (slots < s.num_experts ? slots : s.num_experts) + s.num_shared_chunks;
}

template <class C>
concept moe_config = requires(const MoeShape& s, MoePath requested) {
  { C::select(s, requested) } -> std::same_as<MoeConfig>;
};

namespace config_detail {

// mean + 3·sqrt(mean) + 1 <= limit, without a constexpr sqrt: 3·sqrt(mean) <= limit - 1 - mean.
constexpr bool fits(double mean, double limit) {
  const double room = limit - 1.0 - mean;
  return room >= 0.0 && 9.0 * mean <= room * room;
}

}  // namespace config_detail

// A decode tile's compile-time shape, host-side: decode::Tile<tile_tokens / 8, warps, unroll, prefetch,
// stages>.
struct DecodeTileShape {
  int tile_tokens = 8, warps = 4, unroll = 2, prefetch = 128;
  int stages = 0;
  friend constexpr bool operator==(const DecodeTileShape&, const DecodeTileShape&) = default;
};
constexpr DecodeTileShape decode_tile_of(const MoeConfig& c) {
  return {c.tile_tokens, c.decode_warps, c.decode_unroll, c.decode_prefetch, c.decode_stages};
}

// At most N decode tiles, each once, in the order first added.
template <std::size_t N>
struct DecodeTileList {
  DecodeTileShape tiles[N]{};
  std::size_t size = 0;
  constexpr bool contains(const DecodeTileShape& t) const {
    for (std::size_t i = 0; i < size; ++i)
      if (tiles[i] == t) return true;
    return false;
  }
  constexpr void add(const DecodeTileShape& t) {
    if (!contains(t)) tiles[size++] = t;
  }
};

namespace config_detail {

// The tiles of a table's rows (a row whose int8 or int4 layers are staged: its tile and the staged ones, the
// other precision running the register loop; a row whose int8 or int4 down stage runs other warps: that
// precision's down tile too) and its fallback tile, each once.
template <class Row, std::size_t R>
constexpr DecodeTileList<5 * R + 1> tiles_of(const Row (&rows)[R], const DecodeTileShape& fallback) {
  DecodeTileList<5 * R + 1> list;
  for (const Row& r : rows) {
    list.add({r.tile_tokens, r.warps, r.unroll, r.prefetch, 0});
    const int staged[] = {r.int8_stages, r.int4_stages};
    const int down[] = {r.int8_down_warps, r.int4_down_warps};
    for (int i = 0; i < 2; ++i) {
      if (staged[i] > 0) list.add({r.tile_tokens, r.warps, r.unroll, r.prefetch, staged[i]});
      if (down[i] > 0) list.add({r.tile_tokens, down[i], r.unroll, r.prefetch, staged[i]});
    }
  }
  list.add(fallback);
  return list;
}

// A decode row of DefaultMoeConfig's tables: the shapes it applies to and the tile it names.
struct DecodeRow {
  long long max_routed_slots;  // T·k at most
  int min_intermediate, max_intermediate;
  int max_expected_batch;  // mean + 3σ + 1 of a uniform router at most
  int tile_tokens, warps, unroll;
  int prefetch;                          // L2 prefetch hint of the weight loads, bytes
  int int8_stages, int4_stages;          // quantized rows: k-steps int8 / int4 layers keep in flight through
                                         // shared memory (decode::Tile's kStages; 0: the register loop)
  int int8_down_warps, int4_down_warps;  // quantized rows: warps of the down stage's blocks
                                         // (MoeConfig::decode_down_warps; 0: `warps`)
  enum class Only { kAny, kInt8, kInt4 };
  Only only = Only::kAny;  // quantized rows: a row for one precision's layers (the other skips it)
};

}  // namespace config_detail

// The default table. Decode while a routed expert's mean batch is below one token (T·k < E: most experts
// get none or one), the grouped GEMM (64- or 128-token tiles, below) from there on. On the H200 the sm_90
// grouped GEMM (its weight reads near the HBM floor, a warpgroup with no tokens skipping its wgmma) takes
// 0.915–0.996× the decode tiles' time at 8–64 tokens once the mean batch is one (Qwen1.5 and Qwen3 from 16
// tokens, Mixtral from 8) and 0.39–0.96× at 128–256; at 1 token it takes 1.14–1.49×, at 3 tokens 1.05–1.07×
// (Qwen1.5 routed-only 0.97×), at 8 tokens on Qwen within 3% (docs/results/paged_moe_h200.md, "Decode or
// grouped"). Where the expected largest routed batch exceeds 64 tokens, the grouped GEMM is the persistent
// TMA kernel (grouped::gemm_tma_kernel: 128 tokens × 256 weight rows, one block of a producer and two
// consumer warpgroups per SM; grouped_rows = 256, on H multiples of 256): 0.786–0.937× the cp.async
// kernels' time at 1024–16384 tokens on every model and 0.928× at Mixtral 256
// (docs/results/paged_moe_h200.md, "The persistent TMA grouped GEMM"). Where the expected largest routed
// batch fits 64 tokens (mean + 3σ + 1 <= 64: a mean of up to ~42), the 128-row blocks take 64-token tiles
// (grouped::gemm_wgmma_small_kernel: one warpgroup, 24 KiB stages, 4 stages and 2 blocks per SM, the weight
// loads 3 steps ahead instead of 2): 0.933–0.955× the 128-token tiles' time at 16–256 tokens on Qwen (routed
// and with shared chunks) and at 16–128 on Mixtral, 1.097× at Mixtral 256 (mean batch 64: every expert in two
// tiles); 3 stages and 3 blocks 0.907–0.984×, 8 stages and 1 block 0.928–0.982×
// (docs/results/paged_moe_h200.md, "Small batches on 64-token grouped tiles", 3 processes). On huge experts
// (F ≥ kDeepSmallIntermediate: Mixtral's K of 14336 in the down stage) from a mean routed batch of 2 the
// 64-token tiles run 8 stages and one block per SM (MoeConfig::small_deep): 0.973–0.976× and, on another
// lease, 0.990–0.997× the 4-stage kernel's time at 16–128 tokens on Mixtral, 0.985× at 8 tokens (a third
// lease), but 1.007× at 4 tokens (mean batch 1); on Qwen shapes 8 stages range 0.986–1.079× and 3 stages
// 0.976–1.027× (3 processes each: docs/results/paged_moe_h200.md, "Eight stages for huge experts' 64-token
// tiles"). The decode tile is the first row of kDecodeRows the shape satisfies. Each row is the fastest of
// the tiles measured on the H200 for its shapes (docs/kernel.md, "Decode tiles"; same process, contiguous
// medians; the 8-token tiles with 8 warps or 3–4 k-steps: docs/results/paged_moe_h200.md, "Decode tiles with
// more bytes in flight", 3 processes):
//  - up to 32 routed slots on small experts (Qwen1.5 to 8 tokens, Qwen3 to 4): 8-token tiles with two k-steps
//    in flight. At 1 and 3 tokens 4–12% faster than 32-token ones, 0.1–10% faster than three or four
//    k-steps; at 7–8 tokens (Qwen1.5, since the GEMV reads whole lines) the CUDA backend's MoE phase 0.967 ±
//    0.003× (batch 7) and 0.968 ± 0.002× (batch 8) the 32-token tiles' time (3 runs each; the benchmark:
//    0.87–0.89× between back-to-back layers, 0.96–0.99× with 32–64 MB of other reads between them:
//    docs/results/paged_moe_h200.md, "The 8-token rows to 32 routed slots"). Before whole lines 8-token tiles
//    made the engine's steps at batch 7–14 up to 1.3× slower (their line halves were read from DRAM twice
//    whenever the L2 held other data: docs/results/calibration_h200.md). Qwen1.5 with its shared chunks at 12
//    tokens (two 8-token tiles per chunk) 0.92× and 1.04× in the benchmark: not taken;
//  - up to 6 routed slots on huge experts (Mixtral at 1 and 3 tokens): 8-token tiles with 8 warps splitting K
//    (the down projection has only H/32 blocks per expert): 0.945× and 0.926× the 32-token tiles' time;
//  - otherwise 32-token tiles with one k-step of loads in flight: 0.5–2.3% faster than two. On the measured
//    models the 8-token rows apply only where no expert can get more than 8 tokens (T ≤ 8;
//    tests/unit/moe_config): an expert's batch can reach T (shared chunks always do), and an 8-token tile
//    re-reads the expert per 8 tokens. The rows' slot limits are what keep it so; a model with F ≤ 2048 and
//    k = 1 (2) would meet row 1 at up to 32 (16) tokens. 16-token tiles
//    were 1–6% faster on Qwen at 16 and 33 tokens but made the paged layer up to 3% slower than the
//    contiguous one (Qwen3 at 33 tokens, shuffled and adjacent pages alike); 32-token tiles stay within 1%.
//  - the weights' L2 prefetch hint: 128 bytes everywhere. Against 256 (docs/results/paged_moe_h200.md, one
//    process per hint): Qwen shapes 2.4–12.9% faster; Mixtral −2.3% … +4.1%, not yet measured over several
//    processes, so its rows keep 128 until they are (paged_moe_bench's p256 instantiates the 256-byte tiles).
// Skewed routing stays correct on either path: an expert with more tokens than a tile gets several tiles.
struct DefaultMoeConfig {
  using DecodeRow = config_detail::DecodeRow;
  // clang-format off
  static constexpr DecodeRow kDecodeRows[] = {
      // slots ≤  F from  F to     batch ≤ tile warps unroll prefetch stages down
      {32,        0,      2048,    8,      8,   4,    2,     128,     0, 0, 0, 0},
      {6,         8192,   1 << 30, 8,      8,   8,    2,     128,     0, 0, 0, 0},
      {1LL << 40, 0,      1 << 30, 32,     32,  4,    1,     128,     0, 0, 0, 0},
  };
  // clang-format on
  static constexpr int kDecodeTile = 32;  // the largest decode tile (kDecode asked for at any size)
  static constexpr DecodeTileShape kFallbackTile{kDecodeTile, 4, 1, 128};  // when no row matches
  static constexpr double kDecodeMeanBatch = 1.0;  // kAuto decodes while the mean routed batch is below this
  static constexpr int kQuantDecodeTile = 32;      // quantized experts: decode while the batch fits this many
  static constexpr int kQuantSharedDecodeTokens = 128;  // ... and shared chunks (every token) this many
  static constexpr int kGroupedTile = 128;
  static constexpr int kSmallGroupedTile = 64;   // bf16 grouped tiles while the expected batch fits this
  static constexpr int kQuantTmaSmallTile = 32;  // quantized TMA kernel's small-batch units (tokens): ...
  static constexpr double kQuantTmaSmallMeanBatch = 14.0;     // ... kAuto's choice from this mean batch ...
  static constexpr double kQuantTmaSmallMaxMeanBatch = 36.0;  // ... the grouped path's up to this one ...
  static constexpr int kQuantTmaSmallSharedTokens = 256;      // ... and with shared chunks up to T tokens
  static constexpr int kTmaRows = 256;                 // bf16 grouped blocks beyond: the TMA kernel's width
  static constexpr int kDeepSmallIntermediate = 8192;  // 64-token tiles on 8 stages from this F on ...
  static constexpr double kDeepSmallMeanBatch = 2.0;   // ... and this mean routed batch on
  // bf16 decode on 8-token tiles: the down blocks preload their W2 rows into shared memory while gate/up
  // runs (MoeConfig::decode_preload) where every down block's rows fit the device's shared memory at once,
  // preload_bytes(s) <= kPreloadBytes: 26 MiB of the H200's 132 SMs × 228 KB (29.4 MiB), the rest left to the
  // gate/up blocks and the per-block reservations. Measured on the H200 (docs/results/paged_moe_h200.md,
  // "Down weights preloaded during gate/up", 3 processes): 0.932× the streaming down stage's layer time on
  // Qwen1.5-MoE's routed experts at 1 token (23 MB of rows) and 0.964× on Qwen3-30B-A3B (25 MB; with 64 MB of
  // other reads between layers 0.917× and 0.931×); where the rows do not fit at once the blocks that wait for
  // room load and compute in turn and the layer is slower: 1.042× with Qwen1.5's 4 shared chunks at 1 token
  // (46 MB), 1.09–1.25× at 3 and 8 tokens. PagedMoe checks the fit again on the device it runs on (its SMs'
  // shared memory) and streams where it fails (PagedMoe::decode_preloads): a device with fewer SMs keeps the
  // streaming layer.
  static constexpr long long kPreloadBytes = 26LL << 20;

  // Quantized experts (select_quantized): the decode collective while the expected largest routed batch fits
  // kQuantDecodeTile tokens and shared chunks, which take every token, at most kQuantSharedDecodeTokens; the
  // grouped GEMM beyond: where the expected largest routed batch exceeds 64 tokens and H % 256 == 0 (bf16's
  // rule) the persistent TMA kernel that dequantises the weights in registers
  // (grouped::gemm_tma_quant_kernel, grouped_rows = 256: 0.72–0.97× (int8) and 0.78–0.95× (int4) the
  // two-block kernel's time at 1024–16384 tokens on every model and at Mixtral 256, 3 processes; but 1.09× /
  // 1.12× at Qwen1.5 with shared chunks at 256 tokens, mean batch 17, one process:
  // docs/results/quantized_h200.md, "The TMA grouped GEMM on quantized experts"), else the two-block kernel
  // dequantising in shared memory.
  // Measured on the H200 with idle warpgroups skipping their wgmma (docs/results/quantized_h200.md, "Where
  // decode and grouped cross"): grouped over decode 1.15–1.22× (int8) and 1.21–1.41× (int4) at the last
  // decoded sizes (Qwen3 at 256 tokens, Mixtral at 64), 0.69–0.84× at the first grouped ones (Qwen3 at 512,
  // Mixtral at 128); Qwen1.5 with its 4 shared chunks 1.18× / 1.36× at 128 tokens and 0.85× / 0.94× at 256
  // (mean routed batch 17: decoded by the routed rule alone). The decode rows, from the quantized sweep on
  // the H200 (docs/results/quantized_h200.md, "Choosing the quantized decode tiles"): the dequantising main
  // loop needs about twice the registers of the bf16 one, so the tiles that keep fewest live (8 or 16 tokens,
  // one k-step in flight) run fastest; 8-token tiles even when a few experts' batches overflow into a second
  // tile (Qwen at 64 tokens), 16-token tiles beyond (Mixtral at 33 and 64 tokens), and 8 warps splitting K
  // where one or two routed slots meet huge experts (Mixtral at 1 token). int8 layers run every row staged
  // (each thread's next k-steps in flight through shared memory, decode::Tile's kStages, at one step's
  // registers: 55–57 against 78–80): 0.79–0.94× the same table without stages at 1–64 tokens, 0.90× at 128
  // (3 processes); against c2db93d's table (int8 rolling up to 64 routed slots) 0.92–0.98× at 1 token with 4
  // stages and 0.88–0.95× at 3–128 tokens with the rows' counts. 4 stages where few slots are routed (Qwen at
  // 1 token: 3 stages 1.01×, 2 stages 1.03–1.08× the rolling tile), 3 between, 2 from 16 tokens on Qwen
  // (0.90–0.93×; docs/results/quantized_h200.md, "Staged int8 decode tiles"). int4, at half the bytes per
  // value and twice the token chunks per step, lost with every stage count on Qwen (1.04–1.65×) and keeps the
  // register loop there; on huge experts (F ≥ 8192: Mixtral at 1–16 tokens, 8-token tiles) 2 stages took
  // 0.88–0.96× its time (3 processes, the same sweep), so those rows stage int4 too: as the default table
  // 0.88–0.95× the register loop of the same tiles, 1.50–1.94× the packed floor
  // (docs/results/quantized_h200.md, "int4 on huge experts"). The down stage's blocks split K = F over
  // their own warps where that measured faster (decode_down_warps, 3 processes, against the rows' 4 warps:
  // docs/results/quantized_h200.md, "The down stage on its own warps"): on experts of F <= 1024 (Qwen3's 768:
  // 6 int4 or 12 int8 k-steps) 2 warps, int4 past 16 routed slots (0.933–0.982× at 3–64 tokens; 1.033× at
  // 2) and int8 past 64 (0.978–0.990× at 16–64; 0.995–1.009× at 3–8); int4 on 6 warps at up to 4 routed
  // slots, and up to 8 on F <= 1024 (Qwen at 1 token: 0.917–0.925×; Qwen1.5 with its chunks at 2 tokens, 8
  // slots: 1.035×; int8 on 6 warps at 1 token 0.904–1.083× by model, not taken); Qwen1.5's F = 1408 and
  // Mixtral lost with 2, 3 and 6 and keep the row's warps. Since int4's nibbles were interleaved (fewer
  // instructions per weight), int4 layers on experts below F = 8192 past 64 routed slots run 8-token tiles on
  // 2 warps in both stages, up to the decode limit (a row for int4 only: DecodeRow::only). Against the table
  // before, 3 processes (docs/results/quantized_h200.md, "Interleaved int4 nibbles"): 0.789× / 0.867× at
  // Qwen3 128 / 256 tokens (where 16-token tiles ran), 0.940× at Qwen1.5 with its chunks at 128, 0.96× at 64
  // on both, 0.983× / 0.996× at 33 (Qwen1.5 / Qwen3); 1.012× at Qwen3 16 (128 slots), taken with the rest.
  // Two stages on the same tile were slower than none at every size, int8 on 2 warps with 2 or 3 stages
  // 0.99–1.29× its table's time: not taken. Between the decode tiles and the 128-token units, the TMA
  // kernel's 32-token units (tile_tokens = kQuantTmaSmallTile, wgmma n = 32): against the table before, 3
  // processes (docs/results/quantized_h200.md, "32-token units on the quantized TMA kernel"), 0.67–0.93× at a
  // mean routed batch of 16–32 on every model (Qwen3 256 tokens, Mixtral 64–128), 0.73–0.87× against the
  // two-block kernel where Qwen1.5's shared chunks end the decode path (160–256 tokens, mean 10.7–17);
  // 1.005–1.08× at a mean of 12 (Mixtral 48, Qwen3 192) and 1.06–1.07× at 40 (Mixtral 160): so kAuto takes
  // them from a mean of kQuantTmaSmallMeanBatch = 14, and the grouped path up to kQuantTmaSmallMaxMeanBatch.
  // Qwen1.5's shared chunks at 512 tokens (mean 34; 16 units per chunk) took 1.09–1.15× the two-block
  // kernel's time while 256 took 0.80–0.86×: with shared chunks, up to kQuantTmaSmallSharedTokens.
  // clang-format off
  static constexpr DecodeRow kQuantDecodeRows[] = {
      // slots ≤  F from  F to     batch ≤ tile warps unroll prefetch stages: int8 int4 down: int8 int4
      {2,         8192,   1 << 30, 8,      8,   8,    1,     128,             4,   2,      0,   0},
      {8,         8192,   1 << 30, 12,     8,   4,    1,     128,             4,   2,      0,   0},
      {4,         0,      1 << 30, 12,     8,   4,    1,     128,             4,   0,      0,   6},
      {8,         0,      1024,    12,     8,   4,    1,     128,             4,   0,      0,   6},
      {8,         0,      1 << 30, 12,     8,   4,    1,     128,             4,   0,      0,   0},
      {64,        8192,   1 << 30, 12,     8,   4,    1,     128,             3,   2,      0,   0},
      {16,        0,      1024,    12,     8,   4,    1,     128,             3,   0,      0,   0},
      {64,        0,      1024,    12,     8,   4,    1,     128,             3,   0,      0,   2},
      {64,        0,      1 << 30, 12,     8,   4,    1,     128,             3,   0,      0,   0},
      {1LL << 40, 0,      8191,    32,     8,   2,    1,     128,             0,   0,      0,   0, DecodeRow::Only::kInt4},
      {1LL << 40, 0,      1024,    12,     8,   4,    1,     128,             2,   0,      2,   2},
      {1LL << 40, 0,      1 << 30, 12,     8,   4,    1,     128,             2,   0,      0,   0},
      {1LL << 40, 0,      1 << 30, 32,     16,  4,    1,     128,             2,   0,      0,   0},
  };
  // clang-format on
  // The decode tiles select() and select_quantized() can name (their rows' and kFallbackTile): what PagedMoe
  // instantiates by default (kernels/moe/paged_moe.cuh builds its tile types from these lists).
  static constexpr auto kDecodeTiles = config_detail::tiles_of(kDecodeRows, kFallbackTile);
  static constexpr auto kQuantDecodeTiles = config_detail::tiles_of(kQuantDecodeRows, kFallbackTile);

  static constexpr MoeConfig select(const MoeShape& s, MoePath requested) {
    MoePath path = requested;
    if (path == MoePath::kAuto)
      path = mean_batch(s) < kDecodeMeanBatch ? MoePath::kDecode : MoePath::kGrouped;
    if (path != MoePath::kDecode) {
      MoeConfig c{path, kGroupedTile, 4, 1};
      c.chunk_spread = chunk_spread_of(s);
      if (path == MoePath::kGrouped && config_detail::fits(mean_batch(s), kSmallGroupedTile)) {
        c.tile_tokens = kSmallGroupedTile;  // the sm_90 kernel's (run() takes 128 on other devices)
        c.small_deep = s.intermediate >= kDeepSmallIntermediate && mean_batch(s) >= kDeepSmallMeanBatch;
      } else if (path == MoePath::kGrouped && takes_tma_rows(s))
        c.grouped_rows = kTmaRows;  // the TMA kernel (PagedMoe::config falls back to 128 where it cannot run)
      return c;
    }
    for (const DecodeRow& r : kDecodeRows)  // bf16 tiles split K over their warps in 32-value steps
      if (matches(r, s) && s.hidden % (32 * r.warps) == 0 && s.intermediate % (32 * r.warps) == 0) {
        MoeConfig c{path, r.tile_tokens, r.warps, r.unroll, r.prefetch};
        c.decode_preload = c.tile_tokens == 8 && preload_bytes(s) <= kPreloadBytes;
        c.decode_splitk = takes_splitk(s);
        return c;
      }
    return fallback(path);
  }

  // The split-K decode (MoeConfig::decode_splitk) at one token wherever it can run (H a multiple of 256, at
  // most 32 slots): 0.963-0.968x / 0.973-0.975x the decode tiles' layer time on Qwen3-30B-A3B and
  // Qwen1.5-MoE's routed experts on an H100, 1.02-1.17x where its clusters need two or more waves (Qwen1.5
  // with its shared chunks, Mixtral), which PagedMoe::decode_splits turns away (docs/results/
  // paged_moe_h200.md, "Split-K decode at one token"); 1.06-2.3x at 2-3 tokens, where it reads an expert once
  // per slot.
  static constexpr int kSplitkHiddenMultiple = 256;  // splitk::kStep, a warp's loads along H
  static constexpr int kSplitkMaxSlots = 32;         // splitk::kMaxSlots, the combine block's rows
  static constexpr bool takes_splitk(const MoeShape& s) {
    return s.num_tokens == 1 && s.hidden % kSplitkHiddenMultiple == 0 &&
           s.top_k + s.num_shared_chunks <= kSplitkMaxSlots;
  }
  // The split-K kernel's forms for experts of `bits` bits per weight (16: bf16, 8, 4), in order (a
  // configuration may name its own: PagedMoe asks Config::splitk_shapes where it has one).
  //  - bf16: 128 features with warp pairs splitting H at 3 blocks per SM (2 before b30b08a: 62 clusters at
  //    once on an H100; 92 since on an H200), where the call has at least 32 such clusters (a
  //    block per SM, about); else 64 features on 4 warps. Against 64 on 4 warps, on an H100: Qwen3-30B-A3B
  //    (48 clusters of 128) 0.953x, Qwen1.5-MoE's routed experts (44) 0.950x, Qwen3-Next (44) 0.976x, the
  //    paged views a further 1-1.5% faster; on an H200 0.925x, 0.936x, 0.972x
  //    (docs/results/paged_moe_h200.md, "On an H200 at b30b08a"); Qwen's routing on tiny experts (8 clusters:
  //    the layer a chain of latencies) 1.130x, hence min_clusters. At 3 blocks per SM Qwen1.5-MoE with its
  //    shared chunks (88 clusters) fits too: 0.850x (H100) and 0.863x (H200) the decode tiles' time it ran
  //    before, while the shapes that fitted at 2 blocks per SM took 0.994-0.998x their time there
  //    (docs/results/paged_moe_h200.md, "Three blocks per SM"). Two W1 / W3 steps in flight per lane
  //    (SplitkShape::steps) lost 0-1.7% on both cards. 64 features in pairs: 0.982x on Qwen1.5 and 1.007x on
  //    Qwen3-Next, and Qwen3's 96 clusters do not fit the 92 the pairs hold; 128 on 4 warps 0.984-1.018x
  //    (docs/results/paged_moe_h200.md, "Split-K forms as a policy: bf16 on 128-feature warp pairs").
  //  - int4: as bf16, 128 features with warp pairs at 2 blocks per SM (128 registers) where the call has at
  //    least 32 such clusters, else 64 on 4 warps. On an H100, against 64 on 4 warps: Qwen3-30B-A3B 0.916x,
  //    Qwen1.5-MoE's routed experts 0.971x, Qwen3-Next 0.988x; the tiny shape's 8 clusters 1.075x
  //    (docs/results/quantized_h200.md, "int4's split-K on 128-feature warp pairs"); on an H200 0.926x,
  //    0.996x and 1.013x (quantized_h200.md, "The quantized layers on the H200 at b30b08a"). 128 features on
  //    4 warps took 1.08-1.18x the decode tiles' time ("Split-K decode on quantized experts"). The pairs on
  //    mma.sync (SplitkShape::mma), against the same pairs on scalar fmas, on an H100: 0.885-0.896x on
  //    Qwen3-30B-A3B, Qwen1.5-MoE's routed experts and Qwen3-Next (quantized_h200.md, "int4's split-K on
  //    mma.sync"); int8 on mma.sync lost (its bytes become bf16 through floats: 1.031-1.041x in pairs,
  //    0.995-1.016x on 4 warps), so it keeps the fmas. On the mma form, biased values (136 + v, 136·Σx
  //    taken out of D) lost 1.024-1.042x and the first loads issued before the input row 1.061-1.080x
  //    (quantized_h200.md, "Three follow-ups, measured and lost").
  //  - int8: 64 features with warp pairs splitting H (8 warps: half the products per warp, and twice the
  //    warps per SM at 80 registers, where the 4-warp int8 kernel is bound by each warp's chain of loads and
  //    conversions); then 128 features (one scale group of W2's rows, a 128-byte slice: half the clusters)
  //    with warp pairs, at 2 blocks per SM; then 128 features on 4 warps, 3 blocks per SM. On an H100,
  //    against the 4-warp 64/128 forms: Qwen1.5-MoE's routed experts (88 clusters of 64) 0.942x, Qwen3-Next
  //    0.973-0.975x; Qwen3-30B-A3B, whose 96 clusters of 64 outnumber the 92 the pairs fit, 0.914-0.926x on
  //    128 features with pairs (48 of the 62 clusters they fit); Qwen1.5-MoE with its shared chunks (88
  //    clusters of 128) lost with pairs at 3 blocks per SM (1.045-1.051x) and takes the 4-warp form, the
  //    third choice, where the pairs' 2 blocks per SM hold fewer clusters (docs/results/paged_moe_h200.md,
  //    "Warp pairs that split H", "int8's warp pairs landed"). Two W1 / W3 steps in flight in the pairs
  //    (SplitkShape::steps): 0.993x on 64 features, 1.002-1.004x on 128 (quantized_h200.md, "Three
  //    follow-ups, measured and lost").
  static constexpr SplitkShapes splitk_shapes(int bits) {
    if (bits == 8) return {SplitkShape{64, 2}, SplitkShape{128, 2}, SplitkShape{128, 1}};
    if (bits == 4) return {SplitkShape{128, 2, 32, 0, true}, SplitkShape{64, 1}, SplitkShape{}};
    return {SplitkShape{128, 2, 32}, SplitkShape{64, 1}, SplitkShape{}};  // bf16
  }

  // The W2 rows the down blocks of an 8-token decode call preload (MoeConfig::decode_preload) where no expert
  // has more than 8 tokens (as on the 8-token rows): whole_batch_tiles × H rows at decode::preload_pitch.
  static constexpr long long preload_bytes(const MoeShape& s) {
    return whole_batch_tiles(s) * s.hidden * decode::preload_pitch(s.intermediate);
  }

  // The configuration for quantized experts of `bits` (PagedMoe<..., Int8|Int4>): kAuto picks the path by
  // kQuantDecodeTile and kQuantSharedDecodeTokens; on the decode path the first row of kQuantDecodeRows the
  // shape satisfies (staged for int8 where the row says so), else 32-token tiles. Both ask for the split-K
  // decode at one token (takes_splitk): int8 0.85-0.98x the decode tiles' layer time on the Qwen shapes on an
  // H100 (docs/results/quantized_h200.md, "Split-K decode on quantized experts"); int4 on its 128-feature
  // warp pairs 0.905-0.978x (on 64 features on 4 warps, its only form before, 0.91-1.07x: Qwen3-30B-A3B
  // lost) (quantized_h200.md, "int4's split-K on 128-feature warp pairs").
  static constexpr MoeConfig select_quantized(const MoeShape& s, MoePath requested, quant::Bits bits) {
    MoePath path = requested;
    const bool small_units = takes_small_tma_units(s);
    if (path == MoePath::kAuto) {
      const bool shared_fits = s.num_shared_chunks == 0 || s.num_tokens <= kQuantSharedDecodeTokens;
      const bool decode = config_detail::fits(mean_batch(s), kQuantDecodeTile) && shared_fits &&
                          !(small_units && mean_batch(s) >= kQuantTmaSmallMeanBatch);
      path = decode ? MoePath::kDecode : MoePath::kGrouped;
    }
    if (path != MoePath::kDecode) {
      MoeConfig c{path, kGroupedTile, 4, 1};
      c.chunk_spread = chunk_spread_of(s, true);
      if (path == MoePath::kGrouped && takes_tma_rows(s)) {
        c.grouped_rows = kTmaRows;  // the TMA kernel, weights dequantised in registers (bf16's rule)
      } else if (path == MoePath::kGrouped && small_units) {
        c.grouped_rows = kTmaRows;  // the same kernel on 32-token units
        c.tile_tokens = kQuantTmaSmallTile;
      }
      return c;
    }
    const bool int8 = bits == quant::Bits::kInt8;
    for (const DecodeRow& r : kQuantDecodeRows)
      if (matches(r, s) && r.only != (int8 ? DecodeRow::Only::kInt4 : DecodeRow::Only::kInt8)) {
        MoeConfig c{MoePath::kDecode,
                    r.tile_tokens,
                    r.warps,
                    r.unroll,
                    r.prefetch,
                    kGroupedTile,
                    int8 ? r.int8_stages : r.int4_stages};
        c.decode_down_warps = int8 ? r.int8_down_warps : r.int4_down_warps;
        c.decode_splitk = takes_splitk(s);
        return c;
      }
    return fallback(MoePath::kDecode);
  }

  // The grouped GEMMs' order of the shared chunks' units (MoeConfig::chunk_spread, moe/unit_order.hpp):
  // spread over the first kChunkSpread times their count of a call's units from kChunkSpreadMinTokens tokens
  // to kChunkSpreadMaxTokens on bf16 experts and to kQuantChunkSpreadMaxTokens on quantized ones, elsewhere
  // first (the tile list's order). A chunk takes every token: from a few tiles per chunk on, its units read
  // their weights from the L2 and keep the tensor cores busy while the routed experts' units wait on DRAM;
  // run first, they held every SM at once with DRAM idle. Where the routed units are bound by the tensor
  // cores too (bf16 at 4096 tokens; quantized experts, whose units also dequantise, from ~768) there is
  // little to overlap. Measured on an H100 on Qwen1.5-MoE with its 4 chunks, 3 processes with the orders side
  // by side, on up to three leases (docs/results/paged_moe_h200.md, "Shared chunks spread among the routed
  // experts"), spread over twice the chunks' units against chunks first: bf16 0.995-0.996x at 192 tokens,
  // 0.979x at 256, 0.906x at 512, 0.952-0.953x at 768, 0.939-0.941x at 1024, 0.947-0.950x at 2048, but
  // 1.002-1.004x at 16-128 (a chunk in one or two 64-token tiles); int8 0.982-0.990x at 192, 0.964-0.977x at
  // 256, 0.971-0.972x at 512; int4 0.996-0.997x at 192, 1.001-1.003x at 256, 0.989-0.990x at 512. Where the
  // units are bound by the tensor cores (bf16 at 4096: 1.022-1.045x; int8 and int4 at 768-4096: 0.980-1.055x)
  // two measurements of one configuration differ as much (1.029 ± 0.021x, 0.981 ± 0.005x), so the chunks
  // stay first there. Spread over 4x or the whole call gained no more at 256-1024 (bf16 1.052x, 1.065x at
  // 16384).
  static constexpr int kChunkSpread = 2;
  static constexpr int kChunkSpreadMinTokens = 192;
  static constexpr int kChunkSpreadMaxTokens = 2048;
  static constexpr int kQuantChunkSpreadMaxTokens = 512;
  static constexpr int chunk_spread_of(const MoeShape& s, bool quantized = false) {
    const int hi = quantized ? kQuantChunkSpreadMaxTokens : kChunkSpreadMaxTokens;
    return s.num_shared_chunks > 0 && s.num_tokens >= kChunkSpreadMinTokens && s.num_tokens <= hi
               ? kChunkSpread
               : 1;
  }

 private:
  static constexpr MoeConfig fallback(MoePath path) {
    return {path, kFallbackTile.tile_tokens, kFallbackTile.warps, kFallbackTile.unroll,
            kFallbackTile.prefetch};
  }
  // A uniform router's mean batch per routed expert.
  static constexpr double mean_batch(const MoeShape& s) {
    return s.num_experts > 0 ? static_cast<double>(s.num_tokens) * s.top_k / s.num_experts : 0.0;
  }
  // The grouped GEMM's rule for the TMA kernel's 256-row blocks (bf16 and quantized experts alike): the
  // expected largest routed batch passes the small tiles' 64 tokens and H is a multiple of 256.
  static constexpr bool takes_tma_rows(const MoeShape& s) {
    return !config_detail::fits(mean_batch(s), kSmallGroupedTile) && s.hidden % kTmaRows == 0;
  }
  // Quantized experts' grouped path on the TMA kernel's 32-token units: a mean routed batch up to
  // kQuantTmaSmallMaxMeanBatch (below the 128-token units' rule: checked after the class), shared chunks
  // (every token, T / 32 units each re-reading the chunk) up to kQuantTmaSmallSharedTokens tokens, H a
  // multiple of 256.
  static constexpr bool takes_small_tma_units(const MoeShape& s) {
    return s.hidden % kTmaRows == 0 && mean_batch(s) <= kQuantTmaSmallMaxMeanBatch &&
           (s.num_shared_chunks == 0 || s.num_tokens <= kQuantTmaSmallSharedTokens);
  }
  // The shape conditions of a decode row: routed slots, the experts' width, the expected largest batch.
  static constexpr bool matches(const DecodeRow& r, const MoeShape& s) {
    const long long slots = static_cast<long long>(s.num_tokens) * s.top_k;
    return slots <= r.max_routed_slots && s.intermediate >= r.min_intermediate &&
           s.intermediate <= r.max_intermediate && config_detail::fits(mean_batch(s), r.max_expected_batch);
  }
};
static_assert(moe_config<DefaultMoeConfig>);
// The 32-token units end below the 128-token units' rule (takes_tma_rows): no shape meets both.
static_assert(config_detail::fits(DefaultMoeConfig::kQuantTmaSmallMaxMeanBatch,
                                  DefaultMoeConfig::kSmallGroupedTile));
// A configuration that chooses its own tiles for quantized experts (PagedMoe asks it instead of select).
template <class C>
concept quantized_moe_config = requires(const MoeShape& s, MoePath requested, quant::Bits bits) {
  { C::select_quantized(s, requested, bits) } -> std::same_as<MoeConfig>;
};
static_assert(quantized_moe_config<DefaultMoeConfig>);
// A configuration that names the split-K kernel's forms (PagedMoe asks DefaultMoeConfig otherwise).
template <class C>
concept splitk_shapes_config = requires(int bits) {
  { C::splitk_shapes(bits) } -> std::same_as<SplitkShapes>;
};
static_assert(splitk_shapes_config<DefaultMoeConfig>);
// The form a split-K call takes: the index of the first of `forms` whose features divide F, that serves H
// (min_hidden(i) <= H: splitk::min_hidden), whose clusters T·(k+m)·F/features number at least its
// min_clusters and at most capacity(i) (the clusters the device holds at once, asked only of a form that
// passes the rest), -1 where none does (the decode tiles run). PagedMoe::splitk_choice passes the kernel's
// min_hidden and cudaOccupancyMaxActiveClusters.
template <class MinHidden, class Capacity>
constexpr int splitk_form_for(const SplitkShapes& forms, const MoeShape& s, MinHidden&& min_hidden,
                              Capacity&& capacity) {
  for (std::size_t i = 0; i < forms.size(); ++i) {
    const int features = forms[i].features;
    if (features == 0 || s.intermediate % features != 0) continue;
    if (s.hidden < min_hidden(static_cast<int>(i))) continue;
    const long long need =
        static_cast<long long>(s.num_tokens) * s.slots_per_token() * (s.intermediate / features);
    if (need < forms[i].min_clusters) continue;
    if (need <= capacity(static_cast<int>(i))) return static_cast<int>(i);
  }
  return -1;
}

// The forms `C` names for experts of `bits` bits, or DefaultMoeConfig's.
template <class C>
constexpr SplitkShapes splitk_shapes_of(int bits) {
  if constexpr (splitk_shapes_config<C>)
    return C::splitk_shapes(bits);
  else
    return DefaultMoeConfig::splitk_shapes(bits);
}
// Quantized examples (T, H, F, E, k, m): Qwen1.5 and Qwen3 on 8-token tiles (4 warps, int4 on 2 past 64
// routed slots), Mixtral at 1 token with 8 warps, at 33 and 64 tokens on 16-token tiles; many tokens per
// expert: the grouped GEMM (or 32-token decode tiles when asked for the decode path).
static_assert(DefaultMoeConfig::select_quantized({16, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt4) == MoeConfig{MoePath::kDecode, 8, 4, 1});
static_assert(DefaultMoeConfig::select_quantized({16, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt8) ==
              MoeConfig{MoePath::kDecode, 8, 4, 1, 128, 128, 2, false, false, false, 2});
// int4 on experts below F = 8192 past 64 routed slots: 8-token tiles on 2 warps, both stages, up to the
// decode limit (Qwen1.5 from 17 tokens, Qwen3 from 9; 16-token tiles no more); int8 keeps the shared rows.
static_assert(DefaultMoeConfig::select_quantized({64, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt4) == MoeConfig{MoePath::kDecode, 8, 2, 1});
static_assert(DefaultMoeConfig::select_quantized({64, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4) == MoeConfig{MoePath::kDecode, 8, 2, 1});
static_assert(DefaultMoeConfig::select_quantized({160, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4) == MoeConfig{MoePath::kDecode, 8, 2, 1});
static_assert(DefaultMoeConfig::select_quantized({128, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt4) == MoeConfig{MoePath::kDecode, 8, 2, 1});
static_assert(DefaultMoeConfig::select_quantized({160, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt8) ==
              MoeConfig{MoePath::kDecode, 16, 4, 1, 128, 128, 2});
// kAuto: the TMA kernel's 32-token units from a mean routed batch of 14 up to 36 (Qwen3 at 256 and 512
// tokens, Qwen1.5 with its chunks at 256, Mixtral at 64 and 128), and where shared chunks end the decode
// path (Qwen1.5 with its chunks past 128 tokens) up to 256 tokens; the decode tiles below (Mixtral at 48,
// mean 12; at 33 below), the two-block kernel from 36 (Mixtral 160, mean 40; Qwen1.5 with its chunks
// at 512), the 128-token units past the bf16 rule (Mixtral 256).
static_assert([] {
  struct Example {
    MoeShape shape;  // T, H, F, E, k, m
    quant::Bits bits;
    MoeConfig expected;
  };
  constexpr MoeConfig kUnits32{MoePath::kGrouped, 32, 4, 1, 128, 256};
  constexpr auto spread = [](MoeConfig c) {  // shared chunks spread at 192-512 tokens
    c.chunk_spread = DefaultMoeConfig::kChunkSpread;
    return c;
  };
  constexpr Example kExamples[] = {
      {{256, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, kUnits32},
      {{512, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, kUnits32},
      {{256, 2048, 1408, 60, 4, 4}, quant::Bits::kInt8, spread(kUnits32)},
      {{160, 2048, 1408, 60, 4, 4}, quant::Bits::kInt4, kUnits32},
      {{64, 4096, 14336, 8, 2, 0}, quant::Bits::kInt8, kUnits32},
      {{128, 4096, 14336, 8, 2, 0}, quant::Bits::kInt4, kUnits32},
      {{48, 4096, 14336, 8, 2, 0}, quant::Bits::kInt8, {MoePath::kDecode, 16, 4, 1, 128, 128, 2}},
      {{160, 4096, 14336, 8, 2, 0}, quant::Bits::kInt8, {MoePath::kGrouped, 128, 4, 1}},
      {{512, 2048, 1408, 60, 4, 4}, quant::Bits::kInt4, spread({MoePath::kGrouped, 128, 4, 1})},
      {{256, 4096, 14336, 8, 2, 0}, quant::Bits::kInt4, {MoePath::kGrouped, 128, 4, 1, 128, 256}},
  };
  for (const Example& e : kExamples)
    if (DefaultMoeConfig::select_quantized(e.shape, MoePath::kAuto, e.bits) != e.expected) return false;
  return true;
}());
// The down stage on its own warps (decode_down_warps): int4 on 6 at up to 4 routed slots, 8 on F <= 1024
// (Qwen at 1 token), int4 and int8 on 2 past 16 and 64 slots on experts of F <= 1024 (Qwen3 from 3 and 16
// tokens); none on Qwen1.5's F = 1408 past 4 slots, Qwen3 at 2 tokens, Mixtral, or 16-token tiles.
static_assert([] {
  struct Example {
    MoeShape shape;  // T, H, F, E, k, m
    quant::Bits bits;
    int down_warps;
  };
  constexpr Example kDown[] = {
      {{1, 2048, 1408, 60, 4, 4}, quant::Bits::kInt4, 6},
      {{1, 2048, 1408, 60, 4, 4}, quant::Bits::kInt8, 0},
      {{1, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, 6},
      {{3, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, 2},
      {{2, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, 0},
      {{2, 2048, 1408, 60, 4, 4}, quant::Bits::kInt4, 0},
      {{3, 2048, 768, 128, 8, 0}, quant::Bits::kInt8, 0},
      {{16, 2048, 768, 128, 8, 0}, quant::Bits::kInt8, 2},
      {{64, 2048, 768, 128, 8, 0}, quant::Bits::kInt8, 2},
      {{16, 2048, 1408, 60, 4, 4}, quant::Bits::kInt4, 0},
      {{1, 4096, 14336, 8, 2, 0}, quant::Bits::kInt4, 0},
      {{160, 2048, 768, 128, 8, 0}, quant::Bits::kInt4, 0},
  };
  for (const Example& e : kDown) {
    const MoeConfig c = DefaultMoeConfig::select_quantized(e.shape, MoePath::kAuto, e.bits);
    if (c.decode_down_warps != e.down_warps) return false;
    if (!DefaultMoeConfig::kQuantDecodeTiles.contains(decode_tile_of(down_tile_config(c)))) return false;
  }
  return true;
}());
static_assert([] {
  MoeConfig c =
      DefaultMoeConfig::select_quantized({1, 4096, 14336, 8, 2, 0}, MoePath::kAuto, quant::Bits::kInt4);
  const bool splitk = c.decode_splitk;  // asked for at one token; Mixtral's 224 clusters of 128 fit no device
  c.decode_splitk = false;              // at once, so this tile runs
  return splitk && c == MoeConfig{MoePath::kDecode, 8, 8, 1, 128, 128, 2};
}());
static_assert(DefaultMoeConfig::select_quantized({16, 4096, 14336, 8, 2, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kDecode, 8, 4, 1, 128, 128, 2});
static_assert(DefaultMoeConfig::select_quantized({33, 4096, 14336, 8, 2, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kDecode, 16, 4, 1});
static_assert(DefaultMoeConfig::select_quantized({4096, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kGrouped, 128, 4, 1, 128, 256});
// The quantized grouped GEMM takes bf16's rule for the TMA kernel's 128-token units (256 rows where the
// mean routed batch passes 64 tokens and H % 256 == 0: Mixtral at 256, mean 64, above), its 32-token units
// up to a mean of 36 (kAuto from 14); the two-block kernel where H is no multiple of 256.
static_assert(DefaultMoeConfig::select_quantized({256, 2176, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt8)
                  .grouped_rows == 128);
// The last decoded and the first grouped sizes (int4): Qwen3 160 / 256 tokens, Mixtral 33 / 64, Qwen1.5
// with its shared chunks 128 / 256 (shared chunks decode up to 128 tokens), routed-only 160 / 256.
static_assert([] {
  struct Crossing {
    MoeShape shape;
    MoePath path;
  };
  constexpr Crossing kCrossings[] = {
      {{160, 2048, 768, 128, 8, 0}, MoePath::kDecode}, {{256, 2048, 768, 128, 8, 0}, MoePath::kGrouped},
      {{33, 4096, 14336, 8, 2, 0}, MoePath::kDecode},  {{64, 4096, 14336, 8, 2, 0}, MoePath::kGrouped},
      {{128, 2048, 1408, 60, 4, 4}, MoePath::kDecode}, {{256, 2048, 1408, 60, 4, 4}, MoePath::kGrouped},
      {{160, 2048, 1408, 60, 4, 0}, MoePath::kDecode}, {{256, 2048, 1408, 60, 4, 0}, MoePath::kGrouped},
  };
  for (const Crossing& c : kCrossings)
    if (DefaultMoeConfig::select_quantized(c.shape, MoePath::kAuto, quant::Bits::kInt4).path != c.path)
      return false;
  return true;
}());
static_assert(DefaultMoeConfig::select_quantized({4096, 2048, 768, 128, 8, 0}, MoePath::kDecode,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kDecode, 32, 4, 1});
static_assert(DefaultMoeConfig::select_quantized({1, 2048, 768, 128, 8, 0}, MoePath::kGrouped,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kGrouped, 32, 4, 1, 128, 256});
static_assert(DefaultMoeConfig::select_quantized({1, 2176, 768, 128, 8, 0}, MoePath::kGrouped,
                                                 quant::Bits::kInt4) ==
              MoeConfig{MoePath::kGrouped, 128, 4, 1});
// int8 layers are staged on every decode row: 4 k-steps in flight up to 8 routed slots (Mixtral at 1 and 3
// tokens, Qwen3 at 1), 3 up to 64 (Mixtral at 16, Qwen3 at 8), 2 beyond (Qwen3 at 16, Mixtral at 33); int4
// layers only on the huge experts' 8-token rows (2 stages, Mixtral at 1–16 tokens above).
static_assert([] {
  struct Example {
    MoeShape shape;  // T, H, F, E, k, m
    MoeConfig int8;
  };
  constexpr Example kStaged[] = {
      {{1, 4096, 14336, 8, 2, 0}, {MoePath::kDecode, 8, 8, 1, 128, 128, 4}},
      {{3, 4096, 14336, 8, 2, 0}, {MoePath::kDecode, 8, 4, 1, 128, 128, 4}},
      {{1, 2048, 768, 128, 8, 0}, {MoePath::kDecode, 8, 4, 1, 128, 128, 4}},
      {{16, 4096, 14336, 8, 2, 0}, {MoePath::kDecode, 8, 4, 1, 128, 128, 3}},
      {{8, 2048, 768, 128, 8, 0}, {MoePath::kDecode, 8, 4, 1, 128, 128, 3}},
      {{16, 2048, 768, 128, 8, 0}, {MoePath::kDecode, 8, 4, 1, 128, 128, 2, false, false, false, 2}},
      {{33, 4096, 14336, 8, 2, 0}, {MoePath::kDecode, 16, 4, 1, 128, 128, 2}},
  };
  for (const Example& e : kStaged) {
    MoeConfig c = DefaultMoeConfig::select_quantized(e.shape, MoePath::kAuto, quant::Bits::kInt8);
    c.decode_splitk = false;  // the tile the call runs where the split-K clusters do not fit (below)
    if (c != e.int8) return false;
  }
  return true;
}());
// The split-K decode on quantized experts: int8 and int4 at one token (takes_splitk), never at 2 tokens.
static_assert(DefaultMoeConfig::select_quantized({1, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt8)
                  .decode_splitk);
static_assert(DefaultMoeConfig::select_quantized({1, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt8)
                  .decode_splitk);
static_assert(DefaultMoeConfig::select_quantized({1, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4)
                  .decode_splitk);
static_assert(!DefaultMoeConfig::select_quantized({2, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                  quant::Bits::kInt8)
                   .decode_splitk);
static_assert([] {
  for (const auto& r : DefaultMoeConfig::kQuantDecodeRows) {
    // At most two tiles per expected batch; four on the int4 row (8-token tiles on experts below F = 8192),
    // measured faster than 16-token tiles though it reads an expert's weights once per 8 tokens.
    const bool int4_only = r.only == DefaultMoeConfig::DecodeRow::Only::kInt4;
    if (r.max_expected_batch > (int4_only ? 4 : 2) * r.tile_tokens) return false;
    const int staged[] = {r.int8_stages, r.int4_stages};
    for (const int stages : staged)
      if (stages != 0 && (stages < 2 || r.unroll != 1)) return false;  // decode::Tile's rule
  }
  for (const auto& r : DefaultMoeConfig::kDecodeRows) {
    if (r.int8_stages != 0 || r.int4_stages != 0) return false;           // bf16 tiles are never staged
    if (r.only != DefaultMoeConfig::DecodeRow::Only::kAny) return false;  // nor one precision's (select)
  }
  return true;
}());
// Examples (T, H, F, E, k, m).
static_assert(DefaultMoeConfig::select({1, 2048, 768, 128, 8, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 4, 2, 128, 128, 0, false, false, true, 0, true});
// The split-K decode at one token only (PagedMoe turns it away where its clusters need two waves).
static_assert(DefaultMoeConfig::select({1, 2048, 1408, 60, 4, 4}, MoePath::kAuto).decode_splitk);
static_assert(DefaultMoeConfig::select({1, 4096, 14336, 8, 2, 0}, MoePath::kAuto).decode_splitk);
static_assert(!DefaultMoeConfig::select({2, 2048, 768, 128, 8, 0}, MoePath::kAuto).decode_splitk);
static_assert(!DefaultMoeConfig::select({1, 2176, 768, 128, 8, 0}, MoePath::kAuto).decode_splitk);
static_assert(!DefaultMoeConfig::select({1, 2048, 768, 128, 8, 0}, MoePath::kGrouped).decode_splitk);
// W2 preloaded where every down block's rows fit at once: Qwen3 and Qwen1.5's routed experts at 1 token
// (25 and 23 MB); not with Qwen1.5's shared chunks (46 MB), from 2 tokens on Qwen3 (51 MB), on Mixtral
// (28 KB rows), nor off the 8-token tiles.
static_assert(DefaultMoeConfig::select({1, 2048, 1408, 60, 4, 0}, MoePath::kAuto).decode_preload);
static_assert(!DefaultMoeConfig::select({1, 2048, 1408, 60, 4, 4}, MoePath::kAuto).decode_preload);
static_assert(!DefaultMoeConfig::select({2, 2048, 768, 128, 8, 0}, MoePath::kAuto).decode_preload);
static_assert(!DefaultMoeConfig::select({1, 4096, 14336, 8, 2, 0}, MoePath::kAuto).decode_preload);
static_assert(!DefaultMoeConfig::select({1, 2048, 768, 128, 8, 0}, MoePath::kGrouped).decode_preload);
static_assert(!DefaultMoeConfig::select_quantized({1, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                  quant::Bits::kInt8)
                   .decode_preload);
static_assert(DefaultMoeConfig::select({3, 2048, 1408, 60, 4, 4}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 4, 2});
static_assert(DefaultMoeConfig::select({8, 2048, 768, 128, 8, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 32, 4, 1});
static_assert(DefaultMoeConfig::select({8, 2048, 1408, 60, 4, 4}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 4, 2});
static_assert(DefaultMoeConfig::select({9, 2048, 1408, 60, 4, 4}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 32, 4, 1});
static_assert(DefaultMoeConfig::select({14, 2048, 1408, 60, 4, 4}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 32, 4, 1});
static_assert(DefaultMoeConfig::select({15, 2048, 768, 128, 8, 0}, MoePath::kAuto).path == MoePath::kDecode);
static_assert(DefaultMoeConfig::select({16, 2048, 768, 128, 8, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kGrouped, 64, 4, 1});
static_assert(DefaultMoeConfig::select({14, 2048, 1408, 60, 4, 4}, MoePath::kAuto).path == MoePath::kDecode);
static_assert(DefaultMoeConfig::select({16, 2048, 1408, 60, 4, 4}, MoePath::kAuto).path == MoePath::kGrouped);
static_assert(DefaultMoeConfig::select({1, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 8, 2, 128, 128, 0, false, false, false, 0, true});
static_assert(DefaultMoeConfig::select({3, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kDecode, 8, 8, 2});
static_assert(DefaultMoeConfig::select({4, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kGrouped, 64, 4, 1});
// 64-token grouped tiles while the expected largest batch fits them: Qwen3 up to 512 tokens (mean 32),
// Mixtral up to 128; 128-token tiles from a mean of 64 (Mixtral 256, Qwen3 1024), and on the mma.sync path.
static_assert(DefaultMoeConfig::select({512, 2048, 768, 128, 8, 0}, MoePath::kAuto).tile_tokens == 64);
static_assert(DefaultMoeConfig::select({1024, 2048, 768, 128, 8, 0}, MoePath::kAuto).tile_tokens == 128);
static_assert(DefaultMoeConfig::select({128, 4096, 14336, 8, 2, 0}, MoePath::kAuto).tile_tokens == 64);
static_assert(DefaultMoeConfig::select({16, 2048, 768, 128, 8, 0}, MoePath::kGroupedMma).tile_tokens == 128);
// Huge experts' 64-token tiles on 8 stages from a mean batch of 2 (Mixtral at 8–128 tokens), the rest on
// the type's (4).
static_assert(DefaultMoeConfig::select({16, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kGrouped, 64, 4, 1, 128, 128, 0, false, true});
static_assert(DefaultMoeConfig::select({128, 4096, 14336, 8, 2, 0}, MoePath::kAuto).small_deep);
static_assert(!DefaultMoeConfig::select({256, 4096, 14336, 8, 2, 0}, MoePath::kAuto).small_deep);
static_assert(!DefaultMoeConfig::select({7, 4096, 14336, 8, 2, 0}, MoePath::kAuto).small_deep);
static_assert(DefaultMoeConfig::select({8, 4096, 14336, 8, 2, 0}, MoePath::kAuto).small_deep);
static_assert(!DefaultMoeConfig::select({256, 2048, 1408, 60, 4, 4}, MoePath::kAuto).small_deep);
static_assert(!DefaultMoeConfig::select({16, 4096, 14336, 8, 2, 0}, MoePath::kGroupedMma).small_deep);
// The TMA kernel (256-row blocks) wherever the tiles hold 128 tokens on kGrouped: Mixtral from 256 tokens,
// Qwen from 1024; never on the mma.sync path, nor where H is not a multiple of 256.
static_assert(DefaultMoeConfig::select({256, 4096, 14336, 8, 2, 0}, MoePath::kAuto) ==
              MoeConfig{MoePath::kGrouped, 128, 4, 1, 128, 256});
static_assert(DefaultMoeConfig::select({1024, 2048, 768, 128, 8, 0}, MoePath::kAuto).grouped_rows == 256);
static_assert(DefaultMoeConfig::select({16384, 2048, 1408, 60, 4, 4}, MoePath::kAuto).grouped_rows == 256);
static_assert(DefaultMoeConfig::select({512, 2048, 768, 128, 8, 0}, MoePath::kAuto).grouped_rows == 128);
static_assert(DefaultMoeConfig::select({4096, 2048, 768, 128, 8, 0}, MoePath::kGroupedMma).grouped_rows ==
              128);
static_assert(DefaultMoeConfig::select({4096, 2176, 768, 128, 8, 0}, MoePath::kAuto).grouped_rows == 128);
static_assert(DefaultMoeConfig::select({4096, 2048, 1408, 60, 4, 4}, MoePath::kDecode).tile_tokens == 32);
// Shared chunks' units spread over twice their count at 192-2048 tokens on bf16 experts and 192-512 on
// quantized ones (Qwen1.5 with its chunks), first below and above, and in layers without chunks.
static_assert(DefaultMoeConfig::select({192, 2048, 1408, 60, 4, 4}, MoePath::kAuto).chunk_spread == 2);
static_assert(DefaultMoeConfig::select({2048, 2048, 1408, 60, 4, 4}, MoePath::kAuto).chunk_spread == 2);
static_assert(DefaultMoeConfig::select({191, 2048, 1408, 60, 4, 4}, MoePath::kAuto).chunk_spread == 1);
static_assert(DefaultMoeConfig::select({2049, 2048, 1408, 60, 4, 4}, MoePath::kAuto).chunk_spread == 1);
static_assert(DefaultMoeConfig::select({512, 2048, 768, 128, 8, 0}, MoePath::kAuto).chunk_spread == 1);
static_assert(DefaultMoeConfig::select_quantized({512, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt4)
                  .chunk_spread == 2);
static_assert(DefaultMoeConfig::select_quantized({1024, 2048, 1408, 60, 4, 4}, MoePath::kAuto,
                                                 quant::Bits::kInt8)
                  .chunk_spread == 1);
// Every row names a tile that holds its largest expected batch.
static_assert([] {
  for (const auto& r : DefaultMoeConfig::kDecodeRows)
    if (r.max_expected_batch > r.tile_tokens) return false;
  return true;
}());

// A quantized grouped choice moved onto a bf16 copy (MoeConfig::grouped_dequant: the routed experts
// dequantised into the workspace, then the bf16 TMA grouped GEMM's 256-row blocks on 128-token tiles), where
// H allows those blocks; any other choice unchanged.
constexpr MoeConfig with_grouped_dequant(MoeConfig c, const MoeShape& s) {
  if (c.path == MoePath::kGrouped && s.hidden % 256 == 0) {
    c.grouped_dequant = true;
    c.grouped_rows = 256;
    c.tile_tokens = 128;
  }
  return c;
}

// Opt-in: DefaultMoeConfig with quantized experts' largest prefills (kDequantMinTokens tokens and more) on a
// bf16 copy. It costs workspace: PagedMoe's holds the copy of all E + m experts, (E+m)·3·F·H bf16
// (Qwen1.5-MoE with its shared chunks 1.1 GB, Qwen3-30B-A3B 1.2 GB, Mixtral-8x7B 2.8 GB), which is why the
// default table does not choose it. On the H200 at 16384 tokens (docs/results/quantized_h200.md, "Prefill on
// a dequantised bf16 copy", 3 processes) it takes 0.85–0.94× the in-register TMA kernel's time for int8
// (Qwen1.5, Qwen3, Mixtral), 0.93× for int4 on Qwen1.5 and Mixtral, and loses on Qwen3 int4 (1.06×); at 4096
// tokens and below it loses but for Mixtral int4 at 4096 (0.98×): the copy's bytes (reading the packed
// experts, writing 2 bytes a weight) outweigh the dequantisation it saves until each expert's weights serve
// many token tiles.
struct DequantPrefillMoeConfig : DefaultMoeConfig {
  static constexpr bool kDequantWorkspace = true;
  static constexpr int kDequantMinTokens = 16384;
  static constexpr MoeConfig select_quantized(const MoeShape& s, MoePath requested, quant::Bits bits) {
    const MoeConfig c = DefaultMoeConfig::select_quantized(s, requested, bits);
    return s.num_tokens >= kDequantMinTokens ? with_grouped_dequant(c, s) : c;
  }
};
static_assert(DequantPrefillMoeConfig::select_quantized({16384, 2048, 768, 128, 8, 0}, MoePath::kAuto,
                                                        quant::Bits::kInt8) ==
              MoeConfig{MoePath::kGrouped, 128, 4, 1, 128, 256, 0, true});
static_assert(DequantPrefillMoeConfig::select_quantized({4096, 4096, 14336, 8, 2, 0}, MoePath::kAuto,
                                                        quant::Bits::kInt4) ==
              DefaultMoeConfig::select_quantized({4096, 4096, 14336, 8, 2, 0}, MoePath::kAuto,
                                                 quant::Bits::kInt4));
static_assert(!DequantPrefillMoeConfig::select_quantized({16384, 2176, 768, 128, 8, 0}, MoePath::kAuto,
                                                         quant::Bits::kInt8)
                   .grouped_dequant);  // H = 2176: no 256-row blocks

}  // namespace amoeba::kernels
