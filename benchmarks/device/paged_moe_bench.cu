// Device benchmark of PagedMoe: paged vs contiguous addressing of the same layer, interleaved in one process,
// CUDA-event medians of CUDA-graph replays (each graph = one layer call per rotating input set, so weights
// and inputs cycle through more than the 60 MB L2), plus the measured device-copy bandwidth for the floor.
// Writes one JSON object; benchmarks/device/run.sh merges it with the PyTorch baseline into the results
// table.
//
//   paged_moe_bench --json out.json [--models qwen15,qwen3,mixtral] [--tokens 1,3,16,...] [--sets 8]
//                   [--placement shuffled|experts|identity] [--variant
//                   pair|pair-inflight|wide|grid[-tiles][-persistent]]
// --placement: where the paged view puts the matrices (see testing::Placement); --variant: the sm_90 grouped
// GEMM's tile and pipeline (kernels::detail::GroupedTuning), -tiles for tile-major unit order, -persistent
// for a persistent grid; grid = the 2-D-grid kernel of commit d41ff97.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "moe/paged_moe.cuh"
#include "moe_device_fixture.cuh"

using namespace amoeba;
using namespace amoeba::testing;
using kernels::MoePath;
using kernels::PagedMoe;

namespace {

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written (as the project's floor does).
double copy_bandwidth_gbs() {
  const std::size_t bytes = std::size_t{2} << 30;
  DeviceBuffer<unsigned char> a(bytes), b(bytes);
  AMOEBA_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    AMOEBA_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * bytes / (median(ms) * 1e-3) / 1e9;
}

template <class Addressing>
struct Variant {
  std::vector<typename PagedMoe<Addressing>::Arguments> args;
  DeviceBuffer<unsigned char> workspace;
  std::size_t workspace_bytes = 0;
  cudaGraphExec_t exec = nullptr;

  void build(const ExpertStore& store, const std::vector<RoutingSet>& sets, const MoeShape& shape,
             typename Addressing::Arguments w, bf16* out, MoePath path, cudaStream_t stream) {
    for (const RoutingSet& r : sets) {
      typename PagedMoe<Addressing>::Arguments a{};
      a.shape = shape;
      a.input = r.x.get();
      a.topk_ids = r.ids.get();
      a.topk_weights = r.weights.get();
      a.shared_weights = shape.num_shared_chunks > 0 ? r.shared.get() : nullptr;
      a.output = out;
      a.weights = w;
      a.path = path;
      const kernels::Status st = PagedMoe<Addressing>::can_implement(a);
      if (!st) throw std::runtime_error(st.message);
      workspace_bytes = std::max(workspace_bytes, PagedMoe<Addressing>::workspace_size(a));
      args.push_back(a);
    }
    (void)store;
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
      const kernels::Status st = PagedMoe<Addressing>{}.run(a, workspace.get(), workspace_bytes, stream);
      if (!st) throw std::runtime_error(st.message);
    }
  }
  ~Variant() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

const char* path_name(MoePath p) {
  return p == MoePath::kDecode ? "decode" : p == MoePath::kGroupedMma ? "grouped-mma" : "grouped";
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "paged_moe_bench.json";
  std::vector<std::string> models = {"qwen15", "qwen3", "mixtral"};
  std::vector<int> tokens = {1, 3, 16, 33, 64, 256, 1024, 4096, 16384};
  int num_sets = 8;
  Placement placement = Placement::kShuffled;
  std::string placement_name = "shuffled", variant = "pair";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--json")
      json_path = v;
    else if (k == "--tokens")
      tokens = parse_ints(v);
    else if (k == "--sets")
      num_sets = std::stoi(v);
    else if (k == "--placement") {
      placement_name = v;
      placement = v == "identity"  ? Placement::kIdentity
                  : v == "experts" ? Placement::kExperts
                                   : Placement::kShuffled;
    } else if (k == "--variant") {
      variant = v;
      // <tile>[-persistent], tile = pair | pair-inflight | wide
      auto& tune = kernels::detail::grouped_tuning();
      using T = kernels::detail::GroupedTuning;
      auto has = [&](const char* w) { return v.find(w) != std::string::npos; };
      tune.persistent = has("persistent");
      tune.unit_order = has("tiles") ? 1 : 0;
      tune.tile = has("wide")       ? T::kWide
                  : has("inflight") ? T::kPairInFlight
                  : has("grid")     ? T::kGrid
                                    : T::kPair;
    } else if (k == "--models") {
      models.clear();
      std::stringstream ss(v);
      for (std::string m; std::getline(ss, m, ',');) models.push_back(m);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("%s: device copy %.0f GB/s (read+write)\n", prop.name, copy_gbs);

  std::map<std::string, ModelSpec> specs = {
      {"qwen15", kQwen15Routed}, {"qwen15_shared", kQwen15}, {"qwen3", kQwen3}, {"mixtral", kMixtral}};
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t ev[3];
  for (auto& e : ev) cudaEventCreate(&e);

  std::FILE* js = std::fopen(json_path.c_str(), "w");
  std::fprintf(js,
               "{\n \"gpu\": \"%s\",\n \"copy_gbs\": %.1f,\n \"sets\": %d,\n \"placement\": \"%s\",\n "
               "\"variant\": \"%s\",\n \"cases\": [\n",
               prop.name, copy_gbs, num_sets, placement_name.c_str(), variant.c_str());
  bool first = true;
  for (const std::string& name : models) {
    const ModelSpec spec = specs.at(name);
    ExpertStore store(spec, 42, 8, /*aliased=*/true, placement);  // 1 expert in 8 in the load buffer
    for (int t : tokens) {
      const MoeShape shape = shape_of(spec, t);
      std::vector<RoutingSet> sets;
      double distinct = 0;
      for (int i = 0; i < num_sets; ++i) {
        sets.push_back(make_routing(spec, t, 7919ULL * t + i));
        distinct += sets.back().distinct_experts;
      }
      distinct /= num_sets;
      DeviceBuffer<bf16> out(static_cast<std::size_t>(t) * spec.hidden);
      Variant<kernels::Paged> paged;
      Variant<kernels::Contiguous> contiguous;
      paged.build(store, sets, shape, store.paged_args(), out.get(), MoePath::kAuto, stream);
      contiguous.build(store, sets, shape, store.contiguous_args(), out.get(), MoePath::kAuto, stream);
      const MoePath path = PagedMoe<kernels::Paged>::chosen_path(paged.args[0]);
      const int tile = PagedMoe<kernels::Paged>::tile_tokens(paged.args[0]);
      // Warm up, then size the repetitions to ~0.4 s per variant.
      for (int i = 0; i < 3; ++i) {
        cudaGraphLaunch(paged.exec, stream);
        cudaGraphLaunch(contiguous.exec, stream);
      }
      cudaEventRecord(ev[0], stream);
      cudaGraphLaunch(paged.exec, stream);
      cudaEventRecord(ev[1], stream);
      AMOEBA_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float once;
      cudaEventElapsedTime(&once, ev[0], ev[1]);
      const int reps = std::clamp(static_cast<int>(400.0f / std::max(once, 1e-3f)), 7, 201);
      std::vector<float> tp, tc;
      for (int r = 0; r < reps; ++r) {
        // Alternate which variant goes first so neither always follows the other.
        const bool paged_first = r % 2 == 0;
        cudaEventRecord(ev[0], stream);
        cudaGraphLaunch(paged_first ? paged.exec : contiguous.exec, stream);
        cudaEventRecord(ev[1], stream);
        cudaGraphLaunch(paged_first ? contiguous.exec : paged.exec, stream);
        cudaEventRecord(ev[2], stream);
        AMOEBA_CUDA_CHECK(cudaEventSynchronize(ev[2]));
        float a, b;
        cudaEventElapsedTime(&a, ev[0], ev[1]);
        cudaEventElapsedTime(&b, ev[1], ev[2]);
        (paged_first ? tp : tc).push_back(a * 1000.0f / num_sets);
        (paged_first ? tc : tp).push_back(b * 1000.0f / num_sets);
      }
      AMOEBA_CUDA_CHECK(cudaGetLastError());
      const float mp = median(tp), mc = median(tc);
      const double bytes = distinct * 3.0 * static_cast<double>(shape.matrix_bytes()) +
                           shape.num_shared_chunks * 3.0 * static_cast<double>(shape.matrix_bytes());
      const double flops =
          2.0 * t * shape.slots_per_token() * 3.0 * static_cast<double>(shape.matrix_elems());
      std::printf(
          "%-8s T=%-6d %-8s tile=%-4d paged %9.2f us  contiguous %9.2f us  (%+.2f%%)  distinct %.1f  reps "
          "%d\n",
          name.c_str(), t, path_name(path), tile, mp, mc, 100.0 * (mp - mc) / mc, distinct, reps);
      std::fflush(stdout);
      std::fprintf(
          js,
          "%s  {\"model\": \"%s\", \"tokens\": %d, \"E\": %d, \"k\": %d, \"H\": %d, \"F\": %d, "
          "\"shared_chunks\": %d, \"path\": \"%s\", \"tile_tokens\": %d, \"paged_us\": %.3f, "
          "\"contiguous_us\": %.3f, \"distinct_experts\": %.2f, \"expert_bytes\": %.0f, \"flops\": %.0f, "
          "\"reps\": %d}",
          first ? "" : ",\n", spec.name, t, spec.num_experts, spec.top_k, spec.hidden, spec.intermediate,
          spec.shared_chunks, path_name(path), tile, mp, mc, distinct, bytes, flops, reps);
      first = false;
    }
  }
  std::fprintf(js, "\n ]\n}\n");
  std::fclose(js);
  return 0;
}
