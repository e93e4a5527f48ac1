// Thin wrappers over the sm_80+ PTX the MoE kernels use: bf16 tensor-core MMA, ldmatrix, cp.async,
// streaming 16-byte loads, L2 prefetch, and sm_90's cluster barrier and programmatic dependent launch. Kept
// in one place so the collectives read as plain C++.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace amoeba::kernels::ptx {

// D += A·B, m16n8k16, bf16 inputs, fp32 accumulators (row-major A, column-major B).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                               std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// Shared memory per block: what a kernel gets without asking (dynamic plus static) and sm_90's opt-in maximum
// (cudaFuncAttributeMaxDynamicSharedMemorySize, plus the static part).
inline constexpr int kDefaultBlockSmemBytes = 48 * 1024;
inline constexpr int kMaxBlockSmemBytes = 227 * 1024;

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// One 16-byte shared-memory store, always a single vector store (the compiler may otherwise split a uint4
// store into four 32-bit ones, each of which then meets bank conflicts).
__device__ __forceinline__ void st_shared_16(std::uint32_t smem_addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
// Four 8×8 bf16 matrices to shared memory: lane l gives the address of row l % 8 of matrix l / 8, and its
// register j holds row l / 4, columns 2·(l % 4) and + 1 of matrix j (an m16n8 accumulator fragment's layout).
// kTranspose: each matrix is stored transposed, lane l's address then receives column l % 8 of matrix l / 8
// (rows 0..7 of the fragment, 16 contiguous bytes).
template <bool kTranspose = false>
__device__ __forceinline__ void stmatrix_x4(std::uint32_t smem_addr, std::uint32_t r0, std::uint32_t r1,
                                            std::uint32_t r2, std::uint32_t r3) {
  if constexpr (kTranspose)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ uint4 ld_shared_16(std::uint32_t smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr)
               : "memory");
  return v;
}

// 16-byte global→shared copy; src_bytes = 0 fills the destination with zeros (rows past an expert's tokens).
__device__ __forceinline__ void cp_async_16(std::uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
// 16-byte global→shared copies of a thread's own future operands: weights past L1 with the weight loads' L2
// prefetch hint (ld_stream_16), activations through L1 (ld_cached_16).
template <int kPrefetch = 128>
__device__ __forceinline__ void cp_async_stream_16(std::uint32_t smem_addr, const void* gmem) {
  static_assert(kPrefetch == 128 || kPrefetch == 256, "L2 prefetch hint: 128 or 256 bytes");
  if constexpr (kPrefetch == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
  else
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_cached_16(std::uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Weights are read once per layer, with a 128-byte L2 prefetch hint. A quantized decode warp reads 64 bytes
// of each of its rows per k-step, so 128 bytes cover the line's other half too (read by the next warp). A
// 256-byte hint made the L2 fetch more than the kernel used: in the engine at batch 32 (Qwen1.5-MoE, the
// whole model's experts streamed every step) Nsight Compute counted 1.3x (gate/up) and 1.5x (down) the
// weights' bytes read from DRAM, and the MoE layer took 12% longer than with the 128-byte hint
// (docs/results/engine_h200.md, "Decode at fixed batches"); no hint at all was 9% slower still.
// kPrefetch: the hint's size, 128 or 256 bytes (a decode tile's choice, moe_config.hpp). kThroughL1: false
// streams past L1 (no allocation: the quantized loops, whose loads never meet a sector twice); true allocates
// in L1, evict-first (the bf16 loop, whose step pairs read each line's sectors twice: moe/decode_gemv.cuh).
template <int kPrefetch = 128, bool kThroughL1 = false>
__device__ __forceinline__ uint4 ld_stream_16(const void* p) {
  static_assert(kPrefetch == 128 || kPrefetch == 256, "L2 prefetch hint: 128 or 256 bytes");
  uint4 v;
#define AMOEBA_LD_STREAM_16(L1, L2)                                                \
  asm volatile("ld.global.nc.L1::" L1 ".L2::" L2 "B.v4.u32 {%0,%1,%2,%3}, [%4];\n" \
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                        \
               : "l"(p))
  if constexpr (kThroughL1 && kPrefetch == 256)
    AMOEBA_LD_STREAM_16("evict_first", "256");
  else if constexpr (kThroughL1)
    AMOEBA_LD_STREAM_16("evict_first", "128");
  else if constexpr (kPrefetch == 256)
    AMOEBA_LD_STREAM_16("no_allocate", "256");
  else
    AMOEBA_LD_STREAM_16("no_allocate", "128");
#undef AMOEBA_LD_STREAM_16
  return v;
}

// Activations are re-read by every block that works on the same tokens: keep them in L1.
__device__ __forceinline__ uint4 ld_cached_16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// A request that the L2 fetch the line holding p (no data returned).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// The cluster barrier (sm_90) in two halves: every block arrives once it runs, and waits before it first
// writes into another block's shared memory (which must have started); relaxed: the arrival orders no memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// Programmatic dependent launch (sm_90): wait until the previous kernel in the stream has completed and its
// writes are visible; allow the next kernel to start launching (its blocks then wait in
// grid_dependency_wait).
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
}

}  // namespace amoeba::kernels::ptx
