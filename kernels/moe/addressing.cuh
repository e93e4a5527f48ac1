// Where the MoE kernel finds each expert's three weight matrices: the addressing policies (tag structs
// modelling `expert_addressing`). `Paged` reads experts from a shared page pool or from a load-buffer slot;
// `Contiguous` reads one [E+m][3][F·H] array. The kernel template is the same for both: it asks the policy
// once per output tile for the base pointer of (expert, matrix), so the inner loops are identical.
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "amoeba/engine/expert_location.hpp"
#include "moe/moe_shape.hpp"

namespace amoeba::kernels {

using bf16 = __nv_bfloat16;

// The host's own vocabulary (amoeba/engine/expert_location.hpp): the LoadPlanner writes ExpertLocation
// entries, the loader copies them to the device page table, and matrix_base() below reads them.
using amoeba::ExpertLocation;
using amoeba::ExpertMatrix;

// An addressing policy: host Arguments, a trivially copyable device Params, and the lookup of (expert, matrix
// j) → base pointer. The routing kernel calls `matrix_base` once per work tile (once per layer per tile) and
// stores the three base pointers in the tile, so the GEMM kernels never look anything up and never branch on
// where an expert lives: paged and contiguous GEMMs run identical instructions.
template <class A>
concept expert_addressing = std::is_trivially_copyable_v<typename A::Arguments> &&
    std::is_trivially_copyable_v<typename A::Params> &&
    requires(const typename A::Arguments& args, const typename A::Params& params, int e, std::int64_t elems) {
  { A::make_params(args, elems) } -> std::same_as<typename A::Params>;
  { A::check(args) } -> std::same_as<Status>;
  { A::matrix_base(params, e, 0) } -> std::same_as<const bf16*>;
};

// Baseline: one contiguous array, expert e matrix j at weights + (3e + j)·F·H, i.e. page_id[e][j] = 3e + j.
struct Contiguous {
  struct Arguments {
    const bf16* weights = nullptr;  // [E+m][3][F·H]
  };
  struct Params {
    const bf16* weights;
    std::int64_t matrix_elems;
  };

  static Params make_params(const Arguments& a, std::int64_t matrix_elems) {
    return {a.weights, matrix_elems};
  }
  static Status check(const Arguments& a) {
    if (a.weights == nullptr) return Status::error("weights.weights", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(a.weights) % 16 != 0)
      return Status::error("weights.weights", "must be 16-byte aligned");
    return Status::success();
  }
  __device__ __forceinline__ static const bf16* matrix_base(const Params& p, int e, int j) {
    return p.weights + (3 * static_cast<std::int64_t>(e) + j) * p.matrix_elems;
  }
  // The regions matrices live in, for kernels that copy by tensor map (grouped::gemm_tma_kernel).
  static std::array<const void*, 2> tma_regions(const Params& p) { return {p.weights, nullptr}; }
};
static_assert(expert_addressing<Contiguous>);

// An addressing policy whose matrices lie in at most two regions, each a whole number of matrices from its
// base (what a tensor map over the region needs): tma_regions() names them, the second may be null.
template <class A>
concept tma_addressing = expert_addressing<A> && requires(const typename A::Params& params) {
  { A::tma_regions(params) } -> std::same_as<std::array<const void*, 2>>;
};

// Experts in a page pool (page p at pool_base + p·F·H elements, i.e. p·F·H·2 bytes: DESIGN's
// addr_e(n, t) = B_P + p_e(n)·f·d + (n mod f)·d + t) or in a load buffer (slot s holds W1, W3, W2 back to
// back at load_buffer + 3·s·F·H elements). `locations` is the per-layer location table the engine builds.
struct Paged {
  struct Arguments {
    const bf16* pool_base = nullptr;
    const bf16* load_buffer = nullptr;          // may be null when no expert has buffer_slot >= 0
    const ExpertLocation* locations = nullptr;  // device array, [E+m]
  };
  struct Params {
    Arguments args;
    std::int64_t matrix_elems;
  };

  static Params make_params(const Arguments& a, std::int64_t matrix_elems) { return {a, matrix_elems}; }
  static Status check(const Arguments& a) {
    if (a.pool_base == nullptr) return Status::error("weights.pool_base", "must not be null");
    if (a.locations == nullptr) return Status::error("weights.locations", "must not be null");
    if (reinterpret_cast<std::uintptr_t>(a.pool_base) % 16 != 0)
      return Status::error("weights.pool_base", "must be 16-byte aligned");
    if (reinterpret_cast<std::uintptr_t>(a.load_buffer) % 16 != 0)
      return Status::error("weights.load_buffer", "must be 16-byte aligned");
    return Status::success();
  }
  __device__ __forceinline__ static const bf16* matrix_base(const Params& p, int e, int j) {
    const ExpertLocation loc = p.args.locations[e];
    return loc.buffer_slot >= 0
               ? p.args.load_buffer + (3 * static_cast<std::int64_t>(loc.buffer_slot) + j) * p.matrix_elems
               : p.args.pool_base + static_cast<std::int64_t>(loc.page[j]) * p.matrix_elems;
  }
  static std::array<const void*, 2> tma_regions(const Params& p) {
    return {p.args.pool_base, p.args.load_buffer};
  }
};
static_assert(expert_addressing<Paged>);

}  // namespace amoeba::kernels
