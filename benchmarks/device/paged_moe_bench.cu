// Device benchmark of PagedMoe: the same layer read through contiguous addressing and through paged views
// (each a page placement × permutation seed), interleaved in one process, CUDA-event medians of CUDA-graph
// replays (each graph = one layer call per rotating input set, so weights and inputs cycle through more than
// the 60 MB L2), plus the measured device read and copy bandwidths for the floor. Writes one JSON object;
// benchmarks/device/report.py merges several processes' files (and the PyTorch matmul rate) into the table.
// Per configuration the JSON names the path and tile the call chose and, where it took the split-K decode on
// this device, its form (`splitk`: features of F per cluster, h_split 2 for warp pairs, steps, mma; null
// otherwise); the log line then says `splitk` where it says the path.
//
//   paged_moe_bench --json out.json [--models qwen15,qwen15_shared,qwen3,mixtral] [--tokens 1,3,16,...]
//                   (also qwen2_57b, qwen3_next: shapes past 8 slots per token,
//                   tests/device/moe_device_fixture.cuh; chain_qwen3, chain_qwen15_shared: Qwen3's and
//                   Qwen1.5's routing (E, k, chunks) on experts of H 256 and F 128, whose weights take well
//                   under a microsecond to read, so that a layer call's time is about that of its chain of
//                   kernels alone: what a real shape's decode at few tokens spends besides its weight stream)
//                   [--sets 8] [--placement shuffled,adjacent] [--seed 1,2,3] [--seconds 0.1]
//                   [--router uniform|hot:E|zipf:S|balanced] [--layers 1] [--between-read MB]
//                   [--between-write MB]
// --router: how each token's k experts are drawn (tests/device/routing_draw.hpp; uniform by default, as in
// every result so far): zipf:S skews them as a trained router does (popularity ∝ 1 / rank^S), hot:E puts
// expert E in every other token, balanced gives every expert T·k / E tokens rounded down or up (no
// expert's last work tile is partly empty beyond what T·k / E leaves: at 4096 tokens each Qwen3 expert
// takes exactly two full 128-token tiles, where under uniform every expert past 256 tokens takes a third);
// --layers N: N copies of the bf16 weights (distinct memory, as a model's layers), call i of a graph reading
// copy i % N (with --sets N every call another layer's weights, as an engine step reads them; the
// quantized configurations keep one copy);
// --between-read / --between-write MB: after every layer call of a graph, one kernel reads / writes that many
// MB of other memory with plain loads and stores (the other kernels an engine step runs between its MoE
// layers, which leave other data, some of it dirty, in the L2); its time, measured alone in a graph of as
// many calls, is taken off every call's time (`between_us` in the JSON);
// --placement: where the paged views put the matrices (testing::Placement: `shuffled` scatters every matrix,
// `adjacent` shuffles whole experts but keeps W1, W3, W2 of an expert adjacent, `identity` is the contiguous
// layout through the page table);
// --seed: the page-permutation seeds, one paged view per placement and seed; --seconds: time per view per
// case; --config: configurations measured side by side, the first at every size and the one reported
// (bf16_configs() and quant_configs() list them; an unknown name is refused before anything runs):
// default; t8 / t32 / w8: one decode tile wherever it holds the expected largest batch, else the default's
// (t8w4u3, t8w4u4, t8w8u2, t8w8u4 alike: 8-token tiles with 4 or 8 warps and 3 or 4 k-steps of loads in
// flight, the more bytes in flight per block at 1–3 tokens);
// p256: the default's tile with the 256-byte L2 prefetch hint; preload: the default's choice with the down
// blocks copying their W2 rows into shared memory before gate/up ends (MoeConfig::decode_preload) on every
// 8-token tile whose block's rows fit its shared memory (the call streams where not every block's rows fit
// the device at once; at 55e4020-8032f12 it preloaded there too), nopreload: on none (the default preloads at
// 1 token on Qwen3 and Qwen1.5's routed experts); splitk: the default's choice with the split-K decode
// (MoeConfig::decode_splitk: no routing, a cluster of 4 blocks per slot and 64 or 128 features of F) asked
// for at 1–3 tokens (taken where its clusters fit the device at once), nosplitk: at none (the default asks at
// 1 token), sk-q64 / sk-p64 / sk-p128 / sk-q128 / sk-p256: split-K at one token in one form only
// (SplitkFormsConfig: 64 features on 4 warps, 64 on warp pairs, 128 on warp pairs, 128 on 4 warps, 256 on
// warp pairs), sk-p128s2: 128 on warp pairs with two W1 / W3 steps of loads in flight per lane (the kernel's
// own: one with pairs) (the default's forms are
// DefaultMoeConfig::splitk_shapes; the decode tiles where the form's clusters do not fit) (these, like t8 …
// t8w8u4, where the default decodes);
// bf16-decode / bf16-grouped: the default's choice held to one path at every size; wide / narrow: the
// default's choice with its grouped GEMM on 256 weight rows per block (the persistent TMA kernel, 128-token
// tiles) / 128 (the two-block cp.async kernel); tile128: the two-block kernel wherever the default takes
// kGrouped; small4 / small3 / small8: always on 64-token tiles, the small-batch kernel with 4 stages
// and 2 blocks per SM, 3 and 3, 8 and 1; spread1 / spread2 / spread4 / spread-all: the default's choice with
// the shared chunks' grouped units first (the tile list's order), spread over the first 2 or 4 times their
// count of each call's units, or over all of them (MoeConfig::chunk_spread; the default spreads over twice
// their count at 192-2048 tokens on bf16 experts, 192-512 on quantized ones:
// DefaultMoeConfig::chunk_spread_of) (these ten at grouped sizes only); late-w2: the
// default's choice with the down stage issuing its first W2 loads only after it waits for the gate/up kernel
// (the default issues them before in the small-batch grouped GEMM and the streaming decode tiles, int4 on
// its 2-warp row and 16-token tiles: PagedMoe::early_down), every size; int8-late-w2 / int4-late-w2: the same
// on quantized experts; int8 / int4: the default's tiles on quantized experts, contiguous only (random packed
// bytes: the values do not matter to the time), their expert bytes the packed ones, every size; int8-decode /
// int8-grouped (int4 alike): the default's quantized choice held to one path; int8-steady: the default's int8
// choice with no staged decode tile (the register loop); int8-staged2 / 3 / 4 (int4 alike): the default's
// quantized choice with every decode tile keeping 2, 3 or 4 k-steps in flight per thread through shared
// memory (cp.async); int8-dq / int4-dq: the default's quantized choice with its grouped stages on a bf16 copy
// (the routed experts dequantised into the workspace, then the bf16 TMA grouped GEMM:
// MoeConfig::grouped_dequant); int8-tma / int8-twoblock (int4 alike): the default's quantized choice with its
// grouped GEMM on the TMA kernel (weights dequantised in registers) / the two-block kernel; int8-tma32 /
// int4-tma32: the grouped path at every size on the TMA kernel's 32-token units (tile_tokens 32); int8-down2
// / 3 / 6 (int4 alike): the default's quantized choice with the down stage of its 8-token decode tiles split
// over 2, 3 or 6 warps (MoeConfig::decode_down_warps), int8-down0: over the row's warps (the table before its
// down warps); int8-splitk / int4-splitk: the default's quantized choice with the split-K decode asked for at
// one token (the first of DefaultMoeConfig::splitk_shapes that fits the device), int8-nosplitk /
// int4-nosplitk: at none; int8-sk-q64 / -p64 / -p128 / -q128, int4-sk-q64 / -p128: split-K at one token in
// that one form only (q: 4 warps, p: warp pairs; 64 or 128 features); int4-sk-fma: int4's default forms with
// the first on scalar fmas instead of mma.sync (SplitkShape::mma; int4-sk-p128 too), int8-sk-p128mma /
// -q128mma: int8-sk-p128 / -q128 on mma.sync; int8-sk-p64s2 / -p128s2: int8's pairs with two W1 / W3 steps in
// flight; int8-spread1 / -spread2 / -spread4 / -spread-all (int4 alike): as spread1 … spread-all on quantized
// experts; int8-t8w4u2 and the like: one quantized decode tile at every token count (tile tokens, warps,
// unroll), the sweep that chose the quantized rows of the default table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench_args.hpp"
#include "moe/paged_moe.cuh"
#include "moe_configs.hpp"
#include "moe_device_fixture.cuh"

using namespace amoeba;
using namespace amoeba::testing;
using bench::parse_ints;
using bench::split;
using kernels::MoePath;
using kernels::PagedMoe;

namespace {

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
float time_ms(F&& body, int warmup = 3, int reps = 11) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < warmup + reps; ++i) {
    cudaEventRecord(e0);
    body();
    cudaEventRecord(e1);
    AMOEBA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double copy_bandwidth_gbs() {
  const std::size_t bytes = std::size_t{2} << 30;
  DeviceBuffer<unsigned char> a(bytes), b(bytes);
  AMOEBA_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const float ms = time_ms([&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); });
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// Reads `n` 16-byte words over the grid (kStream: with the loads the decode kernels use for weights; else
// plain loads, as other kernels read) and XORs them; one word per block is written to `sink` when the XOR
// hits an unlikely value, so the reads cannot be dropped.
template <bool kStream>
__device__ void xor_reads(const uint4* p, std::size_t n, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    uint4 v;
    if constexpr (kStream)
      v = kernels::ptx::ld_stream_16(p + i);
    else
      v = p[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x | acc.y | acc.z | acc.w) == 0x12345678u) sink[blockIdx.x] = acc;
}
__global__ void read_kernel(const uint4* p, std::size_t n, uint4* sink) {
  xor_reads<true>(p, n, sink);
}

// Device read bandwidth (bytes read only), the memory floor's rate: the weights are only read.
double read_bandwidth_gbs(int sms) {
  const std::size_t bytes = std::size_t{4} << 30;
  DeviceBuffer<uint4> a(bytes / 16), sink(static_cast<std::size_t>(sms) * 8);
  AMOEBA_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const float ms = time_ms([&] { read_kernel<<<sms * 8, 512>>>(a.get(), bytes / 16, sink.get()); });
  AMOEBA_CUDA_CHECK(cudaGetLastError());
  return bytes / (ms * 1e-3) / 1e9;
}

// Other memory traffic between layer calls (--between-read, --between-write): one kernel reading `read_words`
// and writing `write_words` 16-byte words, plain loads and stores.
__global__ void between_kernel(const uint4* read, std::size_t read_words, uint4* write,
                               std::size_t write_words, uint4* sink) {
  xor_reads<false>(read, read_words, sink);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < write_words;
       i += stride)
    write[i] = make_uint4(static_cast<unsigned>(i), 0, 0, 0);
}
struct Between {
  DeviceBuffer<uint4> read, write, sink;
  std::size_t read_words = 0, write_words = 0;
  unsigned blocks = 0;
  Between(double read_mb, double write_mb, int sms)
      : read_words(static_cast<std::size_t>(read_mb * 1e6 / 16)),
        write_words(static_cast<std::size_t>(write_mb * 1e6 / 16)),
        blocks(static_cast<unsigned>(sms) * 4) {
    read = DeviceBuffer<uint4>(std::max<std::size_t>(read_words, 1));
    write = DeviceBuffer<uint4>(std::max<std::size_t>(write_words, 1));
    sink = DeviceBuffer<uint4>(blocks);
    AMOEBA_CUDA_CHECK(cudaMemset(read.get(), 1, std::max<std::size_t>(read_words, 1) * 16));
  }
  bool active() const { return read_words + write_words > 0; }
  void run(cudaStream_t stream) const {
    between_kernel<<<blocks, 512, 0, stream>>>(read.get(), read_words, write.get(), write_words, sink.get());
  }
};

struct GraphBase {
  cudaGraphExec_t exec = nullptr;
  kernels::MoeConfig config{};    // what the layer chose for the first routing set
  kernels::SplitkShape splitk{};  // the split-K form that set's call takes on this device (features 0: none)
  std::size_t workspace_bytes = 0;  // the largest workspace_size() over the routing sets
  GraphBase() = default;
  GraphBase(const GraphBase&) = delete;
  GraphBase& operator=(const GraphBase&) = delete;
  virtual ~GraphBase() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

// One addressing, configuration and precision of the layer: a CUDA graph of one call per routing set.
template <class Addressing, class Config, class Precision = kernels::Bf16>
struct Graph : GraphBase {
  using Moe = PagedMoe<Addressing, Config, Precision>;
  std::vector<typename Moe::Arguments> args;
  DeviceBuffer<unsigned char> workspace;

  const Between* between = nullptr;  // run after every call when active
  // Call i reads layers[i % layers.size()]: several layers' weights, as an engine step reads them.
  Graph(const std::vector<RoutingSet>& sets, const MoeShape& shape,
        const std::vector<typename Addressing::Arguments>& layers, bf16* out, const Between& other,
        cudaStream_t stream)
      : between(&other) {
    for (std::size_t i = 0; i < sets.size(); ++i) {
      const auto a = layer_arguments<typename Moe::Arguments>(sets[i], shape, layers[i % layers.size()], out);
      const kernels::Status st = Moe::can_implement(a);
      if (!st) throw std::runtime_error(st.message);
      workspace_bytes = std::max(workspace_bytes, Moe::workspace_size(a));
      args.push_back(a);
    }
    config = Moe::config(args.front());
    splitk = Moe::decode_split_shape(args.front());
    workspace = DeviceBuffer<unsigned char>(workspace_bytes);
    // One eager call first (sets kernel attributes outside the capture), then capture one call per set.
    run_all(stream);
    AMOEBA_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    AMOEBA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    run_all(stream);
    AMOEBA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    AMOEBA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
  }
  void run_all(cudaStream_t stream) {
    for (const auto& a : args) {
      const kernels::Status st = Moe{}.run(a, workspace.get(), workspace_bytes, stream);
      if (!st) throw std::runtime_error(st.message);
      if (between->active()) between->run(stream);
    }
  }
};

// Configurations compared against the default (A/B): one decode tile wherever it holds the expected largest
// batch and K allows its warps, the default's choice elsewhere; tiles the default does not instantiate are
// added to the configuration's own.
template <int kTile, int kWarps, int kUnroll, int kPrefetch = 128>
struct DecodeTileConfig {
  using DecodeTiles = kernels::DecodeTilesWith<kernels::decode::Tile<kTile / 8, kWarps, kUnroll, kPrefetch>>;
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select(s, requested);
    if (c.path != MoePath::kDecode) return c;
    const double mean = static_cast<double>(s.num_tokens) * s.top_k / s.num_experts;
    const bool k_ok = s.hidden % (32 * kWarps) == 0 && s.intermediate % (32 * kWarps) == 0;
    if (kernels::config_detail::fits(mean, kTile) && k_ok)
      c = {MoePath::kDecode, kTile, kWarps, kUnroll, kPrefetch};
    return c;
  }
};

// The default table's choice with another L2 prefetch hint on the decode path (its own tile list: the
// default's tiles with that hint).
template <class... Ts, int kPrefetch>
auto with_prefetch(std::tuple<Ts...>, std::integral_constant<int, kPrefetch>)
    -> kernels::DecodeTilesWith<kernels::decode::Tile<Ts::kTokTiles, Ts::kWarps, Ts::kUnroll, kPrefetch>...>;
template <int kPrefetch>
struct PrefetchConfig {
  using DecodeTiles = decltype(with_prefetch(kernels::detail::DefaultDecodeTiles{},
                                             std::integral_constant<int, kPrefetch>{}));
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select(s, requested);
    if (c.path == MoePath::kDecode) c.decode_prefetch = kPrefetch;
    return c;
  }
};

// The weights of the layers (--layers): one store per layer, and per paged view (placement × seed) that
// view over every layer's store.
struct Layers {
  std::vector<std::unique_ptr<ExpertStore>> stores;
  std::vector<std::vector<ExpertStore::AliasedView>> views;  // [view][layer]
};

// The graphs of one configuration: contiguous, then one per paged view.
template <class Config>
std::vector<std::unique_ptr<GraphBase>> make_graphs(const std::vector<RoutingSet>& sets,
                                                    const MoeShape& shape, const Layers& layers, bf16* out,
                                                    const Between& between, cudaStream_t stream) {
  std::vector<std::unique_ptr<GraphBase>> g;
  std::vector<kernels::Contiguous::Arguments> contiguous;
  for (const auto& s : layers.stores) contiguous.push_back(s->contiguous_args());
  g.push_back(
      std::make_unique<Graph<kernels::Contiguous, Config>>(sets, shape, contiguous, out, between, stream));
  for (const auto& view : layers.views) {
    std::vector<kernels::Paged::Arguments> paged;
    for (const auto& v : view) paged.push_back(v.args());
    g.push_back(std::make_unique<Graph<kernels::Paged, Config>>(sets, shape, paged, out, between, stream));
  }
  return g;
}

// The bf16 configurations --config names: how their graphs are built and where they are measured besides
// the first one named, which runs at every size (kDecode: where the default's choice decodes; kGrouped:
// where it runs the grouped GEMM; kEvery: everywhere).
enum class Where { kDecode, kGrouped, kEvery };
struct Bf16Config {
  std::vector<std::unique_ptr<GraphBase>> (*make)(const std::vector<RoutingSet>&, const MoeShape&,
                                                  const Layers&, bf16*, const Between&, cudaStream_t);
  Where where;
};
std::map<std::string, Bf16Config> bf16_configs() {
  return {
      {"default", {&make_graphs<kernels::DefaultMoeConfig>, Where::kDecode}},
      {"t8", {&make_graphs<DecodeTileConfig<8, 4, 2>>, Where::kDecode}},
      {"t32", {&make_graphs<DecodeTileConfig<32, 4, 1>>, Where::kDecode}},
      {"w8", {&make_graphs<DecodeTileConfig<32, 8, 2>>, Where::kDecode}},
      {"t8w4u3", {&make_graphs<DecodeTileConfig<8, 4, 3>>, Where::kDecode}},
      {"t8w4u4", {&make_graphs<DecodeTileConfig<8, 4, 4>>, Where::kDecode}},
      {"t8w8u2", {&make_graphs<DecodeTileConfig<8, 8, 2>>, Where::kDecode}},
      {"t8w8u4", {&make_graphs<DecodeTileConfig<8, 8, 4>>, Where::kDecode}},
      {"p256", {&make_graphs<PrefetchConfig<256>>, Where::kDecode}},
      {"preload", {&make_graphs<PreloadConfig<>>, Where::kDecode}},
      {"nopreload", {&make_graphs<NoPreloadConfig>, Where::kDecode}},
      {"splitk", {&make_graphs<SplitkConfig<3>>, Where::kDecode}},
      {"nosplitk", {&make_graphs<NoSplitkConfig>, Where::kDecode}},
      {"sk-q64", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{64, 1}>>, Where::kDecode}},
      {"sk-p64", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{64, 2}>>, Where::kDecode}},
      {"sk-p128", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{128, 2}>>, Where::kDecode}},
      {"sk-q128", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{128, 1}>>, Where::kDecode}},
      {"sk-p256", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{256, 2}>>, Where::kDecode}},
      {"sk-p128s2", {&make_graphs<SplitkFormsConfig<kernels::SplitkShape{128, 2, 0, 2}>>, Where::kDecode}},
      {"bf16-decode", {&make_graphs<PathConfig<MoePath::kDecode>>, Where::kEvery}},
      {"bf16-grouped", {&make_graphs<PathConfig<MoePath::kGrouped>>, Where::kEvery}},
      {"wide", {&make_graphs<GroupedRowsConfig<256>>, Where::kGrouped}},
      {"tile128", {&make_graphs<GroupedTileConfig<128>>, Where::kGrouped}},
      {"small4", {&make_graphs<SmallGroupedConfig<4, 2>>, Where::kGrouped}},
      {"small3", {&make_graphs<SmallGroupedConfig<3, 3>>, Where::kGrouped}},
      {"small8", {&make_graphs<SmallGroupedConfig<8, 1>>, Where::kGrouped}},
      {"narrow", {&make_graphs<GroupedRowsConfig<128>>, Where::kGrouped}},
      {"spread1", {&make_graphs<ChunkSpreadConfig<1>>, Where::kGrouped}},
      {"spread2", {&make_graphs<ChunkSpreadConfig<2>>, Where::kGrouped}},
      {"spread4", {&make_graphs<ChunkSpreadConfig<4>>, Where::kGrouped}},
      {"spread-all", {&make_graphs<ChunkSpreadConfig<kSpreadAll>>, Where::kGrouped}},
      {"late-w2", {&make_graphs<LateWeightsConfig>, Where::kEvery}}};
}

// Writes `value` into n bf16 scales.
__global__ void set_scales_kernel(bf16* p, std::size_t n, bf16 value) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

// The layer on quantized experts in one contiguous [E+m][3][packed matrix] array: random bytes for the packed
// values (every int8 / int4 code occurs), and each matrix's scales one value, chosen so that its weights span
// the bf16 store's range (W1/W3 ±1.7/√H, W2 ±1.7/√F: gate and up O(1), as a model's are). Data of another
// magnitude change the kernels' speed where the arithmetic leaves a fast path (random scales made gate values
// of hundreds: SiLU's division, kernels/moe/moe_params.cuh), so bf16 and quantized layers read alike.
struct QuantWeights {
  DeviceBuffer<bf16> data;  // bytes / 2 elements
  long long matrix_bytes = 0;
  QuantWeights(const ModelSpec& spec, kernels::quant::Bits bits) {
    const kernels::quant::ExpertLayout layout =
        kernels::quant::expert_layout(spec.intermediate, spec.hidden, bits);
    matrix_bytes = static_cast<long long>(layout.matrix_bytes());
    const int matrices = 3 * (spec.num_experts + spec.shared_chunks);
    data = DeviceBuffer<bf16>(static_cast<std::size_t>(matrices) * matrix_bytes / 2);
    fill_uniform(data.get(), data.size(), 4242, 0.05f);
    const auto q_max = static_cast<float>(kernels::quant::qmax(bits));
    for (int m = 0; m < matrices; ++m) {
      const bool down = m % 3 == 2;
      const kernels::quant::MatrixLayout& l = down ? layout.w2 : layout.w13;
      const float range = 1.7f / std::sqrt(static_cast<float>(down ? spec.intermediate : spec.hidden));
      unsigned char* base = reinterpret_cast<unsigned char*>(data.get()) + m * matrix_bytes;
      set_scales_kernel<<<256, 256>>>(reinterpret_cast<bf16*>(base + l.scale_offset()),
                                      l.rows * l.groups_per_row(), __float2bfloat16_rn(range / q_max));
    }
    AMOEBA_CUDA_CHECK(cudaGetLastError());
  }
};

template <class Precision, class Config = kernels::DefaultMoeConfig>
std::unique_ptr<GraphBase> make_quant_graph(const std::vector<RoutingSet>& sets, const MoeShape& shape,
                                            const QuantWeights& w, bf16* out, const Between& between,
                                            cudaStream_t stream) {
  return std::make_unique<Graph<kernels::Contiguous, Config, Precision>>(
      sets, shape, std::vector<kernels::Contiguous::Arguments>{{w.data.get()}}, out, between, stream);
}

// One decode tile at every token count, instantiated alone (its own DecodeTiles): the quantized sweep.
template <int kTile, int kWarps, int kUnroll, int kStages = 0>
struct FixedTileConfig {
  using DecodeTiles = std::tuple<kernels::decode::Tile<kTile / 8, kWarps, kUnroll, 128, kStages>>;
  static constexpr kernels::MoeConfig select(const MoeShape&, MoePath) {
    return {MoePath::kDecode, kTile, kWarps, kUnroll, 128, 128, kStages};
  }
};

// The default table with every quantized decode tile keeping kStages k-steps in flight per thread through
// shared memory (decode::Tile's kStages), int4 too; kStages = 0: every one on the register loop, what the
// staged rows are measured against. Its tiles: the default's and their twins.
template <int kStages, class... Ts>
auto restaged(std::tuple<Ts...>) -> typename kernels::detail::with_tiles<
    std::tuple<Ts...>, kernels::decode::Tile<Ts::kTokTiles, Ts::kWarps, (kStages > 0 ? 1 : Ts::kUnroll),
                                             Ts::kPrefetch, kStages>...>::type;
template <int kStages>
struct StagedQuantConfig : kernels::DefaultMoeConfig {
  using DecodeTiles = decltype(restaged<kStages>(kernels::detail::DefaultQuantDecodeTiles{}));
  static constexpr kernels::MoeConfig select_quantized(const MoeShape& s, MoePath requested,
                                                       kernels::quant::Bits bits) {
    kernels::MoeConfig c = kernels::DefaultMoeConfig::select_quantized(s, requested, bits);
    if (c.path == MoePath::kDecode) {
      if (kStages > 0) c.decode_unroll = 1;  // a staged tile keeps one step in registers
      c.decode_stages = kStages;
    }
    return c;
  }
};

using QuantFactory = std::unique_ptr<GraphBase> (*)(const std::vector<RoutingSet>&, const MoeShape&,
                                                    const QuantWeights&, bf16*, const Between&, cudaStream_t);

// The quantized sweep's configurations, named `int8-t8w4u2` (precision, tile tokens, warps, unroll) and
// `int4-t8w2u1s2` (staged: k-steps in flight through shared memory).
template <class Precision, int kTile, int kWarps, int kUnroll, int kStages = 0>
void add_quant(std::map<std::string, QuantFactory>& m, const std::string& precision) {
  m[precision + "-t" + std::to_string(kTile) + "w" + std::to_string(kWarps) + "u" + std::to_string(kUnroll) +
    (kStages > 0 ? "s" + std::to_string(kStages) : "")] =
      &make_quant_graph<Precision, FixedTileConfig<kTile, kWarps, kUnroll, kStages>>;
}
template <class Precision>
void add_quant_sweep(std::map<std::string, QuantFactory>& m, const std::string& precision) {
  add_quant<Precision, 8, 4, 1>(m, precision);
  add_quant<Precision, 8, 4, 2>(m, precision);
  add_quant<Precision, 8, 8, 1>(m, precision);
  add_quant<Precision, 8, 8, 2>(m, precision);
  add_quant<Precision, 16, 4, 1>(m, precision);
  add_quant<Precision, 16, 4, 2>(m, precision);
  add_quant<Precision, 32, 4, 1>(m, precision);
  add_quant<Precision, 8, 2, 1>(m, precision);  // two warps: twice the k-steps per warp
  add_quant<Precision, 8, 2, 1, 2>(m, precision);
  add_quant<Precision, 8, 2, 1, 3>(m, precision);
  add_quant<Precision, 8, 4, 1, 2>(m, precision);
}
// Every quantized configuration: `int8` / `int4` (the default table), `-decode` / `-grouped` (one path
// everywhere) and the sweep's.
std::map<std::string, QuantFactory> quant_configs() {
  using Decode = PathConfig<MoePath::kDecode>;
  using Grouped = PathConfig<MoePath::kGrouped>;
  std::map<std::string, QuantFactory> m{
      {"int8", &make_quant_graph<kernels::Int8>},
      {"int4", &make_quant_graph<kernels::Int4>},
      {"int8-decode", &make_quant_graph<kernels::Int8, Decode>},
      {"int4-decode", &make_quant_graph<kernels::Int4, Decode>},
      {"int8-grouped", &make_quant_graph<kernels::Int8, Grouped>},
      {"int4-grouped", &make_quant_graph<kernels::Int4, Grouped>},
      {"int8-steady", &make_quant_graph<kernels::Int8, StagedQuantConfig<0>>},
      {"int8-staged2", &make_quant_graph<kernels::Int8, StagedQuantConfig<2>>},
      {"int4-staged2", &make_quant_graph<kernels::Int4, StagedQuantConfig<2>>},
      {"int8-staged3", &make_quant_graph<kernels::Int8, StagedQuantConfig<3>>},
      {"int4-staged3", &make_quant_graph<kernels::Int4, StagedQuantConfig<3>>},
      {"int8-staged4", &make_quant_graph<kernels::Int8, StagedQuantConfig<4>>},
      {"int4-staged4", &make_quant_graph<kernels::Int4, StagedQuantConfig<4>>},
      {"int8-tma", &make_quant_graph<kernels::Int8, GroupedRowsConfig<256>>},
      {"int4-tma", &make_quant_graph<kernels::Int4, GroupedRowsConfig<256>>},
      {"int8-twoblock", &make_quant_graph<kernels::Int8, GroupedRowsConfig<128>>},
      {"int4-twoblock", &make_quant_graph<kernels::Int4, GroupedRowsConfig<128>>},
      {"int8-tma32", &make_quant_graph<kernels::Int8, QuantTmaSmallConfig>},
      {"int4-tma32", &make_quant_graph<kernels::Int4, QuantTmaSmallConfig>},
      {"int8-dq", &make_quant_graph<kernels::Int8, DequantConfig<>>},
      {"int4-dq", &make_quant_graph<kernels::Int4, DequantConfig<>>},
      {"int8-splitk", &make_quant_graph<kernels::Int8, SplitkConfig<>>},
      {"int4-splitk", &make_quant_graph<kernels::Int4, SplitkConfig<>>},
      {"int8-nosplitk", &make_quant_graph<kernels::Int8, NoSplitkConfig>},
      {"int4-nosplitk", &make_quant_graph<kernels::Int4, NoSplitkConfig>},
      {"int8-sk-q64", &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{64, 1}>>},
      {"int8-sk-p64", &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{64, 2}>>},
      {"int8-sk-p128", &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{128, 2}>>},
      {"int8-sk-q128", &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{128, 1}>>},
      {"int4-sk-q64", &make_quant_graph<kernels::Int4, SplitkFormsConfig<kernels::SplitkShape{64, 1}>>},
      {"int4-sk-p128", &make_quant_graph<kernels::Int4, SplitkFormsConfig<kernels::SplitkShape{128, 2}>>},
      {"int4-sk-fma",
       &make_quant_graph<kernels::Int4,
                         SplitkFormsConfig<kernels::SplitkShape{128, 2, 32}, kernels::SplitkShape{64, 1}>>},
      {"int8-sk-p64s2",
       &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{64, 2, 0, 2}>>},
      {"int8-sk-p128s2",
       &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{128, 2, 0, 2}>>},
      {"int8-sk-p128mma",
       &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{128, 2, 0, 0, true}>>},
      {"int8-sk-q128mma",
       &make_quant_graph<kernels::Int8, SplitkFormsConfig<kernels::SplitkShape{128, 1, 0, 0, true}>>},
      {"int8-late-w2", &make_quant_graph<kernels::Int8, LateWeightsConfig>},
      {"int4-late-w2", &make_quant_graph<kernels::Int4, LateWeightsConfig>},
      {"int8-spread1", &make_quant_graph<kernels::Int8, ChunkSpreadConfig<1>>},
      {"int4-spread1", &make_quant_graph<kernels::Int4, ChunkSpreadConfig<1>>},
      {"int8-spread2", &make_quant_graph<kernels::Int8, ChunkSpreadConfig<2>>},
      {"int4-spread2", &make_quant_graph<kernels::Int4, ChunkSpreadConfig<2>>},
      {"int8-spread4", &make_quant_graph<kernels::Int8, ChunkSpreadConfig<4>>},
      {"int4-spread4", &make_quant_graph<kernels::Int4, ChunkSpreadConfig<4>>},
      {"int8-spread-all", &make_quant_graph<kernels::Int8, ChunkSpreadConfig<kSpreadAll>>},
      {"int4-spread-all", &make_quant_graph<kernels::Int4, ChunkSpreadConfig<kSpreadAll>>},
      {"int8-down0", &make_quant_graph<kernels::Int8, DownWarpsConfig<0>>},
      {"int4-down0", &make_quant_graph<kernels::Int4, DownWarpsConfig<0>>},
      {"int8-down2", &make_quant_graph<kernels::Int8, DownWarpsConfig<2>>},
      {"int4-down2", &make_quant_graph<kernels::Int4, DownWarpsConfig<2>>},
      {"int8-down3", &make_quant_graph<kernels::Int8, DownWarpsConfig<3>>},
      {"int4-down3", &make_quant_graph<kernels::Int4, DownWarpsConfig<3>>},
      {"int8-down6", &make_quant_graph<kernels::Int8, DownWarpsConfig<6>>},
      {"int4-down6", &make_quant_graph<kernels::Int4, DownWarpsConfig<6>>},
  };
  add_quant_sweep<kernels::Int8>(m, "int8");
  add_quant_sweep<kernels::Int4>(m, "int4");
  return m;
}

const char* path_name(MoePath p) {
  return p == MoePath::kDecode ? "decode" : p == MoePath::kGroupedMma ? "grouped-mma" : "grouped";
}

// The split-K form a call took, as the JSON writes it: null where it ran the decode tiles or another path.
std::string splitk_json(const kernels::SplitkShape& s) {
  if (s.features == 0) return "null";
  return "{\"features\": " + std::to_string(s.features) + ", \"h_split\": " + std::to_string(s.h_split) +
         ", \"steps\": " + std::to_string(s.steps) + ", \"mma\": " + (s.mma ? "true" : "false") + "}";
}

Placement parse_placement(const std::string& v) {
  if (v == "shuffled") return Placement::kShuffled;
  if (v == "adjacent") return Placement::kAdjacent;
  if (v == "identity") return Placement::kIdentity;
  throw std::runtime_error("--placement: unknown placement '" + v + "' (shuffled, adjacent, identity)");
}

}  // namespace

// The names of the maps' entries, in order, joined by ", " (for "unknown ... (known: ...)" errors).
template <class... Maps>
std::string known_names(const Maps&... maps) {
  std::string names;
  auto add = [&](const auto& map) {
    for (const auto& entry : map) names += (names.empty() ? "" : ", ") + entry.first;
  };
  (add(maps), ...);
  return names;
}

int main(int argc, char** argv) {
  std::string json_path = "paged_moe_bench.json";
  std::vector<std::string> models = {"qwen15", "qwen15_shared", "qwen3", "mixtral"};
  std::vector<int> tokens = {1, 3, 16, 33, 64, 256, 1024, 4096, 16384};
  std::vector<std::string> placements = {"shuffled", "adjacent"};
  std::vector<int> seeds = {1, 2, 3};
  std::vector<std::string> configs = {"default"};
  int num_sets = 8;
  int num_layers = 1;
  double seconds = 0.1;
  double between_read_mb = 0, between_write_mb = 0;
  Router router;  // uniform
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--json")
      json_path = v;
    else if (k == "--tokens")
      tokens = parse_ints(v);
    else if (k == "--sets")
      num_sets = std::stoi(v);
    else if (k == "--layers")
      num_layers = std::stoi(v);
    else if (k == "--between-read")
      between_read_mb = std::stod(v);
    else if (k == "--between-write")
      between_write_mb = std::stod(v);
    else if (k == "--placement")
      placements = split(v);
    else if (k == "--seed")
      seeds = parse_ints(v);
    else if (k == "--seconds")
      seconds = std::stod(v);
    else if (k == "--router") {
      try {
        router = Router::parse(v);
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
    } else if (k == "--models")
      models = split(v);
    else if (k == "--config")
      configs = split(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (num_layers < 1 || num_sets < 1) {
    std::fprintf(stderr, "--layers %d / --sets %d: must be >= 1\n", num_layers, num_sets);
    return 2;
  }
  if (!(between_read_mb >= 0 && between_read_mb <= 65536) ||
      !(between_write_mb >= 0 && between_write_mb <= 65536)) {
    std::fprintf(stderr, "--between-read %g / --between-write %g: must be 0..65536 MB\n", between_read_mb,
                 between_write_mb);
    return 2;
  }
  // The measured four by default; two shapes past 8 slots per token and the kernel-chain shapes on request.
  constexpr ModelSpec kChainQwen3{"qwen3 routing, H256 F128", 128, 8, 256, 128, 0};
  constexpr ModelSpec kChainQwen15{"qwen1.5+shared routing, H256 F128", 60, 4, 256, 128, 4};
  const std::map<std::string, ModelSpec> specs = {
      {"qwen15", kQwen15Routed},    {"qwen15_shared", kQwen15},           {"qwen3", kQwen3},
      {"mixtral", kMixtral},        {"qwen2_57b", kQwen2Large},           {"qwen3_next", kQwen3Next},
      {"chain_qwen3", kChainQwen3}, {"chain_qwen15_shared", kChainQwen15}};
  for (const std::string& m : models) {
    const auto it = specs.find(m);
    if (it == specs.end()) {
      std::fprintf(stderr, "--models: unknown model '%s' (known: %s)\n", m.c_str(),
                   known_names(specs).c_str());
      return 2;
    }
    if (router.kind == Router::Kind::kHot && router.hot_expert >= it->second.num_experts) {
      std::fprintf(stderr, "--router %s: %s has %d routed experts (ids 0..%d)\n", router.name().c_str(),
                   m.c_str(), it->second.num_experts, it->second.num_experts - 1);
      return 2;
    }
  }
  const std::map<std::string, QuantFactory> quantized = quant_configs();
  const std::map<std::string, Bf16Config> bf16_table = bf16_configs();
  for (const std::string& c : configs)
    if (bf16_table.count(c) == 0 && quantized.count(c) == 0) {
      std::fprintf(stderr, "--config: unknown configuration '%s' (known: %s)\n", c.c_str(),
                   known_names(bf16_table, quantized).c_str());
      return 2;
    }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double copy_gbs = copy_bandwidth_gbs();
  const double read_gbs = read_bandwidth_gbs(prop.multiProcessorCount);
  std::printf("%s: device copy %.0f GB/s (read+write), read %.0f GB/s\n", prop.name, copy_gbs, read_gbs);

  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t ev[2];
  for (auto& e : ev) cudaEventCreate(&e);
  const Between between(between_read_mb, between_write_mb, prop.multiProcessorCount);
  // The between kernel's time per call, alone in a graph of num_sets calls (median of 21 replays).
  double between_us = 0;
  if (between.active()) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    AMOEBA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < num_sets; ++i) between.run(stream);
    AMOEBA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    AMOEBA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    between_us =
        time_ms([&] { AMOEBA_CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); }, 2, 21) * 1000.0 / num_sets;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::printf("between layers: read %.0f MB, write %.0f MB: %.1f us per call (taken off every call)\n",
                between_read_mb, between_write_mb, between_us);
  }

  std::FILE* js = std::fopen(json_path.c_str(), "w");
  std::fprintf(
      js,
      "{\n \"gpu\": \"%s\",\n \"copy_gbs\": %.1f,\n \"read_gbs\": %.1f,\n \"sets\": %d,\n "
      "\"layers\": %d,\n \"router\": \"%s\",\n \"between_read_mb\": %g,\n \"between_write_mb\": %g,\n "
      "\"between_us\": %.2f,\n \"cases\": [\n",
      prop.name, copy_gbs, read_gbs, num_sets, num_layers, router.name().c_str(), between_read_mb,
      between_write_mb, between_us);
  bool first = true;
  for (const std::string& name : models) {
    const ModelSpec spec = specs.at(name);
    Layers layers;  // bf16 weights: --layers stores (seeds 42, 43, ...), the paged views over each
    for (int l = 0; l < num_layers; ++l)
      layers.stores.push_back(
          std::make_unique<ExpertStore>(spec, 42 + static_cast<std::uint64_t>(l), 0, /*aliased=*/true));
    std::map<std::string, std::unique_ptr<QuantWeights>> quant;  // per precision named by a config
    for (const std::string& c : configs) {
      const std::string prec = c.substr(0, 4);  // a quantized configuration's name starts with it
      if (quantized.count(c) == 0 || quant.count(prec) != 0) continue;
      quant[prec] = std::make_unique<QuantWeights>(
          spec, prec == "int8" ? kernels::quant::Bits::kInt8 : kernels::quant::Bits::kInt4);
    }
    std::vector<std::pair<std::string, int>> view_names;
    for (const std::string& pl : placements)
      for (int seed : seeds) {  // 1 expert in 8 in load-buffer slots
        view_names.emplace_back(pl, seed);
        layers.views.emplace_back();
        for (const auto& st : layers.stores)
          layers.views.back().push_back(
              st->aliased_view(parse_placement(pl), static_cast<std::uint64_t>(seed), 8));
      }
    for (int t : tokens) {
      const MoeShape shape = shape_of(spec, t);
      std::vector<RoutingSet> sets;
      double distinct = 0;
      for (int i = 0; i < num_sets; ++i) {
        sets.push_back(make_routing(spec, t, 7919ULL * t + i, router));
        distinct += sets.back().distinct_experts;
      }
      distinct /= num_sets;
      DeviceBuffer<bf16> out(static_cast<std::size_t>(t) * spec.hidden);
      const kernels::MoeConfig config = kernels::DefaultMoeConfig::select(shape, MoePath::kAuto);
      // Per configuration: graph 0 contiguous, graphs 1.. the paged views. Other configurations only where
      // they differ (decode).
      std::vector<std::string> used;
      std::vector<int> first_graph, graph_count;  // per used configuration
      std::vector<double> matrix_bytes;           // per used configuration: the experts' matrix bytes
      std::vector<std::unique_ptr<GraphBase>> graphs;
      for (const std::string& c : configs) {
        // Quantized configurations are measured at every size (their own path choice).
        const auto q = quantized.find(c);
        std::vector<std::unique_ptr<GraphBase>> g;
        double mb = static_cast<double>(shape.matrix_bytes());
        if (q != quantized.end()) {  // quantized configurations: every size
          const QuantWeights& w = *quant.at(c.substr(0, 4));
          g.push_back(q->second(sets, shape, w, out.get(), between, stream));
          mb = static_cast<double>(w.matrix_bytes);
        } else {
          const Bf16Config& b = bf16_table.at(c);
          const bool decodes = config.path == MoePath::kDecode;
          if (b.where == Where::kGrouped ? decodes : c != configs[0] && b.where == Where::kDecode && !decodes)
            continue;
          g = b.make(sets, shape, layers, out.get(), between, stream);
        }
        used.push_back(c);
        first_graph.push_back(static_cast<int>(graphs.size()));
        graph_count.push_back(static_cast<int>(g.size()));
        matrix_bytes.push_back(mb);
        for (auto& x : g) graphs.push_back(std::move(x));
      }
      const int n = static_cast<int>(graphs.size());
      if (n == 0) continue;  // no configuration applies at this size (wide / narrow on the decode path)
      auto launch = [&](int g) { AMOEBA_CUDA_CHECK(cudaGraphLaunch(graphs[g]->exec, stream)); };
      for (int i = 0; i < 2; ++i)
        for (int g = 0; g < n; ++g) launch(g);
      cudaEventRecord(ev[0], stream);
      launch(0);
      cudaEventRecord(ev[1], stream);
      AMOEBA_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float once;
      cudaEventElapsedTime(&once, ev[0], ev[1]);
      const int reps = std::clamp(static_cast<int>(seconds * 1000.0 / std::max(once, 1e-3f)), 5, 301);
      std::vector<std::vector<float>> us(n);
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 shuffle_rng(static_cast<unsigned>(t));
      for (int r = 0; r < reps; ++r) {
        // A new order every repetition, so that no graph always follows the same one.
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        for (int i = 0; i < n; ++i) {
          const int g = order[i];
          cudaEventRecord(ev[0], stream);
          launch(g);
          cudaEventRecord(ev[1], stream);
          AMOEBA_CUDA_CHECK(cudaEventSynchronize(ev[1]));
          float ms;
          cudaEventElapsedTime(&ms, ev[0], ev[1]);
          us[g].push_back(ms * 1000.0f / num_sets - static_cast<float>(between_us));
        }
      }
      AMOEBA_CUDA_CHECK(cudaGetLastError());
      const double bytes = distinct * 3.0 * static_cast<double>(shape.matrix_bytes()) +
                           shape.num_shared_chunks * 3.0 * static_cast<double>(shape.matrix_bytes());
      const double flops =
          2.0 * t * shape.slots_per_token() * 3.0 * static_cast<double>(shape.matrix_elems());
      std::fprintf(js,
                   "%s  {\"model\": \"%s\", \"tokens\": %d, \"E\": %d, \"k\": %d, \"H\": %d, \"F\": %d, "
                   "\"shared_chunks\": %d, \"path\": \"%s\", \"tile_tokens\": %d, \"grouped_rows\": %d, "
                   "\"small_deep\": %s, \"distinct_experts\": %.2f, \"expert_bytes\": %.0f, \"flops\": %.0f, "
                   "\"reps\": %d, \"configs\": [",
                   first ? "" : ",\n", spec.name, t, spec.num_experts, spec.top_k, spec.hidden,
                   spec.intermediate, spec.shared_chunks, path_name(config.path), config.tile_tokens,
                   config.grouped_rows, config.small_deep ? "true" : "false", distinct, bytes, flops, reps);
      for (std::size_t ci = 0; ci < used.size(); ++ci) {
        const int base = first_graph[ci];
        const float mc = median(us[base]);
        const kernels::MoeConfig& chosen = graphs[base]->config;
        const kernels::SplitkShape& sk = graphs[base]->splitk;
        // The floor of this configuration's bytes: routed experts touched plus the shared chunks.
        const double cfg_bytes = (distinct + shape.num_shared_chunks) * 3.0 * matrix_bytes[ci];
        std::printf("%-14s T=%-6d %-8s tile=%-4d %-9s contiguous %9.2f us (%.2fx the read floor)  paged",
                    name.c_str(), t, sk.features != 0 ? "splitk" : path_name(chosen.path), chosen.tile_tokens,
                    used[ci].c_str(), mc, mc * 1e-6 / (cfg_bytes / (read_gbs * 1e9)));
        std::fprintf(
            js,
            "%s{\"config\": \"%s\", \"path\": \"%s\", \"tile_tokens\": %d, \"grouped_rows\": %d, "
            "\"grouped_dequant\": %s, \"small_deep\": %s, \"decode_preload\": %s, \"chunk_spread\": %d, "
            "\"splitk\": %s, \"workspace_bytes\": %zu, \"expert_bytes\": %.0f, \"contiguous_us\": %.3f, "
            "\"paged\": [",
            ci ? ", " : "", used[ci].c_str(), path_name(chosen.path), chosen.tile_tokens, chosen.grouped_rows,
            chosen.grouped_dequant ? "true" : "false", chosen.small_deep ? "true" : "false",
            chosen.decode_preload ? "true" : "false", chosen.chunk_spread, splitk_json(sk).c_str(),
            graphs[base]->workspace_bytes, cfg_bytes, mc);
        for (int v = 0; v + 1 < graph_count[ci]; ++v) {
          const float mp = median(us[base + 1 + v]);
          std::printf(" %s/%d %+.2f%%", view_names[v].first.c_str(), view_names[v].second,
                      100.0 * (mp - mc) / mc);
          std::fprintf(js, "%s{\"placement\": \"%s\", \"seed\": %d, \"us\": %.3f}", v ? ", " : "",
                       view_names[v].first.c_str(), view_names[v].second, mp);
        }
        std::printf("  reps %d\n", reps);
        std::fprintf(js, "]}");
      }
      std::fflush(stdout);
      std::fprintf(js, "]}");
      first = false;
    }
  }
  std::fprintf(js, "\n ]\n}\n");
  std::fclose(js);
  return 0;
}
