// PagedMoe<Addressing, Config, Precision>: the fused MoE layer the engine calls, as a CUTLASS-style device
// adapter.
//   Arguments → can_implement() (a Status naming the bad field) → workspace_size() → run(workspace, stream).
// No hidden allocations: every scratch byte lives in the caller's workspace.
//
// One run = routing preparation (CUB) → gate/up stage (SiLU·mul fused) → down stage → combine (top-k weighted
// sum in slot order, fp32, bf16 out). The gate/up and down stages use one of two collectives, chosen per call
// by the shape through the configuration policy (moe/moe_config.hpp): decode (tensor-core GEMV streaming
// weights; the default table's choice below one token per routed expert) or grouped (tiled grouped GEMM; on
// sm_90 wgmma blocks of 128 weight rows on cp.async, or 256 on the persistent TMA kernel). Both are templates
// over the addressing policy, so Paged and Contiguous run the same code. Precision (moe/precision.cuh): bf16
// experts (the default), or int8 / int4 experts packed as moe/quant_layout.hpp says: the decode GEMV
// dequantises in its main loop, the grouped GEMMs in registers (the TMA kernel, 256-row blocks, on units of
// 128 or 32 tokens) or in shared memory (the two-block kernel, 128-row blocks) (sm_90 only: on other devices
// quantized layers stay on the decode path, with 32-token tiles), or, with MoeConfig::grouped_dequant, once
// per call into a bf16 copy of the routed experts in the workspace that the bf16 TMA grouped GEMM then reads
// (moe/dequant_experts.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "moe/addressing.cuh"
#include "moe/decode_gemv.cuh"
#include "moe/decode_splitk.cuh"
#include "moe/dequant_experts.cuh"
#include "moe/grouped_gemm.cuh"
#include "moe/grouped_gemm_sm90.cuh"
#include "moe/grouped_gemm_tma_quant.cuh"
#include "moe/moe_config.hpp"
#include "moe/moe_params.cuh"
#include "moe/precision.cuh"
#include "moe/routing.cuh"
#include "moe/tensor_rows.hpp"

namespace amoeba::kernels {

namespace detail {

// y rows are summed per token in slot order (fp32, deterministic): 8 hidden values per thread. A thread
// issues the loads of up to kBatch slots together (their ids and weights, then the used slots' y rows), so
// that a token's slots cost two or three memory round trips, not two per slot; the sums still run in slot
// order, skipping dropped slots.
template <class Addressing>
__global__ void combine_kernel(const __grid_constant__ MoeParams<Addressing> p) {
  constexpr int kBatch = 8;
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int per_token = p.hidden / 8;
  const std::int64_t t = idx / per_token;
  if (t >= p.num_tokens) return;
  const int h = static_cast<int>(idx % per_token) * 8;
  ptx::grid_dependency_wait();  // y: written by the down stage
  ptx::launch_dependents();     // the next layer's routing may take its SM and wait
  const int token = static_cast<int>(t), first = token * p.slots_per_token;
  float acc[8] = {};
  for (int j0 = 0; j0 < p.slots_per_token; j0 += kBatch) {
    int id[kBatch];
    float w[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // ids and weights: independent loads
      const int j = j0 + i;
      id[i] = slot_id(p, token, j);
      w[i] = j < p.slots_per_token ? slot_weight(p, token, j) : 0.f;
    }
    bool used[kBatch];
    uint4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {  // the used slots' y rows
      const int j = j0 + i;
      used[i] = j < p.slots_per_token && slot_expert_of(p, j, id[i]) >= 0;
      const std::int64_t row = static_cast<std::int64_t>(first + j) * p.hidden + h;
      v[i] = used[i] ? *reinterpret_cast<const uint4*>(p.y + row) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (!used[i]) continue;
      const std::uint32_t words[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[c]));
        acc[2 * c] += w[i] * f.x;
        acc[2 * c + 1] += w[i] * f.y;
      }
    }
  }
  uint4 out;
  out.x = ptx::pack_bf16x2(acc[0], acc[1]);
  out.y = ptx::pack_bf16x2(acc[2], acc[3]);
  out.z = ptx::pack_bf16x2(acc[4], acc[5]);
  out.w = ptx::pack_bf16x2(acc[6], acc[7]);
  *reinterpret_cast<uint4*>(p.output + t * p.hidden + h) = out;
}

inline constexpr int kMaxDevices = 64;

// What the launches need to know about the current device, read once per device (attributes never change
// while the process runs). Devices past kMaxDevices are simply queried every time.
struct DeviceInfo {
  int device = 0;
  int sms = 0;
  int major = 0;
  int smem_per_sm = 0;  // bytes of shared memory per multiprocessor
};
inline Status current_device(DeviceInfo& info) {
  static std::array<std::atomic<int>, kMaxDevices> sms{}, major{}, smem{};
  if (cudaError_t e = cudaGetDevice(&info.device); e != cudaSuccess)
    return Status::error("cudaGetDevice", cudaGetErrorString(e));
  const bool cached = info.device < kMaxDevices;
  if (cached && sms[info.device].load(std::memory_order_acquire) > 0) {
    info.sms = sms[info.device].load(std::memory_order_relaxed);
    info.major = major[info.device].load(std::memory_order_relaxed);
    info.smem_per_sm = smem[info.device].load(std::memory_order_relaxed);
    return Status::success();
  }
  if (cudaError_t e =
          cudaDeviceGetAttribute(&info.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, info.device);
      e != cudaSuccess)
    return Status::error("cudaDeviceGetAttribute", cudaGetErrorString(e));
  if (cudaError_t e = cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, info.device);
      e != cudaSuccess)
    return Status::error("cudaDeviceGetAttribute", cudaGetErrorString(e));
  if (cudaError_t e = cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, info.device);
      e != cudaSuccess)
    return Status::error("cudaDeviceGetAttribute", cudaGetErrorString(e));
  if (cached) {
    major[info.device].store(info.major, std::memory_order_relaxed);
    smem[info.device].store(info.smem_per_sm, std::memory_order_relaxed);
    sms[info.device].store(info.sms, std::memory_order_release);  // the others are set once this is
  }
  return Status::success();
}

// Kernels whose shared memory (the dynamic `bytes` plus the kernel's static `static_bytes`) passes the
// default 48 KB must be told so on each device. The largest limit set per (kernel, device) is remembered: a
// later call needing no more sets nothing, one needing more (a staged decode tile's scales grow with K)
// raises it. Two threads racing set it twice, harmlessly.
template <auto kKernel>
Status set_smem(int device, int bytes, int static_bytes = 0) {
  static std::array<std::atomic<int>, kMaxDevices> limit{};
  if (bytes + static_bytes <= ptx::kDefaultBlockSmemBytes) return Status::success();
  if (device < kMaxDevices && limit[device].load(std::memory_order_relaxed) >= bytes)
    return Status::success();
  if (cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess) {
    cudaGetLastError();  // reported here: the next launch's check must not see it
    return Status::error("cudaFuncSetAttribute", cudaGetErrorString(e));
  }
  if (device < kMaxDevices) {
    int seen = limit[device].load(std::memory_order_relaxed);
    while (seen < bytes && !limit[device].compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
    }
  }
  return Status::success();
}

// The decode::Tile types of a DecodeTileList (moe/moe_config.hpp).
template <const auto& kList, std::size_t... I>
auto tile_types(std::index_sequence<I...>)
    -> std::tuple<decode::Tile<kList.tiles[I].tile_tokens / 8, kList.tiles[I].warps, kList.tiles[I].unroll,
                               kList.tiles[I].prefetch, kList.tiles[I].stages>...>;
template <const auto& kList>
using tile_types_t = decltype(tile_types<kList>(std::make_index_sequence<kList.size>{}));

// The decode tiles PagedMoe instantiates unless its configuration lists its own: exactly those the default
// table can name, bf16 (DefaultMoeConfig::kDecodeTiles) and quantized (kQuantDecodeTiles, for configurations
// that choose quantized tiles themselves, quantized_moe_config; the others' select() names bf16 tiles).
using DefaultDecodeTiles = tile_types_t<DefaultMoeConfig::kDecodeTiles>;
using DefaultQuantDecodeTiles = tile_types_t<DefaultMoeConfig::kQuantDecodeTiles>;

// Tiles plus the `Extra` tiles they lack, each once (a tile listed twice would run twice).
template <class Tiles, class... Extra>
struct with_tiles {
  using type = Tiles;
};
template <class... Ts, class T, class... Rest>
struct with_tiles<std::tuple<Ts...>, T, Rest...>
    : with_tiles<std::conditional_t<(std::is_same_v<T, Ts> || ...), std::tuple<Ts...>, std::tuple<Ts..., T>>,
                 Rest...> {};

// The stages and minimum blocks per SM of the small-batch grouped GEMM (64-token tiles,
// grouped::gemm_wgmma_small_kernel): the configuration's kSmallStages / kSmallBlocks where it has them, else
// 4 stages and 2 blocks.
template <class Config>
struct small_gemm_of {
  static constexpr int kStages = 4, kBlocks = 2;
};
template <class Config>
requires requires {
  Config::kSmallStages;
  Config::kSmallBlocks;
}
struct small_gemm_of<Config> {
  static constexpr int kStages = Config::kSmallStages, kBlocks = Config::kSmallBlocks;
};

// Whether the down stage issues its first W2 loads before it waits for the gate/up kernel, in the small-batch
// grouped GEMM and the streaming decode tiles (grouped::gemm_wgmma_small_kernel's kEarlyWeightsT,
// decode::gemv_kernel's kEarlyWeights; PagedMoe::early_down says where on the decode tiles): the
// configuration's kEarlyWeights where it has it, else yes.
template <class Config>
struct early_weights_of {
  static constexpr bool value = true;
};
template <class Config>
requires requires {
  Config::kEarlyWeights;
}
struct early_weights_of<Config> {
  static constexpr bool value = Config::kEarlyWeights;
};

// Whether the configuration may choose MoeConfig::grouped_dequant (Config::kDequantWorkspace = true): then
// PagedMoe's workspace holds the bf16 copy of a layer's experts.
template <class Config>
struct dequant_workspace_of {
  static constexpr bool value = false;
};
template <class Config>
requires requires {
  Config::kDequantWorkspace;
}
struct dequant_workspace_of<Config> {
  static constexpr bool value = Config::kDequantWorkspace;
};

template <class Config, class Precision>
struct decode_tiles_of {
  using type = std::conditional_t<Precision::kQuantized && quantized_moe_config<Config>,
                                  DefaultQuantDecodeTiles, DefaultDecodeTiles>;
};
template <class Config, class Precision>
requires requires {
  typename Config::DecodeTiles;
}
struct decode_tiles_of<Config, Precision> {
  using type = typename Config::DecodeTiles;
};

inline std::size_t align_up(std::size_t v, std::size_t a = 256) {
  return (v + a - 1) / a * a;
}

}  // namespace detail

// The host-only table's grouped tile sizes are the kernels' (moe/moe_config.hpp cannot include them).
static_assert(DefaultMoeConfig::kGroupedTile == grouped::kBlockM &&
                  DefaultMoeConfig::kSmallGroupedTile == grouped::kSmallM &&
                  DefaultMoeConfig::kQuantTmaSmallTile == grouped::kTmaSmallTokens,
              "DefaultMoeConfig's grouped tiles must be the grouped kernels' token rows");
static_assert(DefaultMoeConfig::kSplitkHiddenMultiple == splitk::kStep &&
                  DefaultMoeConfig::kSplitkMaxSlots == splitk::kMaxSlots,
              "DefaultMoeConfig's split-K rule must be the split-K kernels' limits");

// The default decode tiles plus `Extra` decode::Tile types: the `DecodeTiles` of a configuration that names
// tiles the default table does not (`using DecodeTiles = DecodeTilesWith<decode::Tile<1, 4, 4>>;`).
template <class... Extra>
using DecodeTilesWith = typename detail::with_tiles<detail::DefaultDecodeTiles, Extra...>::type;

// What one layer call takes (PagedMoe<Addressing, ...>::Arguments).
template <expert_addressing Addressing>
struct MoeArguments {
  MoeShape shape;
  const bf16* input = nullptr;             // [T, H]
  const std::int32_t* topk_ids = nullptr;  // [T, k]; ids outside [0, E) contribute nothing
  const float* topk_weights = nullptr;     // [T, k]
  const float* shared_weights = nullptr;   // [T] or null: weight 1 for every shared chunk
  bf16* output = nullptr;                  // [T, H]
  typename Addressing::Arguments weights;  // where the E + m experts live
  MoePath path = MoePath::kAuto;           // kAuto: Config chooses by shape
  // Bytes from one expert matrix to the next in `weights` (a pool page, a load-buffer slot's third, a
  // contiguous matrix); 0: the tightest, Precision::matrix_bytes (F·H·2 for bf16). A pool whose pages are
  // padded (quantized pages nesting KV pages) passes its page size.
  long long matrix_stride_bytes = 0;
};

template <expert_addressing Addressing, moe_config Config = DefaultMoeConfig,
          expert_precision Precision = Bf16>
class PagedMoe {
 public:
  // One type per addressing, whatever the configuration and precision: a caller that picks the precision at
  // run time builds one Arguments.
  using Arguments = MoeArguments<Addressing>;
  // Whether workspace_size() holds a bf16 copy of the experts for MoeConfig::grouped_dequant.
  static constexpr bool kDequantWorkspace =
      Precision::kQuantized && detail::dequant_workspace_of<Config>::value;
  // The stages of the 64-token grouped tiles where the configuration asks for MoeConfig::small_deep (one
  // block per SM).
  static constexpr int kDeepSmallStages = 8;

  // Tiling limits. Paths need: H % 128 (down tiles, decode K split), F % 64 (gate/up tiles), F % 128 (decode
  // K split of the down stage); total experts <= 1024 (one per routing thread).
  static Status can_implement(const Arguments& a) {
    const MoeShape& s = a.shape;
    if (Status st = validate(s); !st) return st;
    if (s.hidden % kMoeRowBlock != 0)
      return Status::error("shape.hidden", s.hidden, "must be a multiple of " + std::to_string(kMoeRowBlock));
    if (s.intermediate % kMoeRowBlock != 0)
      return Status::error("shape.intermediate", s.intermediate,
                           "must be a multiple of " + std::to_string(kMoeRowBlock));
    if (s.total_experts() > routing::kMaxExperts)
      return Status::error("shape.num_experts + shape.num_shared_chunks", s.total_experts(),
                           "must be <= 1024");
    if (s.num_slots() > (1LL << 30))
      return Status::error("shape.num_tokens", s.num_tokens,
                           "num_tokens*(top_k+num_shared_chunks) must be <= 2^30");
    if (max_tiles(s, 8) > 65535)
      return Status::error("shape.num_tokens", s.num_tokens, "too many work tiles for one grid (<= 65535)");
    if (Precision::kQuantized && a.path == MoePath::kGroupedMma)
      return Status::error(
          "path", static_cast<long long>(a.path),
          "quantized experts' grouped GEMM is the sm_90 wgmma kernel (kAuto, kDecode or kGrouped)");
    const MoeConfig c = config(a);
    const bool small = c.path == MoePath::kGrouped && c.tile_tokens == grouped::kSmallM;
    const bool tma_small = c.path == MoePath::kGrouped && c.tile_tokens == grouped::kTmaSmallTokens;
    if (c.path == MoePath::kAuto ||
        (c.path != MoePath::kDecode && c.tile_tokens != grouped::kBlockM && !small && !tma_small))
      return Status::error("config.tile_tokens", c.tile_tokens,
                           "must be 128 on the grouped paths, or 64 or 32 on kGrouped (kAuto resolved)");
    if (tma_small && !Precision::kQuantized)
      return Status::error("config.tile_tokens", c.tile_tokens,
                           "32-token grouped tiles run quantized experts only (the quantized TMA kernel)");
    if (tma_small && c.grouped_rows != 2 * grouped::kBlockN)
      return Status::error("config.grouped_rows", c.grouped_rows,
                           "must be 256 with 32-token grouped tiles (the quantized TMA kernel)");
    if (tma_small && c.grouped_dequant)
      return Status::error("config.grouped_dequant", 1,
                           "needs 128-token grouped tiles (the bf16 TMA kernel), not 32");
    if (small && Precision::kQuantized)
      return Status::error(
          "config.tile_tokens", c.tile_tokens,
          "must be 128 for quantized experts on the grouped path (64-token tiles read bf16)");
    if (c.chunk_spread < 1)
      return Status::error("config.chunk_spread", c.chunk_spread,
                           "must be >= 1 (1: the shared chunks' units first, the tile list's order)");
    if (c.small_deep && !small)
      return Status::error("config.small_deep", 1,
                           "applies to 64-token tiles on the grouped path (kGrouped, tile_tokens = 64) only");
    if (small && c.grouped_rows != grouped::kBlockN)
      return Status::error("config.grouped_rows", c.grouped_rows, "must be 128 with 64-token grouped tiles");
    if (c.grouped_rows != grouped::kBlockN && c.grouped_rows != 2 * grouped::kBlockN)
      return Status::error("config.grouped_rows", c.grouped_rows, "must be 128 or 256");
    if (c.grouped_dequant) {
      if (!Precision::kQuantized)
        return Status::error("config.grouped_dequant", 1, "dequantises quantized experts only (0 on bf16)");
      if (c.path != MoePath::kGrouped)
        return Status::error("config.grouped_dequant", 1, "applies to the grouped path (kGrouped) only");
      if (!kDequantWorkspace)
        return Status::error("config.grouped_dequant", 1,
                             "needs a configuration type with kDequantWorkspace = true (the workspace's bf16 "
                             "copy of the experts)");
      if (c.grouped_rows != 2 * grouped::kBlockN)
        return Status::error("config.grouped_rows", c.grouped_rows,
                             "must be 256 with config.grouped_dequant (the bf16 TMA grouped GEMM)");
    }
    if (c.path != MoePath::kDecode && c.grouped_rows == 2 * grouped::kBlockN) {
      if (s.hidden % (2 * grouped::kBlockN) != 0)
        return Status::error("shape.hidden", s.hidden,
                             "must be a multiple of 256 with config.grouped_rows = 256 (down blocks of 256 "
                             "rows)");
    }
    if constexpr (Precision::kQuantized) {
      // Off sm_90 a quantized grouped choice runs kQuantFallback's decode tile (run()).
      if (c.path == MoePath::kGrouped && decode_k_multiple(kQuantFallback) == 0)
        return Status::error(
            "config.tile_tokens", kQuantFallback.tile_tokens,
            "quantized experts need the 32-token decode tile (4 warps, unroll 1) instantiated "
            "for devices without wgmma (PagedMoe::DecodeTiles)");
    }
    if (c.decode_preload) {
      if (Precision::kQuantized || c.path != MoePath::kDecode || c.tile_tokens != 8)
        return Status::error(
            "config.decode_preload", 1,
            "applies to bf16 experts on 8-token decode tiles (kDecode, tile_tokens = 8) only");
      const long long bytes = preload_block_smem(c, s.intermediate);
      if (bytes > ptx::kMaxBlockSmemBytes)
        return Status::error("config.decode_preload", 1,
                             "needs " + std::to_string(bytes) +
                                 " bytes of shared memory per down block (W2 rows of " +
                                 "intermediate = " + std::to_string(s.intermediate) + "); at most " +
                                 std::to_string(ptx::kMaxBlockSmemBytes) + " (sm_90)");
    }
    if (c.decode_down_warps != 0 && c.decode_down_warps != c.decode_warps) {
      if (c.path != MoePath::kDecode)
        return Status::error("config.decode_down_warps", c.decode_down_warps,
                             "applies to the decode path (kDecode) only (0 otherwise)");
      if (c.decode_preload)
        return Status::error("config.decode_down_warps", c.decode_down_warps,
                             "excludes decode_preload (the preloading down blocks run decode_warps warps)");
      const MoeConfig down = down_tile_config(c);
      const int multiple = decode_k_multiple(down);
      if (multiple == 0)
        return Status::error("config.decode_down_warps", c.decode_down_warps,
                             "with the decode tile's tokens, unroll, prefetch and stages must name an "
                             "instantiated decode tile (PagedMoe::DecodeTiles)");
      if (!Precision::kQuantized && s.intermediate % multiple != 0)
        return Status::error("config.decode_down_warps", c.decode_down_warps,
                             "needs intermediate to be a multiple of 32·decode_down_warps");
      const long long bytes = decode_block_smem(down, s.intermediate);
      if (bytes > ptx::kMaxBlockSmemBytes)
        return Status::error("config.decode_down_warps", c.decode_down_warps,
                             "needs " + std::to_string(bytes) +
                                 " bytes of shared memory per down block here; at most " +
                                 std::to_string(ptx::kMaxBlockSmemBytes) + " (sm_90)");
    }
    if (c.decode_splitk) {
      if (c.path != MoePath::kDecode)
        return Status::error("config.decode_splitk", 1, "applies to the decode path (kDecode) only");
      if (!Precision::kQuantized && s.hidden % splitk::kStep != 0)
        return Status::error("shape.hidden", s.hidden,
                             "must be a multiple of " + std::to_string(splitk::kStep) +
                                 " with config.decode_splitk on bf16 experts (a warp's loads along H)");
      if (s.slots_per_token() > splitk::kMaxSlots)
        return Status::error(
            "shape.top_k + shape.num_shared_chunks", s.slots_per_token(),
            "must be <= " + std::to_string(splitk::kMaxSlots) + " with config.decode_splitk");
      if (s.num_tokens > 65535)
        return Status::error("shape.num_tokens", s.num_tokens, "must be <= 65535 with config.decode_splitk");
      const long long bytes = splitk::smem_bytes(s.hidden);
      if (bytes > ptx::kMaxBlockSmemBytes)
        return Status::error("shape.hidden", s.hidden,
                             "needs " + std::to_string(bytes) +
                                 " bytes of shared memory per block with config.decode_splitk; at most " +
                                 std::to_string(ptx::kMaxBlockSmemBytes) + " (sm_90)");
    }
    if (c.path == MoePath::kDecode && c.decode_stages != 0 && !Precision::kQuantized)
      return Status::error("config.decode_stages", c.decode_stages,
                           "staged decode tiles read quantized experts only (0 on bf16)");
    if (c.path == MoePath::kDecode) {
      const int multiple = decode_k_multiple(c);
      if (multiple == 0)
        return Status::error(
            "config.tile_tokens", c.tile_tokens,
            "with decode_warps, decode_unroll, decode_prefetch and decode_stages must name an "
            "instantiated decode tile (PagedMoe::DecodeTiles)");
      if constexpr (Precision::kQuantized) {
        // K is dealt to the warps in whole k-steps, each inside one scale group.
        if (s.hidden % Precision::kKStep != 0)
          return Status::error("shape.hidden", s.hidden,
                               "must be a multiple of " + std::to_string(Precision::kKStep) +
                                   " (the quantized decode k-step)");
        if (s.intermediate % Precision::kKStep != 0)
          return Status::error("shape.intermediate", s.intermediate,
                               "must be a multiple of " + std::to_string(Precision::kKStep) +
                                   " (the quantized decode k-step)");
        // A staged tile's shared memory grows with its stages, tokens and warps, and with K (the scales).
        if (c.decode_stages > 0) {
          const long long bytes =
              std::max(decode_block_smem(c, s.hidden), decode_block_smem(c, s.intermediate));
          if (bytes > ptx::kMaxBlockSmemBytes)
            return Status::error(
                "config.decode_stages", c.decode_stages,
                "needs " + std::to_string(bytes) + " bytes of shared memory per block here (" +
                    std::to_string(c.tile_tokens) + " tokens, " + std::to_string(c.decode_warps) +
                    " warps, K up to " + std::to_string(std::max(s.hidden, s.intermediate)) + "); at most " +
                    std::to_string(ptx::kMaxBlockSmemBytes) + " (sm_90): fewer stages, tokens or warps");
        }
      } else if (s.hidden % multiple != 0 || s.intermediate % multiple != 0) {
        return Status::error("config.decode_warps", c.decode_warps,
                             "needs hidden and intermediate to be multiples of 32·decode_warps");
      }
    }
    if (a.matrix_stride_bytes != 0) {
      const long long tight = Precision::matrix_bytes(s.intermediate, s.hidden);
      if (a.matrix_stride_bytes < tight || a.matrix_stride_bytes % 16 != 0)
        return Status::error(
            "matrix_stride_bytes", a.matrix_stride_bytes,
            "must be 0 or a multiple of 16 >= one expert matrix's bytes (" + std::to_string(tight) + ")");
    }
    if (s.num_tokens > 0) {
      if (a.input == nullptr) return Status::error("input", "must not be null");
      if (a.output == nullptr) return Status::error("output", "must not be null");
      if (a.topk_ids == nullptr) return Status::error("topk_ids", "must not be null");
      if (a.topk_weights == nullptr) return Status::error("topk_weights", "must not be null");
      if (reinterpret_cast<std::uintptr_t>(a.input) % 16 != 0)
        return Status::error("input", "must be 16-byte aligned");
      if (reinterpret_cast<std::uintptr_t>(a.output) % 16 != 0)
        return Status::error("output", "must be 16-byte aligned");
    }
    return Addressing::check(a.weights);
  }

  static std::size_t workspace_size(const Arguments& a) { return layout(a.shape, config(a)).total; }

  // Whether a call preloads the down stage's W2 rows on the current device: its configuration asks for it
  // (MoeConfig::decode_preload) and every down block's rows fit the device's shared memory at once.
  static bool decode_preloads(const Arguments& a) {
    const MoeConfig c = config(a);
    if (!c.decode_preload || c.path != MoePath::kDecode) return false;
    detail::DeviceInfo dev;
    if (!detail::current_device(dev)) return false;
    const unsigned grid_tiles = static_cast<unsigned>(max_tiles(a.shape, c.tile_tokens));
    bool preloaded = false;
    on_decode_tile(c, [&]<class T>() { preloaded = preloads<T>(true, a.shape, grid_tiles, dev); });
    return preloaded;
  }

  // Whether a call runs the split-K decode on the current device: its configuration asks for it
  // (MoeConfig::decode_splitk) and all its clusters fit the device at once (splitk_choice).
  static bool decode_splits(const Arguments& a) { return decode_split_shape(a).features != 0; }
  // The form of the split-K kernel the call takes on the current device (kSplitkShapes: features of
  // F per cluster and warps per feature group), features = 0 where it runs the decode tiles.
  static SplitkShape decode_split_shape(const Arguments& a) {
    if (!config(a).decode_splitk) return {};
    detail::DeviceInfo dev;
    if (!detail::current_device(dev)) return {};
    const int choice = splitk_choice(a.shape, dev);
    return choice < 0 ? SplitkShape{} : kSplitkShapes[static_cast<std::size_t>(choice)];
  }
  // How many split-K clusters of the form `shape` (one per token, slot and its features of F) the current
  // device holds at once at hidden size H: cudaOccupancyMaxActiveClusters of the kernel; 0 before sm_90 or
  // for a form the precision does not take (kSplitkShapes).
  static int splitk_clusters_at_once(int hidden, SplitkShape shape = kSplitkShapes[0]) {
    detail::DeviceInfo dev;
    if (!detail::current_device(dev)) return 0;
    for (std::size_t i = 0; i < kSplitkShapes.size(); ++i)
      if (kSplitkShapes[i].features != 0 && kSplitkShapes[i].kernel_form() == shape.kernel_form())
        return splitk_capacity(static_cast<int>(i), hidden, dev);
    return 0;
  }

  // The configuration the call will use: path and tokens per work tile (8, 16 or 32 decode, 64 or 128
  // grouped; 32 grouped for quantized experts on the TMA kernel's small-batch units).
  // Quantized experts: the configuration's quantized choice where it has one (quantized_moe_config), else
  // select()'s with kAuto read as kDecode and 128-row grouped blocks. On a device without wgmma (not sm_90)
  // run() replaces a quantized grouped choice by kQuantFallback.
  static constexpr MoeConfig config(const Arguments& a) {
    if constexpr (Precision::kQuantized && quantized_moe_config<Config>) {
      MoeConfig c = Config::select_quantized(a.shape, a.path, Precision::kBits);
      // A bf16 copy (grouped_dequant) is contiguous, on the TMA kernel's rows whatever the pages. Off the
      // rows the two-block kernel runs, on its 128-token tiles.
      if (uses_tma(c) && !c.grouped_dequant && !tma_fits(a)) {
        c.grouped_rows = grouped::kBlockN;
        c = with_grouped_tile(c, grouped::kBlockM);
      }
      return c;
    } else if constexpr (Precision::kQuantized) {  // select()'s bf16 choice, on 128×128 grouped blocks
      MoeConfig c = Config::select(a.shape, a.path == MoePath::kAuto ? MoePath::kDecode : a.path);
      c.grouped_rows = grouped::kBlockN;
      c.decode_splitk = false;  // select() asks for it by its bf16 measurements; select_quantized decides
      return c.path != MoePath::kDecode ? with_grouped_tile(c, grouped::kBlockM) : c;
    } else {
      MoeConfig c = Config::select(a.shape, a.path);
      if (uses_tma(c) && !tma_fits(a)) c.grouped_rows = grouped::kBlockN;
      return c;
    }
  }
  // The configurations the TMA grouped GEMM runs (grouped::gemm_tma_kernel): 256-row blocks on kGrouped.
  static constexpr bool uses_tma(const MoeConfig& c) {
    return c.path == MoePath::kGrouped && c.grouped_rows == 2 * grouped::kBlockN;
  }
  // The TMA grouped GEMMs read weights through tensor maps over the addressing's regions (tma_regions()),
  // in rows of H (gate/up) and F (down) values (2H / 2F bytes bf16, the packed row bytes quantized): every
  // matrix must start on such a row. Where one cannot (another addressing policy, pages padded to a size
  // that is no multiple of both rows), config() takes 128-row blocks, the two-block cp.async kernel.
  static constexpr bool tma_fits(const Arguments& a) {
    if constexpr (!tma_addressing<Addressing>) {
      return false;
    } else {
      const long long f = a.shape.intermediate, h = a.shape.hidden;
      const long long stride =
          a.matrix_stride_bytes != 0 ? a.matrix_stride_bytes : Precision::matrix_bytes(f, h);
      if constexpr (Precision::kQuantized)
        return tensor_rows::on_rows(stride, static_cast<long long>(Precision::w13(f, h).row_bytes()),
                                    static_cast<long long>(Precision::w2(f, h).row_bytes()));
      else
        return tensor_rows::on_rows(stride, 2 * h, 2 * f);
    }
  }
  // The decode tile quantized layers run where the wgmma grouped GEMM cannot (devices other than sm_90).
  static constexpr MoeConfig kQuantFallback{MoePath::kDecode, 32, 4, 1};

  // Enqueues the layer on `stream`: it waits for the work before it; a kernel launched after it with
  // programmatic dependent launch may start while its last kernel (combine) runs and must wait
  // (griddepcontrol.wait) before reading `output`; a plain launch after it starts once `output` is written.
  Status run(const Arguments& a, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) const {
    if (Status st = can_implement(a); !st) return st;
    const MoeShape& s = a.shape;
    if (s.num_tokens == 0) return Status::success();
    const MoeConfig chosen = config(a);
    const Layout lay = layout(s, chosen);
    if (workspace_bytes < lay.total)
      return Status::error("workspace_bytes", static_cast<long long>(workspace_bytes),
                           "must be >= workspace_size() = " + std::to_string(lay.total));
    if (workspace == nullptr) return Status::error("workspace", "must not be null");
    auto* base = static_cast<unsigned char*>(workspace);
    auto at = [&](std::size_t off) { return static_cast<void*>(base + off); };
    detail::DeviceInfo dev;
    if (Status st = detail::current_device(dev); !st) return st;
    MoeConfig choice = chosen;
    if (Precision::kQuantized && choice.path == MoePath::kGrouped && dev.major != 9) choice = kQuantFallback;
    // The split-K decode where all its clusters fit the device at once (sm_90 and later), else the decode
    // tiles.
    const int splitk_form = choice.decode_splitk ? splitk_choice(s, dev) : -1;
    if (splitk_form < 0) choice.decode_splitk = false;
    if (choice.path == MoePath::kGrouped && choice.tile_tokens == grouped::kSmallM && dev.major != 9)
      choice = with_grouped_tile(choice, grouped::kBlockM);  // the mma.sync grouped GEMM's tiles

    const long long stride = a.matrix_stride_bytes != 0 ? a.matrix_stride_bytes
                                                        : Precision::matrix_bytes(s.intermediate, s.hidden);
    // One layer's parameters with the experts at `addr` (A: the addressing the GEMMs read them through).
    auto params = [&]<class A>(const typename A::Params& addr) {
      routing::RoutingParams<A> r{};
      MoeParams<A>& p = r.moe;
      p.addr = addr;
      p.input = a.input;
      p.output = a.output;
      p.topk_ids = a.topk_ids;
      p.topk_weights = a.topk_weights;
      p.shared_weights = a.shared_weights;
      p.num_tokens = s.num_tokens;
      p.hidden = s.hidden;
      p.intermediate = s.intermediate;
      p.num_experts = s.num_experts;
      p.top_k = s.top_k;
      p.slots_per_token = s.slots_per_token();
      p.num_slots = static_cast<int>(s.num_slots());
      p.chunk_spread = choice.chunk_spread;
      p.unit_counters = static_cast<int*>(at(lay.unit_counters));
      p.act = static_cast<bf16*>(at(lay.act));
      p.y = static_cast<bf16*>(at(lay.y));
      r.total_experts = s.total_experts();
      r.tile_rows = choice.tile_tokens;
      r.sorted_slot = static_cast<int*>(at(lay.sorted_slot));
      r.expert_offset = static_cast<int*>(at(lay.expert_offset));
      r.tiles = static_cast<WorkTile*>(at(lay.tiles));
      r.num_tiles = static_cast<int*>(at(lay.num_tiles));
      p.sorted_slot = r.sorted_slot;  // routing writes them, the GEMMs and combine read them
      p.tiles = r.tiles;
      p.num_tiles = r.num_tiles;
      r.keys = static_cast<int*>(at(lay.keys));
      r.vals = static_cast<int*>(at(lay.vals));
      return r;
    };
    const auto addr = Addressing::make_params(a.weights, stride / 2);
    const unsigned grid_tiles = static_cast<unsigned>(max_tiles(s, choice.tile_tokens));

    if constexpr (kDequantWorkspace) {
      // Routing over the bf16 copy (the tiles point into it), the routed experts dequantised into it, then
      // the bf16 layer.
      if (choice.grouped_dequant && choice.path == MoePath::kGrouped && dev.major == 9) {
        auto* copy = static_cast<bf16*>(at(lay.dequant));
        const auto r = params.template operator()<Contiguous>(
            Contiguous::make_params({copy}, static_cast<std::int64_t>(s.intermediate) * s.hidden));
        if (Status st = route(r, stream); !st) return st;
        const dequant::ExpertsParams<Addressing> d{addr,     r.expert_offset, copy, s.total_experts(),
                                                   s.hidden, s.intermediate};
        if (Status st =
                launch(dequant::experts_kernel<Addressing, Precision::kBits>,
                       dequant::experts_grid<Precision::kBits>(s.total_experts(), s.hidden, s.intermediate),
                       dequant::kThreads, 0, stream, d, "dequant::experts_kernel");
            !st)
          return st;
        if (Status st = run_tma<Contiguous, Bf16>(r.moe, s, choice, grid_tiles, dev, stream, nullptr); !st)
          return st;
        return combine(r.moe, s, stream);
      }
    }

    const auto r = params.template operator()<Addressing>(addr);
    const MoeParams<Addressing>& p = r.moe;
    if (choice.decode_splitk)
      return run_splitk(splitk_form, p, s, static_cast<float*>(at(lay.partials)), dev, stream);

    // 1. Routing preparation.
    if (Status st = route(r, stream); !st) return st;

    // 2-3. Gate/up then down.
    if (choice.path == MoePath::kGrouped && dev.major == 9) {
      // 256-row blocks: the TMA kernels (bf16 or quantized); 128: the two-block kernel or the small-batch
      // one.
      using Narrow = grouped::Sm90Gemm<Addressing, Precision>;
      using SmallShape = detail::small_gemm_of<Config>;
      constexpr bool kEarly = detail::early_weights_of<Config>::value;
      using Small = std::conditional_t<
          Precision::kQuantized, Narrow,
          grouped::Sm90SmallGemm<Addressing, SmallShape::kStages, SmallShape::kBlocks, kEarly>>;
      using SmallDeep = std::conditional_t<Precision::kQuantized, Narrow,
                                           grouped::Sm90SmallGemm<Addressing, kDeepSmallStages, 1, kEarly>>;
      if (Status st = uses_tma(choice)
                          ? run_tma<Addressing, Precision>(p, s, choice, grid_tiles, dev, stream,
                                                           static_cast<bf16*>(at(lay.permuted_input)))
                      : choice.tile_tokens == grouped::kSmallM
                          ? (choice.small_deep ? run_sm90<SmallDeep>(p, s, grid_tiles, dev.device, stream)
                                               : run_sm90<Small>(p, s, grid_tiles, dev.device, stream))
                          : run_sm90<Narrow>(p, s, grid_tiles, dev.device, stream);
          !st)
        return st;
    } else if (!Precision::kQuantized &&
               (choice.path == MoePath::kGrouped || choice.path == MoePath::kGroupedMma)) {
      using grouped::gemm_kernel;
      using grouped::Stage;
      if (Status st =
              run_grouped<gemm_kernel<Addressing, Stage::kGateUp>, gemm_kernel<Addressing, Stage::kDown>>(
                  p, s, grid_tiles, grouped::kSmemBytes, dev.device, stream, "grouped::gemm_kernel<kGateUp>",
                  "grouped::gemm_kernel<kDown>");
          !st)
        return st;
    } else {
      if (Status st = run_decode(p, s, choice, grid_tiles, dev, stream); !st) return st;
    }

    // 4. Combine.
    return combine(p, s, stream);
  }

 private:
  struct Layout {
    std::size_t expert_offset, num_tiles, unit_counters, tiles, sorted_slot, keys, vals, act, y,
        permuted_input, dequant, partials;
    std::size_t total;
  };

  // Upper bound of work tiles: sum over experts of ceil(count/tile) <= S/tile + min(E+m, S).
  static long long max_tiles(const MoeShape& s, int tile_tokens) {
    const long long slots = s.num_slots();
    return slots / tile_tokens + std::min<long long>(s.total_experts(), slots) + 1;
  }

  static Layout layout(const MoeShape& s, const MoeConfig& c) {
    using detail::align_up;
    Layout l{};
    const std::size_t slots = static_cast<std::size_t>(s.num_slots());
    const std::size_t experts = static_cast<std::size_t>(s.total_experts());
    std::size_t off = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t at = off;
      off += align_up(bytes);
      return at;
    };
    l.expert_offset = take((experts + 1) * sizeof(int));
    l.num_tiles = take(sizeof(int));
    l.unit_counters = take(2 * sizeof(int));
    l.tiles = take(static_cast<std::size_t>(max_tiles(s, 8)) * sizeof(WorkTile));
    l.sorted_slot = take(slots * sizeof(int));
    const bool large = slots > static_cast<std::size_t>(routing::kSmallSlots);
    // The large routing path's keys (each slot's expert and rank) and per-block counts (RoutingParams).
    l.keys = take(large ? slots * sizeof(int) : 0);
    l.vals = take(large ? slots * sizeof(int) : 0);
    l.act = take(slots * static_cast<std::size_t>(s.intermediate) * sizeof(bf16));
    l.y = take(slots * static_cast<std::size_t>(s.hidden) * sizeof(bf16));
    // Quantized experts: the input with K permuted for the TMA grouped GEMM (grouped::permute_k_kernel).
    l.permuted_input = take(Precision::kQuantized ? static_cast<std::size_t>(s.num_tokens) *
                                                        static_cast<std::size_t>(s.hidden) * sizeof(bf16)
                                                  : 0);
    // MoeConfig::grouped_dequant: the bf16 copy of the E + m experts ([E+m][3][F·H], Contiguous's layout).
    l.dequant = take(kDequantWorkspace
                         ? static_cast<std::size_t>(experts) * 3 * static_cast<std::size_t>(s.intermediate) *
                               static_cast<std::size_t>(s.hidden) * sizeof(bf16)
                         : 0);
    // MoeConfig::decode_splitk: the fp32 partial sums [T][k + m][F / features][H], for the fewest features
    // per cluster the call may take (kSplitkMinFeatures).
    l.partials =
        take(c.decode_splitk && kSplitkMinFeatures != 0
                 ? static_cast<std::size_t>(splitk::partial_floats(
                       s.num_tokens, s.slots_per_token(), s.intermediate, s.hidden, kSplitkMinFeatures)) *
                       sizeof(float)
                 : 0);
    l.total = off;
    return l;
  }

  // Routing preparation: the expert-sorted slots, expert offsets and work tiles (small: one block; large: a
  // counting sort in two kernels).
  template <class A>
  static Status route(const routing::RoutingParams<A>& r, cudaStream_t stream) {
    const int slots = r.moe.num_slots;
    if (slots <= routing::kSmallSlots) {
      return launch_args(routing::small_kernel<A>, dim3(1), routing::kThreads, 0, stream,
                         "routing::small_kernel", r);
    }
    if (cudaError_t e = routing::launch_large(r, stream); e != cudaSuccess)
      return Status::error("routing::launch_large", std::string("launch failed: ") + cudaGetErrorString(e));
    return Status::success();
  }

  // The top-k weighted sum of each token's slot outputs.
  template <class A>
  static Status combine(const MoeParams<A>& p, const MoeShape& s, cudaStream_t stream) {
    const std::int64_t threads = static_cast<std::int64_t>(s.num_tokens) * (s.hidden / 8);
    return launch(detail::combine_kernel<A>, dim3(static_cast<unsigned>((threads + 255) / 256)), 256, 0,
                  stream, p, "combine_kernel");
  }

  // The decode tiles a configuration may name, one instantiation each: the configuration's own list
  // (`Config::DecodeTiles`, a std::tuple of decode::Tile) where it has one, else detail::DefaultDecodeTiles
  // (bf16) or detail::DefaultQuantDecodeTiles (quantized, with a configuration that has select_quantized).
  using DecodeTiles = typename detail::decode_tiles_of<Config, Precision>::type;

  template <class T>
  static constexpr bool names(const MoeConfig& c) {
    return c.tile_tokens == T::kTileTokens && c.decode_warps == T::kWarps && c.decode_unroll == T::kUnroll &&
           c.decode_prefetch == T::kPrefetch && c.decode_stages == T::kStages;
  }
  template <class T>
  static constexpr int k_multiple_of(const MoeConfig& c) {
    return names<T>(c) ? T::kKMultiple : 0;
  }
  // K multiple the configuration's decode tile needs, 0 when it names no instantiated tile.
  static constexpr int decode_k_multiple(const MoeConfig& c) {
    return std::apply([&](auto... t) { return (k_multiple_of<decltype(t)>(c) + ...); }, DecodeTiles{});
  }
  // Shared memory per block of the configuration's staged decode tile at reduction length K (the operand
  // slots and scales, decode::staged_smem_bytes, plus the K split's reduction buffer); 0 for other tiles.
  template <class T>
  static constexpr long long staged_smem_of(const MoeConfig& c, int k) {
    if constexpr (Precision::kQuantized && T::kStages > 0)
      return names<T>(c) ? decode::staged_smem_bytes<Precision, T>(k) + decode::reduction_bytes<T>() : 0;
    else
      return 0;
  }
  static constexpr long long decode_block_smem(const MoeConfig& c, int k) {
    return std::apply([&](auto... t) { return (staged_smem_of<decltype(t)>(c, k) + ...); }, DecodeTiles{});
  }
  // Shared memory per preloading down block (MoeConfig::decode_preload) of the configuration's decode tile at
  // intermediate size F: its W2 rows plus the reduction buffer; 0 when it names no instantiated tile.
  template <class T>
  static constexpr long long preload_block_bytes(int f) {
    return decode::preload_smem_bytes(f) + decode::reduction_bytes<T>();
  }
  template <class T>
  static constexpr long long preload_smem_of(const MoeConfig& c, int f) {
    return names<T>(c) ? preload_block_bytes<T>(f) : 0;
  }
  static constexpr long long preload_block_smem(const MoeConfig& c, int f) {
    return std::apply([&](auto... t) { return (preload_smem_of<decltype(t)>(c, f) + ...); }, DecodeTiles{});
  }

  // The two stages of a grouped GEMM: gate/up over F / 64 feature slices, down over H / 128 row slices, one
  // per block, each with `smem` bytes of dynamic shared memory (set once per device).
  template <auto kGateUp, auto kDown>
  static Status run_grouped(const MoeParams<Addressing>& p, const MoeShape& s, unsigned grid_tiles, int smem,
                            int device, cudaStream_t stream, const char* gate_up_name, const char* down_name,
                            unsigned threads = grouped::kThreads) {
    if (Status st = detail::set_smem<kGateUp>(device, smem); !st) return st;
    if (Status st = detail::set_smem<kDown>(device, smem); !st) return st;
    const unsigned gate_up_blocks = static_cast<unsigned>(s.intermediate / grouped::kGateUpFeatures);
    if (Status st = launch(kGateUp, dim3(gate_up_blocks, grid_tiles), threads, smem, stream, p, gate_up_name);
        !st)
      return st;
    const unsigned down_blocks = static_cast<unsigned>(s.hidden / grouped::kBlockN);
    return launch(kDown, dim3(down_blocks, grid_tiles), threads, smem, stream, p, down_name);
  }
  // The sm_90 cp.async grouped GEMM described by Gemm (grouped::Sm90Gemm, Sm90SmallGemm).
  template <class Gemm>
  static Status run_sm90(const MoeParams<Addressing>& p, const MoeShape& s, unsigned grid_tiles, int device,
                         cudaStream_t stream) {
    using grouped::Stage;
    return run_grouped<Gemm::template kKernel<Stage::kGateUp>, Gemm::template kKernel<Stage::kDown>>(
        p, s, grid_tiles, Gemm::kSmem, device, stream, Gemm::kGateUpName, Gemm::kDownName, Gemm::kThreads);
  }

  // The persistent TMA grouped GEMMs (tma_addressing): grouped::gemm_tma_kernel on bf16 experts,
  // grouped::gemm_tma_quant_kernel on int8 / int4 ones (after grouped::permute_k_kernel writes the input with
  // K permuted into `permuted_input`); each stage's tensor maps over the addressing's regions (gate/up: K =
  // H, boxes of a unit's 128 W1 rows and 128 W3 rows; down: K = F, boxes of its 256 W2 rows) and unit
  // counter, one block per SM at most.
  // A, P: the addressing and precision of the experts it reads (the layer's own, or Contiguous bf16 over a
  // grouped_dequant copy).
  template <class A, class P>
  static Status run_tma(const MoeParams<A>& p, const MoeShape& s, const MoeConfig& c, unsigned grid_tiles,
                        const detail::DeviceInfo& dev, cudaStream_t stream, bf16* permuted_input) {
    if constexpr (tma_addressing<A>) {
      if constexpr (P::kQuantized) {
        if (c.tile_tokens == grouped::kTmaSmallTokens)
          return run_tma_units<A, P, grouped::kTmaSmallTokens>(p, s, grid_tiles, dev, stream, permuted_input);
      }
      return run_tma_units<A, P, grouped::kBlockM>(p, s, grid_tiles, dev, stream, permuted_input);
    } else {
      (void)p, (void)s, (void)grid_tiles, (void)dev, (void)stream, (void)permuted_input;
      return Status::error("config.grouped_rows", c.grouped_rows,
                           "the TMA grouped GEMM needs tma_regions() (can_implement, config)");
    }
  }
  // run_tma on units of kTokens token rows (grouped::TmaGemm).
  template <class A, class P, int kTokens>
  static Status run_tma_units(const MoeParams<A>& p, const MoeShape& s, unsigned grid_tiles,
                              const detail::DeviceInfo& dev, cudaStream_t stream, bf16* permuted_input) {
    using grouped::Stage;
    using Gemm = grouped::TmaGemm<A, P, kTokens>;
    auto stage = [&]<Stage kStage>(int k, int box_rows, int slices, const char* name) -> Status {
      constexpr auto kernel = Gemm::template kKernel<kStage>;
      grouped::TmaParams<A> tp{};
      tp.moe = p;
      if (P::kQuantized && kStage == Stage::kGateUp) tp.moe.input = permuted_input;
      tp.unit_counter = p.unit_counters + (kStage == Stage::kGateUp ? 0 : 1);
      const std::array<const void*, 2> regions = A::tma_regions(p.addr);
      for (int i = 0; i < 2; ++i) {
        tp.regions[i] = static_cast<const unsigned char*>(regions[i]);
        if (regions[i] == nullptr) continue;
        if (Status st = tma::encode(tp.maps[i], {regions[i], k, box_rows, Gemm::kBits}); !st) return st;
      }
      if (Status st = detail::set_smem<kernel>(dev.device, Gemm::kSmem); !st) return st;
      const long long units = static_cast<long long>(grid_tiles) * slices;
      const unsigned grid = static_cast<unsigned>(std::min<long long>(units, dev.sms));
      return launch(kernel, dim3(grid), grouped::kTmaThreads, Gemm::kSmem, stream, tp, name);
    };
    if constexpr (P::kQuantized) {
      const long long threads = static_cast<long long>(s.num_tokens) * (s.hidden / 8);  // 16-byte chunks
      if (Status st =
              launch_args(grouped::permute_k_kernel, dim3(static_cast<unsigned>((threads + 255) / 256)), 256,
                          0, stream, "grouped::permute_k_kernel", p.input, permuted_input,
                          static_cast<long long>(s.num_tokens), s.hidden);
          !st)
        return st;
    }
    if (Status st = stage.template operator()<Stage::kGateUp>(
            s.hidden, grouped::kBlockN, s.intermediate / (2 * grouped::kGateUpFeatures), Gemm::kGateUpName);
        !st)
      return st;
    return stage.template operator()<Stage::kDown>(s.intermediate, 2 * grouped::kBlockN,
                                                   s.hidden / (2 * grouped::kBlockN), Gemm::kDownName);
  }

  // The split-K decode (moe/decode_splitk.cuh): a cluster of 4 blocks per (token, slot, the form's features
  // of F), then the combine of the partial sums; no routing. Its forms, in the order a call tries them: the
  // configuration's (Config::splitk_shapes) where it names them, else DefaultMoeConfig's.
  static constexpr SplitkShapes kSplitkShapes = splitk_shapes_of<Config>(splitk::bits_of<Precision>());
  // The fewest features per cluster among the forms (the partials' workspace holds that many), 0 for none.
  static constexpr int kSplitkMinFeatures = [] {
    int fewest = 0;
    for (const SplitkShape& form : kSplitkShapes)
      if (form.features != 0 && (fewest == 0 || form.features < fewest)) fewest = form.features;
    return fewest;
  }();
  // The kernel of a form (SplitkShape::kernel_form) and its geometry.
  template <SplitkShape kS>
  static constexpr auto kSplitkKernel =
      splitk::kernel<Addressing, Precision, kS.features, kS.h_split, kS.steps, kS.mma>;
  template <SplitkShape kS>
  using SplitkGeometry = splitk::Geometry<Precision, kS.features, kS.h_split, kS.steps, kS.mma>;

  // Calls f.template operator()<kS>() with kS the kernel of the form kSplitkShapes[choice]
  // (SplitkShape::kernel_form; none where it names no form).
  template <class F>
  static void on_splitk_shape(int choice, F&& f) {
    auto one = [&]<std::size_t kI>() {
      constexpr SplitkShape kS = kSplitkShapes[kI].kernel_form();
      if constexpr (kS.features != 0)
        if (choice == static_cast<int>(kI)) f.template operator()<kS>();
    };
    [&]<std::size_t... kI>(std::index_sequence<kI...>) {
      (one.template operator()<kI>(), ...);
    }
    (std::make_index_sequence<kSplitkShapes.size()>{});
  }
  // The kernel's shared memory at hidden size H, set on the device where it passes the default.
  template <SplitkShape kS>
  static Status splitk_smem(int hidden, const detail::DeviceInfo& dev, int& smem) {
    smem = static_cast<int>(splitk::smem_bytes(hidden));
    return detail::set_smem<kSplitkKernel<kS>>(dev.device, smem, SplitkGeometry<kS>::kStaticSmemBytes);
  }

  static Status run_splitk(int choice, const MoeParams<Addressing>& p, const MoeShape& s, float* partials,
                           const detail::DeviceInfo& dev, cudaStream_t stream) {
    Status st = Status::error("config.decode_splitk", choice, "split-K form not instantiated");
    on_splitk_shape(choice, [&]<SplitkShape kS>() {
      const splitk::Params<Addressing> sp{p, partials};
      int smem = 0;
      if (st = splitk_smem<kS>(s.hidden, dev, smem); !st) return;
      if (st = launch_clustered(
              kSplitkKernel<kS>,
              dim3(splitk::kCluster * (s.intermediate / kS.features), s.slots_per_token(), s.num_tokens),
              SplitkGeometry<kS>::kThreads, smem, splitk::kCluster, stream, "splitk::kernel", sp);
          !st)
        return;
      st = launch(splitk::combine_kernel<Addressing, kS.features>,
                  dim3(s.hidden / splitk::kCombineColumns, s.num_tokens),
                  static_cast<unsigned>(32 * s.slots_per_token()), 0, stream, sp, "splitk::combine_kernel");
    });
    return st;
  }

  // The form a split-K call takes (splitk_form_for over kSplitkShapes: the first whose features divide F,
  // that serves H, reaches its min_clusters and whose clusters all fit the device at once), -1 where none
  // does (the decode tiles run). Two waves of clusters ran 1.02-1.17x the decode tiles' time
  // (MoeConfig::decode_splitk).
  static int splitk_choice(const MoeShape& s, const detail::DeviceInfo& dev) {
    auto min_hidden = [](int choice) {
      int h = 0;
      on_splitk_shape(choice, [&]<SplitkShape kS>() { h = splitk::min_hidden<SplitkGeometry<kS>>(); });
      return h;
    };
    auto capacity = [&](int choice) {
      return static_cast<long long>(splitk_capacity(choice, s.hidden, dev));
    };
    return splitk_form_for(kSplitkShapes, s, min_hidden, capacity);
  }
  // cudaOccupancyMaxActiveClusters of the form kSplitkShapes[choice] at its shared memory, remembered per
  // device for the last H asked; 0 before sm_90 and for a choice that names no form.
  static int splitk_capacity(int choice, int hidden, const detail::DeviceInfo& dev) {
    int clusters = 0;
    if (dev.major >= 9)
      on_splitk_shape(choice, [&]<SplitkShape kS>() { clusters = splitk_capacity<kS>(hidden, dev); });
    return clusters;
  }
  template <SplitkShape kS>
  static int splitk_capacity(int hidden, const detail::DeviceInfo& dev) {
    static std::array<std::atomic<long long>, detail::kMaxDevices> cache{};  // (H << 32) | clusters
    const bool cached = dev.device < detail::kMaxDevices;
    if (cached) {
      const long long v = cache[dev.device].load(std::memory_order_relaxed);
      if (v != 0 && (v >> 32) == hidden) return static_cast<int>(v & 0xffffffffLL);
    }
    int smem = 0;
    if (!splitk_smem<kS>(hidden, dev, smem)) return 0;
    const LaunchConfig probe(dim3(splitk::kCluster), SplitkGeometry<kS>::kThreads,
                             static_cast<std::size_t>(smem), nullptr, splitk::kCluster, false);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kSplitkKernel<kS>, &probe.config) != cudaSuccess) {
      cudaGetLastError();  // not an error of the layer: the decode tiles run instead
      return 0;
    }
    if (cached)
      cache[dev.device].store((static_cast<long long>(hidden) << 32) | clusters, std::memory_order_relaxed);
    return clusters;
  }

  // Calls f.template operator()<T>() with the instantiated decode tile T that `c` names, if one does.
  template <class F>
  static void on_decode_tile(const MoeConfig& c, F&& f) {
    std::apply(
        [&](auto... t) { ((names<decltype(t)>(c) ? (f.template operator()<decltype(t)>(), 0) : 0), ...); },
        DecodeTiles{});
  }

  static Status run_decode(const MoeParams<Addressing>& p, const MoeShape& s, const MoeConfig& c,
                           unsigned grid_tiles, const detail::DeviceInfo& dev, cudaStream_t stream) {
    Status st = Status::success();
    on_decode_tile(c, [&]<class T>() { st = run_decode_tile<T>(p, s, c, grid_tiles, dev, stream); });
    return st;
  }

  // Shared memory per SM a preloading down stage leaves to the gate/up blocks still resident (a few KB each:
  // the K split's reduction buffer and the block's reservation), and sm_90's reservation per block.
  static constexpr long long kPreloadSmLeft = 16 * 1024;
  static constexpr long long kBlockReservedSmem = 1024;

  // Whether a call on decode tile T preloads W2: asked for (MoeConfig::decode_preload), a bf16 8-token tile,
  // and every preloading down block of the call (one per 32 rows of H per work tile; a tile per routed expert
  // and shared chunk where no expert can have more tokens than a tile, T <= its tokens, else the grid's
  // bound) fits the device's shared memory at once, beside the gate/up blocks. Where they do not, the blocks
  // that find no room wait, then load and compute in turn, and the layer is slower than streaming
  // (docs/results/paged_moe_h200.md, "Down weights preloaded during gate/up"), so the call streams.
  template <class T>
  static bool preloads(bool asked, const MoeShape& s, unsigned grid_tiles, const detail::DeviceInfo& dev) {
    if constexpr (Precision::kQuantized || T::kTokTiles != 1) {
      return false;
    } else {
      const long long tiles =
          s.num_tokens <= T::kTileTokens ? std::min<long long>(grid_tiles, whole_batch_tiles(s)) : grid_tiles;
      const long long per_block = preload_block_bytes<T>(s.intermediate) + kBlockReservedSmem;
      return asked && tiles * (s.hidden / decode::kDownRows) * per_block <=
                          static_cast<long long>(dev.sms) * (dev.smem_per_sm - kPreloadSmLeft);
    }
  }

  template <class T>
  static Status run_decode_tile(const MoeParams<Addressing>& p, const MoeShape& s, const MoeConfig& c,
                                unsigned grid_tiles, const detail::DeviceInfo& dev, cudaStream_t stream) {
    using decode::Stage;
    if (Status st = decode_launch<T, Stage::kGateUp>(p, s, grid_tiles, dev, stream); !st) return st;
    if constexpr (!Precision::kQuantized && T::kTokTiles == 1) {  // decode_preload excludes decode_down_warps
      if (preloads<T>(c.decode_preload, s, grid_tiles, dev)) {
        constexpr auto kPreloadDown = decode::gemv_kernel<Addressing, Stage::kDown, T, Precision, true>;
        const int smem = static_cast<int>(decode::preload_smem_bytes(s.intermediate));
        if (Status st = detail::set_smem<kPreloadDown>(dev.device, smem,
                                                       static_cast<int>(decode::reduction_bytes<T>()));
            !st)
          return st;
        return launch(kPreloadDown, dim3(s.hidden / decode::kDownRows, grid_tiles), T::kThreads, smem, stream,
                      p, "decode::gemv_kernel<kDown, preload>");
      }
    }
    // The down stage on the tile of its own warps (down_tile_config: T itself unless decode_down_warps
    // names others).
    std::optional<Status> st;
    on_decode_tile(down_tile_config(c), [&]<class D>() {
      st = decode_launch<D, Stage::kDown, early_down<T>()>(p, s, grid_tiles, dev, stream);
    });
    return st ? *st
              : Status::error("config.decode_down_warps", c.decode_down_warps,
                              "names no instantiated decode tile (PagedMoe::DecodeTiles)");
  }

  // Whether the down stage of a call on decode tile T issues its first W2 loads before it waits for gate/up
  // (decode::gemv_kernel's kEarlyWeights): where the configuration asks for it (detail::early_weights_of),
  // bf16 and int8 on every tile, int4 on its 2-warp row and on tiles of 16 or more tokens. On an H100 the
  // early loads took 0.927-1.000x the late ones' layer time on int8's decode tiles, 0.972-0.991x on bf16's
  // at 3 tokens on Qwen (Mixtral at 1 token 1.013x); int4's 2-warp row (Qwen at 16-64 tokens) 0.941-0.977x
  // and Mixtral's 16-token tile at 33 tokens 0.939x, while its 8-token tiles on 4 or 8 warps (1-16 tokens)
  // ranged 0.952-1.081x (docs/results/paged_moe_h200.md, "The down stage's first weights before its
  // dependency wait").
  template <class T>
  static constexpr bool early_down() {
    return detail::early_weights_of<Config>::value &&
           (!std::is_same_v<Precision, Int4> || T::kWarps == 2 || T::kTileTokens >= 16);
  }

  // One decode stage on tile T: gate/up one block per 16 features of F, down one per 32 rows of H, over
  // `tiles` work tiles; a staged tile's operand slots and scales in dynamic shared memory. kEarly: the down
  // stage's early W2 loads (early_down, of the call's tile).
  template <class T, decode::Stage kStage, bool kEarly = false>
  static Status decode_launch(const MoeParams<Addressing>& p, const MoeShape& s, unsigned tiles,
                              const detail::DeviceInfo& dev, cudaStream_t stream) {
    constexpr bool kGateUp = kStage == decode::Stage::kGateUp;
    constexpr auto kernel = decode::gemv_kernel<Addressing, kStage, T, Precision, false, kEarly>;
    int smem = 0;
    if constexpr (Precision::kQuantized && T::kStages > 0) {
      smem = static_cast<int>(decode::staged_smem_bytes<Precision, T>(kGateUp ? s.hidden : s.intermediate));
      if (Status st =
              detail::set_smem<kernel>(dev.device, smem, static_cast<int>(decode::reduction_bytes<T>()));
          !st)
        return st;
    }
    const dim3 grid(kGateUp ? s.intermediate / decode::kGateUpRows : s.hidden / decode::kDownRows, tiles);
    return launch(kernel, grid, T::kThreads, smem, stream, p,
                  kGateUp ? "decode::gemv_kernel<kGateUp>" : "decode::gemv_kernel<kDown>");
  }

  // Launches a kernel of the layer with programmatic dependent launch: its blocks may start
  // while the previous kernel drains and wait in ptx::grid_dependency_wait(), which hides the launch gap (a
  // few µs per kernel against a ~16 µs decode floor). Works under stream capture (graph edges become
  // programmatic).
  template <class Kernel, class Params>
  static Status launch(Kernel kernel, dim3 grid, unsigned threads, std::size_t smem, cudaStream_t stream,
                       const Params& p, const char* what) {
    return launch_args(kernel, grid, threads, smem, stream, what, p);
  }

  // launch() for a kernel of several arguments.
  template <class Kernel, class... Args>
  static Status launch_args(Kernel kernel, dim3 grid, unsigned threads, std::size_t smem, cudaStream_t stream,
                            const char* what, Args... args) {
    return launch_clustered(kernel, grid, threads, smem, 1, stream, what, args...);
  }

  // launch_args() in clusters of `cluster` blocks along x (1: no clusters).
  template <class Kernel, class... Args>
  static Status launch_clustered(Kernel kernel, dim3 grid, unsigned threads, std::size_t smem, int cluster,
                                 cudaStream_t stream, const char* what, Args... args) {
    const LaunchConfig launch(grid, threads, smem, stream, cluster, true);
    if (cudaError_t e = cudaLaunchKernelEx(&launch.config, kernel, args...); e != cudaSuccess)
      return Status::error(what, std::string("launch failed: ") + cudaGetErrorString(e));
    return launched(what);
  }

  // A launch's configuration: with programmatic dependent launch (`pdl`) and, where `cluster` > 1, in
  // clusters of that many blocks along x. `config.attrs` points into the object, which therefore is not
  // copied.
  struct LaunchConfig {
    cudaLaunchAttribute attrs[2]{};
    cudaLaunchConfig_t config{};
    LaunchConfig(dim3 grid, unsigned threads, std::size_t smem, cudaStream_t stream, int cluster, bool pdl) {
      unsigned n = 0;
      if (pdl) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
      }
      if (cluster > 1) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n++].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
      }
      config.gridDim = grid;
      config.blockDim = dim3(threads);
      config.dynamicSmemBytes = smem;
      config.stream = stream;
      config.attrs = attrs;
      config.numAttrs = n;
    }
    LaunchConfig(const LaunchConfig&) = delete;
    LaunchConfig& operator=(const LaunchConfig&) = delete;
  };

  static Status launched(const char* what) {
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      return Status::error(what, std::string("launch failed: ") + cudaGetErrorString(e));
    return Status::success();
  }
};

}  // namespace amoeba::kernels
