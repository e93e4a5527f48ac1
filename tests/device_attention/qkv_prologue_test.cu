// Device test of QkvPrologue (kernels/model/qkv_prologue.cuh) against the kernels it replaces: per-head
// RMSNorm (rms_norm_kernel, Qwen3's q/k norm), rope_kernel on q and k, and KvAppend of k and v, run on a copy
// of the same arena and the same fused-projection rows. Without the norm every byte must agree (the same
// formulas); with it the norm's float sum runs in another order, so a few bf16 values may be one step apart.
// Nothing outside the new rows' K/V slots may change. Batches mix prefills, decodes and chunks after a
// prefix.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "attention/kv_append.cuh"
#include "attention_fixture.cuh"
#include "model/decoder_ops.cuh"
#include "model/qkv_prologue.cuh"

namespace {

using namespace amoeba;
using namespace amoeba::testing;
namespace dec = amoeba::kernels::decoder;

struct Case {
  const char* name;
  std::uint32_t heads, kv_heads;
  std::uint64_t page_bytes;
  bool qk_norm;
};

int bf16_ulps(std::uint16_t a, std::uint16_t b) {
  auto key = [](std::uint16_t x) { return (x & 0x8000) ? -int(x & 0x7fff) : int(x); };
  return std::abs(key(a) - key(b));
}

}  // namespace

TEST_CASE("QkvPrologue equals per-head RMSNorm + RoPE + K/V append", "[gpu][attention][prologue]") {
  for (const Case& c : {Case{"Qwen1.5-MoE: 16/16 heads, qkv bias, no q/k norm", 16, 16, 131072, false},
                        Case{"Qwen3-MoE: 32/4 heads, q/k norm", 32, 4, 32768, true}}) {
    INFO(c.name);
    const std::uint32_t hd = 128, layers = 3, layer = 2;
    KvArena arena(c.kv_heads, hd, c.page_bytes, 1024, 5);
    const std::vector<SeqSpec> specs{{0, 37}, {15, 1}, {16, 1}, {100, 20}, {31, 1}, {5, 60}, {0, 1}};
    AttentionBatch b = arena.make_batch(c.heads, layers, specs);
    const std::uint32_t T = b.tokens(), qd = c.heads * hd, kvd = c.kv_heads * hd, ld = qd + 2 * kvd;
    Rng rng(17);
    std::vector<std::uint16_t> qkv(std::size_t{T} * ld), qn(hd), kn(hd), inv_bits;
    for (auto& x : qkv) x = rng.bf16(3.0f);
    for (auto& x : qn) x = rng.bf16(1.5f);
    for (auto& x : kn) x = rng.bf16(1.5f);
    std::vector<float> inv(hd / 2);
    for (std::uint32_t j = 0; j < hd / 2; ++j) inv[j] = 1.0f / std::pow(1e6f, 2.0f * j / hd);
    std::vector<std::int32_t> pos;
    for (const SeqSpec& s : specs)
      for (std::uint32_t p = s.context_before; p < s.context_before + s.new_tokens; ++p)
        pos.push_back(static_cast<std::int32_t>(p));
    REQUIRE(pos.size() == T);
    DeviceBytes d_qkv(qkv.size() * 2), d_qn(hd * 2), d_kn(hd * 2), d_inv(inv.size() * 4), d_pos(T * 4);
    DeviceBytes d_q(std::size_t{T} * qd * 2), d_k(std::size_t{T} * kvd * 2), d_v(std::size_t{T} * kvd * 2),
        d_qf(std::size_t{T} * qd * 2);
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_qkv.get(), qkv.data(), d_qkv.size(), cudaMemcpyHostToDevice));
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_qn.get(), qn.data(), d_qn.size(), cudaMemcpyHostToDevice));
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_kn.get(), kn.data(), d_kn.size(), cudaMemcpyHostToDevice));
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_inv.get(), inv.data(), d_inv.size(), cudaMemcpyHostToDevice));
    AMOEBA_ATTN_CHECK(cudaMemcpy(d_pos.get(), pos.data(), d_pos.size(), cudaMemcpyHostToDevice));
    const std::size_t arena_bytes = c.page_bytes * 1024;
    std::vector<unsigned char> before(arena_bytes), unfused(arena_bytes), fused(arena_bytes);
    AMOEBA_ATTN_CHECK(cudaMemcpy(before.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));
    const auto table = b.table.view(b.d_words.get<const std::int32_t>());

    // The unfused sequence: split the rows, norm (Qwen3), RoPE, append.
    const auto* qkv_d = d_qkv.get<const kernels::bf16>();
    AMOEBA_ATTN_CHECK(cudaMemcpy2D(d_q.get(), qd * 2, qkv_d, ld * 2, qd * 2, T, cudaMemcpyDeviceToDevice));
    AMOEBA_ATTN_CHECK(
        cudaMemcpy2D(d_k.get(), kvd * 2, qkv_d + qd, ld * 2, kvd * 2, T, cudaMemcpyDeviceToDevice));
    AMOEBA_ATTN_CHECK(
        cudaMemcpy2D(d_v.get(), kvd * 2, qkv_d + qd + kvd, ld * 2, kvd * 2, T, cudaMemcpyDeviceToDevice));
    auto* q = d_q.get<kernels::bf16>();
    auto* k = d_k.get<kernels::bf16>();
    if (c.qk_norm) {
      dec::rms_norm_kernel<<<T * c.heads, 128>>>(q, d_qn.get<kernels::bf16>(), q, int(hd), 1e-6f);
      dec::rms_norm_kernel<<<T * c.kv_heads, 128>>>(k, d_kn.get<kernels::bf16>(), k, int(hd), 1e-6f);
    }
    dec::rope_kernel<<<T, 256>>>(q, d_pos.get<std::int32_t>(), d_inv.get<float>(), int(c.heads), int(hd));
    dec::rope_kernel<<<T, 256>>>(k, d_pos.get<std::int32_t>(), d_inv.get<float>(), int(c.kv_heads), int(hd));
    AMOEBA_ATTN_CHECK(cudaGetLastError());
    kernels::KvAppendArguments ka{b.kv, table, layer, k, d_v.get<const kernels::bf16>()};
    REQUIRE(kernels::KvAppend::run(ka, nullptr).ok);
    AMOEBA_ATTN_CHECK(cudaDeviceSynchronize());
    AMOEBA_ATTN_CHECK(cudaMemcpy(unfused.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));
    std::vector<std::uint16_t> q_unfused(std::size_t{T} * qd), q_fused(q_unfused.size());
    AMOEBA_ATTN_CHECK(cudaMemcpy(q_unfused.data(), q, q_unfused.size() * 2, cudaMemcpyDeviceToHost));

    // The fused kernel on the arena as it was.
    AMOEBA_ATTN_CHECK(cudaMemcpy(b.kv.arena, before.data(), arena_bytes, cudaMemcpyHostToDevice));
    kernels::QkvPrologueArguments a;
    a.qkv = qkv_d;
    a.ld = ld;
    a.heads = c.heads;
    a.q_out = d_qf.get<kernels::bf16>();
    a.q_norm = c.qk_norm ? d_qn.get<const kernels::bf16>() : nullptr;
    a.k_norm = c.qk_norm ? d_kn.get<const kernels::bf16>() : nullptr;
    a.eps = 1e-6f;
    a.positions = d_pos.get<const std::int32_t>();
    a.inv_freq = d_inv.get<const float>();
    a.kv = b.kv;
    a.table = table;
    a.layer = layer;
    REQUIRE(kernels::QkvPrologue::run(a, nullptr).ok);
    AMOEBA_ATTN_CHECK(cudaDeviceSynchronize());
    AMOEBA_ATTN_CHECK(cudaMemcpy(fused.data(), b.kv.arena, arena_bytes, cudaMemcpyDeviceToHost));
    AMOEBA_ATTN_CHECK(cudaMemcpy(q_fused.data(), a.q_out, q_fused.size() * 2, cudaMemcpyDeviceToHost));

    // Bytes outside the new slots: unchanged by both. New slots and q: equal, or (with the norm) a few one
    // bf16 step apart.
    std::size_t changed = 0, off = 0, values = 0;
    int worst = 0;
    for (std::size_t i = 0; i < arena_bytes; i += 2) {
      std::uint16_t u, f, o;
      std::memcpy(&u, &unfused[i], 2);
      std::memcpy(&f, &fused[i], 2);
      std::memcpy(&o, &before[i], 2);
      if (u == o && f == o) continue;
      ++changed;
      const int d = bf16_ulps(u, f);
      worst = std::max(worst, d);
      off += d > 0;
    }
    for (std::size_t i = 0; i < q_fused.size(); ++i) {
      const int d = bf16_ulps(q_unfused[i], q_fused[i]);
      worst = std::max(worst, d);
      off += d > 0;
      ++values;
    }
    values += changed;
    CHECK(changed > std::size_t{T} * kvd);  // the new rows' K and V did land
    INFO("values " << values << ", differing " << off << ", worst " << worst << " ulps");
    if (c.qk_norm) {
      CHECK(worst <= 2);
      CHECK(off <= values / 50);
    } else {
      CHECK(off == 0);
    }

    // Refusals name the field.
    kernels::QkvPrologueArguments bad = a;
    bad.ld = qd;
    CHECK_THAT(kernels::QkvPrologue::can_implement(bad).message, Catch::Contains("ld"));
    bad = a;
    bad.k_norm = nullptr;
    bad.q_norm = c.qk_norm ? a.q_norm : d_qn.get<const kernels::bf16>();
    CHECK_THAT(kernels::QkvPrologue::can_implement(bad).message, Catch::Contains("q_norm/k_norm"));
    bad = a;
    bad.layer = layers;
    CHECK_FALSE(kernels::QkvPrologue::can_implement(bad).ok);
  }
}
