// The CUDA backend's implementation; see cuda_backend.hpp for what it is and its memory layout.
//
// One forward (forward_impl), on one compute stream; the loader's copy stream runs beside it:
//   host:  tokens and positions of the step's rows, the KV page table (KvPageTable), the sampled rows, the
//          synthetic routing (when asked) -> pinned staging -> one upload each; PagedAttention::plan
//   per layer l (MoE layer m):
//          loader.prefetch(m)                           restores into reserved pages (copy stream)
//          [previous layer's residual add +] RMSNorm -> QKV (one cuBLASLt GEMM, biases in the epilogue)
//          -> QkvPrologue (q/k RMSNorm (Qwen3), RoPE, the new rows' K/V into their pages) -> PagedAttention
//          -> O -> residual add + RMSNorm -> router + shared gate (one GEMM) -> top-k and gate (one kernel;
//          or the synthetic ids) [-> ids to the host when the layer has non-resident experts]
//          -> loader.prepare_layer(m, routed) (misses; the compute stream waits for the layer's copies)
//          -> PagedMoe<Paged> -> loader.layer_done(m); its residual add opens the next layer
//   final: the sampled rows -> RMSNorm -> LM head -> argmax -> host; loader.end_forward() (synchronises).
// Routing is read back once per forward (all layers' top-k ids), except for layers whose misses must be
// known before their MoE (the host waits for that layer's router there).
#include "engine/cuda_backend.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <iomanip>
#include <sstream>

#include "amoeba/core/errors.hpp"
#include "amoeba/engine/kv_page_table.hpp"
#include "engine/cuda_attention.hpp"
#include "engine/decoder_ops.hpp"
#include "engine/model_weights.hpp"
#include "engine/quantize.hpp"
#include "loader/device_memory.cuh"
#include "loader/double_buffer_loader.cuh"
#include "model/decoder_ops.cuh"
#include "model/dense_gemm.cuh"
#include "model/qkv_prologue.cuh"
#include "model/router.cuh"
#include "moe/paged_moe.cuh"

namespace amoeba::engine {

namespace {

using dbf16 = __nv_bfloat16;
namespace kd = amoeba::kernels::decoder;
namespace kn = amoeba::kernels;

// Messages: "{}" takes the next argument, "{:.2f}" the next one with two decimals (fmt's headers do not
// compile under nvcc).
template <class... A>
std::string fmtx(std::string_view f, const A&... a) {
  std::vector<std::function<void(std::ostream&)>> args{[&a](std::ostream& os) { os << a; }...};
  std::ostringstream os;
  std::size_t next = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '{') {
      const std::size_t close = f.find('}', i);
      const std::string_view spec = f.substr(i + 1, close - i - 1);
      std::ostringstream one;
      if (spec == ":.2f") one << std::fixed << std::setprecision(2);
      if (next < args.size()) args[next++](one);
      os << one.str();
      i = close;
    } else {
      os << f[i];
    }
  }
  return os.str();
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmtx("cuda backend: {}: {}", what, cudaGetErrorString(e)));
}
void check_status(const kn::Status& st, const char* what) {
  if (!st) throw std::runtime_error(fmtx("cuda backend: {}: {}", what, st.message));
}
constexpr std::uint64_t align256(std::uint64_t v) {
  return (v + 255) / 256 * 256;
}

// The pinned master copy of every routed expert. Filling it (tens of GB) dominates a backend's setup, and
// `ablate` builds one backend per policy on the same weights: the last store built is kept for the process's
// lifetime and handed to the next backend of the same weights (it is read-only once filled). An empty key
// builds a store of its own, uncached (a backend handed its weights, or one rank's slices).
std::shared_ptr<const kn::PinnedExpertStore> expert_store(const std::string& key, const ModelWeights& weights,
                                                          std::uint32_t layers, std::uint32_t experts,
                                                          std::uint64_t matrix_bytes, std::uint64_t payload,
                                                          ExpertPrecision precision) {
  auto build = [&] {
    auto store = std::make_shared<kn::PinnedExpertStore>(layers, experts, matrix_bytes, payload);
    store->fill([&](ExpertKey k, std::byte* dst, std::uint64_t bytes) {
      if (precision == ExpertPrecision::kBf16)
        weights.read_expert(k.layer, k.expert, std::span<std::byte>(dst, bytes));
      else  // quantized once, here: [W1 | W3 | W2] packed one matrix per page (engine/quantize.hpp)
        read_expert_packed(weights, k.layer, k.expert, precision, std::span<std::byte>(dst, bytes));
    });
    return store;
  };
  if (key.empty()) return build();
  static std::mutex mutex;
  static std::string last_key;
  static std::shared_ptr<const kn::PinnedExpertStore> last;
  const std::lock_guard<std::mutex> lock(mutex);
  if (last && last_key == key && last->layers() == layers && last->experts() == experts &&
      last->matrix_bytes() == matrix_bytes && last->payload_bytes() == payload)
    return last;
  last.reset();  // free the previous store before taking another
  auto store = build();
  last_key = key;
  last = store;
  return store;
}

// Measurement mode (AMOEBA_GATE_FORWARD=1): the stream waits here until the host has enqueued the whole
// forward and writes `value` into the mapped flag, so the events after it time the GPU's work without gaps
// between launches. Gives up after `max_ns` (then *timed_out = 1), so a full launch queue cannot hang it.
__global__ void gate_kernel(const volatile int* flag, int value, int* timed_out, unsigned long long max_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*flag != value) {
    __nanosleep(200);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > max_ns) {
      *timed_out = 1;
      return;
    }
  }
}

// Bytes carved from the arena, in order; each region 256-byte aligned.
struct Carver {
  std::byte* base = nullptr;
  std::uint64_t used = 0;
  std::uint64_t take(std::uint64_t bytes) {
    const std::uint64_t at = align256(used);
    used = at + bytes;
    return at;
  }
};

// Where each non-expert weight goes, relative to the weights' region, and the region's size. Each tensor is
// 256-byte aligned, except that the tensors one GEMM reads as one matrix follow each other without a gap:
// a layer's q, k, v projections (and their biases) and its router with the shared expert's gate.
struct WeightLayout {
  std::unordered_map<std::string, std::uint64_t> offset;
  std::uint64_t bytes = 0;
};
WeightLayout weight_layout(const std::vector<WeightTensor>& tensors) {
  static const std::vector<std::vector<std::string>> kGroups = {
      {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
      {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
      {"mlp.gate.weight", "mlp.shared_expert_gate.weight"}};
  std::unordered_map<std::string, const WeightTensor*> by_name;
  for (const WeightTensor& t : tensors) by_name[t.name] = &t;
  WeightLayout l;
  auto place = [&](const WeightTensor& t, bool aligned) {
    if (aligned) l.bytes = align256(l.bytes);
    l.offset[t.name] = l.bytes;
    l.bytes += t.bytes();
  };
  for (const WeightTensor& t : tensors) {
    if (l.offset.contains(t.name)) continue;
    bool grouped = false;
    for (const auto& group : kGroups)
      for (const std::string& suffix : group)
        if (!grouped && t.name.size() > suffix.size() && t.name.ends_with(suffix)) {
          const std::string prefix = t.name.substr(0, t.name.size() - suffix.size());
          bool first = true;
          for (const std::string& member : group)
            if (auto it = by_name.find(prefix + member); it != by_name.end()) {
              place(*it->second, first);
              first = false;
            }
          grouped = true;
        }
    if (!grouped) place(t, true);
  }
  l.bytes = align256(l.bytes);
  return l;
}

}  // namespace

struct CudaBackend::Impl {
  // Device pointers of one decoder layer's non-expert weights (null where the architecture has none).
  struct LayerWeights {
    const dbf16 *in_norm = nullptr, *post_norm = nullptr;
    // q: the fused [q | k | v] projection (and q_bias its bias); router: [router | shared gate]
    // (weight_layout).
    const dbf16 *q = nullptr, *o = nullptr, *q_bias = nullptr;
    const dbf16 *q_norm = nullptr, *k_norm = nullptr;
    const dbf16* router = nullptr;
    const dbf16 *gate = nullptr, *up = nullptr, *down = nullptr;  // dense MLP layers
    std::int32_t moe = -1;                                        // MoE layer index, -1 for a dense layer
  };

  CudaBackendConfig cfg;
  HfMoeConfig hf;
  std::shared_ptr<const ModelWeights> weights;  // the rank's (the whole model's at tp 1)
  TokenSource prompts;
  std::uint32_t moe_layers = 0, chunks = 0, H = 0, F = 0, E = 0, K = 0, qd = 0, kvd = 0, hd = 0, V = 0;
  std::uint32_t router_ld = 0;  // E, or E + 1 where the shared expert's gate is the router GEMM's last column
  std::uint64_t matrix_bytes = 0;

  cudaStream_t stream = nullptr;
  std::byte* arena = nullptr;  // one cudaMalloc
  CudaMemoryReport mem;
  std::shared_ptr<const kn::PinnedExpertStore> store;
  std::unique_ptr<kn::DoubleBufferLoader> loader;
  std::unique_ptr<kd::DenseGemm> gemm;
  PagedAttentionRunner attention;
  kn::PagedMoe<kn::Paged> moe;
  void* attn_dev = nullptr;
  void* attn_pin = nullptr;
  AttentionBytes attn_bytes;
  void* moe_ws = nullptr;
  std::uint64_t moe_ws_bytes = 0;

  std::vector<LayerWeights> layers;
  const dbf16 *embed = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  std::uint32_t shared_base_page = 0;  // expert-page index of the first shared chunk page

  // Activations ([max_batched_tokens] rows) and per-step device inputs.
  // qkv: the fused projection's rows [q | k | v]; q: the roped queries attention reads; router_logits: the
  // fused router + shared gate GEMM's rows [E logits | gate] (ld E + 1 with a shared expert, else E).
  dbf16 *x = nullptr, *hn = nullptr, *qkv = nullptr, *q = nullptr, *att = nullptr, *o = nullptr;
  dbf16 *router_logits = nullptr, *mlp_a = nullptr, *mlp_b = nullptr;
  kd::ArgmaxPartial* argmax_ws = nullptr;
  dbf16 *xs = nullptr, *xn = nullptr, *logits = nullptr;
  float *topk_w = nullptr, *shared_w = nullptr, *inv_freq = nullptr;
  std::int32_t *topk_ids = nullptr, *tokens_d = nullptr, *positions_d = nullptr, *sample_rows_d = nullptr;
  std::int32_t *argmax_d = nullptr, *table_d = nullptr;
  std::uint64_t table_words_max = 0;

  // Pinned host staging (uploads) and readback.
  std::byte* pinned = nullptr;
  std::uint64_t pinned_bytes = 0;
  std::int32_t *h_tokens = nullptr, *h_positions = nullptr, *h_sample_rows = nullptr, *h_table = nullptr;
  std::int32_t *h_ids = nullptr, *h_argmax = nullptr;
  dbf16* h_logits = nullptr;

  // Timing events: per layer attention begin/end, MoE begin/end; the forward's begin/end.
  std::vector<cudaEvent_t> ev_att0, ev_att1, ev_moe0, ev_moe1;
  // Tensor parallelism: around layer l's two all-reduces (2l, 2l + 1).
  std::vector<cudaEvent_t> ev_ar0, ev_ar1;
  std::vector<cudaEvent_t> ev_routed;  // per layer: the router has run (a miss's copy may start)
  cudaEvent_t ev_begin = nullptr, ev_end = nullptr, ev_head0 = nullptr;

  bool gate_mode = false;
  int* gate_host = nullptr;  // mapped pinned: [0] the flag, [1] timed out
  int* gate_dev = nullptr;
  int gate_seq = 0;
  std::uint64_t gate_timeouts = 0;

  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> history;
  std::vector<std::vector<float>> last_logits;
  KvPageTable table;
  std::vector<std::uint8_t> restored;  // [moe layer][expert]: restored by this step's ChangeList
  // [moe layer]: an expert of the layer is neither resident nor restored this step, so with the model's
  // router the host must read the layer's choices back before its MoE (the loader loads the misses).
  std::vector<std::uint8_t> may_miss;
  std::vector<std::uint32_t> set_scratch;
  std::vector<std::uint8_t> flag_scratch;

  Impl(const CudaBackendConfig& c, TokenSource p) : cfg(c), hf(c.model), prompts(std::move(p)) {}
  ~Impl() { release(); }

  void release() noexcept {
    loader.reset();  // synchronises its copy stream
    store.reset();
    gemm.reset();
    if (stream) cudaStreamSynchronize(stream);
    for (auto* v : {&ev_att0, &ev_att1, &ev_moe0, &ev_moe1, &ev_routed, &ev_ar0, &ev_ar1})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    for (cudaEvent_t e : {ev_begin, ev_end, ev_head0})
      if (e) cudaEventDestroy(e);
    if (pinned) cudaFreeHost(pinned);
    if (gate_host) cudaFreeHost(gate_host);
    gate_host = nullptr;
    if (arena) cudaFree(arena);
    if (stream) cudaStreamDestroy(stream);
    pinned = nullptr;
    arena = nullptr;
    stream = nullptr;
  }

  void setup();
  void upload_weights(std::uint64_t weights_at, const WeightLayout& layout);
  std::optional<ChangeError> forward(const StepBatch& batch, const ChangeList& changes,
                                     const ResidencyTable& residency, const PoolOwners& owners,
                                     RoutingSource& routing, StepResult& out);
  // Token `position` of `request`, whose tokens so far are `h` (its history).
  std::int32_t token_at(std::vector<std::int32_t>& h, std::uint64_t request, std::uint32_t position);
  // The distinct experts in ids[0..n) (ids outside [0, E) skipped), ascending, into set_scratch.
  void distinct_experts(const std::int32_t* ids, std::size_t n);
  // hn = RMSNorm(x) over the step's `rows` rows, after x += y when y is given (one kernel).
  void add_norm(std::uint32_t rows, const dbf16* y, const dbf16* weight) {
    if (y != nullptr)
      kd::add_rms_norm_kernel<true>
          <<<rows, kd::kAddNormThreads, 0, stream>>>(x, y, weight, hn, int(H), float(hf.rms_norm_eps));
    else
      kd::add_rms_norm_kernel<false>
          <<<rows, kd::kAddNormThreads, 0, stream>>>(x, nullptr, weight, hn, int(H), float(hf.rms_norm_eps));
  }
  // f(the layer's PagedMoe in the experts' precision). The arguments are the same for all three, the
  // workspace is not: quantized layers also hold a K-permuted copy of the input (PagedMoe::workspace_size).
  template <class F>
  decltype(auto) with_moe(F&& f) {
    switch (cfg.expert_precision) {
      case ExpertPrecision::kInt8:
        return f(kn::PagedMoe<kn::Paged, kn::DefaultMoeConfig, kn::Int8>{});
      case ExpertPrecision::kInt4:
        return f(kn::PagedMoe<kn::Paged, kn::DefaultMoeConfig, kn::Int4>{});
      default:
        return f(moe);
    }
  }
  kn::Status run_moe(const kn::MoeArguments<kn::Paged>& a) {
    return with_moe([&](const auto& m) { return m.run(a, moe_ws, moe_ws_bytes, stream); });
  }

  // The per-layer phase events (attention, MoE or dense FFN, LM head): on unless AMOEBA_PHASE_EVENTS=0, an
  // experiment's switch: 4 event records per layer fewer in the launch queue, and the phases then read 0
  // (the step's time, stalls and compute_s stay measured). Not for calibrate, which needs the phases.
  bool phase_events = true;
  void record_phase(cudaEvent_t e) {
    if (phase_events) check_cuda(cudaEventRecord(e, stream), "cudaEventRecord");
  }
  // Tensor parallelism: sums this rank's partial output with the other ranks' (nothing at tp 1); `slot`
  // 2l after layer l's attention, 2l + 1 after its MoE or MLP, for the phase events around it.
  void all_reduce(dbf16* buf, std::uint64_t count, std::uint32_t slot) {
    if (cfg.shard.tp <= 1) return;
    record_phase(ev_ar0[slot]);
    cfg.collective->all_reduce_sum_bf16(buf, count, stream);
    record_phase(ev_ar1[slot]);
  }
  void gemm_run(const dbf16* xin, int M, int Kd, const dbf16* w, int N, const dbf16* bias, dbf16* y) {
    check_status(gemm->run(xin, M, Kd, w, N, bias, y, stream), "dense GEMM");
  }
  // The warm-up's run of one projection at M rows: at M <= kExactRows the fastest of cuBLASLt's first 8
  // algorithms on these operands, chosen once per process (DenseGemm::tune_once), unless AMOEBA_TUNE_GEMM=0
  // (then cuBLASLt's first: a plain run).
  void gemm_warm(const dbf16* xin, int M, int Kd, const dbf16* w, int N, const dbf16* bias, dbf16* y) {
    if (tune_gemm && M <= kd::DenseGemm::kExactRows)
      check_status(gemm->tune_once(xin, M, Kd, w, N, bias, y, stream), "dense GEMM tuning");
    else
      gemm_run(xin, M, Kd, w, N, bias, y);
  }
  bool tune_gemm = true;
};

void CudaBackend::Impl::setup() {
  // ---- shapes and host-side checks (nothing on the GPU yet)
  std::shared_ptr<const ModelWeights> full = cfg.full_weights;
  if (!full) full = serving_weights(hf, cfg.checkpoint_dir, cfg.seed);
  if (cfg.shard.tp > 1) {
    if (!cfg.collective)
      throw_config_error("--tp", cfg.shard.tp,
                         "a tensor-parallel rank needs a collective to sum its outputs");
    if (cfg.collective->tp() != cfg.shard.tp || cfg.collective->rank() != cfg.shard.rank)
      throw ConfigError("--tp", std::to_string(cfg.shard.tp),
                        fmtx("rank {}'s collective is rank {} of {}", cfg.shard.rank, cfg.collective->rank(),
                             cfg.collective->tp()));
    weights = sharded_weights(full, cfg.shard);
  } else {
    weights = full;
  }
  hf = weights->config();
  H = hf.hidden_size;
  F = hf.moe_intermediate_size;
  E = hf.num_experts;
  K = hf.top_k;
  hd = hf.head_dim;
  qd = hf.num_heads * hd;
  kvd = hf.num_kv_heads * hd;
  V = hf.vocab_size;
  moe_layers = hf.moe_layers();
  chunks = weights->shared_chunks();
  // One expert matrix as the pool pages hold it: bf16 F x H, or packed (at most the page: padded pages nest
  // KV pages).
  const std::uint64_t payload =
      cfg.expert_precision == ExpertPrecision::kBf16
          ? std::uint64_t(F) * H * 2
          : expert_quant_layout(F, H, cfg.expert_precision, "expert_precision").matrix_bytes();
  matrix_bytes = cfg.expert_precision == ExpertPrecision::kBf16 ? payload : cfg.geometry.expert_page_bytes;
  if (hd != 128)
    throw_config_error("model.head_dim", hd, "the CUDA backend's attention is built for head_dim 128");
  if (!kd::add_rms_norm_fits(int(H)))
    throw_config_error(
        "model.hidden_size", H,
        fmtx("the CUDA backend's RMSNorm needs a multiple of 8, at most {}", kd::kAddNormMaxDim));
  if (cfg.expert_precision == ExpertPrecision::kBf16 && cfg.geometry.expert_page_bytes != matrix_bytes)
    throw_config_error("geometry.expert_page_bytes", cfg.geometry.expert_page_bytes,
                       fmtx("must be one bf16 expert matrix, F x H x 2 = {} bytes", matrix_bytes));
  if (cfg.expert_precision != ExpertPrecision::kBf16) {
    if (matrix_bytes < payload || matrix_bytes % 16 != 0)
      throw_config_error("geometry.expert_page_bytes", matrix_bytes,
                         fmtx("must be a multiple of 16 holding one packed {} expert matrix ({} bytes)",
                              to_string(cfg.expert_precision), payload));
    // The quantized decode GEMV deals K out in whole k-steps (moe/precision.cuh).
    const std::uint32_t step =
        cfg.expert_precision == ExpertPrecision::kInt8 ? kn::Int8::kKStep : kn::Int4::kKStep;
    if (H % step != 0 || F % step != 0)
      throw_config_error(
          "expert_precision", std::string(to_string(cfg.expert_precision)),
          fmtx("needs hidden_size ({}) and moe_intermediate_size ({}) to be multiples of {}", H, F, step));
  }
  if (cfg.max_batched_tokens == 0 || cfg.max_seqs == 0)
    throw_config_error("max_batched_tokens", cfg.max_batched_tokens, "and max_seqs must be >= 1");
  if (cfg.load_buffer_experts > E)
    throw_config_error("load_buffer_experts", cfg.load_buffer_experts,
                       fmtx("must be <= the experts per layer ({})", E));

  const std::uint32_t T = cfg.max_batched_tokens, S = cfg.max_seqs;
  const std::uint32_t Sl = std::min(S, T);  // sequences that can sample in one step
  // ---- the arena's layout
  Carver c;
  (void)c.take(cfg.pool_bytes);  // the pool is the arena's first region: its pages index from the base
  shared_base_page = static_cast<std::uint32_t>((cfg.pool_bytes + matrix_bytes - 1) / matrix_bytes);
  c.used = std::uint64_t(shared_base_page) * matrix_bytes;
  const std::uint64_t shared_at = c.take(std::uint64_t(moe_layers) * chunks * 3 * matrix_bytes);
  mem.shared_expert_bytes = c.used - shared_at;
  // Non-expert weights: each tensor 256-byte aligned.
  const std::uint64_t weights_at = align256(c.used);
  const WeightLayout layout = weight_layout(weights->tensors());
  c.used = weights_at + layout.bytes;
  mem.weight_bytes = layout.bytes;
  router_ld = E + (chunks > 0 ? 1 : 0);
  const std::uint64_t act_begin = c.used;
  auto act = [&](std::uint64_t elems, std::uint64_t size) { return c.take(elems * size); };
  const std::uint64_t at_x = act(std::uint64_t(T) * H, 2), at_hn = act(std::uint64_t(T) * H, 2);
  const std::uint64_t at_qkv = act(std::uint64_t(T) * (qd + 2 * kvd), 2);
  const std::uint64_t at_q = act(std::uint64_t(T) * qd, 2), at_att = act(std::uint64_t(T) * qd, 2);
  const std::uint64_t at_o = act(std::uint64_t(T) * H, 2);
  const std::uint64_t at_rl = act(std::uint64_t(T) * router_ld, 2);
  const bool dense_layers = hf.num_layers > moe_layers;
  const std::uint64_t at_ma = dense_layers ? act(std::uint64_t(T) * hf.intermediate_size, 2) : 0;
  const std::uint64_t at_mb = dense_layers ? act(std::uint64_t(T) * hf.intermediate_size, 2) : 0;
  const std::uint64_t at_xs = act(std::uint64_t(Sl) * H, 2), at_xn = act(std::uint64_t(Sl) * H, 2);
  const std::uint64_t at_lg = act(std::uint64_t(Sl) * V, 2), at_amw = act(kd::argmax_workspace_bytes(Sl), 1);
  const std::uint64_t at_tw = act(std::uint64_t(moe_layers) * T * K, 4);
  const std::uint64_t at_ti = act(std::uint64_t(moe_layers) * T * K, 4);
  const std::uint64_t at_sw = act(T, 4), at_if = act(hd / 2, 4);
  const std::uint64_t at_tok = act(T, 4), at_pos = act(T, 4), at_sr = act(Sl, 4), at_am = act(Sl, 4);
  // The page table: 3 (S + 1) + S offsets and at most every KV page of the pool once.
  table_words_max = 3ull * (S + 1) + S + cfg.pool_bytes / cfg.geometry.kv_page_bytes + 16;
  const std::uint64_t at_tab = act(table_words_max, 4);
  mem.activation_bytes = c.used - act_begin;
  // Workspaces.
  const std::uint64_t ws_begin = c.used;
  kn::MoeShape ms{static_cast<int>(T), static_cast<int>(H), static_cast<int>(F),
                  static_cast<int>(E), static_cast<int>(K), static_cast<int>(chunks)};
  typename kn::PagedMoe<kn::Paged>::Arguments ma{};
  ma.shape = ms;
  moe_ws_bytes = with_moe([&](const auto& m) { return std::uint64_t(m.workspace_size(ma)); });
  const std::uint64_t at_moe = c.take(moe_ws_bytes);
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices <= cfg.device)
    throw ConfigError("--backend", "cuda",
                      e != cudaSuccess
                          ? fmtx("no usable CUDA device ({})", cudaGetErrorString(e))
                          : fmtx("device {} does not exist ({} CUDA devices)", cfg.device, devices));
  check_cuda(cudaSetDevice(cfg.device), "cudaSetDevice");
  const kn::PoolKvCache kv_shape{reinterpret_cast<void*>(256), cfg.geometry.kv_page_bytes,
                                 cfg.geometry.kTokensPerKvPage, hf.num_kv_heads, hd};
  attn_bytes = PagedAttentionRunner::workspace_size(kv_shape, hf.num_heads, S, T);
  const std::uint64_t at_attws = c.take(attn_bytes.device);
  const std::uint64_t at_gemm = c.take(kd::DenseGemm::kWorkspaceBytes);
  mem.workspace_bytes = c.used - ws_begin;
  mem.pool_bytes = cfg.pool_bytes;
  mem.arena_bytes = align256(c.used);

  // ---- the GPU: free memory first, so that a configuration that cannot fit is refused before taking any
  std::size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  mem.device_free_before = free_b;
  mem.load_buffer_bytes = 2ull * cfg.load_buffer_experts * 3 * matrix_bytes;
  const std::uint64_t need = mem.arena_bytes + mem.load_buffer_bytes + (64ull << 20);
  if (need > free_b)
    throw ConfigError("memory", fmtx("{:.2f} GB", need / 1e9),
                      fmtx("the CUDA backend needs an arena of {:.2f} GB (pool {:.2f}, shared experts "
                           "{:.2f}, weights {:.2f}, activations {:.2f}, workspaces {:.2f}) and load "
                           "buffers of {:.2f} GB; the device has {:.2f} GB free",
                           mem.arena_bytes / 1e9, mem.pool_bytes / 1e9, mem.shared_expert_bytes / 1e9,
                           mem.weight_bytes / 1e9, mem.activation_bytes / 1e9, mem.workspace_bytes / 1e9,
                           mem.load_buffer_bytes / 1e9, free_b / 1e9));
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* a = nullptr;
  check_cuda(cudaMalloc(&a, mem.arena_bytes), "cudaMalloc(arena)");
  arena = static_cast<std::byte*>(a);
  auto at = [&](std::uint64_t off) { return arena + off; };
  x = reinterpret_cast<dbf16*>(at(at_x));
  hn = reinterpret_cast<dbf16*>(at(at_hn));
  qkv = reinterpret_cast<dbf16*>(at(at_qkv));
  q = reinterpret_cast<dbf16*>(at(at_q));
  att = reinterpret_cast<dbf16*>(at(at_att));
  o = reinterpret_cast<dbf16*>(at(at_o));
  router_logits = reinterpret_cast<dbf16*>(at(at_rl));
  argmax_ws = reinterpret_cast<kd::ArgmaxPartial*>(at(at_amw));
  mlp_a = dense_layers ? reinterpret_cast<dbf16*>(at(at_ma)) : nullptr;
  mlp_b = dense_layers ? reinterpret_cast<dbf16*>(at(at_mb)) : nullptr;
  xs = reinterpret_cast<dbf16*>(at(at_xs));
  xn = reinterpret_cast<dbf16*>(at(at_xn));
  logits = reinterpret_cast<dbf16*>(at(at_lg));
  topk_w = reinterpret_cast<float*>(at(at_tw));
  topk_ids = reinterpret_cast<std::int32_t*>(at(at_ti));
  shared_w = reinterpret_cast<float*>(at(at_sw));
  inv_freq = reinterpret_cast<float*>(at(at_if));
  tokens_d = reinterpret_cast<std::int32_t*>(at(at_tok));
  positions_d = reinterpret_cast<std::int32_t*>(at(at_pos));
  sample_rows_d = reinterpret_cast<std::int32_t*>(at(at_sr));
  argmax_d = reinterpret_cast<std::int32_t*>(at(at_am));
  table_d = reinterpret_cast<std::int32_t*>(at(at_tab));
  moe_ws = at(at_moe);
  attn_dev = at(at_attws);
  gemm = std::make_unique<kd::DenseGemm>(at(at_gemm), kd::DenseGemm::kWorkspaceBytes);

  // Pinned staging: uploads (tokens, positions, sampled rows, the page table, synthetic routing), the
  // attention plan's buffer, readbacks (routing ids, argmax, logits).
  const std::uint64_t routing_elems = std::uint64_t(moe_layers) * T * K;
  std::uint64_t pin = 0;
  auto ptake = [&](std::uint64_t bytes) {
    const std::uint64_t o2 = align256(pin);
    pin = o2 + bytes;
    return o2;
  };
  const std::uint64_t p_tok = ptake(4ull * T), p_pos = ptake(4ull * T), p_sr = ptake(4ull * Sl);
  const std::uint64_t p_tab = ptake(4ull * table_words_max), p_ids = ptake(4 * routing_elems);
  const std::uint64_t p_am = ptake(4ull * Sl);
  const std::uint64_t p_lg = cfg.keep_logits ? ptake(2ull * Sl * V) : 0;
  const std::uint64_t p_attn = ptake(attn_bytes.pinned);
  pinned_bytes = align256(pin);
  void* hp = nullptr;
  check_cuda(cudaHostAlloc(&hp, pinned_bytes, cudaHostAllocDefault), "cudaHostAlloc(staging)");
  pinned = static_cast<std::byte*>(hp);
  h_tokens = reinterpret_cast<std::int32_t*>(pinned + p_tok);
  h_positions = reinterpret_cast<std::int32_t*>(pinned + p_pos);
  h_sample_rows = reinterpret_cast<std::int32_t*>(pinned + p_sr);
  h_table = reinterpret_cast<std::int32_t*>(pinned + p_tab);
  h_ids = reinterpret_cast<std::int32_t*>(pinned + p_ids);
  h_argmax = reinterpret_cast<std::int32_t*>(pinned + p_am);
  h_logits = cfg.keep_logits ? reinterpret_cast<dbf16*>(pinned + p_lg) : nullptr;
  attn_pin = pinned + p_attn;

  // Synthetic or recorded routing gives every token's k experts the weight 1 / k, whatever the step: written
  // once here (the model's router writes its own weights at every layer instead).
  if (cfg.routing != RoutingKind::kModel) {
    const std::vector<float> uniform(routing_elems, 1.0f / float(K));
    check_cuda(cudaMemcpy(topk_w, uniform.data(), 4 * routing_elems, cudaMemcpyHostToDevice),
               "routing weights");
  }

  // RoPE's inverse frequencies, as transformers computes them (float32 on the host).
  std::vector<float> inv(hd / 2);
  for (std::uint32_t j = 0; j < hd / 2; ++j) inv[j] = ops::rope_inv_freq(hf.rope_theta, j, hd);
  check_cuda(cudaMemcpy(inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice), "upload inv_freq");

  // ---- weights: the master copy of every routed expert in pinned memory, the rest on the device
  // Cached for the next backend of the same weights where the backend read them itself on one GPU.
  const bool cached = !cfg.full_weights && cfg.shard.tp == 1;
  store = expert_store(
      cached ? (cfg.checkpoint_dir.empty() ? "random:" + std::to_string(cfg.seed) + ":" + hf.architecture
                                           : "checkpoint:" + cfg.checkpoint_dir) +
                   ":" + std::string(to_string(cfg.expert_precision))
             : std::string(),
      *weights, moe_layers, E, matrix_bytes, payload, cfg.expert_precision);
  mem.pinned_host_bytes = store->bytes() + pinned_bytes;
  upload_weights(weights_at, layout);
  if (chunks > 0) {
    // The shared expert's chunks, in the routed experts' precision (one kernel reads both).
    const bool quantized = cfg.expert_precision != ExpertPrecision::kBf16;
    std::vector<std::byte> chunk(quantized ? 3ull * F * H * 2 : 0), buf(3 * matrix_bytes);
    for (std::uint32_t m = 0; m < moe_layers; ++m)
      for (std::uint32_t ch = 0; ch < chunks; ++ch) {
        if (quantized) {
          weights->read_shared_chunk(m, ch, chunk);
          quantize_expert(chunk, F, H, cfg.expert_precision, buf,
                          fmtx("shared expert chunk {} of MoE layer {}", ch, m));
        } else {
          weights->read_shared_chunk(m, ch, buf);
        }
        const std::uint64_t page = shared_base_page + (std::uint64_t(m) * chunks + ch) * 3;
        check_cuda(cudaMemcpy(arena + page * matrix_bytes, buf.data(), buf.size(), cudaMemcpyHostToDevice),
                   "upload shared expert");
      }
  }

  kn::LoaderOptions lo;
  lo.static_entries = chunks;
  loader = std::make_unique<kn::DoubleBufferLoader>(LoaderShape{moe_layers, E, cfg.load_buffer_experts},
                                                    *store, ArenaSpan{arena, cfg.pool_bytes}, stream, lo);
  if (chunks > 0) {
    std::vector<ExpertLocation> entries(chunks);
    for (std::uint32_t m = 0; m < moe_layers; ++m) {
      for (std::uint32_t ch = 0; ch < chunks; ++ch) {
        const std::uint64_t page = shared_base_page + (std::uint64_t(m) * chunks + ch) * 3;
        for (std::uint32_t j = 0; j < 3; ++j) entries[ch].page[j] = static_cast<std::int32_t>(page + j);
        entries[ch].buffer_slot = -1;
      }
      loader->set_static_entries(m, entries);
    }
  }

  auto events = [&](std::vector<cudaEvent_t>& vv) {
    vv.resize(hf.num_layers);
    for (cudaEvent_t& e : vv) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  };
  events(ev_att0);
  events(ev_att1);
  events(ev_moe0);
  events(ev_moe1);
  if (cfg.shard.tp > 1) {
    for (auto* v : {&ev_ar0, &ev_ar1}) {
      v->resize(2 * hf.num_layers);
      for (cudaEvent_t& e : *v) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    }
  }
  ev_routed.resize(hf.num_layers);
  for (cudaEvent_t& e : ev_routed)
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventCreate(&ev_begin), "cudaEventCreate");
  check_cuda(cudaEventCreate(&ev_end), "cudaEventCreate");
  check_cuda(cudaEventCreate(&ev_head0), "cudaEventCreate");
  phase_events = phase_events_from_environment();
  if (const char* g = std::getenv("AMOEBA_GATE_FORWARD"); g != nullptr && std::string(g) == "1") {
    void* gp = nullptr;
    check_cuda(cudaHostAlloc(&gp, 2 * sizeof(int), cudaHostAllocMapped), "cudaHostAlloc(gate)");
    gate_host = static_cast<int*>(gp);
    gate_host[0] = gate_host[1] = 0;
    void* gd = nullptr;
    check_cuda(cudaHostGetDevicePointer(&gd, gp, 0), "cudaHostGetDevicePointer(gate)");
    gate_dev = static_cast<int*>(gd);
    gate_mode = true;
  }
  // Every dense GEMM plan a step can need, so that no step waits for cuBLASLt's heuristic (DenseGemm).
  {
    const int Tm = static_cast<int>(T), Hi = static_cast<int>(H);
    const LayerWeights& w0 = layers.front();
    // Warm-up (it also builds every plan, exact fallbacks included): every projection runs once at every row
    // count a step can have, so that no step pays a plan (an exact fallback's heuristic query) or the first
    // launch of an algorithm's kernels (in a 60-request trace on the H200, steps with a prefill of a size not
    // seen before took 4.0 ms of attention, 1.6 ms for seen sizes, with the host blocked:
    // docs/results/calibration_h200.md). ~5 GEMMs per row count. The inputs are whatever the activation
    // buffers hold; the first forward overwrites every output before reading it.
    const dbf16* router = nullptr;
    const LayerWeights* dense = nullptr;
    for (const LayerWeights& w : layers) {
      if (w.moe >= 0 && router == nullptr) router = w.router;
      if (w.moe < 0 && dense == nullptr) dense = &w;
    }
    tune_gemm = gemm_tuning_from_environment();
    for (int M = 1; M <= Tm; ++M) {
      gemm_warm(hn, M, Hi, w0.q, int(qd + 2 * kvd), w0.q_bias, qkv);
      gemm_warm(att, M, int(qd), w0.o, Hi, nullptr, o);
      if (router != nullptr) gemm_warm(hn, M, Hi, router, int(router_ld), nullptr, router_logits);
      if (dense != nullptr) {
        const int Fd = static_cast<int>(hf.intermediate_size);
        gemm_warm(hn, M, Hi, dense->gate, Fd, nullptr, mlp_a);
        gemm_warm(mlp_a, M, Fd, dense->down, Hi, nullptr, o);
      }
    }
    for (int M = 1; M <= static_cast<int>(std::min(cfg.max_seqs, T)); ++M)
      gemm_warm(xn, M, Hi, lm_head, int(V), nullptr, logits);
  }
  restored.assign(std::size_t(moe_layers) * E, 0);
  may_miss.assign(moe_layers, 0);
  flag_scratch.assign(E, 0);
  // The whole device, not only `stream`: the uploads above are plain cudaMemcpy calls on the legacy default
  // stream, which a non-blocking stream does not wait for (a pageable copy may return before its DMA lands).
  check_cuda(cudaDeviceSynchronize(), "setup");
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  mem.device_free_after_setup = free_b;
}

void CudaBackend::Impl::upload_weights(std::uint64_t weights_at, const WeightLayout& layout) {
  std::unordered_map<std::string, const dbf16*> dev;
  std::vector<bf16> host;
  for (const WeightTensor& t : weights->tensors()) {
    const std::uint64_t off = weights_at + layout.offset.at(t.name);
    host.assign(t.elements(), bf16{});
    weights->read(t.name, host);
    check_cuda(cudaMemcpy(arena + off, host.data(), host.size() * 2, cudaMemcpyHostToDevice),
               "upload weight");
    dev[t.name] = reinterpret_cast<const dbf16*>(arena + off);
  }
  auto get = [&](const std::string& name, bool required = true) -> const dbf16* {
    auto it = dev.find(name);
    if (it == dev.end()) {
      if (required) throw std::logic_error("cuda backend: weight " + name + " was not uploaded");
      return nullptr;
    }
    return it->second;
  };
  // The fused GEMMs read `next` right after `first`'s `rows` rows of `cols` (weight_layout put it there).
  auto follows = [&](const dbf16* first, std::uint64_t rows, std::uint64_t cols, const std::string& next) {
    const dbf16* n = get(next, first != nullptr);
    if (n != nullptr && n != first + rows * cols)
      throw std::logic_error("cuda backend: " + next + " does not follow the tensor before it in the arena");
  };
  embed = get("model.embed_tokens.weight");
  final_norm = get("model.norm.weight");
  lm_head = hf.tie_word_embeddings ? embed : get("lm_head.weight");
  layers.resize(hf.num_layers);
  std::int32_t m = 0;
  for (std::uint32_t l = 0; l < hf.num_layers; ++l) {
    const std::string p = fmtx("model.layers.{}.", l);
    LayerWeights& w = layers[l];
    w.in_norm = get(p + "input_layernorm.weight");
    w.post_norm = get(p + "post_attention_layernorm.weight");
    w.q = get(p + "self_attn.q_proj.weight");
    follows(w.q, qd, H, p + "self_attn.k_proj.weight");
    follows(w.q + std::uint64_t(qd) * H, kvd, H, p + "self_attn.v_proj.weight");
    w.o = get(p + "self_attn.o_proj.weight");
    w.q_bias = get(p + "self_attn.q_proj.bias", hf.qkv_bias);
    follows(w.q_bias, qd, 1, p + "self_attn.k_proj.bias");
    follows(w.q_bias ? w.q_bias + qd : nullptr, kvd, 1, p + "self_attn.v_proj.bias");
    w.q_norm = get(p + "self_attn.q_norm.weight", hf.qk_norm);
    w.k_norm = get(p + "self_attn.k_norm.weight", hf.qk_norm);
    if (hf.is_moe_layer(l)) {
      w.moe = m++;
      w.router = get(p + "mlp.gate.weight");
      if (chunks > 0) follows(w.router, E, H, p + "mlp.shared_expert_gate.weight");
    } else {
      w.gate = get(p + "mlp.gate_proj.weight");
      w.up = get(p + "mlp.up_proj.weight");
      w.down = get(p + "mlp.down_proj.weight");
    }
  }
}

std::int32_t CudaBackend::Impl::token_at(std::vector<std::int32_t>& h, std::uint64_t request,
                                         std::uint32_t position) {
  if (position < h.size()) return h[position];
  if (position != h.size())
    throw std::logic_error(fmtx("cuda backend: request {} computes position {} but knows {} tokens", request,
                                position, h.size()));
  const std::int32_t t = prompts(request, position);
  if (t < 0 || std::uint32_t(t) >= V)
    throw_config_error(fmtx("prompt token {} of request {}", position, request), t,
                       fmtx("must be in [0, vocab_size = {})", V));
  h.push_back(t);
  return t;
}

void CudaBackend::Impl::distinct_experts(const std::int32_t* ids, std::size_t n) {
  std::fill(flag_scratch.begin(), flag_scratch.end(), 0);
  for (std::size_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && std::uint32_t(ids[i]) < E) flag_scratch[ids[i]] = 1;
  set_scratch.clear();
  for (std::uint32_t e = 0; e < E; ++e)
    if (flag_scratch[e]) set_scratch.push_back(e);
}

std::optional<ChangeError> CudaBackend::Impl::forward(const StepBatch& batch, const ChangeList& changes,
                                                      const ResidencyTable& residency,
                                                      const PoolOwners& owners, RoutingSource& routing,
                                                      StepResult& out) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  out.clear();
  if (cfg.shard.tp > 1) check_cuda(cudaSetDevice(cfg.device), "cudaSetDevice");  // the rank's thread
  if (cfg.routing == RoutingKind::kModel && routing.kind() != RoutingKind::kModel)
    throw std::logic_error("cuda backend: configured for the model's router, given a non-model source");
  if (batch.tokens > cfg.max_batched_tokens || batch.size() > cfg.max_seqs)
    throw std::logic_error(
        fmtx("cuda backend: a step of {} tokens / {} sequences exceeds the sizes it "
             "was built for ({} / {})",
             batch.tokens, batch.size(), cfg.max_batched_tokens, cfg.max_seqs));
  if (auto e = loader->begin_forward(changes, residency, owners)) return e;
  const LoadStats ls0 = loader->stats();
  const kn::LoaderDeviceStats ds0 = loader->device_stats();
  double stall0 = 0;
  for (double s : ds0.stall_ms_per_layer) stall0 += s;

  // ---- host inputs
  const std::uint32_t T = static_cast<std::uint32_t>(batch.tokens);
  std::uint32_t row = 0, samples = 0;
  for (const SequenceStep& s : batch.seqs) {
    std::vector<std::int32_t>& h = history[s.request];
    for (std::uint32_t p = s.context_before; p < s.context_after(); ++p, ++row) {
      h_tokens[row] = token_at(h, s.request, p);
      h_positions[row] = static_cast<std::int32_t>(p);
    }
    if (s.samples) h_sample_rows[samples++] = static_cast<std::int32_t>(row - 1);
  }
  if (auto err = table.assign(batch)) throw std::logic_error("cuda backend: page table: " + *err);
  const auto words = table.words();
  if (words.size() > table_words_max)
    throw std::logic_error("cuda backend: page table larger than its buffer");
  std::memcpy(h_table, words.data(), words.size_bytes());
  // Which experts this step's ChangeList restores (their pages are written during this forward).
  for (const Restore& r : changes.restores) restored[std::size_t(r.expert.layer) * E + r.expert.expert] = 1;
  const bool synthetic = cfg.routing != RoutingKind::kModel;
  bool any_may_miss = false;
  for (std::uint32_t m = 0; m < moe_layers; ++m) {
    may_miss[m] = 0;
    for (std::uint32_t e = 0; e < E && !may_miss[m]; ++e)
      may_miss[m] = !residency.is_resident({m, e}) && !restored[std::size_t(m) * E + e];
    any_may_miss |= may_miss[m] != 0;
  }
  // The measurement gate, where nothing inside the forward waits for the GPU (no router readback).
  const bool gated = gate_mode && (synthetic || !any_may_miss);
  if (gated) {
    gate_kernel<<<1, 1, 0, stream>>>(gate_dev, ++gate_seq, gate_dev + 1, 500'000'000ull);
    check_cuda(cudaGetLastError(), "gate_kernel");
  }
  check_cuda(cudaEventRecord(ev_begin, stream), "cudaEventRecord");
  check_cuda(cudaMemcpyAsync(tokens_d, h_tokens, 4ull * T, cudaMemcpyHostToDevice, stream), "upload tokens");
  check_cuda(cudaMemcpyAsync(positions_d, h_positions, 4ull * T, cudaMemcpyHostToDevice, stream),
             "upload pos");
  if (samples)
    check_cuda(cudaMemcpyAsync(sample_rows_d, h_sample_rows, 4ull * samples, cudaMemcpyHostToDevice, stream),
               "upload sampled rows");
  check_cuda(cudaMemcpyAsync(table_d, h_table, words.size_bytes(), cudaMemcpyHostToDevice, stream),
             "upload page table");
  const KvPageTableView dview = table.view(table_d);
  const kn::PoolKvCache kv{arena, cfg.geometry.kv_page_bytes, cfg.geometry.kTokensPerKvPage, hf.num_kv_heads,
                           hd};
  // What QkvPrologue reads and writes, the same in every layer but for the layer and its norms.
  kn::QkvPrologueArguments pa{};
  pa.qkv = qkv;
  pa.ld = qd + 2 * kvd;
  pa.heads = hf.num_heads;
  pa.q_out = q;
  pa.eps = float(hf.rms_norm_eps);
  pa.positions = positions_d;
  pa.inv_freq = inv_freq;
  pa.kv = kv;
  pa.table = dview;
  check_status(attention.plan(kv, hf.num_heads, dview, table.host_view(), attn_dev, attn_bytes.device,
                              attn_pin, attn_bytes.pinned, q, att, stream),
               "attention plan");

  // Synthetic or recorded routing: each token takes k experts of the layer's set, round robin, so that the
  // tokens together route to exactly the set when k <= |set| <= T x k (weights 1 / k, written at setup).
  if (synthetic) {
    for (std::uint32_t m = 0; m < moe_layers; ++m) {
      const auto set = routing.layer_experts(m);
      std::int32_t* ids = h_ids + std::size_t(m) * T * K;
      for (std::uint32_t i = 0; i < T * K; ++i)
        ids[i] = set.empty() ? -1 : static_cast<std::int32_t>(set[i % set.size()]);
    }
    // Layer m's ids sit at [m][T][K] in both the host and the device buffers.
    check_cuda(cudaMemcpyAsync(topk_ids, h_ids, 4ull * moe_layers * T * K, cudaMemcpyHostToDevice, stream),
               "upload routing");
  }

  // ---- the layers
  const int Ti = static_cast<int>(T);
  kd::embed_kernel<<<T, 256, 0, stream>>>(embed, tokens_d, x, static_cast<int>(H));
  const int ew_blocks = static_cast<int>(std::min<std::uint64_t>((std::uint64_t(T) * H + 255) / 256, 4096));
  for (std::uint32_t l = 0; l < hf.num_layers; ++l) {
    const LayerWeights& w = layers[l];
    if (w.moe >= 0)
      if (auto e = loader->prefetch(static_cast<std::uint32_t>(w.moe), {}))
        throw std::logic_error("cuda backend: prefetch: " + e->message);
    record_phase(ev_att0[l]);
    // RMSNorm of x, with the previous layer's residual add (x += o) in the same kernel after the first layer.
    add_norm(T, l > 0 ? o : nullptr, w.in_norm);
    gemm_run(hn, Ti, int(H), w.q, int(qd + 2 * kvd), w.q_bias, qkv);  // q, k, v (and biases): one matrix
    pa.q_norm = w.q_norm;
    pa.k_norm = w.k_norm;
    pa.layer = l;
    check_status(kn::QkvPrologue::run(pa, stream), "q/k norm, RoPE, K/V append");
    check_status(attention.run(l, stream), "paged attention");
    gemm_run(att, Ti, int(qd), w.o, int(H), nullptr, o);
    all_reduce(o, std::uint64_t(T) * H, 2 * l);  // o_proj is row-parallel: the ranks' partial sums
    add_norm(T, o, w.post_norm);
    record_phase(ev_att1[l]);
    if (w.moe >= 0) {
      const std::uint32_t m = static_cast<std::uint32_t>(w.moe);
      std::int32_t* ids = topk_ids + std::size_t(m) * T * K;
      float* wts = topk_w + std::size_t(m) * T * K;
      // The router and the shared expert's gate: one GEMM (the gate is its last column), one kernel.
      gemm_run(hn, Ti, int(H), w.router, int(router_ld), nullptr, router_logits);
      if (!synthetic) {
        check_status(kd::router_topk(router_logits, Ti, int(E), int(router_ld), int(K), hf.norm_topk_prob,
                                     ids, wts, chunks > 0 ? shared_w : nullptr, stream),
                     "router");
      } else if (chunks > 0) {
        check_status(kd::shared_gate(router_logits, Ti, int(router_ld), int(E), shared_w, stream),
                     "shared expert gate");
      }
      // A miss's copy starts no earlier than this point of the compute stream, whatever the routing source:
      // synthetic routing is known on the host before the GPU gets here, and loading its misses earlier would
      // be a perfect prefetch that no router allows (the simulator prices a miss from this point too).
      check_cuda(cudaEventRecord(ev_routed[l], stream), "cudaEventRecord");
      // The routed set: known on the host for synthetic routing; from the router otherwise, and then read
      // back here only if the layer may miss (an expert neither resident nor restored this step).
      set_scratch.clear();
      if (synthetic) {
        const auto set = routing.layer_experts(m);
        set_scratch.assign(set.begin(), set.end());
      } else if (may_miss[m]) {
        check_cuda(cudaMemcpyAsync(h_ids + std::size_t(m) * T * K, ids, 4ull * T * K, cudaMemcpyDeviceToHost,
                                   stream),
                   "routing readback");
        check_cuda(cudaStreamSynchronize(stream), "routing readback");
        distinct_experts(h_ids + std::size_t(m) * T * K, std::size_t(T) * K);
      }
      auto lw = loader->prepare_layer(
          m, std::span<const std::uint32_t>(set_scratch.data(), set_scratch.size()), ev_routed[l]);
      if (!lw) throw std::logic_error("cuda backend: " + lw.error().message);
      record_phase(ev_moe0[l]);
      typename kn::PagedMoe<kn::Paged>::Arguments ma{};
      ma.shape = kn::MoeShape{Ti, int(H), int(F), int(E), int(K), int(chunks)};
      ma.input = hn;
      ma.topk_ids = ids;
      ma.topk_weights = wts;
      ma.shared_weights = chunks > 0 ? shared_w : nullptr;
      ma.output = o;
      ma.weights = kn::Paged::Arguments{lw->pool_base, lw->load_buffer, lw->locations};
      ma.matrix_stride_bytes = static_cast<long long>(matrix_bytes);
      check_status(run_moe(ma), "paged MoE");
      loader->layer_done(m);
    } else {
      record_phase(ev_moe0[l]);
      const int Fd = static_cast<int>(hf.intermediate_size);
      gemm_run(hn, Ti, int(H), w.gate, Fd, nullptr, mlp_a);
      gemm_run(hn, Ti, int(H), w.up, Fd, nullptr, mlp_b);
      kd::silu_mul_kernel<<<ew_blocks, 256, 0, stream>>>(mlp_a, mlp_b, mlp_a, std::int64_t(T) * Fd);
      gemm_run(mlp_a, Ti, Fd, w.down, int(H), nullptr, o);
    }
    all_reduce(o, std::uint64_t(T) * H, 2 * l + 1);  // W2 / down_proj are row-parallel
    // The residual add x += o is the next layer's first kernel (add_norm); after the last layer, here.
    if (l + 1 == hf.num_layers) kd::add_kernel<<<ew_blocks, 256, 0, stream>>>(x, o, std::int64_t(T) * H);
    check_cuda(cudaGetLastError(), "layer epilogue kernels");
    record_phase(ev_moe1[l]);
  }

  // ---- the sampled rows: final norm, LM head, argmax
  record_phase(ev_head0);
  if (samples > 0) {
    check_status(kd::gather_rows(x, sample_rows_d, int(samples), int(H), xs, stream), "gather sampled rows");
    kd::rms_norm_kernel<<<samples, 256, 0, stream>>>(xs, final_norm, xn, int(H), float(hf.rms_norm_eps));
    gemm_run(xn, int(samples), int(H), lm_head, int(V), nullptr, logits);
    check_cuda(kd::argmax_rows(logits, int(samples), int(V), argmax_ws, argmax_d, stream), "LM head kernels");
    check_cuda(cudaMemcpyAsync(h_argmax, argmax_d, 4ull * samples, cudaMemcpyDeviceToHost, stream),
               "argmax readback");
    if (cfg.keep_logits)
      check_cuda(cudaMemcpyAsync(h_logits, logits, 2ull * samples * V, cudaMemcpyDeviceToHost, stream),
                 "logits readback");
  }
  // The routing the model chose, for the adjuster (layers read back above are not read again).
  if (!synthetic)
    for (std::uint32_t m = 0; m < moe_layers; ++m)
      if (!may_miss[m])
        check_cuda(cudaMemcpyAsync(h_ids + std::size_t(m) * T * K, topk_ids + std::size_t(m) * T * K,
                                   4ull * T * K, cudaMemcpyDeviceToHost, stream),
                   "routing readback");
  check_cuda(cudaEventRecord(ev_end, stream), "cudaEventRecord");
  out.host_s = std::chrono::duration<double>(clock::now() - t0).count();
  if (gated) reinterpret_cast<volatile int*>(gate_host)[0] = gate_seq;
  (void)loader->end_forward();  // synchronises both streams
  if (gated && gate_host[1] != 0) {
    gate_host[1] = 0;
    if (gate_timeouts++ == 0)
      std::fprintf(stderr,
                   "amoeba: AMOEBA_GATE_FORWARD: the gate opened on its timeout (a launch queue too "
                   "short to hold a forward); compute_ms of such steps include launch gaps\n");
  }
  for (const Restore& r : changes.restores) restored[std::size_t(r.expert.layer) * E + r.expert.expert] = 0;

  // ---- results
  std::uint32_t si = 0;
  last_logits.clear();
  for (const SequenceStep& s : batch.seqs) {
    if (!s.samples) continue;
    history[s.request].push_back(h_argmax[si]);
    if (cfg.keep_logits) {
      std::vector<float>& lg = last_logits.emplace_back(V);
      for (std::uint32_t i = 0; i < V; ++i) lg[i] = __bfloat162float(h_logits[std::size_t(si) * V + i]);
    }
    ++si;
  }
  const LoadStats ls1 = loader->stats();
  const kn::LoaderDeviceStats& ds1 = loader->device_stats();
  double stall1 = 0;
  for (double s : ds1.stall_ms_per_layer) stall1 += s;
  for (std::uint32_t m = 0; m < moe_layers; ++m) {
    distinct_experts(h_ids + std::size_t(m) * T * K, std::size_t(T) * K);
    out.add_routed(std::span<const std::uint32_t>(set_scratch.data(), set_scratch.size()));
    for (std::uint32_t e : set_scratch) {
      ++out.expert_touches;
      if (residency.is_resident({m, e})) ++out.expert_hits;
    }
  }
  out.h2d_bytes = ds1.bytes_h2d - ds0.bytes_h2d;
  out.copy_calls = ds1.copy_calls - ds0.copy_calls;
  out.restores_copied = ls1.restores - ls0.restores;
  out.prefetches = ls1.prefetches - ls0.prefetches;
  out.on_demand = ls1.on_demand_misses - ls0.on_demand_misses;
  out.expert_misses = out.on_demand;
  out.expert_prefetched = out.expert_touches - out.expert_hits - out.expert_misses;
  out.wasted_prefetches = ls1.prefetch_wasted - ls0.prefetch_wasted;
  float ms = 0;
  for (std::uint32_t l = 0; phase_events && l < hf.num_layers; ++l) {
    check_cuda(cudaEventElapsedTime(&ms, ev_att0[l], ev_att1[l]), "cudaEventElapsedTime");
    out.attention_s += ms * 1e-3;
    check_cuda(cudaEventElapsedTime(&ms, ev_moe0[l], ev_moe1[l]), "cudaEventElapsedTime");
    (layers[l].moe >= 0 ? out.moe_s : out.dense_s) += ms * 1e-3;
    for (std::uint32_t k = 2 * l; cfg.shard.tp > 1 && k < 2 * l + 2; ++k) {
      check_cuda(cudaEventElapsedTime(&ms, ev_ar0[k], ev_ar1[k]), "cudaEventElapsedTime");
      out.allreduce_s += ms * 1e-3;
    }
  }
  if (phase_events) {
    check_cuda(cudaEventElapsedTime(&ms, ev_head0, ev_end), "cudaEventElapsedTime");
    out.dense_s += ms * 1e-3;
  }
  out.stall_s = (stall1 - stall0) * 1e-3;
  check_cuda(cudaEventElapsedTime(&ms, ev_begin, ev_end), "cudaEventElapsedTime");
  out.compute_s = ms * 1e-3 - out.stall_s;
  out.copy_s = 0;  // the copy engine's busy time is not measured separately (stall_s is what it costs)
  out.step_s = std::chrono::duration<double>(clock::now() - t0).count();
  return std::nullopt;
}

// ---- CudaBackend

CudaBackend::CudaBackend(const CudaBackendConfig& config, TokenSource prompts)
    : impl_(std::make_unique<Impl>(config, std::move(prompts))) {
  impl_->setup();
}
CudaBackend::~CudaBackend() = default;
CudaBackend::CudaBackend(CudaBackend&&) noexcept = default;
CudaBackend& CudaBackend::operator=(CudaBackend&&) noexcept = default;

std::optional<ChangeError> CudaBackend::forward_impl(const StepBatch& batch, const ChangeList& changes,
                                                     const ResidencyTable& residency,
                                                     const PoolOwners& owners, RoutingSource& routing,
                                                     StepResult& out) {
  return impl_->forward(batch, changes, residency, owners, routing, out);
}

void CudaBackend::populate(const ResidencyTable& residency) {
  Impl& d = *impl_;
  if (d.cfg.shard.tp > 1) check_cuda(cudaSetDevice(d.cfg.device), "cudaSetDevice");  // the rank's thread
  residency.for_each_resident([&](ExpertKey key, const ExpertPages& pages) {
    for (ExpertMatrix m : kExpertMatrices)
      check_cuda(cudaMemcpyAsync(d.arena + std::uint64_t(pages[m].index) * d.matrix_bytes,
                                 d.store->matrix(key, m), d.matrix_bytes, cudaMemcpyHostToDevice, d.stream),
                 "populate");
  });
  check_cuda(cudaStreamSynchronize(d.stream), "populate");
}

std::span<const std::int32_t> CudaBackend::tokens(std::uint64_t request) const {
  auto it = impl_->history.find(request);
  if (it == impl_->history.end()) return {};
  return it->second;
}

void CudaBackend::release(std::uint64_t request) {
  if (!impl_->cfg.keep_tokens) impl_->history.erase(request);
}

void CudaBackend::replace_last_token(std::uint64_t request, std::int32_t token) {
  auto it = impl_->history.find(request);
  if (it == impl_->history.end() || it->second.empty())
    throw_config_error("request", request, "has no token to replace");
  if (token < 0 || std::uint32_t(token) >= impl_->V)
    throw_config_error("token", token, fmtx("must be in [0, vocab_size = {})", impl_->V));
  it->second.back() = token;
}

const std::vector<std::vector<float>>& CudaBackend::last_logits() const {
  return impl_->last_logits;
}
const CudaMemoryReport& CudaBackend::memory() const {
  return impl_->mem;
}
const CudaBackendConfig& CudaBackend::config() const {
  return impl_->cfg;
}

std::uint64_t CudaMemoryReport::device_free_now() const {
  std::size_t f = 0, t = 0;
  return cudaMemGetInfo(&f, &t) == cudaSuccess ? f : 0;
}

bool cuda_backend_available() noexcept {
  return true;
}

}  // namespace amoeba::engine
