// Device tests of PagedMoe on int8 and int4 experts (moe/precision.cuh, moe/quant_layout.hpp): random packed
// values and bf16 group scales, written straight into the packed layout; the layer through Contiguous and
// through Paged (shuffled pages, some experts in a load buffer) must agree bit for bit, and both must match a
// double CPU reference that dequantises the same packed bytes exactly (q x scale), with the kernel's bf16
// roundings (SiLU(gate)·up, each slot's down projection, the output) mirrored. Both collectives: the decode
// GEMV (exact q x scale) and the wgmma grouped GEMM (bf16(q x scale) in shared memory, one more rounding of
// each weight, inside the same tolerance).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "moe/paged_moe.cuh"
#include "moe_configs.hpp"
#include "moe_device_fixture.cuh"
#include "moe_runner.cuh"
#include "reference/moe_reference.hpp"

namespace {

using namespace amoeba;
using namespace amoeba::testing;
using kernels::MoePath;
using kernels::PagedMoe;
using kernels::quant::Bits;
using kernels::quant::MatrixLayout;
using reference::bf16_to_float;
using reference::float_to_bf16;

// E + m experts, each three packed matrices [W1 | W3 | W2] of `page` bytes (the pool's page size: the packed
// matrix plus `pad` bytes, as a pool that pads expert pages to nest KV pages has): host bytes, a contiguous
// device copy, and a paged copy on shuffled pages of a pool (every 5th expert in a load buffer).
struct QuantStore {
  ModelSpec spec;
  Bits bits;
  kernels::quant::ExpertLayout layout;
  std::size_t page = 0;
  std::vector<unsigned char> host;  // [E+m][3][page]
  DeviceBuffer<unsigned char> contiguous, pool, buffer;
  DeviceBuffer<ExpertLocation> table;

  QuantStore(const ModelSpec& m, Bits b, std::uint64_t seed, std::size_t pad = 0)
      : spec(m), bits(b), layout(kernels::quant::expert_layout(m.intermediate, m.hidden, b)) {
    page = layout.matrix_bytes() + pad;
    const int experts = m.num_experts + m.shared_chunks;
    host.assign(static_cast<std::size_t>(experts) * 3 * page, 0);
    std::mt19937_64 rng(seed);
    const int qmax = kernels::quant::qmax(b);
    std::uniform_int_distribution<int> qdist(-qmax, qmax);
    std::uniform_real_distribution<float> sdist(0.5f, 1.5f);
    for (int e = 0; e < experts; ++e)
      for (int j = 0; j < 3; ++j) {
        const MatrixLayout& L = layout.matrix(j);
        unsigned char* mat = host.data() + (static_cast<std::size_t>(e) * 3 + j) * page;
        for (std::uint64_t n = 0; n < L.rows; ++n)
          for (std::uint64_t k = 0; k < L.k; ++k) L.put_q(mat, n, k, qdist(rng));
        for (std::uint64_t n = 0; n < L.rows; ++n)
          for (std::uint64_t g = 0; g < L.groups_per_row(); ++g) {
            const std::uint16_t s = float_to_bf16(0.03f / static_cast<float>(qmax) * sdist(rng));
            std::memcpy(mat + L.scale_byte(n, g * kernels::quant::kGroup), &s, 2);
          }
      }
    contiguous = DeviceBuffer<unsigned char>(host.size());
    contiguous.upload(host);
    // The paged copy: 3 (E + m) + 7 pages, shuffled; the spare pages hold 0xFF bytes.
    const int pages = 3 * experts + 7;
    std::vector<int> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<unsigned char> pool_host(static_cast<std::size_t>(pages) * page, 0xFF);
    std::vector<ExpertLocation> loc(experts);
    int slots = 0;
    for (int e = 0; e < experts; ++e) slots += e % 5 == 4;
    std::vector<unsigned char> buffer_host(static_cast<std::size_t>(std::max(slots, 1)) * 3 * page, 0xFF);
    int slot = 0;
    for (int e = 0; e < experts; ++e)
      for (int j = 0; j < 3; ++j) {
        const unsigned char* src = host.data() + (static_cast<std::size_t>(e) * 3 + j) * page;
        if (e % 5 == 4) {
          loc[e].buffer_slot = slot;
          std::memcpy(buffer_host.data() + (static_cast<std::size_t>(slot) * 3 + j) * page, src, page);
          if (j == 2) ++slot;
        } else {
          loc[e].page[j] = perm[3 * e + j];
          std::memcpy(pool_host.data() + static_cast<std::size_t>(perm[3 * e + j]) * page, src, page);
        }
      }
    pool = DeviceBuffer<unsigned char>(pool_host.size());
    pool.upload(pool_host);
    buffer = DeviceBuffer<unsigned char>(buffer_host.size());
    buffer.upload(buffer_host);
    table = DeviceBuffer<ExpertLocation>(loc.size());
    table.upload(loc);
  }

  // matrix_stride_bytes: the page size, or 0 (the tightest) when the pages are not padded.
  long long stride() const { return page == layout.matrix_bytes() ? 0 : static_cast<long long>(page); }
  kernels::Contiguous::Arguments contiguous_args() const {
    return {reinterpret_cast<const bf16*>(contiguous.get())};
  }
  kernels::Paged::Arguments paged_args() const {
    return {reinterpret_cast<const bf16*>(pool.get()), reinterpret_cast<const bf16*>(buffer.get()),
            table.get()};
  }
  // Matrix j of expert e, dequantised exactly: q x scale as double, row-major rows x k.
  std::vector<double> dequantized(int e, int j) const {
    const MatrixLayout& L = layout.matrix(j);
    const unsigned char* mat = host.data() + (static_cast<std::size_t>(e) * 3 + j) * page;
    std::vector<double> w(L.rows * L.k);
    for (std::uint64_t n = 0; n < L.rows; ++n)
      for (std::uint64_t k = 0; k < L.k; ++k) {
        const int q = L.q_at(mat, n, k);
        std::uint16_t s;
        std::memcpy(&s, mat + L.scale_byte(n, k), 2);
        w[n * L.k + k] = static_cast<double>(q) * bf16_to_float(s);
      }
    return w;
  }
};

// The layer in double over the exactly dequantised weights, rounding where the kernel stores bf16.
std::vector<double> cpu_reference(const QuantStore& store, const RoutingSet& r, const MoeShape& s) {
  const int H = s.hidden, F = s.intermediate, spt = s.slots_per_token();
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.num_tokens) * H);
  AMOEBA_CUDA_CHECK(cudaMemcpy(x.data(), r.x.get(), x.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<std::vector<double>> w(static_cast<std::size_t>(s.total_experts()) * 3);
  auto matrix = [&](int e, int j) -> const std::vector<double>& {
    std::vector<double>& m = w[static_cast<std::size_t>(e) * 3 + j];
    if (m.empty()) m = store.dequantized(e, j);
    return m;
  };
  auto round_bf16 = [](double v) {
    return static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(v))));
  };
  std::vector<double> out(x.size()), act(F);
  for (int t = 0; t < s.num_tokens; ++t) {
    std::vector<double> acc(H, 0.0);
    for (int j = 0; j < spt; ++j) {
      const int e =
          j < s.top_k ? r.ids_host[static_cast<std::size_t>(t) * s.top_k + j] : s.num_experts + j - s.top_k;
      const double weight =
          j < s.top_k ? r.weights_host[static_cast<std::size_t>(t) * s.top_k + j] : r.shared_host[t];
      const std::vector<double>&w1 = matrix(e, 0), &w3 = matrix(e, 1), &w2 = matrix(e, 2);
      for (int n = 0; n < F; ++n) {
        double gate = 0, up = 0;
        for (int k = 0; k < H; ++k) {
          const double xv = bf16_to_float(x[static_cast<std::size_t>(t) * H + k]);
          gate += w1[static_cast<std::size_t>(n) * H + k] * xv;
          up += w3[static_cast<std::size_t>(n) * H + k] * xv;
        }
        act[n] = round_bf16(reference::silu(gate) * up);
      }
      for (int h = 0; h < H; ++h) {
        double y = 0;
        for (int n = 0; n < F; ++n) y += w2[static_cast<std::size_t>(h) * F + n] * act[n];
        acc[h] += weight * round_bf16(y);
      }
    }
    for (int h = 0; h < H; ++h) out[static_cast<std::size_t>(t) * H + h] = acc[h];
  }
  return out;
}

template <class Addressing, class Precision, class Config = kernels::DefaultMoeConfig>
std::vector<std::uint16_t> run_layer(const RoutingSet& r, const MoeShape& shape,
                                     typename Addressing::Arguments weights, long long stride,
                                     MoePath expected, int expected_rows = 0) {
  Runner<Addressing, Config, Precision> runner;
  const std::vector<std::uint16_t> out = runner.run(r, shape, weights, MoePath::kAuto, true, stride);
  CHECK(decltype(runner)::Moe::config(runner.args).path == expected);
  if (expected_rows != 0) CHECK(decltype(runner)::Moe::config(runner.args).grouped_rows == expected_rows);
  return out;
}

// Per element: |out - ref| <= kAbs·rms(ref) + kRel·|ref| (the bf16 tests' tolerance, paged_moe_test.cu).
constexpr double kAbs = 4e-2, kRel = 1e-2;

// One layer call through Paged and Contiguous on `expected`'s path, checked against each other and the double
// reference. expected_rows: the grouped blocks' weight rows the configuration must resolve to (0: not
// checked).
// Returns the contiguous layer's output.
template <class Precision, class Config = kernels::DefaultMoeConfig>
std::vector<std::uint16_t> check_quant_case(const QuantStore& store, int tokens, std::uint64_t seed,
                                            MoePath expected, int hot_expert = -1, int expected_rows = 0) {
  const MoeShape shape = shape_of(store.spec, tokens);
  const RoutingSet r = make_routing(store.spec, tokens, seed, hot_expert);
  const long long stride = store.stride();
  const auto out_p = run_layer<kernels::Paged, Precision, Config>(r, shape, store.paged_args(), stride,
                                                                  expected, expected_rows);
  const auto out_c = run_layer<kernels::Contiguous, Precision, Config>(r, shape, store.contiguous_args(),
                                                                       stride, expected, expected_rows);
  const char* path_name = expected == MoePath::kDecode ? "decode" : expected_rows == 256 ? "tma" : "grouped";
  INFO(store.spec.name << " int" << kernels::quant::bit_count(store.bits) << " T=" << tokens << " "
                       << path_name << (hot_expert >= 0 ? " skewed" : "") << " stride " << stride);
  CHECK(std::memcmp(out_p.data(), out_c.data(), out_p.size() * 2) == 0);
  const std::vector<double> ref = cpu_reference(store, r, shape);
  double sq = 0, num = 0;
  for (double v : ref) sq += v * v;
  const double rms = std::sqrt(sq / static_cast<double>(ref.size()));
  double worst = 0;
  std::size_t nonfinite = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double a = bf16_to_float(out_p[i]);
    nonfinite += !std::isfinite(a);
    num += (a - ref[i]) * (a - ref[i]);
    worst = std::max(worst, std::abs(a - ref[i]) / (kAbs * rms + kRel * std::abs(ref[i])));
  }
  const double rel = std::sqrt(num / sq);
  std::printf("  %-26s int%u T=%-5d %-7s%s%s rel_err %.3e  worst element/tol %.3f\n", store.spec.name,
              kernels::quant::bit_count(store.bits), tokens, path_name, hot_expert >= 0 ? " skewed" : "",
              stride != 0 ? " padded pages" : "", rel, worst);
  CHECK(nonfinite == 0);
  CHECK(rel <= 1e-2);
  CHECK(worst <= 1.0);
  return out_c;
}

constexpr ModelSpec kSmall{"small E8 k2 m1 H256 F256", 8, 2, 256, 256, 1};

// Shapes whose K gives the grouped GEMM an odd and the smallest number of 64-k steps (6 and 2), the down
// stage a single 128-row slice, and both B tiles and all three packed stages in use.
constexpr ModelSpec kOddK{"small E6 k2 m0 H384 F128", 6, 2, 384, 128, 0};

// The device engine tests' small Qwen2-MoE layer: F = 128 gives the TMA kernel's down stage one scale group
// and two 64-k steps, its shared expert two chunks.
constexpr ModelSpec kEngineSmall{"small E16 k4 m2 H256 F128", 16, 4, 256, 128, 2};

// One quantized decode tile T of PagedMoe's defaults (detail::DefaultQuantDecodeTiles) at every token count.
template <class T>
struct QuantTileConfig : kernels::DefaultMoeConfig {  // select(): the default table's
  static constexpr kernels::MoeConfig select_quantized(const MoeShape&, MoePath, kernels::quant::Bits) {
    return {MoePath::kDecode, T::kTileTokens, T::kWarps, T::kUnroll, T::kPrefetch, 128, T::kStages};
  }
};

// Tile T alone (its own DecodeTiles).
template <class T>
struct OnlyTileConfig : QuantTileConfig<T> {
  using DecodeTiles = std::tuple<T>;
};
template <class T, int kStages>
using Staged = kernels::decode::Tile<T::kTokTiles, T::kWarps, 1, T::kPrefetch, kStages>;

// Every 32-bit word through dequant::int8x4 and dequant::int4x8 against the plain conversion (the value
// sign-extended, then __float2bfloat16): counts the words whose bf16 words differ and keeps the first one.
__global__ void exhaustive_dequant_kernel(unsigned long long* bad, unsigned int* first_bad) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const auto w = static_cast<std::uint32_t>(i);
    const auto word = [](int lo, int hi) {
      const __nv_bfloat162 v{__float2bfloat16(static_cast<float>(lo)),
                             __float2bfloat16(static_cast<float>(hi))};
      return *reinterpret_cast<const std::uint32_t*>(&v);
    };
    const auto byte = [w](int k) { return static_cast<int>(static_cast<std::int8_t>(w >> (8 * k))); };
    const auto nibble = [w](int k) {
      return static_cast<int>((w >> (4 * k)) & 0xF) - ((w >> (4 * k + 3)) & 1) * 16;
    };
    std::uint32_t e8[2], e4[4];
    kernels::dequant::int8x4(w, e8);
    kernels::dequant::int4x8(w, e4);
    bool ok = e8[0] == word(byte(0), byte(1)) && e8[1] == word(byte(2), byte(3));
    // A whole word of the int4 layout: value v in nibble slot int4_slot(v, 8) (values 2k, 2k + 1 in k, k +
    // 4).
    for (int k = 0; k < 4; ++k)
      ok = ok && e4[k] == word(nibble(static_cast<int>(kernels::quant::int4_slot(2 * k, 8))),
                               nibble(static_cast<int>(kernels::quant::int4_slot(2 * k + 1, 8))));
    if (!ok) {
      if (local == 0) atomicMin(first_bad, w);
      ++local;
    }
  }
  if (local > 0) atomicAdd(bad, local);
}

// The quantized TMA kernel's int8 conversion (grouped::PackedRow, dequant::int8x4_scaled: one fma per value
// from 2^23 + q + 128, one round to bf16) against dequant::scaled_chunk (bf16(q) times the scale, one HMUL2,
// what the two-block kernel and the bf16 copy multiply), for every int8 value in every byte of a word and
// every positive normal bf16 scale from 2^-100 to below 2^100. Case i: scale fma_case_scale(i), bytes
// b .. b + 3 (mod 256) with b = i % 256.
constexpr int kFmaCases = 200 * 128 * 256;  // exponents 27 .. 226 × 128 mantissas × 256 base bytes
__host__ __device__ constexpr std::uint16_t fma_case_scale(unsigned i) {
  return static_cast<std::uint16_t>(((27 + i / (128 * 256)) << 7) | (i / 256) % 128);
}
__global__ void fma_conversion_kernel(unsigned long long* bad, unsigned int* first_bad) {
  using Row = kernels::grouped::PackedRow<kernels::Int8>;
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint16_t scale_bits = fma_case_scale(i);
  const std::uint32_t b = i % 256;
  Row row{};
  row.w[0] = b | ((b + 1) & 0xFF) << 8 | ((b + 2) & 0xFF) << 16 | ((b + 3) & 0xFF) << 24;
  std::uint32_t lo, hi;
  row.pairs(0, Row::scale_of(scale_bits), lo, hi);
  const uint4 expected = kernels::dequant::scaled_chunk<Bits::kInt8>(
      make_uint4(row.w[0], 0, 0, 0), 0, __bfloat162bfloat162(__ushort_as_bfloat16(scale_bits)));
  if (lo != expected.x || hi != expected.y) {
    atomicMin(first_bad, i);
    atomicAdd(bad, 1ull);
  }
}

// A configuration that instantiates only the 8-token decode tile and chooses the grouped GEMM at every size.
struct OnlyT8Grouped : QuantGroupedConfig {
  using DecodeTiles = std::tuple<kernels::decode::Tile<1, 4, 1>>;
};

// grouped_dequant on every grouped choice, 128-token tiles, kRows-row blocks, bf16 (select) and quantized
// (select_quantized) alike; with (DequantRows) or without (DequantNoWorkspace) the workspace's bf16 copy.
template <int kRows>
struct DequantNoWorkspace {
  static constexpr kernels::MoeConfig dequant(const MoeShape& s, kernels::MoeConfig c) {
    c = kernels::with_grouped_dequant(c, s);
    if (c.grouped_dequant) c.grouped_rows = kRows;
    return c;
  }
  static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath requested) {
    return dequant(s, kernels::DefaultMoeConfig::select(s, requested));
  }
  static constexpr kernels::MoeConfig select_quantized(const MoeShape& s, MoePath requested, Bits bits) {
    return dequant(s, kernels::DefaultMoeConfig::select_quantized(s, requested, bits));
  }
};
template <int kRows>
struct DequantRows : DequantNoWorkspace<kRows> {
  static constexpr bool kDequantWorkspace = true;
};

}  // namespace

TEST_CASE("quantized experts: int8x4 and int4x8 convert every 32-bit word exactly", "[gpu][small][quant]") {
  DeviceBuffer<unsigned long long> bad(1);
  DeviceBuffer<unsigned int> first(1);
  bad.upload({0ull});
  first.upload({0xFFFFFFFFu});
  exhaustive_dequant_kernel<<<132 * 16, 256>>>(bad.get(), first.get());
  AMOEBA_CUDA_CHECK(cudaGetLastError());
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  INFO("first word converted wrongly: 0x" << std::hex << first.download()[0]);
  CHECK(bad.download()[0] == 0);
}

TEST_CASE(
    "quantized experts: the TMA kernel's int8 fma conversion equals bf16(q) times the scale bit for bit",
    "[gpu][small][quant][tma]") {
  DeviceBuffer<unsigned long long> bad(1);
  DeviceBuffer<unsigned int> first(1);
  bad.upload({0ull});
  first.upload({0xFFFFFFFFu});
  fma_conversion_kernel<<<kFmaCases / 256, 256>>>(bad.get(), first.get());
  AMOEBA_CUDA_CHECK(cudaGetLastError());
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  const unsigned f = first.download()[0];
  INFO("first case converted differently: scale bits 0x" << std::hex << fma_case_scale(f) << ", base byte 0x"
                                                         << f % 256);
  CHECK(bad.download()[0] == 0);
}

TEST_CASE("quantized experts: small shapes, paged = contiguous bit for bit, against the double reference",
          "[gpu][small][quant]") {
  const QuantStore s8(kSmall, Bits::kInt8, 11), s4(kSmall, Bits::kInt4, 12);
  // E8 k2: decode while the expected largest batch fits 32 tokens (40 tokens: mean 10), grouped at 200 (mean
  // 50).
  for (int tokens : {1, 3, 16, 40, 200}) {
    const MoePath path = tokens < 200 ? MoePath::kDecode : MoePath::kGrouped;
    check_quant_case<kernels::Int8>(s8, tokens, 100 + tokens, path);
    check_quant_case<kernels::Int4>(s4, tokens, 200 + tokens, path);
  }
  // One hot expert with half the tokens (the grouped GEMM at 200 tokens: its 100 rows in one tile).
  check_quant_case<kernels::Int8>(s8, 200, 7, MoePath::kGrouped, 3);
  check_quant_case<kernels::Int4>(s4, 200, 8, MoePath::kGrouped, 3);
  // More than 8 slots per token (k = 10 and a chunk: the combine's second batch of 8) on every path the table
  // gives this shape: decode at 1–16 tokens, the TMA kernel's 32-token units at 40 (mean routed batch 25),
  // the two-block kernel at 64 (mean 40) and the 128-token TMA units at 200.
  const ModelSpec wide{"small E16 k10 m1 H256 F256", 16, 10, 256, 256, 1};
  const QuantStore w8(wide, Bits::kInt8, 17), w4(wide, Bits::kInt4, 18);
  for (const auto& [tokens, path, rows] :
       {std::tuple{1, MoePath::kDecode, 0}, std::tuple{3, MoePath::kDecode, 0},
        std::tuple{16, MoePath::kDecode, 0}, std::tuple{40, MoePath::kGrouped, 256},
        std::tuple{64, MoePath::kGrouped, 128}, std::tuple{200, MoePath::kGrouped, 256}}) {
    check_quant_case<kernels::Int8>(w8, tokens, 1100 + tokens, path, -1, rows);
    check_quant_case<kernels::Int4>(w4, tokens, 1200 + tokens, path, -1, rows);
  }
  // Pages padded past the packed matrix (matrix_stride_bytes = the page).
  const QuantStore p8(kSmall, Bits::kInt8, 13, 48), p4(kSmall, Bits::kInt4, 14, 4096);
  for (int tokens : {3, 40}) {
    check_quant_case<kernels::Int8>(p8, tokens, 500 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int4>(p4, tokens, 600 + tokens, MoePath::kDecode);
  }
}

TEST_CASE("quantized experts: every default decode tile, whichever shapes the table gives it",
          "[gpu][small][quant]") {
  const QuantStore s8(kSmall, Bits::kInt8, 15), s4(kSmall, Bits::kInt4, 16);
  for (int tokens : {1, 5, 37, 300})
    std::apply(
        [&](auto... tile) {
          (check_quant_case<kernels::Int8, QuantTileConfig<decltype(tile)>>(s8, tokens, 700 + tokens,
                                                                            MoePath::kDecode),
           ...);
          (check_quant_case<kernels::Int4, QuantTileConfig<decltype(tile)>>(s4, tokens, 800 + tokens,
                                                                            MoePath::kDecode),
           ...);
        },
        kernels::detail::DefaultQuantDecodeTiles{});
}

TEST_CASE(
    "quantized experts: the two-block grouped GEMM at every token count, paged = contiguous, against the "
    "reference",
    "[gpu][small][quant]") {
  const QuantStore s8(kSmall, Bits::kInt8, 31), s4(kSmall, Bits::kInt4, 32);
  const QuantStore o8(kOddK, Bits::kInt8, 33), o4(kOddK, Bits::kInt4, 34);
  for (int tokens : {1, 3, 40, 200, 700}) {
    check_quant_case<kernels::Int8, QuantTwoBlockConfig>(s8, tokens, 900 + tokens, MoePath::kGrouped, -1,
                                                         128);
    check_quant_case<kernels::Int4, QuantTwoBlockConfig>(s4, tokens, 1000 + tokens, MoePath::kGrouped, -1,
                                                         128);
    check_quant_case<kernels::Int8, QuantGroupedConfig>(o8, tokens, 1100 + tokens, MoePath::kGrouped, -1,
                                                        128);
    check_quant_case<kernels::Int4, QuantGroupedConfig>(o4, tokens, 1200 + tokens, MoePath::kGrouped, -1,
                                                        128);
  }
  // One hot expert with half of 700 tokens: three 128-token tiles of one expert.
  check_quant_case<kernels::Int8, QuantTwoBlockConfig>(s8, 700, 13, MoePath::kGrouped, 5, 128);
  check_quant_case<kernels::Int4, QuantGroupedConfig>(o4, 700, 14, MoePath::kGrouped, 2, 128);
  // Pages padded past the packed matrix.
  const QuantStore p8(kSmall, Bits::kInt8, 35, 48), p4(kSmall, Bits::kInt4, 36, 4096);
  check_quant_case<kernels::Int8, QuantTwoBlockConfig>(p8, 300, 1300, MoePath::kGrouped, -1, 128);
  check_quant_case<kernels::Int4, QuantTwoBlockConfig>(p4, 300, 1400, MoePath::kGrouped, -1, 128);
}

TEST_CASE(
    "quantized experts: the TMA grouped GEMM (weights dequantised in registers), paged = contiguous, "
    "against the reference",
    "[gpu][small][quant][tma]") {
  const QuantStore s8(kSmall, Bits::kInt8, 41), s4(kSmall, Bits::kInt4, 42);
  // 1..40 tokens: one partial tile per expert; 200: full and partial; 700: several full tiles per expert.
  for (int tokens : {1, 3, 40, 200, 700}) {
    check_quant_case<kernels::Int8, QuantTmaConfig>(s8, tokens, 1500 + tokens, MoePath::kGrouped, -1, 256);
    check_quant_case<kernels::Int4, QuantTmaConfig>(s4, tokens, 1600 + tokens, MoePath::kGrouped, -1, 256);
  }
  // One hot expert with half of 700 tokens: three 128-token tiles of one expert.
  check_quant_case<kernels::Int8, QuantTmaConfig>(s8, 700, 15, MoePath::kGrouped, 5, 256);
  check_quant_case<kernels::Int4, QuantTmaConfig>(s4, 700, 16, MoePath::kGrouped, 2, 256);
  // Pages padded by whole packed rows (the tensor maps still reach every page) ...
  const QuantStore r8(kSmall, Bits::kInt8, 43, 4096), r4(kSmall, Bits::kInt4, 44, 4096);
  check_quant_case<kernels::Int8, QuantTmaConfig>(r8, 300, 1700, MoePath::kGrouped, -1, 256);
  check_quant_case<kernels::Int4, QuantTmaConfig>(r4, 300, 1800, MoePath::kGrouped, -1, 256);
  // The smallest K of the down stage (F = 128: one scale group), 384 tokens as the engine's prefill.
  const QuantStore e8(kEngineSmall, Bits::kInt8, 47), e4(kEngineSmall, Bits::kInt4, 48);
  for (int tokens : {40, 384}) {
    check_quant_case<kernels::Int8, QuantTmaConfig>(e8, tokens, 2000 + tokens, MoePath::kGrouped, -1, 256);
    check_quant_case<kernels::Int4, QuantTmaConfig>(e4, tokens, 2100 + tokens, MoePath::kGrouped, -1, 256);
  }
  // ... and off a row: PagedMoe::config takes the two-block kernel instead.
  const QuantStore p8(kSmall, Bits::kInt8, 45, 48);
  check_quant_case<kernels::Int8, QuantTmaConfig>(p8, 300, 1900, MoePath::kGrouped, -1, 128);
}

// The tokens per work tile PagedMoe<Addressing, Config, Precision> takes for a layer of `shape` on experts
// `stride` bytes apart.
template <class Addressing, class Config, class Precision>
int tile_tokens_of(const MoeShape& shape, long long stride) {
  typename PagedMoe<Addressing, Config, Precision>::Arguments a{};
  a.shape = shape;
  a.matrix_stride_bytes = stride;
  return PagedMoe<Addressing, Config, Precision>::config(a).tile_tokens;
}

// The TMA kernel's 32-token units (tile_tokens 32): the same k steps per output as its 128-token units, so
// bit for bit equal to them (contiguous experts), paged = contiguous, and within the reference's tolerance;
// at 1-40 tokens (one partial unit per expert), 200 and 700 (several per expert), one hot expert (11 units of
// one expert at 700 tokens), padded pages, the engine's F = 128 (one scale group in the down stage), and off
// the TMA rows (PagedMoe::config: the two-block kernel's 128-token tiles).
template <class Precision>
void check_small_units(const QuantStore& store, int tokens, std::uint64_t seed, int hot_expert = -1) {
  const auto out_small = check_quant_case<Precision, QuantTmaSmallConfig>(store, tokens, seed,
                                                                          MoePath::kGrouped, hot_expert, 256);
  const MoeShape shape = shape_of(store.spec, tokens);
  Runner<kernels::Contiguous, QuantTmaConfig, Precision> wide;
  const auto out_wide = wide.run(make_routing(store.spec, tokens, seed, hot_expert), shape,
                                 store.contiguous_args(), MoePath::kAuto, true, store.stride());
  CHECK(tile_tokens_of<kernels::Contiguous, QuantTmaSmallConfig, Precision>(shape, store.stride()) == 32);
  CHECK(decltype(wide)::Moe::config(wide.args).tile_tokens == 128);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < out_small.size(); ++i) differ += out_small[i] != out_wide[i];
  INFO(store.spec.name << " int" << kernels::quant::bit_count(store.bits) << " T=" << tokens
                       << " 32- against 128-token units: " << differ << " of " << out_small.size()
                       << " differ");
  CHECK(differ == 0);
}

TEST_CASE("quantized experts: the TMA kernel's 32-token units equal its 128-token units bit for bit",
          "[gpu][small][quant][tma]") {
  const QuantStore s8(kSmall, Bits::kInt8, 81), s4(kSmall, Bits::kInt4, 82);
  for (int tokens : {1, 3, 16, 40, 200, 700}) {
    check_small_units<kernels::Int8>(s8, tokens, 3100 + tokens);
    check_small_units<kernels::Int4>(s4, tokens, 3200 + tokens);
  }
  check_small_units<kernels::Int8>(s8, 700, 83, 5);
  check_small_units<kernels::Int4>(s4, 700, 84, 2);
  const QuantStore r8(kSmall, Bits::kInt8, 85, 4096), r4(kSmall, Bits::kInt4, 86, 4096);
  check_small_units<kernels::Int8>(r8, 300, 3300);
  check_small_units<kernels::Int4>(r4, 300, 3400);
  const QuantStore e8(kEngineSmall, Bits::kInt8, 87), e4(kEngineSmall, Bits::kInt4, 88);
  for (int tokens : {5, 40}) {
    check_small_units<kernels::Int8>(e8, tokens, 3500 + tokens);
    check_small_units<kernels::Int4>(e4, tokens, 3600 + tokens);
  }
  // Off the TMA rows: the two-block kernel on 128-token tiles.
  const QuantStore p8(kSmall, Bits::kInt8, 89, 48);
  check_quant_case<kernels::Int8, QuantTmaSmallConfig>(p8, 40, 3700, MoePath::kGrouped, -1, 128);
  CHECK(tile_tokens_of<kernels::Paged, QuantTmaSmallConfig, kernels::Int8>(shape_of(kSmall, 40),
                                                                           p8.stride()) == 128);
}

// The shared chunks' units spread among the routed experts' (MoeConfig::chunk_spread): the same units in
// another order, so equal to the tile list's order (chunk_spread 1) bit for bit, paged = contiguous and
// against the reference (check_quant_case), on the TMA kernel (one chunk at 200 and 700 tokens).
template <class Precision>
void check_spread_case(const QuantStore& store, int tokens, std::uint64_t seed) {
  const auto spread = check_quant_case<Precision, ChunkSpreadConfig<kSpreadAll>>(store, tokens, seed,
                                                                                 MoePath::kGrouped, -1, 256);
  Runner<kernels::Contiguous, ChunkSpreadConfig<1>, Precision> listed;
  const auto out = listed.run(make_routing(store.spec, tokens, seed), shape_of(store.spec, tokens),
                              store.contiguous_args(), MoePath::kAuto, true, store.stride());
  INFO(store.spec.name << " int" << kernels::quant::bit_count(store.bits) << " T=" << tokens
                       << " chunks spread against the list's order");
  CHECK(std::memcmp(spread.data(), out.data(), out.size() * 2) == 0);
}

TEST_CASE("quantized experts: shared chunks' units spread among the routed ones equal the list's order",
          "[gpu][small][quant][tma]") {
  const QuantStore s8(kSmall, Bits::kInt8, 95), s4(kSmall, Bits::kInt4, 96);
  for (int tokens : {200, 700}) {
    check_spread_case<kernels::Int8>(s8, tokens, 4000 + tokens);
    check_spread_case<kernels::Int4>(s4, tokens, 4100 + tokens);
  }
}

TEST_CASE("quantized experts: the TMA kernel's 32-token units on model shapes", "[gpu][models][quant][tma]") {
  for (const ModelSpec& m : {kQwen15, kQwen3}) {
    const QuantStore s8(m, Bits::kInt8, 91), s4(m, Bits::kInt4, 92);
    for (int tokens : {16, 64}) {
      check_small_units<kernels::Int8>(s8, tokens, 3800 + tokens);
      check_small_units<kernels::Int4>(s4, tokens, 3900 + tokens);
    }
  }
}

// The grouped stages on a bf16 copy (MoeConfig::grouped_dequant): the routed experts dequantised into the
// workspace, then the bf16 TMA grouped GEMM. Paged and contiguous read the same copy (bit for bit); against
// the reference at tile edges, with a hot expert, unrouted experts (3 tokens: most experts skipped) and
// padded pages (the copy is contiguous whatever the pages).
TEST_CASE("quantized experts: the grouped stages on a dequantised bf16 copy, against the reference",
          "[gpu][small][quant][dequant]") {
  using Dequant = testing::DequantConfig<MoePath::kGrouped>;
  const QuantStore s8(kSmall, Bits::kInt8, 61), s4(kSmall, Bits::kInt4, 62);
  for (int tokens : {3, 200, 700}) {
    check_quant_case<kernels::Int8, Dequant>(s8, tokens, 2300 + tokens, MoePath::kGrouped, -1, 256);
    check_quant_case<kernels::Int4, Dequant>(s4, tokens, 2400 + tokens, MoePath::kGrouped, -1, 256);
  }
  check_quant_case<kernels::Int8, Dequant>(s8, 700, 63, MoePath::kGrouped, 5, 256);
  const QuantStore e8(kEngineSmall, Bits::kInt8, 64), e4(kEngineSmall, Bits::kInt4, 65);
  check_quant_case<kernels::Int8, Dequant>(e8, 384, 2500, MoePath::kGrouped, -1, 256);
  check_quant_case<kernels::Int4, Dequant>(e4, 384, 2600, MoePath::kGrouped, -1, 256);
  const QuantStore p8(kSmall, Bits::kInt8, 66, 48), p4(kSmall, Bits::kInt4, 67, 4096);
  check_quant_case<kernels::Int8, Dequant>(p8, 300, 2700, MoePath::kGrouped, -1, 256);
  check_quant_case<kernels::Int4, Dequant>(p4, 300, 2800, MoePath::kGrouped, -1, 256);
  for (const ModelSpec& m : {kQwen15, kQwen3}) {
    const QuantStore q8(m, Bits::kInt8, 68), q4(m, Bits::kInt4, 69);
    check_quant_case<kernels::Int8, Dequant>(q8, 300, 2900, MoePath::kGrouped, -1, 256);
    check_quant_case<kernels::Int4, Dequant>(q4, 300, 3000, MoePath::kGrouped, -1, 256);
  }
}

TEST_CASE("quantized experts: the TMA grouped GEMM on model shapes", "[gpu][models][quant][tma]") {
  for (const ModelSpec& m : {kQwen15, kQwen3}) {
    const QuantStore s8(m, Bits::kInt8, 51), s4(m, Bits::kInt4, 52);
    check_quant_case<kernels::Int8, QuantTmaConfig>(s8, 64, 2064, MoePath::kGrouped, -1, 256);
    check_quant_case<kernels::Int4, QuantTmaConfig>(s4, 64, 2164, MoePath::kGrouped, -1, 256);
  }
}

TEST_CASE("quantized experts: model shapes", "[gpu][models][quant]") {
  for (const ModelSpec& m : {kQwen15, kQwen3}) {
    const QuantStore s8(m, Bits::kInt8, 21), s4(m, Bits::kInt4, 22);
    for (int tokens : {1, 3, 16, 64}) {  // int4 at 64 (Qwen1.5) and 16, 64 (Qwen3): its 2-warp 8-token row
      check_quant_case<kernels::Int8>(s8, tokens, 300 + tokens, MoePath::kDecode);
      check_quant_case<kernels::Int4>(s4, tokens, 400 + tokens, MoePath::kDecode);
    }
    check_quant_case<kernels::Int8, QuantGroupedConfig>(s8, 64, 364, MoePath::kGrouped);
    check_quant_case<kernels::Int4, QuantGroupedConfig>(s4, 64, 464, MoePath::kGrouped);
  }
}

// Whether a call of `shape` can take split-K `form`: its features divide F, the call has at least its
// min_clusters and they all fit this device at once (asked of the device here, independently of the layer's
// own choice).
template <class Layer>
bool splitk_form_fits(const MoeShape& shape, const kernels::SplitkShape& form) {
  if (form.features == 0 || shape.intermediate % form.features != 0) return false;
  const long long clusters = static_cast<long long>(shape.num_tokens) * shape.slots_per_token() *
                             (shape.intermediate / form.features);
  return clusters >= form.min_clusters && clusters <= Layer::splitk_clusters_at_once(shape.hidden, form);
}

// The split-K decode (MoeConfig::decode_splitk) on quantized experts at `tokens`: checked that the call takes
// it, then check_quant_case (paged = contiguous bit for bit, the double reference).
template <class Precision>
void check_quant_splitk(const QuantStore& store, int tokens, std::uint64_t seed) {
  using Config = SplitkConfig<4, MoePath::kDecode>;
  using Layer = PagedMoe<kernels::Paged, Config, Precision>;
  const MoeShape shape = shape_of(store.spec, tokens);
  // The call takes split-K where some form fits: else the decode tiles would run.
  bool fits = false;
  for (const kernels::SplitkShape& form : kernels::splitk::shape_choices<Precision>())
    fits = fits || splitk_form_fits<Layer>(shape, form);
  if (!fits) return;
  INFO(store.spec.name << " T=" << tokens << " split-K");
  REQUIRE(Layer::decode_splits({.shape = shape}));
  check_quant_case<Precision, Config>(store, tokens, seed, MoePath::kDecode);
}

// The split-K tests' tiny shapes: H of whole and partial steps, F of 1 to 6 chunks of 64 features, routed
// experts alone and with shared chunks.
constexpr ModelSpec kSplitkTiny[] = {{"tiny H1024 F256 m1", 8, 2, 1024, 256, 1},
                                     {"tiny H768 F128", 8, 2, 768, 128, 0},
                                     {"tiny H1280 F384 k6 m4", 16, 6, 1280, 384, 4},
                                     {"tiny H256 F256 m1", 8, 2, 256, 256, 1}};

TEST_CASE("quantized experts: split-K decode against the reference, paged = contiguous",
          "[gpu][small][quant]") {
  // H of whole and partial steps along H (a warp's step: 512 int8, 1024 int4 values; 768 and 1280 end on a
  // partial one), F of 2, 4 and 6 chunks of 64 features, routed experts alone and with shared chunks, 1 to
  // 4 tokens, padded pages.
  for (const ModelSpec& spec : kSplitkTiny) {
    const QuantStore s8(spec, Bits::kInt8, 31), s4(spec, Bits::kInt4, 32);
    for (int tokens : {1, 2, 4}) {
      check_quant_splitk<kernels::Int8>(s8, tokens, 2100 + tokens);
      check_quant_splitk<kernels::Int4>(s4, tokens, 2200 + tokens);
    }
  }
  const QuantStore p8(kSmall, Bits::kInt8, 33, 48), p4(kSmall, Bits::kInt4, 34, 4096);
  check_quant_splitk<kernels::Int8>(p8, 1, 2301);
  check_quant_splitk<kernels::Int4>(p4, 1, 2302);
  // Below splitk::min_hidden (a warp's W2 rows fewer than one step of its loads) a form is skipped: int4 on
  // 64 features needs H >= 256; int8 in warp pairs 256 on 64 features, 128 on 128; int8 on 4 warps 64 on 128.
  using Split4 = PagedMoe<kernels::Paged, SplitkConfig<4, MoePath::kDecode>, kernels::Int4>;
  using Split8 = PagedMoe<kernels::Paged, SplitkConfig<4, MoePath::kDecode>, kernels::Int8>;
  using kernels::SplitkShape;
  CHECK_FALSE(Split4::decode_splits({.shape = shape_of(ModelSpec{"tiny H128 F128", 8, 2, 128, 128, 0}, 1)}));
  const SplitkShape h128 =
      Split8::decode_split_shape({.shape = shape_of(ModelSpec{"tiny H128 F128", 8, 2, 128, 128, 0}, 1)});
  CHECK((Split8::splitk_clusters_at_once(128, SplitkShape{128, 2}) < 2 ||
         (h128.features == 128 && h128.h_split == 2)));
  const SplitkShape h64 =
      Split8::decode_split_shape({.shape = shape_of(ModelSpec{"tiny H64 F128", 8, 2, 64, 128, 0}, 1)});
  CHECK((Split8::splitk_clusters_at_once(64, SplitkShape{128, 1}) < 2 ||
         (h64.features == 128 && h64.h_split == 1)));
}

TEST_CASE("quantized experts: split-K decode on model shapes", "[gpu][small][quant]") {
  for (const ModelSpec& m : {kQwen3, kQwen15, kQwen3Next}) {  // int8 on Qwen1.5 + shared: 128 features
    const QuantStore s8(m, Bits::kInt8, 35), s4(m, Bits::kInt4, 36);
    check_quant_splitk<kernels::Int8>(s8, 1, 2401);
    check_quant_splitk<kernels::Int4>(s4, 1, 2402);
  }
  // Where it does not fit the device at once (Mixtral int8: 224 clusters) the call runs the decode tiles:
  // equal to the configuration without split-K bit for bit.
  using Split = PagedMoe<kernels::Contiguous, SplitkConfig<>, kernels::Int8>;
  REQUIRE_FALSE(Split::decode_splits({.shape = shape_of(kMixtral, 1)}));
  const QuantStore mix(kMixtral, Bits::kInt8, 37);
  const RoutingSet r = make_routing(kMixtral, 1, 2410);
  const auto with = run_layer<kernels::Contiguous, kernels::Int8, SplitkConfig<>>(
      r, shape_of(kMixtral, 1), mix.contiguous_args(), mix.stride(), MoePath::kDecode);
  const auto without = run_layer<kernels::Contiguous, kernels::Int8, NoSplitkConfig>(
      r, shape_of(kMixtral, 1), mix.contiguous_args(), mix.stride(), MoePath::kDecode);
  CHECK(std::memcmp(with.data(), without.data(), with.size() * 2) == 0);
  using Split8 = PagedMoe<kernels::Paged, SplitkConfig<>, kernels::Int8>;
  using Split4 = PagedMoe<kernels::Paged, SplitkConfig<>, kernels::Int4>;
  using kernels::SplitkShape;
  // int4's forms: 128 features in warp pairs on mma.sync, then 64 on 4 warps
  // (DefaultMoeConfig::splitk_shapes).
  const SplitkShape int4_pairs = kernels::DefaultMoeConfig::splitk_shapes(4)[0],
                    int4_quads = kernels::DefaultMoeConfig::splitk_shapes(4)[1];
  REQUIRE((int4_pairs.features == 128 && int4_pairs.h_split == 2 && int4_pairs.mma));
  REQUIRE((int4_quads.features == 64 && int4_quads.h_split == 1 && !int4_quads.mma));
  const int pairs64 = Split8::splitk_clusters_at_once(2048, SplitkShape{64, 2}),
            pairs128 = Split8::splitk_clusters_at_once(2048, SplitkShape{128, 2}),
            quads128 = Split8::splitk_clusters_at_once(2048, SplitkShape{128, 1});
  std::printf(
      "  quantized split-K clusters at once on this device at H = 2048: int8 %d (64 features, warp pairs), "
      "%d "
      "(128, warp pairs), %d (128, 4 warps); int4 %d (128, warp pairs), %d (64, 4 warps)\n",
      pairs64, pairs128, quads128, Split4::splitk_clusters_at_once(2048, int4_pairs),
      Split4::splitk_clusters_at_once(2048, int4_quads));
  CHECK(Split4::splitk_clusters_at_once(2048, SplitkShape{128, 1}) == 0);  // not one of int4's forms
  CHECK(Split4::splitk_clusters_at_once(2048, SplitkShape{128, 2}) == 0);  // int4's pairs are on mma.sync
  CHECK(Split8::splitk_clusters_at_once(2048, SplitkShape{64, 1}) ==
        0);  // int8's 64 features: warp pairs only
  // int8 takes the first form whose clusters fit: Qwen3-30B-A3B's 96 clusters of 64 or 48 of 128, Qwen1.5-MoE
  // with its shared chunks' 176 of 64 or 88 of 128 (both forms of 128).
  auto expect = [&](const ModelSpec& m, int clusters64) {
    const SplitkShape got = Split8::decode_split_shape({.shape = shape_of(m, 1)});
    INFO(m.name << ": 64 features need " << clusters64 << " clusters");
    if (clusters64 <= pairs64) {
      CHECK((got.features == 64 && got.h_split == 2));
    } else if (clusters64 / 2 <= pairs128) {
      CHECK((got.features == 128 && got.h_split == 2));
    } else if (clusters64 / 2 <= quads128) {
      CHECK((got.features == 128 && got.h_split == 1));
    } else {
      CHECK(got.features == 0);
    }
  };
  expect(kQwen3, 96);
  expect(kQwen15, 176);
  expect(kQwen3Next, 88);
  CHECK(Split4::decode_split_shape({.shape = shape_of(kQwen15, 1)}).features == 0);
  // int4 takes 128 features in pairs on mma.sync where 32 or more such clusters fit (Qwen3's 48), else 64 on
  // 4 warps.
  const SplitkShape q3_int4 = Split4::decode_split_shape({.shape = shape_of(kQwen3, 1)});
  if (48 <= Split4::splitk_clusters_at_once(2048, int4_pairs)) {
    CHECK(q3_int4 == int4_pairs);
  } else if (96 <= Split4::splitk_clusters_at_once(2048, int4_quads)) {
    CHECK(q3_int4 == int4_quads);
  } else {
    CHECK(q3_int4.features == 0);
  }
}

// A split-K form on mma.sync (SplitkShape::mma: gate/up for int8 and int4, the down step for int4): the call
// takes it exactly where its clusters fit this device at once, and there it meets the reference with paged =
// contiguous bit for bit. Returns whether it ran.
template <class Precision, kernels::SplitkShape kForm>
bool check_mma_form(const QuantStore& store, int tokens, std::uint64_t seed) {
  using Config = SplitkFormsConfig<kForm, kernels::SplitkShape{}, 4, MoePath::kDecode>;
  using Layer = PagedMoe<kernels::Paged, Config, Precision>;
  const MoeShape shape = shape_of(store.spec, tokens);
  const bool fits = splitk_form_fits<Layer>(shape, kForm);
  INFO(store.spec.name << " T=" << tokens << " fits " << fits);
  REQUIRE(Layer::decode_splits({.shape = shape}) == fits);  // every shape here is past the forms' min_hidden
  if (!fits) return false;
  REQUIRE(Layer::decode_split_shape({.shape = shape}) == kForm);
  check_quant_case<Precision, Config>(store, tokens, seed, MoePath::kDecode);
  return true;
}

TEST_CASE("quantized experts: split-K on mma.sync against the reference, paged = contiguous",
          "[gpu][small][quant]") {
  // H of 2 to 10 k-steps of 128 (int4) or 64 (int8) values, 1 or 2 per warp of a pair and odd counts; warps
  // of 8 to 40 W2 rows (the down step's 16-row groups clamped at the warp's end); F of 1 to 3 clusters of
  // 128; routed experts alone and with shared chunks; 1 to 4 tokens; padded pages; then the model shapes.
  constexpr kernels::SplitkShape kPairs{128, 2, 0, 0, true}, kQuads{128, 1, 0, 0, true};
  int ran = 0;
  for (const ModelSpec& spec : kSplitkTiny) {
    const QuantStore s8(spec, Bits::kInt8, 41), s4(spec, Bits::kInt4, 42);
    for (int tokens : {1, 2, 4}) {
      ran += check_mma_form<kernels::Int8, kPairs>(s8, tokens, 2500 + tokens);
      ran += check_mma_form<kernels::Int8, kQuads>(s8, tokens, 2510 + tokens);
      ran += check_mma_form<kernels::Int4, kPairs>(s4, tokens, 2520 + tokens);
    }
  }
  const QuantStore p8(kSmall, Bits::kInt8, 43, 48), p4(kSmall, Bits::kInt4, 44, 4096);
  ran += check_mma_form<kernels::Int8, kPairs>(p8, 1, 2531);
  ran += check_mma_form<kernels::Int4, kPairs>(p4, 1, 2532);
  for (const ModelSpec& m : {kQwen3, kQwen3Next}) {
    const QuantStore s8(m, Bits::kInt8, 45), s4(m, Bits::kInt4, 46);
    ran += check_mma_form<kernels::Int8, kPairs>(s8, 1, 2541);
    ran += check_mma_form<kernels::Int4, kPairs>(s4, 1, 2542);
  }
  std::printf("  split-K on mma.sync: %d calls took it\n", ran);
  CHECK(ran >= 14);  // at one token: the tiny shapes (2-30 clusters) and the padded pages (6) fit any sm_90
}

// A model past 8 slots per token (Qwen2-57B-A14B: k = 8 and 8 shared chunks, 16 slots, F = 2560) on the
// decode tiles the table gives it.
TEST_CASE("quantized experts: a model with 16 slots per token", "[gpu][models][quant]") {
  const QuantStore s8(kQwen2Large, Bits::kInt8, 23), s4(kQwen2Large, Bits::kInt4, 24);
  for (int tokens : {1, 3}) {
    check_quant_case<kernels::Int8>(s8, tokens, 1300 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int4>(s4, tokens, 1400 + tokens, MoePath::kDecode);
  }
}

// The staged main loop (2, 3 or 4 k-steps per thread in flight through shared memory) adds the same partial
// sums in the same order as the register loop: bit-identical outputs, on model shapes whose warps get odd and
// even step counts (Qwen1.5 down: 22 int8 / 11 int4 steps over 4 warps, fewer than the stages at int4), and
// the reference holds.
TEST_CASE("quantized experts: staged decode tiles = their register-loop twins bit for bit",
          "[gpu][models][quant]") {
  for (const ModelSpec& m : {kQwen15, kQwen3}) {
    const QuantStore s8(m, Bits::kInt8, 23), s4(m, Bits::kInt4, 24);
    for (int tokens : {1, 3, 16, 37}) {
      const MoeShape shape = shape_of(m, tokens);
      const RoutingSet r = make_routing(m, tokens, 1500 + tokens, tokens == 37 ? 2 : -1);
      std::apply(
          [&](auto... tile) {
            auto same = [&]<class Precision, class T>(const QuantStore& st) {
              INFO(m.name << " T=" << tokens << " tile " << T::kTileTokens << "w" << T::kWarps << " int"
                          << kernels::quant::bit_count(st.bits) << " stages " << T::kStages);
              if constexpr (T::kStages == 0) {  // a staged default tile is some register tile's twin
                const auto a = run_layer<kernels::Paged, Precision, OnlyTileConfig<T>>(
                    r, shape, st.paged_args(), st.stride(), MoePath::kDecode);
                auto twin = [&]<class Twin>() {
                  const auto b = run_layer<kernels::Paged, Precision, OnlyTileConfig<Twin>>(
                      r, shape, st.paged_args(), st.stride(), MoePath::kDecode);
                  CHECK(std::memcmp(a.data(), b.data(), a.size() * 2) == 0);
                };
                twin.template operator()<Staged<T, 2>>();
                twin.template operator()<Staged<T, 3>>();
                twin.template operator()<Staged<T, 4>>();
              }
            };
            (same.template operator()<kernels::Int8, decltype(tile)>(s8), ...);
            (same.template operator()<kernels::Int4, decltype(tile)>(s4), ...);
          },
          kernels::detail::DefaultQuantDecodeTiles{});
      check_quant_case<kernels::Int8, OnlyTileConfig<Staged<kernels::decode::Tile<1, 4, 1>, 3>>>(
          s8, tokens, 1800 + tokens, MoePath::kDecode);
      check_quant_case<kernels::Int4, OnlyTileConfig<Staged<kernels::decode::Tile<2, 4, 1>, 3>>>(
          s4, tokens, 1900 + tokens, MoePath::kDecode);
    }
  }
}

// The down stage on its own warps (MoeConfig::decode_down_warps): another K split, so other float sums than
// the row's warps, within the reference's tolerance; paged = contiguous bit for bit. Warps with one, several
// or no k-steps: F = 256 is 4 int8 / 2 int4 steps, F = 128 one int4 step; Qwen3's F = 768 6 int4 steps.
TEST_CASE("quantized experts: the decode's down stage on its own warps against the reference",
          "[gpu][small][quant]") {
  const QuantStore s8(kSmall, Bits::kInt8, 81), s4(kSmall, Bits::kInt4, 82);
  const QuantStore e8(kEngineSmall, Bits::kInt8, 83), e4(kEngineSmall, Bits::kInt4, 84);
  for (const int tokens : {1, 3, 16}) {
    check_quant_case<kernels::Int8, DownWarpsConfig<2>>(s8, tokens, 4100 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int4, DownWarpsConfig<3>>(s4, tokens, 4200 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int8, DownWarpsConfig<6>>(e8, tokens, 4300 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int4, DownWarpsConfig<2>>(e4, tokens, 4400 + tokens, MoePath::kDecode);
  }
  check_quant_case<kernels::Int4, DownWarpsConfig<6>>(s4, 16, 4500, MoePath::kDecode, 3);
  Runner<kernels::Contiguous, DownWarpsConfig<3>, kernels::Int8> runner;
  const RoutingSet r = make_routing(kSmall, 3, 4600);
  runner.run(r, shape_of(kSmall, 3), s8.contiguous_args(), MoePath::kAuto, true);
  CHECK(decltype(runner)::Moe::config(runner.args).decode_down_warps == 3);
}

TEST_CASE("quantized experts: the decode's down stage on its own warps on Qwen3", "[gpu][models][quant]") {
  const QuantStore s8(kQwen3, Bits::kInt8, 85), s4(kQwen3, Bits::kInt4, 86);
  for (const int tokens : {1, 16, 64}) {
    check_quant_case<kernels::Int4, DownWarpsConfig<2>>(s4, tokens, 4700 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int4, DownWarpsConfig<3>>(s4, tokens, 4800 + tokens, MoePath::kDecode);
    check_quant_case<kernels::Int8, DownWarpsConfig<6>>(s8, tokens, 4900 + tokens, MoePath::kDecode);
  }
}

TEST_CASE("quantized experts: can_implement names the rule", "[gpu][small][quant]") {
  using Moe8 = PagedMoe<kernels::Contiguous, kernels::DefaultMoeConfig, kernels::Int8>;
  using Moe4 = PagedMoe<kernels::Contiguous, kernels::DefaultMoeConfig, kernels::Int4>;
  const bf16* fake = reinterpret_cast<const bf16*>(std::uintptr_t{256});
  Moe8::Arguments a{};
  a.shape = MoeShape{4, 256, 192, 8, 2, 0};  // F = 192: a multiple of 64, not of 128
  a.input = fake;
  a.output = const_cast<bf16*>(fake);
  a.topk_ids = reinterpret_cast<const std::int32_t*>(fake);
  a.topk_weights = reinterpret_cast<const float*>(fake);
  a.weights = {fake};
  // The bf16 rule (F a multiple of 128) holds for both precisions.
  CHECK(Moe8::can_implement(a).field == "shape.intermediate");
  a.shape.intermediate = 384;
  a.shape.hidden = 320;  // a multiple of 64, not of 128
  CHECK(Moe8::can_implement(a).field == "shape.hidden");
  a.shape.hidden = 256;
  CHECK(Moe8::can_implement(a).ok);
  // A matrix stride below the packed matrix, or not a multiple of 16.
  const long long tight = kernels::Int8::matrix_bytes(384, 256);
  a.matrix_stride_bytes = tight - 16;
  CHECK(Moe8::can_implement(a).field == "matrix_stride_bytes");
  a.matrix_stride_bytes = tight + 8;
  CHECK(Moe8::can_implement(a).field == "matrix_stride_bytes");
  a.matrix_stride_bytes = tight + 16;
  CHECK(Moe8::can_implement(a).ok);
  a.matrix_stride_bytes = 0;
  a.path = MoePath::kGrouped;  // the wgmma grouped GEMM dequantises; the mma.sync one does not
  CHECK(Moe8::can_implement(a).ok);
  CHECK(Moe8::config(a).path == MoePath::kGrouped);
  a.path = MoePath::kGroupedMma;
  const kernels::Status grouped = Moe8::can_implement(a);
  CHECK(grouped.field == "path");
  CHECK_THAT(grouped.message, Catch::Contains("wgmma"));
  // Without the 32-token decode tile, a configuration that may choose the grouped GEMM cannot fall back off
  // sm_90.
  a.path = MoePath::kAuto;
  a.shape.num_tokens = 4096;
  using Moe8Tiles =
      PagedMoe<kernels::Contiguous, QuantTileConfig<kernels::decode::Tile<1, 4, 1>>, kernels::Int8>;
  CHECK(Moe8Tiles::can_implement(a).ok);  // its select_quantized never chooses the grouped GEMM
  using Moe8Grouped = PagedMoe<kernels::Contiguous, OnlyT8Grouped, kernels::Int8>;
  const kernels::Status fallback = Moe8Grouped::can_implement(a);
  CHECK(fallback.field == "config.tile_tokens");
  CHECK_THAT(fallback.message, Catch::Contains("32-token decode tile"));
  a.shape.num_tokens = 4;
  Moe4::Arguments b{};
  b.shape = MoeShape{4, 256, 384, 8, 2, 0};  // F = 384: a multiple of 128 (int4's k-step), fine
  b.input = fake;
  b.output = const_cast<bf16*>(fake);
  b.topk_ids = reinterpret_cast<const std::int32_t*>(fake);
  b.topk_weights = reinterpret_cast<const float*>(fake);
  b.weights = {fake};
  CHECK(Moe4::can_implement(b).ok);
  b.shape.num_tokens = 100000;  // large T: the grouped GEMM, or the decode path when asked for
  CHECK(Moe4::config(b).path == MoePath::kGrouped);
  b.path = MoePath::kDecode;
  CHECK(Moe4::config(b) == kernels::MoeConfig{MoePath::kDecode, 32, 4, 1});
  // A staged tile whose shared memory passes the per-block maximum: 32 tokens, 8 warps, 4 stages of int4
  // operands (20 chunks per thread per stage: 327680 bytes); 2 stages fit.
  b.shape.num_tokens = 4;
  using Moe4Huge =
      PagedMoe<kernels::Contiguous, OnlyTileConfig<Staged<kernels::decode::Tile<4, 8, 1>, 4>>, kernels::Int4>;
  const kernels::Status huge = Moe4Huge::can_implement(b);
  CHECK(huge.field == "config.decode_stages");
  CHECK_THAT(huge.message, Catch::Contains("bytes of shared memory per block") && Catch::Contains("232448"));
  using Moe4Fits =
      PagedMoe<kernels::Contiguous, OnlyTileConfig<Staged<kernels::decode::Tile<4, 8, 1>, 2>>, kernels::Int4>;
  CHECK(Moe4Fits::can_implement(b).ok);
  // grouped_dequant: its workspace holds the bf16 copy (kDequantWorkspace) and it runs the bf16 TMA GEMM's
  // 256-row blocks; a configuration type without the workspace, 128-row blocks or bf16 experts are refused.
  b.shape.num_tokens = 4096;
  b.path = MoePath::kAuto;
  using Moe4Dequant = PagedMoe<kernels::Contiguous, DequantConfig<>, kernels::Int4>;
  CHECK(Moe4Dequant::can_implement(b).ok);
  CHECK(Moe4Dequant::config(b).grouped_dequant);
  CHECK(Moe4Dequant::workspace_size(b) ==
        Moe4::workspace_size(b) + kernels::detail::align_up(std::size_t{8} * 3 * 384 * 256 * 2));
  using Moe4NoCopy = PagedMoe<kernels::Contiguous, DequantNoWorkspace<256>, kernels::Int4>;
  const kernels::Status no_copy = Moe4NoCopy::can_implement(b);
  CHECK(no_copy.field == "config.grouped_dequant");
  CHECK_THAT(no_copy.message, Catch::Contains("kDequantWorkspace"));
  using Moe4Narrow = PagedMoe<kernels::Contiguous, DequantRows<128>, kernels::Int4>;
  CHECK(Moe4Narrow::can_implement(b).field == "config.grouped_rows");
  using MoeBf16Dequant = PagedMoe<kernels::Contiguous, DequantRows<256>, kernels::Bf16>;
  CHECK(MoeBf16Dequant::can_implement(b).field == "config.grouped_dequant");
  // 32-token grouped tiles: quantized experts on the TMA kernel's 256-row blocks only.
  {
    struct Tile32Rows128 : QuantGroupedBlocks<128, 32> {  // bf16 experts too, on 32-token grouped tiles
      static constexpr kernels::MoeConfig select(const MoeShape& s, MoePath) {
        return kernels::with_grouped_tile(kernels::DefaultMoeConfig::select(s, MoePath::kGrouped), 32);
      }
    };
    CHECK(PagedMoe<kernels::Contiguous, QuantTmaSmallConfig, kernels::Int4>::can_implement(b).ok);
    CHECK(PagedMoe<kernels::Contiguous, QuantTmaSmallConfig, kernels::Int4>::config(b).tile_tokens == 32);
    CHECK(PagedMoe<kernels::Contiguous, Tile32Rows128, kernels::Int4>::can_implement(b).field ==
          "config.grouped_rows");
    const kernels::Status bf16_32 =
        PagedMoe<kernels::Contiguous, Tile32Rows128, kernels::Bf16>::can_implement(b);
    CHECK(bf16_32.field == "config.tile_tokens");
    CHECK_THAT(bf16_32.message, Catch::Contains("quantized experts only"));
  }
  // decode_down_warps: the down tile must be instantiated (DownWarpsConfig's DecodeTiles lists it; the
  // default's do not) and the path the decode one.
  b.shape.num_tokens = 4;
  using Moe4Down = PagedMoe<kernels::Contiguous, DownWarpsConfig<3>, kernels::Int4>;
  CHECK(Moe4Down::can_implement(b).ok);
  CHECK(Moe4Down::config(b).decode_down_warps == 3);
  struct DownNotListed : kernels::DefaultMoeConfig {
    static constexpr kernels::MoeConfig select_quantized(const MoeShape& s, MoePath p, Bits bits) {
      kernels::MoeConfig c = kernels::DefaultMoeConfig::select_quantized(s, p, bits);
      c.decode_down_warps = 3;
      return c;
    }
  };
  const kernels::Status not_listed =
      PagedMoe<kernels::Contiguous, DownNotListed, kernels::Int4>::can_implement(b);
  CHECK(not_listed.field == "config.decode_down_warps");
  CHECK_THAT(not_listed.message, Catch::Contains("instantiated decode tile"));
  b.path = MoePath::kGrouped;
  CHECK(PagedMoe<kernels::Contiguous, DownNotListed, kernels::Int4>::can_implement(b).field ==
        "config.decode_down_warps");
}
