// The Hopper (sm_90a) asynchronous-copy machinery of the TMA grouped GEMMs: shared-memory mbarriers (arrive,
// expected transaction bytes, phase waits), 2-D tensor copies (cp.async.bulk.tensor; bf16 boxes 128-byte
// swizzled, packed int8 / int4 boxes as they are), cp.async arrivals on an mbarrier, named barriers, register
// reallocation between warpgroups (setmaxnreg), and the host side: a 2-D tensor map over a region of expert
// matrices, encoded through the driver entry point the runtime hands out (no link against libcuda).
// One map per (region, K) serves every page of the region, whatever its position: moe/tensor_rows.hpp says
// why and finds a matrix's map and row.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "moe/moe_shape.hpp"
#include "moe/ptx.cuh"

namespace amoeba::kernels::tma {

// ---- device --------------------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA unit arrives on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void arrive(std::uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(ptx::smem_u32(bar))
      : "memory");
}
// One arrival that also announces `bytes` of transactions (the TMA copies of the phase).
__device__ __forceinline__ void arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   ptx::smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// An arrival triggered when all of this thread's earlier cp.async copies have landed; .noinc: the barrier's
// initial count includes it.
__device__ __forceinline__ void cp_async_arrive(std::uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(ptx::smem_u32(bar)) : "memory");
}
// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(ptx::smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Box (x = k, y = row) of a 2-D tensor map into shared memory, completing `bytes` on `bar`.
__device__ __forceinline__ void load_2d(void* smem_dst, const CUtensorMap* map, std::uint64_t* bar, int x,
                                        int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], "
      "[%4];\n" ::"r"(ptx::smem_u32(smem_dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(ptx::smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

// Named barrier `id` among kThreads threads (0 is __syncthreads; the TMA kernels use 1 for the producer
// warpgroup and 2 + w for consumer warpgroup w).
template <int kThreads>
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Register reallocation: a warpgroup gives registers back (producer) or takes them (consumers).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// ---- host ----------------------------------------------------------------------------------------------

// A region of expert matrices read as rows of K values: bf16 (bits 16) or packed int8 / int4 weight rows
// (bits 8 / 4, moe/quant_layout.hpp: K · bits / 8 bytes per row).
struct Region {
  const void* base = nullptr;
  int k = 0;         // values per row (the matrices' K)
  int box_rows = 0;  // rows per copy; a copy is 64 k wide (128 bytes bf16, 64 / 32 bytes packed)
  int bits = 16;     // 16: bf16; 8, 4: packed bytes
};

// The region's tensor map: 2-D, boxes of 64 k × box_rows rows. bf16: 128-byte swizzle (the grouped GEMM's
// shared-memory layout); packed: bytes, unswizzled (the quantized kernel's threads read their own rows). The
// row count is left at 2^31 − 1: the map is only ever read at rows inside the region (each matrix's rows),
// and pages carry no size here.
inline Status encode(CUtensorMap& map, const Region& r) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<Encode>(f);
  }();
  if (fn == nullptr) return Status::error("cuTensorMapEncodeTiled", "not available from the driver");
  if (r.bits != 16 && r.bits != 8 && r.bits != 4)
    return Status::error("tma::Region::bits", r.bits, "must be 16 (bf16), 8 or 4 (packed)");
  const bool bf16 = r.bits == 16;
  const cuuint64_t row_elems =
      bf16 ? static_cast<cuuint64_t>(r.k) : static_cast<cuuint64_t>(r.k) * r.bits / 8;
  const cuuint64_t dims[2] = {row_elems, (1ull << 31) - 1};
  const cuuint64_t strides[1] = {bf16 ? row_elems * 2 : row_elems};
  const cuuint32_t box[2] = {bf16 ? 64u : static_cast<cuuint32_t>(64 * r.bits / 8),
                             static_cast<cuuint32_t>(r.box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult e = fn(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
                        const_cast<void*>(r.base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        bf16 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (e != CUDA_SUCCESS)
    return Status::error("cuTensorMapEncodeTiled", "error " + std::to_string(static_cast<int>(e)) +
                                                       " (k = " + std::to_string(r.k) +
                                                       ", bits = " + std::to_string(r.bits) +
                                                       ", box rows = " + std::to_string(r.box_rows) + ")");
  return Status::success();
}

}  // namespace amoeba::kernels::tma
