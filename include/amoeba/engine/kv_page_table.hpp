// KvPageTable: one step's KV page table in the int32 CSR form that paged attention reads (FlashInfer's
// paged_kv_t: indptr, indices, last_page_len), built on the host from a StepBatch. Host-only C++20 and
// CUDA-free; kernels/attention/paged_attention.cuh reads the same view from the device copy.
//
// A KV page handle's index, times the KV page size, is its byte offset in the pool's arena
// (amoeba/pool/page_kinds.hpp), so the handle index IS the attention kernel's page index with the arena as
// its base: nothing is translated. Every attention layer of a sequence has the same number of pages, so the
// per-sequence CSR offsets are shared by all layers and only the indices differ: they are stored layer-major,
// and the attention of layer a reads kv_indices + a * pages_per_layer. One table (and one upload) per step
// serves every layer.
//
// All arrays live in one int32 buffer (words()), so one host-to-device copy moves the whole table:
//   kv_indptr          [sequences + 1]   pages of one layer, cumulative from 0
//   kv_last_page_len   [sequences]       tokens in each sequence's last page, 1..tokens_per_page
//   qo_indptr          [sequences + 1]   query rows (new tokens), cumulative from 0, in batch order
//   prefill_qo_indptr  [sequences - decode_sequences + 1]  the same for the sequences after the decode run,
//                                        from 0 (relative to row decode_sequences)
//   kv_indices         [attention_layers][pages_per_layer]
// decode_sequences is the leading run of sequences with exactly one new token: those can go through a decode
// kernel (one query row per sequence, rows 0..decode_sequences-1) and the rest through a prefill kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "amoeba/core/host_device.hpp"
#include "amoeba/engine/step.hpp"

namespace amoeba {

// Pointers into one copy of a KvPageTable's words (host or device) plus its shape. Trivially copyable.
struct KvPageTableView {
  const std::int32_t* kv_indptr = nullptr;
  const std::int32_t* kv_last_page_len = nullptr;
  const std::int32_t* qo_indptr = nullptr;
  const std::int32_t* prefill_qo_indptr = nullptr;
  const std::int32_t* kv_indices = nullptr;
  std::uint64_t pages_per_layer = 0;  // kv_indptr[sequences]
  std::uint32_t sequences = 0;
  std::uint32_t decode_sequences = 0;  // leading sequences with one new token
  std::uint32_t tokens = 0;            // query rows, qo_indptr[sequences]
  std::uint32_t attention_layers = 0;
  std::uint32_t tokens_per_page = 0;

  AMOEBA_HOST_DEVICE constexpr std::uint32_t prefill_sequences() const noexcept {
    return sequences - decode_sequences;
  }
  // The page ids of attention layer `layer`, indexed by kv_indptr.
  AMOEBA_HOST_DEVICE constexpr const std::int32_t* layer_indices(std::uint32_t layer) const noexcept {
    return kv_indices + static_cast<std::uint64_t>(layer) * pages_per_layer;
  }
};

class KvPageTable {
 public:
  // Rebuilds the table for `batch` (keeping capacity across steps). Returns an error naming the field, its
  // value and the rule, and leaves the table empty, when the batch cannot be expressed:
  //   attention_layers >= 1, tokens_per_kv_page >= 1; every sequence has new_tokens >= 1 and kv_pages holding
  //   a whole number of blocks (a multiple of attention_layers), at least ceil(context_after /
  //   tokens_per_kv_page) of them (extra blocks are not read); page indices and counts fit int32; all KV
  //   pages are of one kind.
  [[nodiscard]] std::optional<std::string> assign(const StepBatch& batch) {
    clear();
    if (auto e = fill(batch)) {
      clear();
      return e;
    }
    return std::nullopt;
  }

  void clear() noexcept {
    words_.clear();
    shape_ = KvPageTableView{};
  }

  bool empty() const noexcept { return shape_.sequences == 0; }
  // The buffer to upload (int32, 4-byte aligned wherever it is copied to).
  std::span<const std::int32_t> words() const noexcept { return words_; }
  // The same arrays, read through `base`: words().data() or a copy of words() elsewhere (the device).
  KvPageTableView view(const std::int32_t* base) const noexcept {
    KvPageTableView v = shape_;
    if (base == nullptr || empty()) return v;
    v.kv_indptr = base + at_.kv_indptr;
    v.kv_last_page_len = base + at_.kv_last_page_len;
    v.qo_indptr = base + at_.qo_indptr;
    v.prefill_qo_indptr = base + at_.prefill_qo_indptr;
    v.kv_indices = base + at_.kv_indices;
    return v;
  }
  KvPageTableView host_view() const noexcept { return view(words_.data()); }

 private:
  struct Offsets {
    std::size_t kv_indptr = 0, kv_last_page_len = 0, qo_indptr = 0, prefill_qo_indptr = 0, kv_indices = 0;
  };

  static std::string seq_field(std::size_t s, const char* member) {
    return "batch.seqs[" + std::to_string(s) + "]." + member;
  }
  static std::string bad(const std::string& field, std::uint64_t value, const std::string& rule) {
    return field + " = " + std::to_string(value) + ": " + rule;
  }

  std::optional<std::string> fill(const StepBatch& batch) {
    constexpr std::uint64_t kMax = std::numeric_limits<std::int32_t>::max();
    const std::uint32_t layers = batch.attention_layers;
    const std::uint32_t tpp = batch.tokens_per_kv_page;
    if (layers == 0) return bad("batch.attention_layers", 0, "must be >= 1");
    if (tpp == 0) return bad("batch.tokens_per_kv_page", 0, "must be >= 1");
    const std::size_t n = batch.seqs.size();
    if (n == 0) return std::nullopt;
    if (n > kMax) return bad("batch.seqs.size()", n, "must fit int32");

    // Pass 1: shape and checks.
    std::uint64_t pages = 0, tokens = 0;
    std::uint32_t decode = 0;
    bool decode_run = true;
    for (std::size_t s = 0; s < n; ++s) {
      const SequenceStep& q = batch.seqs[s];
      if (q.new_tokens == 0) return bad(seq_field(s, "new_tokens"), 0, "must be >= 1");
      const std::uint64_t ctx = std::uint64_t{q.context_before} + q.new_tokens;
      if (ctx > kMax) return bad(seq_field(s, "context_before + new_tokens"), ctx, "must fit int32");
      const std::uint64_t blocks = (ctx + tpp - 1) / tpp;
      if (q.kv_pages.size() % layers != 0)
        return bad(seq_field(s, "kv_pages.size()"), q.kv_pages.size(),
                   "must be a multiple of attention_layers (" + std::to_string(layers) + ")");
      if (q.kv_pages.size() / layers < blocks)
        return bad(seq_field(s, "kv_pages.size()"), q.kv_pages.size(),
                   "must cover context_before + new_tokens = " + std::to_string(ctx) + " tokens: " +
                       std::to_string(blocks) + " blocks x " + std::to_string(layers) + " layers");
      pages += blocks;
      tokens += q.new_tokens;
      decode_run = decode_run && q.new_tokens == 1;
      if (decode_run) ++decode;
    }
    if (pages > kMax) return bad("pages per layer", pages, "must fit int32");
    if (tokens > kMax) return bad("new tokens", tokens, "must fit int32");

    at_.kv_indptr = 0;
    at_.kv_last_page_len = at_.kv_indptr + n + 1;
    at_.qo_indptr = at_.kv_last_page_len + n;
    at_.prefill_qo_indptr = at_.qo_indptr + n + 1;
    at_.kv_indices = at_.prefill_qo_indptr + (n - decode) + 1;
    words_.resize(at_.kv_indices + static_cast<std::size_t>(pages) * layers);

    // Pass 2: fill.
    std::int32_t* kv_indptr = words_.data() + at_.kv_indptr;
    std::int32_t* last = words_.data() + at_.kv_last_page_len;
    std::int32_t* qo = words_.data() + at_.qo_indptr;
    std::int32_t* pqo = words_.data() + at_.prefill_qo_indptr;
    std::int32_t* idx = words_.data() + at_.kv_indices;
    const std::uint8_t kind = batch.seqs[0].kv_pages.empty() ? 0 : batch.seqs[0].kv_pages[0].kind;
    kv_indptr[0] = 0;
    qo[0] = 0;
    pqo[0] = 0;
    for (std::size_t s = 0; s < n; ++s) {
      const SequenceStep& q = batch.seqs[s];
      const std::uint32_t ctx = q.context_after();
      const std::uint32_t blocks = (ctx + tpp - 1) / tpp;
      const std::int32_t begin = kv_indptr[s];
      kv_indptr[s + 1] = begin + static_cast<std::int32_t>(blocks);
      last[s] = static_cast<std::int32_t>(ctx - (blocks - 1) * tpp);
      qo[s + 1] = qo[s] + static_cast<std::int32_t>(q.new_tokens);
      if (s >= decode) pqo[s - decode + 1] = qo[s + 1] - static_cast<std::int32_t>(decode);
      for (std::uint32_t b = 0; b < blocks; ++b)
        for (std::uint32_t a = 0; a < layers; ++a) {
          const PageHandle h = q.kv_pages[static_cast<std::size_t>(b) * layers + a];
          if (h.index > kMax)
            return bad(seq_field(s, "kv_pages[") + std::to_string(std::size_t{b} * layers + a) + "].index",
                       h.index, "must fit int32");
          if (h.kind != kind)
            return bad(seq_field(s, "kv_pages[") + std::to_string(std::size_t{b} * layers + a) + "].kind",
                       h.kind, "every KV page must be of one kind (" + std::to_string(kind) + ")");
          idx[static_cast<std::size_t>(a) * pages + static_cast<std::size_t>(begin) + b] =
              static_cast<std::int32_t>(h.index);
        }
    }

    shape_.pages_per_layer = pages;
    shape_.sequences = static_cast<std::uint32_t>(n);
    shape_.decode_sequences = decode;
    shape_.tokens = static_cast<std::uint32_t>(tokens);
    shape_.attention_layers = layers;
    shape_.tokens_per_page = tpp;
    return std::nullopt;
  }

  std::vector<std::int32_t> words_;
  Offsets at_;
  KvPageTableView shape_;
};

}  // namespace amoeba
