// Paged attention over the unified pool's KV pages, through FlashInfer's header-only kernels (batch decode
// and causal batch prefill over paged KV; flashinfer-python 0.7.2.post1, cmake/FlashInfer.cmake), as a
// CUTLASS-style device adapter:
//   Arguments → can_implement() (a Status naming the bad field) → workspace_size() → plan(host table,
//   caller's workspace) once per step → run(stream) once per attention layer.
//
// The KV cache needs no copy and no page-id translation: a KV page handle's index times the page size is its
// byte offset in the pool's arena (amoeba/pool/page_kinds.hpp), so FlashInfer's paged_kv_t is pointed at the
// arena itself (k_data = arena base, v_data = arena base + one K block, stride_page = page bytes / 2) and the
// handle indices are its page indices. K and V share one set of strides, which FlashInfer's decode kernel
// requires (it addresses V with K's strides). Offsets are computed in size_t, so arenas past 2^32 elements
// work; page ids are int32.
//
// One step's batch (amoeba/engine/kv_page_table.hpp) = a leading run of one-token sequences (decode) and the
// rest (prefill chunks appended after a cached prefix, causal). AttentionSchedule::kSplit runs the first
// through FlashInfer's decode kernel and the rest through its prefill kernel; kPrefillOnly runs everything
// through the prefill kernel in one launch; kAuto (the default) picks by what was measured on the H200
// (docs/results/attention_h200.md): the decode kernel only for an all-decode step without GQA grouping.
//
// No hidden allocations: the plan needs a device workspace and a pinned host buffer, both the caller's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

// FlashInfer (third party): decode.cuh defines the decode kernel that the plan's work estimation queries.
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>

#include "amoeba/core/host_device.hpp"
#include "amoeba/engine/kv_page_table.hpp"
#include "attention/pool_kv_cache.cuh"
#include "moe/moe_shape.hpp"  // Status

namespace amoeba::kernels {

using bf16 = __nv_bfloat16;

static_assert(std::is_trivially_copyable_v<KvPageTableView>);

enum class AttentionSchedule : std::uint8_t {
  kAuto,         // resolve_schedule() below
  kSplit,        // decode kernel for the leading one-token sequences, prefill kernel for the rest
  kPrefillOnly,  // the prefill kernel for every sequence
};

// kAuto's rule, from the H200 measurements (docs/results/attention_h200.md, bf16, head dim 128):
//  - GQA group > 1 (Qwen3-30B-A3B, 8 q heads per kv head): the decode kernel works on CUDA cores and reached
//    24-36% of the read bandwidth where the prefill kernel (tensor cores) reached 65-93% at >= 32 sequences;
//    the prefill kernel was 1.3-2.6x faster in every case measured.
//  - group 1 (Qwen1.5-MoE), every sequence decoding: the decode kernel was 1.01-1.29x faster (both at 91-100%
//  of
//    the read bandwidth from 32 sequences x 2048 tokens on).
//  - a mixed step: one prefill launch beat decode + prefill launches in every case measured (1.03-1.27x for
//    group 1): the two launches run one after the other and the lone chunk fills only part of the GPU.
// Groups 2-6 were not measured; they follow the group-8 rule.
constexpr AttentionSchedule resolve_schedule(AttentionSchedule s, std::uint32_t group,
                                             std::uint32_t decode_sequences,
                                             std::uint32_t sequences) noexcept {
  if (s != AttentionSchedule::kAuto) return s;
  return group == 1 && decode_sequences == sequences ? AttentionSchedule::kSplit
                                                     : AttentionSchedule::kPrefillOnly;
}
static_assert(resolve_schedule(AttentionSchedule::kAuto, 1, 32, 32) == AttentionSchedule::kSplit);
static_assert(resolve_schedule(AttentionSchedule::kAuto, 1, 32, 33) == AttentionSchedule::kPrefillOnly);
static_assert(resolve_schedule(AttentionSchedule::kAuto, 8, 32, 32) == AttentionSchedule::kPrefillOnly);
static_assert(resolve_schedule(AttentionSchedule::kSplit, 8, 32, 33) == AttentionSchedule::kSplit);

// Caller-provided memory for one plan: `device` (cudaMalloc'd, 256-byte aligned) and `pinned` (host memory
// from cudaHostAlloc). The plan copies from `pinned` to `device` asynchronously on the plan's stream, so
// `pinned` may be rewritten (by the next plan) only once that stream has passed this plan.
struct AttentionWorkspace {
  void* device = nullptr;
  std::size_t device_bytes = 0;
  void* pinned = nullptr;
  std::size_t pinned_bytes = 0;
};
struct AttentionWorkspaceSize {
  std::size_t device_bytes = 0;
  std::size_t pinned_bytes = 0;
};

// HeadDim is compile time (FlashInfer's kernels are templates over it); Qwen1.5-MoE, Qwen3-30B-A3B and
// Mixtral all use 128.
template <std::uint32_t HeadDim = 128>
class PagedAttention {
  static_assert(HeadDim == 64 || HeadDim == 128 || HeadDim == 256,
                "FlashInfer's paged kernels: 64, 128 or 256");

 public:
  static constexpr std::uint32_t kHeadDim = HeadDim;

  struct Arguments {
    PoolKvCache kv;
    std::uint32_t qo_heads = 0;
    const bf16* q =
        nullptr;        // [table.tokens][qo_heads][HeadDim], sequences' rows in batch order (RoPE applied)
    bf16* o = nullptr;  // same shape
    KvPageTableView table;    // this step's page table, read through a DEVICE copy of KvPageTable::words()
    std::uint32_t layer = 0;  // attention layer: its page ids are table.layer_indices(layer)
    float sm_scale = 0.0f;    // 0: 1 / sqrt(HeadDim)
    AttentionSchedule schedule = AttentionSchedule::kAuto;
  };

  // Everything that can be checked without the GPU.
  static Status can_implement(const Arguments& a) {
    if (Status st = a.kv.check(); !st) return st;
    if (a.kv.head_dim != HeadDim)
      return Status::error(
          "kv.head_dim", a.kv.head_dim,
          "unsupported head dim: this PagedAttention is built for " + std::to_string(HeadDim));
    if (a.qo_heads == 0) return Status::error("qo_heads", 0, "must be >= 1");
    if (a.qo_heads % a.kv.kv_heads != 0)
      return Status::error("qo_heads", a.qo_heads,
                           "must be a multiple of kv.kv_heads = " + std::to_string(a.kv.kv_heads));
    if (!supported_group(a.qo_heads / a.kv.kv_heads))
      return Status::error("qo_heads / kv.kv_heads", a.qo_heads / a.kv.kv_heads,
                           "must be 1, 2, 3, 4, 6, 8 or 16 (FlashInfer's decode dispatch)");
    const KvPageTableView& t = a.table;
    if (t.decode_sequences > t.sequences)
      return Status::error("table.decode_sequences", t.decode_sequences,
                           "must be <= table.sequences = " + std::to_string(t.sequences));
    if (t.sequences == 0) return Status::success();  // nothing to do
    if (t.tokens_per_page != a.kv.tokens_per_page)
      return Status::error("table.tokens_per_page", t.tokens_per_page,
                           "must equal kv.tokens_per_page = " + std::to_string(a.kv.tokens_per_page));
    if (a.layer >= t.attention_layers)
      return Status::error("layer", a.layer,
                           "must be < table.attention_layers = " + std::to_string(t.attention_layers));
    // FlashInfer forms page_iter * page_size in 32 bits.
    if (t.pages_per_layer * t.tokens_per_page > 0xffffffffull)
      return Status::error("table.pages_per_layer", static_cast<long long>(t.pages_per_layer),
                           "pages_per_layer * tokens_per_page must be < 2^32");
    if (t.kv_indptr == nullptr || t.kv_last_page_len == nullptr || t.qo_indptr == nullptr ||
        t.prefill_qo_indptr == nullptr || t.kv_indices == nullptr)
      return Status::error("table", "every array must point at the device copy of the table");
    if (a.q == nullptr) return Status::error("q", "must not be null");
    if (a.o == nullptr) return Status::error("o", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(a.q) % 16 != 0) return Status::error("q", "must be 16-byte aligned");
    if (reinterpret_cast<std::uintptr_t>(a.o) % 16 != 0) return Status::error("o", "must be 16-byte aligned");
    if (!(a.sm_scale >= 0.0f) || !std::isfinite(a.sm_scale))
      return Status::error("sm_scale", "must be finite and >= 0 (0 picks 1/sqrt(head_dim))");
    return Status::success();
  }

  // Device and pinned bytes that plan() needs for any batch of a.table.sequences sequences and a.table.tokens
  // query rows (an upper bound of what FlashInfer's planner may ask for; monotone in both, so a workspace
  // sized for the largest step serves every step). Reads the device's SM count: needs a CUDA device.
  static AttentionWorkspaceSize workspace_size(const Arguments& a) {
    const Layout l = layout(a, sm_count());
    return {l.device_total, l.pinned_total};
  }

  // Plans the step on the host (FlashInfer's DecodePlan / PrefillPlan: split-KV chunking, tile sizes), writes
  // the plan into the workspace and queues its copy to the device on `stream`. `host` is the same table as
  // a.table, read through host memory (KvPageTable::host_view()). Needs a CUDA device; not capturable into a
  // CUDA graph (it reads the batch on the host). Runs of any layer may follow.
  Status plan(const Arguments& a, const KvPageTableView& host, const AttentionWorkspace& ws,
              cudaStream_t stream) {
    planned_ = false;
    if (Status st = can_implement(a); !st) return st;
    if (host.sequences != a.table.sequences || host.decode_sequences != a.table.decode_sequences ||
        host.tokens != a.table.tokens || host.pages_per_layer != a.table.pages_per_layer)
      return Status::error("host",
                           "must describe the same table as a.table (sequences, tokens, pages differ)");
    if (a.table.sequences > 0 &&
        (host.kv_indptr == nullptr || host.qo_indptr == nullptr || host.prefill_qo_indptr == nullptr))
      return Status::error("host", "must point at the host copy of the table");
    const Layout l = layout(a, sm_count());
    if (ws.device_bytes < l.device_total)
      return Status::error("workspace.device_bytes", static_cast<long long>(ws.device_bytes),
                           "must be >= workspace_size().device_bytes = " + std::to_string(l.device_total));
    if (ws.pinned_bytes < l.pinned_total)
      return Status::error("workspace.pinned_bytes", static_cast<long long>(ws.pinned_bytes),
                           "must be >= workspace_size().pinned_bytes = " + std::to_string(l.pinned_total));
    if (l.device_total > 0 && ws.device == nullptr)
      return Status::error("workspace.device", "must not be null");
    if (l.pinned_total > 0 && ws.pinned == nullptr)
      return Status::error("workspace.pinned", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(ws.device) % 256 != 0)
      return Status::error("workspace.device", "must be 256-byte aligned");

    args_ = a;
    layout_ = l;
    ws_ = ws;
    const Split sp = split(a);
    auto* dev = static_cast<unsigned char*>(ws.device);
    auto* pin = static_cast<unsigned char*>(ws.pinned);
    try {
      if (sp.decode > 0) {
        Status st = dispatch_group(a.qo_heads / a.kv.kv_heads, [&](auto group) {
          constexpr std::uint32_t kGroup = decltype(group)::value;
          auto estimate =
              flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<kGroup, HeadDim, kPos,
                                                                              DecodeVariant, DecodeParams>;
          return cuda_status(
              flashinfer::DecodePlan<HeadDim, kPos, DecodeVariant, DecodeParams>(
                  dev + l.float_at, l.float_bytes, dev + l.decode_int_at, pin + l.decode_pinned_at,
                  l.decode_int_bytes, decode_plan_, const_cast<std::int32_t*>(host.kv_indptr), sp.decode,
                  a.qo_heads, a.kv.tokens_per_page, /*enable_cuda_graph=*/false, stream, estimate),
              "flashinfer::DecodePlan");
        });
        if (!st) return st;
      }
      if (sp.prefill > 0) {
        const std::int32_t* qo = sp.decode > 0 ? host.prefill_qo_indptr : host.qo_indptr;
        Status st = cuda_status(
            flashinfer::PrefillPlan<std::int32_t>(
                dev + l.float_at, l.float_bytes, dev + l.prefill_int_at, pin + l.prefill_pinned_at,
                l.prefill_int_bytes, prefill_plan_, const_cast<std::int32_t*>(qo),
                const_cast<std::int32_t*>(host.kv_indptr + sp.decode),
                static_cast<std::uint32_t>(qo[sp.prefill]), sp.prefill, a.qo_heads, a.kv.kv_heads, HeadDim,
                HeadDim, a.kv.tokens_per_page,
                /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/sizeof(bf16), /*window_left=*/-1,
                /*fixed_split_size=*/-1, /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                /*uniform_q_len=*/0, stream, /*kv_dtype_bytes=*/sizeof(bf16)),
            "flashinfer::PrefillPlan");
        if (!st) return st;
        if (prefill_plan_.cta_tile_q != 16 && prefill_plan_.cta_tile_q != 64 &&
            prefill_plan_.cta_tile_q != 128)
          return Status::error("flashinfer::PrefillPlan", prefill_plan_.cta_tile_q,
                               "chose a query tile this adapter does not instantiate (16, 64, 128)");
      }
    } catch (const std::exception& e) {
      return Status::error("plan", e.what());
    }
    planned_ = true;
    return Status::success();
  }

  // Runs the planned step for the planned arguments.
  Status run(cudaStream_t stream) const { return run(args_, stream); }

  // Runs the planned step with other arguments of the same batch: another layer, other q/o buffers.
  Status run(const Arguments& a, cudaStream_t stream) const {
    if (!planned_) return Status::error("plan", "run() needs a successful plan() first");
    if (a.table.sequences != args_.table.sequences ||
        a.table.decode_sequences != args_.table.decode_sequences || a.table.tokens != args_.table.tokens ||
        a.qo_heads != args_.qo_heads || a.kv.kv_heads != args_.kv.kv_heads ||
        a.kv.tokens_per_page != args_.kv.tokens_per_page || a.schedule != args_.schedule)
      return Status::error("arguments", "must keep the planned batch, heads and schedule (plan() again)");
    if (Status st = can_implement(a); !st) return st;
    const Split sp = split(a);
    const float scale = a.sm_scale > 0.0f ? a.sm_scale : 1.0f / std::sqrt(static_cast<float>(HeadDim));
    auto* dev = static_cast<unsigned char*>(ws_.device);
    const KvPageTableView& t = a.table;
    const std::int64_t kv_strides[3] = {static_cast<std::int64_t>(a.kv.page_bytes / sizeof(bf16)),
                                        static_cast<std::int64_t>(a.kv.kv_heads) * HeadDim, HeadDim};
    bf16* k_data = static_cast<bf16*>(a.kv.arena);
    bf16* v_data = k_data + a.kv.block_elems();
    auto* indices = const_cast<std::int32_t*>(t.layer_indices(a.layer));
    const std::int32_t q_stride_n = static_cast<std::int32_t>(a.qo_heads * HeadDim);
    try {
      if (sp.decode > 0) {
        flashinfer::paged_kv_t<bf16, std::int32_t> kv(a.kv.kv_heads, a.kv.tokens_per_page, HeadDim, sp.decode,
                                                      flashinfer::QKVLayout::kNHD, k_data, v_data, kv_strides,
                                                      indices, const_cast<std::int32_t*>(t.kv_indptr),
                                                      const_cast<std::int32_t*>(t.kv_last_page_len));
        DecodeParams p(const_cast<bf16*>(a.q), /*q_rope_offset=*/nullptr, kv, a.o, /*lse=*/nullptr,
                       /*maybe_alibi_slopes=*/nullptr, a.qo_heads, q_stride_n, HeadDim, /*window_left=*/-1,
                       /*logits_soft_cap=*/0.0f, scale, /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
        const flashinfer::DecodePlanInfo& pi = decode_plan_;
        p.request_indices = at<std::int32_t>(dev + layout_.decode_int_at, pi.request_indices_offset);
        p.kv_tile_indices = at<std::int32_t>(dev + layout_.decode_int_at, pi.kv_tile_indices_offset);
        p.o_indptr = at<std::int32_t>(dev + layout_.decode_int_at, pi.o_indptr_offset);
        p.kv_chunk_size_ptr = at<std::int32_t>(dev + layout_.decode_int_at, pi.kv_chunk_size_ptr_offset);
        p.padded_batch_size = static_cast<std::uint32_t>(pi.padded_batch_size);
        bf16* tmp_v = nullptr;
        float* tmp_s = nullptr;
        if (pi.split_kv) {
          tmp_v = at<bf16>(dev + layout_.float_at, pi.v_offset);
          tmp_s = at<float>(dev + layout_.float_at, pi.s_offset);
        }
        if (Status st =
                cuda_status(flashinfer::BatchDecodeWithPagedKVCacheDispatched<HeadDim, kPos, DecodeVariant>(
                                p, tmp_v, tmp_s, /*enable_pdl=*/false, stream),
                            "flashinfer::BatchDecodeWithPagedKVCacheDispatched");
            !st)
          return st;
      }
      if (sp.prefill > 0) {
        const std::uint64_t row0 = sp.decode;  // the prefill part's first query row
        flashinfer::paged_kv_t<bf16, std::int32_t> kv(
            a.kv.kv_heads, a.kv.tokens_per_page, HeadDim, sp.prefill, flashinfer::QKVLayout::kNHD, k_data,
            v_data, kv_strides, indices, const_cast<std::int32_t*>(t.kv_indptr + sp.decode),
            const_cast<std::int32_t*>(t.kv_last_page_len + sp.decode));
        PrefillParams p(const_cast<bf16*>(a.q) + row0 * q_stride_n, kv, /*maybe_custom_mask=*/nullptr,
                        const_cast<std::int32_t*>(sp.decode > 0 ? t.prefill_qo_indptr : t.qo_indptr),
                        /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr,
                        a.o + row0 * q_stride_n,
                        /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr, a.qo_heads, q_stride_n, HeadDim,
                        /*window_left=*/-1, /*logits_soft_cap=*/0.0f, scale, /*rope_scale=*/1.0f,
                        /*rope_theta=*/1e4f);
        const flashinfer::PrefillPlanInfo& pi = prefill_plan_;
        unsigned char* ib = dev + layout_.prefill_int_at;
        p.request_indices = at<std::int32_t>(ib, pi.request_indices_offset);
        p.qo_tile_indices = at<std::int32_t>(ib, pi.qo_tile_indices_offset);
        p.kv_tile_indices = at<std::int32_t>(ib, pi.kv_tile_indices_offset);
        p.o_indptr = at<std::int32_t>(ib, pi.o_indptr_offset);
        p.kv_chunk_size_ptr = at<std::int32_t>(ib, pi.kv_chunk_size_ptr_offset);
        bf16* tmp_v = nullptr;
        float* tmp_s = nullptr;
        if (pi.split_kv) {
          p.merge_indptr = at<std::int32_t>(ib, pi.merge_indptr_offset);
          tmp_v = at<bf16>(dev + layout_.float_at, pi.v_offset);
          tmp_s = at<float>(dev + layout_.float_at, pi.s_offset);
        }
        p.padded_batch_size = static_cast<std::uint32_t>(pi.padded_batch_size);
        p.max_total_num_rows = static_cast<std::uint32_t>(pi.total_num_rows);
        Status st = Status::success();
        switch (pi.cta_tile_q) {
          case 128:
            st = run_prefill<128>(p, tmp_v, tmp_s, stream);
            break;
          case 64:
            st = run_prefill<64>(p, tmp_v, tmp_s, stream);
            break;
          default:
            st = run_prefill<16>(p, tmp_v, tmp_s, stream);
            break;
        }
        if (!st) return st;
      }
    } catch (const std::exception& e) {
      return Status::error("run", e.what());
    }
    return Status::success();
  }

  // kSplit or kPrefillOnly: what a.schedule resolves to for a's batch and heads.
  static AttentionSchedule chosen_schedule(const Arguments& a) {
    const std::uint32_t group = a.kv.kv_heads > 0 ? a.qo_heads / a.kv.kv_heads : 0;
    return resolve_schedule(a.schedule, group, a.table.decode_sequences, a.table.sequences);
  }

  // What the last plan() chose (for tests and benchmarks).
  bool decode_split_kv() const { return decode_plan_.split_kv; }
  bool prefill_split_kv() const { return prefill_plan_.split_kv; }
  int prefill_tile_q() const { return static_cast<int>(prefill_plan_.cta_tile_q); }

 private:
  static constexpr auto kPos = flashinfer::PosEncodingMode::kNone;  // RoPE is applied before K is cached
  using DecodeVariant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                                     /*logits_soft_cap=*/false, /*alibi=*/false>;
  using PrefillVariant = DecodeVariant;
  using DecodeParams = flashinfer::BatchDecodeParams<bf16, bf16, bf16, std::int32_t>;
  using PrefillParams = flashinfer::BatchPrefillPagedParams<bf16, bf16, bf16, std::int32_t>;

  struct Split {
    std::uint32_t decode, prefill;
  };
  static Split split(const Arguments& a) {
    const std::uint32_t d = chosen_schedule(a) == AttentionSchedule::kSplit ? a.table.decode_sequences : 0;
    return {d, a.table.sequences - d};
  }

  // Workspace regions: one float region (split-KV partial outputs; the decode and prefill calls of a step run
  // one after the other on one stream, so they share it), one device int region per call (each plan copies
  // its own), and their pinned twins.
  struct Layout {
    std::size_t float_at = 0, float_bytes = 0;
    std::size_t decode_int_at = 0, decode_int_bytes = 0, prefill_int_at = 0, prefill_int_bytes = 0;
    std::size_t decode_pinned_at = 0, prefill_pinned_at = 0;
    std::size_t device_total = 0, pinned_total = 0;
  };
  static constexpr std::size_t align(std::size_t v, std::size_t a = 256) { return (v + a - 1) / a * a; }

  // Bounds of FlashInfer 0.7.2's DecodePlanImpl / PrefillPlanImpl allocations without CUDA graphs (each
  // AlignedAllocator request rounded up to 16 bytes plus 16 for its alignment):
  //  decode: padded batch <= max(sequences, max_grid / kv_heads), max_grid = blocks per SM (<= 32) x SMs;
  //          float = qo_heads x padded x (HeadDim + 1) x 4 when split-KV; int = 3 index arrays + mask.
  //  prefill: work tiles <= ceil(tokens x group / 16) + sequences (16 is the smallest query tile); when
  //  split-KV,
  //          tiles <= 2 x SMs / kv_heads and partial rows <= ceil(tiles x 128 / group); int = 3 tile arrays,
  //          o_indptr, merge_indptr (rows + 1).
  static Layout layout(const Arguments& a, std::uint32_t sms) {
    auto chunk = [](std::size_t bytes) { return align(bytes, 16) + 16; };
    const std::size_t seqs = a.table.sequences, tokens = a.table.tokens;
    const std::size_t kvh = std::max<std::uint32_t>(a.kv.kv_heads, 1);
    const std::size_t qoh = a.qo_heads;
    const std::size_t group = std::max<std::size_t>(qoh / kvh, 1);
    Layout l;
    const std::size_t pd = std::max<std::size_t>(seqs, std::size_t{32} * sms / kvh);
    const std::size_t decode_float = chunk(qoh * pd * HeadDim * 4) + chunk(qoh * pd * 4);
    l.decode_int_bytes = 3 * chunk((pd + 1) * 4) + chunk(4) + chunk(pd);
    const std::size_t split_tiles = std::size_t{2} * sms / kvh;
    const std::size_t tiles = std::max<std::size_t>((tokens * group + 15) / 16 + seqs, split_tiles);
    const std::size_t rows = (split_tiles * 128 + group - 1) / group;
    const std::size_t prefill_float = chunk(qoh * rows * HeadDim * 4) + chunk(qoh * rows * 4);
    l.prefill_int_bytes = 3 * chunk(tiles * 4) + chunk((seqs + 1) * 4) + chunk(4) + chunk((tokens + 1) * 4) +
                          chunk(4) + chunk(tiles);
    l.float_bytes = align(std::max(decode_float, prefill_float));
    l.decode_int_bytes = align(l.decode_int_bytes);
    l.prefill_int_bytes = align(l.prefill_int_bytes);
    l.float_at = 0;
    l.decode_int_at = l.float_bytes;
    l.prefill_int_at = l.decode_int_at + l.decode_int_bytes;
    l.device_total = l.prefill_int_at + l.prefill_int_bytes;
    l.decode_pinned_at = 0;
    l.prefill_pinned_at = l.decode_int_bytes;
    l.pinned_total = l.decode_int_bytes + l.prefill_int_bytes;
    if (seqs == 0) l = Layout{};
    return l;
  }

  static std::uint32_t sm_count() {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 132;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 132;
    return static_cast<std::uint32_t>(sms);
  }

  static constexpr bool supported_group(std::uint32_t g) {
    return g == 1 || g == 2 || g == 3 || g == 4 || g == 6 || g == 8 || g == 16;
  }
  // The decode planner's work estimation is a template over the GQA group size, like the decode kernel.
  template <class F>
  static Status dispatch_group(std::uint32_t g, F&& f) {
    switch (g) {
      case 1:
        return f(std::integral_constant<std::uint32_t, 1>{});
      case 2:
        return f(std::integral_constant<std::uint32_t, 2>{});
      case 3:
        return f(std::integral_constant<std::uint32_t, 3>{});
      case 4:
        return f(std::integral_constant<std::uint32_t, 4>{});
      case 6:
        return f(std::integral_constant<std::uint32_t, 6>{});
      case 8:
        return f(std::integral_constant<std::uint32_t, 8>{});
      case 16:
        return f(std::integral_constant<std::uint32_t, 16>{});
      default:
        return Status::error("qo_heads / kv.kv_heads", g, "must be 1, 2, 3, 4, 6, 8 or 16");
    }
  }

  template <std::uint32_t kTileQ>
  static Status run_prefill(PrefillParams& p, bf16* tmp_v, float* tmp_s, cudaStream_t stream) {
    return cuda_status(flashinfer::BatchPrefillWithPagedKVCacheDispatched<
                           /*SAME_KV_STRIDES=*/true, kTileQ, HeadDim, HeadDim, kPos,
                           /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal, PrefillVariant>(
                           p, tmp_v, tmp_s, /*enable_pdl=*/false, stream),
                       "flashinfer::BatchPrefillWithPagedKVCacheDispatched");
  }

  template <class T>
  static T* at(unsigned char* base, std::int64_t offset) {
    return reinterpret_cast<T*>(base + offset);
  }
  static Status cuda_status(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::success();
    return Status::error(what, cudaGetErrorString(e));
  }

  Arguments args_{};
  Layout layout_{};
  AttentionWorkspace ws_{};
  flashinfer::DecodePlanInfo decode_plan_{};
  flashinfer::PrefillPlanInfo prefill_plan_{};
  bool planned_ = false;
};

}  // namespace amoeba::kernels
