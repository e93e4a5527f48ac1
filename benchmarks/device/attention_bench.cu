// Device benchmark of PagedAttention (FlashInfer over the pool's KV pages): decode at 1 / 32 / 256 sequences
// × context 512 / 2048 for Qwen1.5-MoE (16 q / 16 kv heads) and Qwen3-30B-A3B (32 q / 4 kv heads), through
// the decode kernel (AttentionSchedule::kSplit) and through the prefill kernel (kPrefillOnly), plus mixed
// steps (decode sequences + one prefill chunk) under both schedules, and the host cost of plan().
//
// Timing: CUDA events around a loop of run() calls, each on the next attention layer of one plan (the
// engine's pattern: plan once per step, run per layer); the layers' pages together span >= 512 MB, several
// times the 60 MB L2, so every call reads its K/V from HBM. Warm-up, then the median over repetitions of the
// mean time per call (launch gaps included, no CUDA graph). Achieved bandwidth = K+V bytes one call must read
// / time, against a read-only bandwidth measured in the same process.
//
//   attention_bench [--json FILE] [--reps N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "amoeba/engine/kv_page_table.hpp"
#include "attention/paged_attention.cuh"

namespace {

using namespace amoeba;
using kernels::AttentionSchedule;
using Attention = kernels::PagedAttention<128>;
using kernels::bf16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define CK(expr) check((expr), #expr)
void check(const kernels::Status& st) {
  if (!st) throw std::runtime_error(st.message);
}

__global__ void fill_random_kernel(bf16* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = __float2bfloat16_rn(static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Read-only bandwidth ceiling: every byte of `n` 16-byte words read once, a value kept so nothing is elided.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

struct Geometry {
  const char* name;
  std::uint32_t qo_heads, kv_heads;
  std::uint64_t page_bytes() const { return 2ull * 16 * kv_heads * 128 * 2; }
};
constexpr Geometry kGeometries[] = {{"qwen1.5-moe", 16, 16}, {"qwen3-30b-a3b", 32, 4}};

struct SeqSpec {
  std::uint32_t context_before, new_tokens;
};

struct Record {
  std::string model, kind, schedule;
  std::uint32_t seqs, context, tokens, layers;
  double us, us_min, us_max, kv_bytes, tbps, plan_us;
  bool decode_split_kv, prefill_split_kv;
  int prefill_tile_q;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Bench {
 public:
  explicit Bench(int reps) : reps_(reps) {
    CK(cudaStreamCreate(&stream_));
    CK(cudaEventCreate(&start_));
    CK(cudaEventCreate(&stop_));
  }

  double read_bandwidth() {
    const std::size_t bytes = 2ull << 30;
    void* p = nullptr;
    unsigned* sink = nullptr;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&sink, 4));
    fill_random_kernel<<<4096, 256, 0, stream_>>>(static_cast<bf16*>(p), bytes / 2, 1);
    std::vector<double> t;
    for (int r = 0; r < 3 + reps_; ++r) {
      CK(cudaEventRecord(start_, stream_));
      read_kernel<<<132 * 16, 512, 0, stream_>>>(static_cast<const uint4*>(p), bytes / 16, sink);
      CK(cudaEventRecord(stop_, stream_));
      CK(cudaEventSynchronize(stop_));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start_, stop_));
      if (r >= 3) t.push_back(ms * 1e-3);
    }
    CK(cudaFree(p));
    CK(cudaFree(sink));
    return bytes / median(t) / 1e12;
  }

  // One step of `specs` over enough layers to exceed 512 MB of K/V, timed under `schedule`.
  Record measure(const Geometry& g, const char* kind, const std::vector<SeqSpec>& specs,
                 AttentionSchedule schedule, double read_tbps) {
    std::uint64_t blocks = 0, kv_tokens = 0;
    std::uint32_t tokens = 0;
    for (const SeqSpec& s : specs) {
      blocks += (s.context_before + s.new_tokens + 15) / 16;
      kv_tokens += s.context_before + s.new_tokens;
      tokens += s.new_tokens;
    }
    const double kv_bytes = static_cast<double>(kv_tokens) * 2 * g.kv_heads * 128 * 2;
    const std::uint32_t layers =
        static_cast<std::uint32_t>(std::clamp<double>(std::ceil(512e6 / (blocks * g.page_bytes())), 2, 512));
    const std::uint64_t pages =
        blocks * layers + blocks * layers / 4 + 16;  // a quarter spare, shuffled among
    const std::uint64_t arena_bytes = pages * g.page_bytes();
    void* arena = nullptr;
    CK(cudaMalloc(&arena, arena_bytes));
    fill_random_kernel<<<4096, 256, 0, stream_>>>(static_cast<bf16*>(arena), arena_bytes / 2, 7);

    std::vector<std::uint32_t> order(pages);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
    std::vector<std::vector<PageHandle>> lists(specs.size());
    StepBatch step;
    step.attention_layers = layers;
    step.tokens_per_kv_page = 16;
    std::size_t next = 0;
    for (std::size_t s = 0; s < specs.size(); ++s) {
      const std::uint32_t b = (specs[s].context_before + specs[s].new_tokens + 15) / 16;
      for (std::uint64_t i = 0; i < std::uint64_t{b} * layers; ++i)
        lists[s].push_back(PageHandle{order[next++], 0});
      SequenceStep x;
      x.request = s;
      x.context_before = specs[s].context_before;
      x.new_tokens = specs[s].new_tokens;
      x.samples = true;
      x.kv_pages = lists[s];
      step.seqs.push_back(x);
      step.tokens += x.new_tokens;
    }
    KvPageTable table;
    if (auto e = table.assign(step)) throw std::runtime_error(*e);
    std::int32_t* words = nullptr;
    CK(cudaMalloc(&words, table.words().size() * 4));
    CK(cudaMemcpy(words, table.words().data(), table.words().size() * 4, cudaMemcpyHostToDevice));
    bf16 *q = nullptr, *o = nullptr;
    CK(cudaMalloc(&q, std::size_t{tokens} * g.qo_heads * 128 * 2));
    CK(cudaMalloc(&o, std::size_t{tokens} * g.qo_heads * 128 * 2));
    fill_random_kernel<<<256, 256, 0, stream_>>>(q, std::size_t{tokens} * g.qo_heads * 128, 13);

    Attention::Arguments a;
    a.kv = {arena, g.page_bytes(), 16, g.kv_heads, 128};
    a.qo_heads = g.qo_heads;
    a.q = q;
    a.o = o;
    a.table = table.view(words);
    a.schedule = schedule;
    check(Attention::can_implement(a));
    const auto need = Attention::workspace_size(a);
    void *dev = nullptr, *pin = nullptr;
    CK(cudaMalloc(&dev, std::max<std::size_t>(need.device_bytes, 256)));
    CK(cudaHostAlloc(&pin, std::max<std::size_t>(need.pinned_bytes, 256), cudaHostAllocDefault));
    Attention op;
    const kernels::AttentionWorkspace ws{dev, need.device_bytes, pin, need.pinned_bytes};
    // Host cost of a plan (per step): median of several, each followed by a sync so pinned reuse is safe.
    std::vector<double> plan_t;
    for (int r = 0; r < 20; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      check(op.plan(a, table.host_view(), ws, stream_));
      const auto t1 = std::chrono::steady_clock::now();
      CK(cudaStreamSynchronize(stream_));
      plan_t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }

    const int calls = static_cast<int>(std::min<std::uint32_t>(layers, 64));
    std::uint32_t layer = 0;
    std::vector<double> per_call;
    for (int r = 0; r < 3 + reps_; ++r) {
      CK(cudaEventRecord(start_, stream_));
      for (int c = 0; c < calls; ++c) {
        a.layer = layer;
        layer = (layer + 1) % layers;
        check(op.run(a, stream_));
      }
      CK(cudaEventRecord(stop_, stream_));
      CK(cudaEventSynchronize(stop_));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start_, stop_));
      if (r >= 3) per_call.push_back(ms * 1e3 / calls);
    }
    Record rec;
    rec.model = g.name;
    rec.kind = kind;
    rec.schedule = schedule == AttentionSchedule::kSplit ? "split" : "prefill-only";
    rec.seqs = static_cast<std::uint32_t>(specs.size());
    rec.context = specs.front().context_before + specs.front().new_tokens;
    rec.tokens = tokens;
    rec.layers = layers;
    rec.us = median(per_call);
    rec.us_min = *std::min_element(per_call.begin(), per_call.end());
    rec.us_max = *std::max_element(per_call.begin(), per_call.end());
    rec.kv_bytes = kv_bytes;
    rec.tbps = kv_bytes / (rec.us * 1e-6) / 1e12;
    rec.plan_us = median(plan_t);
    rec.decode_split_kv = op.decode_split_kv();
    rec.prefill_split_kv = op.prefill_split_kv();
    rec.prefill_tile_q = op.prefill_tile_q();
    std::printf(
        "%-14s %-26s %-12s seqs %3u ctx %4u layers %3u  %8.2f us (%.2f-%.2f)  K+V %6.1f MB  %5.2f TB/s = "
        "%3.0f%% "
        "of read  plan %6.1f us  split_kv %d/%d tile_q %d\n",
        rec.model.c_str(), rec.kind.c_str(), rec.schedule.c_str(), rec.seqs, rec.context, rec.layers, rec.us,
        rec.us_min, rec.us_max, kv_bytes / 1e6, rec.tbps, 100 * rec.tbps / read_tbps, rec.plan_us,
        rec.decode_split_kv, rec.prefill_split_kv, rec.prefill_tile_q);
    std::fflush(stdout);
    CK(cudaFree(arena));
    CK(cudaFree(words));
    CK(cudaFree(q));
    CK(cudaFree(o));
    CK(cudaFree(dev));
    CK(cudaFreeHost(pin));
    return rec;
  }

 private:
  int reps_;
  cudaStream_t stream_{};
  cudaEvent_t start_{}, stop_{};
};

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int reps = 15;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    Bench bench(reps);
    const double read_tbps = bench.read_bandwidth();
    std::printf("%s, %d SMs; read-only bandwidth %.2f TB/s\n", prop.name, prop.multiProcessorCount,
                read_tbps);
    std::vector<Record> recs;
    for (const Geometry& g : kGeometries) {
      for (std::uint32_t ctx : {512u, 2048u})
        for (std::uint32_t n : {1u, 32u, 256u}) {
          const std::vector<SeqSpec> specs(n, SeqSpec{ctx - 1, 1});
          for (AttentionSchedule s : {AttentionSchedule::kSplit, AttentionSchedule::kPrefillOnly})
            recs.push_back(bench.measure(g, "decode", specs, s, read_tbps));
        }
      // Mixed steps: decode sequences at context 2048 then one prefill chunk of 512 after a 512 prefix.
      for (std::uint32_t n : {32u, 255u}) {
        std::vector<SeqSpec> specs(n, SeqSpec{2047, 1});
        specs.push_back({512, 512});
        for (AttentionSchedule s : {AttentionSchedule::kSplit, AttentionSchedule::kPrefillOnly})
          recs.push_back(bench.measure(g, n == 32 ? "mixed 32 dec + 512 chunk" : "mixed 255 dec + 512 chunk",
                                       specs, s, read_tbps));
      }
    }
    if (!json.empty()) {
      FILE* f = std::fopen(json.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + json);
      std::fprintf(f,
                   "{\n  \"gpu\": \"%s\",\n  \"sms\": %d,\n  \"read_tbps\": %.4f,\n  \"reps\": %d,\n  "
                   "\"records\": [\n",
                   prop.name, prop.multiProcessorCount, read_tbps, reps);
      for (std::size_t i = 0; i < recs.size(); ++i) {
        const Record& r = recs[i];
        std::fprintf(
            f,
            "    {\"model\": \"%s\", \"kind\": \"%s\", \"schedule\": \"%s\", \"seqs\": %u, \"context\": %u, "
            "\"tokens\": %u, \"layers\": %u, \"us_median\": %.3f, \"us_min\": %.3f, \"us_max\": %.3f, "
            "\"kv_bytes\": %.0f, \"kv_tbps\": %.4f, \"fraction_of_read_bw\": %.4f, \"plan_us\": %.2f, "
            "\"decode_split_kv\": %s, \"prefill_split_kv\": %s, \"prefill_tile_q\": %d}%s\n",
            r.model.c_str(), r.kind.c_str(), r.schedule.c_str(), r.seqs, r.context, r.tokens, r.layers, r.us,
            r.us_min, r.us_max, r.kv_bytes, r.tbps, r.tbps / read_tbps, r.plan_us,
            r.decode_split_kv ? "true" : "false", r.prefill_split_kv ? "true" : "false", r.prefill_tile_q,
            i + 1 < recs.size() ? "," : "");
      }
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
    }
    // The short table, last: decode kernel (split) vs prefill kernel (prefill-only), µs per layer call.
    std::printf(
        "\n| model | case | seqs | ctx | split µs | prefill-only µs | split TB/s (%% of %.2f) "
        "|\n|---|---|---|---|---|---|---|\n",
        read_tbps);
    for (std::size_t i = 0; i + 1 < recs.size(); i += 2) {
      const Record& s = recs[i];
      const Record& p = recs[i + 1];
      std::printf("| %s | %s | %u | %u | %.1f | %.1f | %.2f (%.0f%%) |\n", s.model.c_str(), s.kind.c_str(),
                  s.seqs, s.context, s.us, p.us, s.tbps, 100 * s.tbps / read_tbps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
