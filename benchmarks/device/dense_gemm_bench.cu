// Device benchmark of DenseGemm (kernels/model/dense_gemm.cuh) on the CUDA backend's dense projections at
// decode-sized row counts: for each projection and M, the median time of each of cuBLASLt's first
// --candidates heuristic algorithms (DenseGemm::tune: one warm-up launch, then --reps launches between CUDA
// events), so the first one (what an untuned DenseGemm runs) stands beside the fastest. Random bf16 operands.
// Prints one line per projection and M and writes one JSON object.
//
//   dense_gemm_bench --json out.json [--models qwen15,qwen3] [--max-m 16] [--candidates 8] [--reps 50]
//
// The projections per layer (engine/cuda_backend.cu): q/k/v as one GEMM (Qwen1.5 with biases), o_proj, the
// router with the shared expert's gate as one more column (N = E + 1 where the model has a shared expert),
// the same router padded to a multiple of 8 columns (a candidate layout: every row of y 16-byte aligned), and
// the LM head (once per step).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "model/dense_gemm.cuh"
#include "moe_device_fixture.cuh"

namespace {

using amoeba::kernels::decoder::bf16;
using amoeba::kernels::decoder::DenseGemm;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "dense_gemm_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Projection {
  const char* model;
  const char* name;
  int K, N;
  bool bias;
};

// Qwen1.5-MoE-A2.7B: H 2048, 16 heads and 16 KV heads of 128, q/k/v biases, 60 experts and a shared one.
// Qwen3-30B-A3B: H 2048, 32 heads and 4 KV heads of 128, 128 experts. Both: a vocabulary of 151936.
const std::vector<Projection> kProjections{
    {"qwen15", "qkv", 2048, 6144, true},        {"qwen15", "o_proj", 2048, 2048, false},
    {"qwen15", "router+gate", 2048, 61, false}, {"qwen15", "router+gate pad8", 2048, 64, false},
    {"qwen15", "lm_head", 2048, 151936, false}, {"qwen3", "qkv", 2048, 5120, false},
    {"qwen3", "o_proj", 4096, 2048, false},     {"qwen3", "router", 2048, 128, false},
    {"qwen3", "lm_head", 2048, 151936, false},
};

int int_arg(const char* flag, const char* v, int lo, int hi) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "dense_gemm_bench: %s %s: must be an integer in [%d, %d]\n", flag, v, lo, hi);
    std::exit(2);
  }
  return static_cast<int>(x);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, models = "qwen15,qwen3";
  int max_m = 16, candidates = 8, reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "dense_gemm_bench: %s needs a value\n", k.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (k == "--json")
      json_path = v;
    else if (k == "--models")
      models = v;
    else if (k == "--max-m")
      max_m = int_arg("--max-m", v, 1, DenseGemm::kExactRows);
    else if (k == "--candidates")
      candidates = int_arg("--candidates", v, 1, 64);
    else if (k == "--reps")
      reps = int_arg("--reps", v, 1, 100000);
    else {
      std::fprintf(stderr,
                   "dense_gemm_bench: unknown flag %s (--json, --models, --max-m, --candidates, --reps)\n",
                   k.c_str());
      return 2;
    }
  }
  const std::vector<std::string> wanted = amoeba::bench::split(models);
  for (const std::string& m : wanted)
    if (m != "qwen15" && m != "qwen3") {
      std::fprintf(stderr, "dense_gemm_bench: --models %s: unknown model %s (qwen15, qwen3)\n",
                   models.c_str(), m.c_str());
      return 2;
    }
  if (json_path.empty()) {
    std::fprintf(stderr, "dense_gemm_bench: --json FILE is required\n");
    return 2;
  }
  std::FILE* json = std::fopen(json_path.c_str(), "w");
  if (json == nullptr) {
    std::fprintf(stderr, "dense_gemm_bench: --json %s: cannot open for writing\n", json_path.c_str());
    return 2;
  }

  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::size_t max_w = 0, max_x = 0, max_y = 0, max_n = 0;
  for (const Projection& p : kProjections) {
    max_w = std::max(max_w, std::size_t(p.N) * p.K);
    max_x = std::max(max_x, std::size_t(max_m) * p.K);
    max_y = std::max(max_y, std::size_t(max_m) * p.N);
    max_n = std::max(max_n, std::size_t(p.N));
  }
  bf16 *x = nullptr, *w = nullptr, *y = nullptr, *bias = nullptr;
  void* workspace = nullptr;
  check(cudaMalloc(&x, max_x * sizeof(bf16)), "cudaMalloc x");
  check(cudaMalloc(&w, max_w * sizeof(bf16)), "cudaMalloc w");
  check(cudaMalloc(&y, max_y * sizeof(bf16)), "cudaMalloc y");
  check(cudaMalloc(&bias, max_n * sizeof(bf16)), "cudaMalloc bias");
  check(cudaMalloc(&workspace, DenseGemm::kWorkspaceBytes), "cudaMalloc workspace");
  amoeba::testing::fill_uniform(x, max_x, 1, 2.0f);
  amoeba::testing::fill_uniform(w, max_w, 2, 0.05f);
  amoeba::testing::fill_uniform(bias, max_n, 3, 1.0f);
  check(cudaDeviceSynchronize(), "fill");
  DenseGemm gemm(workspace, DenseGemm::kWorkspaceBytes);
  if (!gemm.status()) {
    std::fprintf(stderr, "dense_gemm_bench: DenseGemm: %s\n", gemm.status().message.c_str());
    return 1;
  }

  std::fprintf(json, "{\n \"gpu\": \"%s\",\n \"candidates\": %d,\n \"reps\": %d,\n \"cases\": [", prop.name,
               candidates, reps);
  std::printf("%s: median us of cuBLASLt's first heuristic algorithm and of the fastest of its first %d\n",
              prop.name, candidates);
  bool first_case = true;
  for (const Projection& p : kProjections) {
    if (std::find(wanted.begin(), wanted.end(), p.model) == wanted.end()) continue;
    for (int M = 1; M <= max_m; ++M) {
      std::vector<float> us;
      int chosen = -1;
      const auto st =
          gemm.tune(x, M, p.K, w, p.N, p.bias ? bias : nullptr, y, nullptr, candidates, reps, &us, &chosen);
      if (!st) {
        std::fprintf(stderr, "dense_gemm_bench: %s %s M %d: %s\n", p.model, p.name, M, st.message.c_str());
        return 1;
      }
      std::printf(
          "%-7s %-17s K %5d N %6d M %3d  first %8.2f us  best %8.2f us (#%d of %zu)  first/best %.3f\n",
          p.model, p.name, p.K, p.N, M, us[0], us[chosen], chosen, us.size(), us[0] / us[chosen]);
      std::fprintf(json,
                   "%s\n  {\"model\": \"%s\", \"projection\": \"%s\", \"K\": %d, \"N\": %d, \"bias\": %s, "
                   "\"M\": %d, \"chosen\": %d, \"us\": [",
                   first_case ? "" : ",", p.model, p.name, p.K, p.N, p.bias ? "true" : "false", M, chosen);
      for (std::size_t i = 0; i < us.size(); ++i)
        std::fprintf(json, "%s%s", i ? ", " : "",
                     std::isfinite(us[i]) ? std::to_string(us[i]).c_str() : "null");
      std::fprintf(json, "]}");
      first_case = false;
    }
  }
  std::fprintf(json, "\n ]\n}\n");
  std::fclose(json);
  for (void* ptr : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y),
                    static_cast<void*>(bias), workspace})
    cudaFree(ptr);
  return 0;
}
