// The Qwen MoE decoders' small operations on the GPU, rounding where transformers' bf16 modules round (the
// host formulas they are tested against: reference_engine/engine/decoder_ops.hpp): RMSNorm per row,
// rotate-half RoPE per head, SiLU(gate) x up, the residual add, the embedding gather and the greedy argmax
// per row. bf16 in and out, float32 inside. The projections and the MoE are GEMMs (cuBLASLt, PagedMoe), not
// here. The CUDA backend runs the fused forms (add_rms_norm_kernel, argmax_rows, model/qkv_prologue.cuh);
// rope_kernel and argmax_kernel are the one-operation references the fused ones are tested against (the
// tests/device_model and tests/device_attention suites). The kernels are static: each translation unit that
// includes this header gets its own copy, where plain __global__ definitions would be defined twice at link
// time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace amoeba::kernels::decoder {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// One block per row; blockDim.x a multiple of 32, at most 1024.
static __global__ void rms_norm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
                                       bf16* __restrict__ out, int dim, float eps) {
  const bf16* xr = x + static_cast<std::int64_t>(blockIdx.x) * dim;
  bf16* yr = out + static_cast<std::int64_t>(blockIdx.x) * dim;
  float sum = 0;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = __bfloat162float(xr[d]);
    sum += v * v;
  }
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x == 0) partial[0] = sum;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(partial[0] / float(dim) + eps);
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    yr[d] = __float2bfloat16_rn(__bfloat162float(weight[d]) * round_bf16(__bfloat162float(xr[d]) * inv));
}

// The residual add and the next RMSNorm in one pass, for rows whose dim is a multiple of 8 and at most
// 8·kAddNormThreads·kAddNormChunks: with kAdd, x[row] = bf16(x + y) first (as add_kernel), then
// out[row] = RMSNorm(x[row]) (as rms_norm_kernel; only the float sum's order differs). Each thread keeps
// its 16-byte chunks in registers, so x is read once. One block of kAddNormThreads threads per row.
inline constexpr int kAddNormThreads = 256;
inline constexpr int kAddNormChunks = 4;
template <bool kAdd>
__global__ void __launch_bounds__(kAddNormThreads)
    add_rms_norm_kernel(bf16* __restrict__ x, const bf16* __restrict__ y, const bf16* __restrict__ weight,
                        bf16* __restrict__ out, int dim, float eps) {
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * dim;
  uint4 xv[kAddNormChunks];
  float sum = 0;
#pragma unroll
  for (int c = 0; c < kAddNormChunks; ++c) {
    const int d = (c * kAddNormThreads + static_cast<int>(threadIdx.x)) * 8;
    if (d >= dim) break;
    xv[c] = *reinterpret_cast<const uint4*>(x + base + d);
    bf16* xe = reinterpret_cast<bf16*>(&xv[c]);
    if constexpr (kAdd) {
      const uint4 yv = *reinterpret_cast<const uint4*>(y + base + d);
      const bf16* ye = reinterpret_cast<const bf16*>(&yv);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        xe[i] = __float2bfloat16_rn(__bfloat162float(xe[i]) + __bfloat162float(ye[i]));
      *reinterpret_cast<uint4*>(x + base + d) = xv[c];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float v = __bfloat162float(xe[i]);
      sum += v * v;
    }
  }
  __shared__ float partial[kAddNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0;
#pragma unroll
  for (int w = 0; w < kAddNormThreads / 32; ++w) sum += partial[w];
  const float inv = 1.0f / sqrtf(sum / float(dim) + eps);
#pragma unroll
  for (int c = 0; c < kAddNormChunks; ++c) {
    const int d = (c * kAddNormThreads + static_cast<int>(threadIdx.x)) * 8;
    if (d >= dim) break;
    const uint4 wv = *reinterpret_cast<const uint4*>(weight + d);
    const bf16* we = reinterpret_cast<const bf16*>(&wv);
    const bf16* xe = reinterpret_cast<const bf16*>(&xv[c]);
    uint4 ov;
    bf16* oe = reinterpret_cast<bf16*>(&ov);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      oe[i] = __float2bfloat16_rn(__bfloat162float(we[i]) * round_bf16(__bfloat162float(xe[i]) * inv));
    *reinterpret_cast<uint4*>(out + base + d) = ov;
  }
}

// Whether add_rms_norm_kernel takes rows of `dim` elements (at these addresses: 16-byte vectors).
inline constexpr int kAddNormMaxDim = 8 * kAddNormThreads * kAddNormChunks;
inline bool add_rms_norm_fits(int dim, const void* x = nullptr, const void* y = nullptr,
                              const void* weight = nullptr, const void* out = nullptr) {
  auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return dim > 0 && dim % 8 == 0 && dim <= kAddNormMaxDim && aligned(x) && aligned(y) && aligned(weight) &&
         aligned(out);
}

// The reference RoPE (QkvPrologue does it in the backend). In place over v [tokens][heads][head_dim]; one
// block per token, one thread per (head, pair j < head_dim / 2). inv_freq [head_dim / 2]: float32, computed
// on the host as transformers does.
static __global__ void rope_kernel(bf16* __restrict__ v, const std::int32_t* __restrict__ positions,
                                   const float* __restrict__ inv_freq, int heads, int head_dim) {
  const int half = head_dim / 2;
  const float pos = float(positions[blockIdx.x]);
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int h = i / half, j = i % half;
    bf16* p = v + (static_cast<std::int64_t>(blockIdx.x) * heads + h) * head_dim;
    const float angle = pos * inv_freq[j];
    const float c = round_bf16(cosf(angle)), s = round_bf16(sinf(angle));
    const float a = __bfloat162float(p[j]), b = __bfloat162float(p[j + half]);
    // d = j: a*c + (-b)*s; d = j + half: b*c + a*s (rotate_half), each product and sum rounded.
    p[j] = __float2bfloat16_rn(round_bf16(a * c) + round_bf16(-b * s));
    p[j + half] = __float2bfloat16_rn(round_bf16(b * c) + round_bf16(a * s));
  }
}

static __global__ void silu_mul_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                       bf16* __restrict__ out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gate[i]);
    out[i] = __float2bfloat16_rn(round_bf16(g / (1.0f + expf(-g))) * __bfloat162float(up[i]));
  }
}

// x += y in bf16.
static __global__ void add_kernel(bf16* __restrict__ x, const bf16* __restrict__ y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

// out[row] = table[ids[row]]; one block per row.
static __global__ void embed_kernel(const bf16* __restrict__ table, const std::int32_t* __restrict__ ids,
                                    bf16* __restrict__ out, int dim) {
  const bf16* src = table + static_cast<std::int64_t>(ids[blockIdx.x]) * dim;
  bf16* dst = out + static_cast<std::int64_t>(blockIdx.x) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
}

// The block's best (value, index) from each thread's: the larger value, the lower index on a tie (as the
// host reference and torch.argmax on a CPU). The result is in thread 0; blockDim.x a multiple of 32.
__device__ __forceinline__ void block_argmax(float& best, int& arg, int none) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
  }
  __shared__ float sb[32];
  __shared__ int sa[32];
  if (threadIdx.x % 32 == 0) sb[threadIdx.x / 32] = best, sa[threadIdx.x / 32] = arg;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < blockDim.x / 32 ? sb[threadIdx.x] : -INFINITY;
    arg = threadIdx.x < blockDim.x / 32 ? sa[threadIdx.x] : none;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
    }
  }
}

// The reference argmax (argmax_rows runs in the backend). Greedy sampling: the index of each row's largest
// logit, the lowest index on a tie (as the host reference and torch.argmax on a CPU); one block of 256
// threads per row.
static __global__ void argmax_kernel(const bf16* __restrict__ logits, int vocab,
                                     std::int32_t* __restrict__ out) {
  const bf16* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int arg = vocab;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    if (v > best) best = v, arg = i;  // i grows per thread: the first maximum of this thread wins
  }
  block_argmax(best, arg, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = arg;
}

// The argmax of long rows (an LM head's vocabulary) on many blocks: argmax_partial_kernel gives each of
// kArgmaxChunks blocks per row one slice of the row (grid (kArgmaxChunks, rows)) and writes the slice's best
// (value, index) to partial[row][chunk]; argmax_final_kernel (one warp per row) takes the best of the row's
// slices, the lowest index on a tie. The same answer as argmax_kernel (NaN never wins; a row of NaN or of
// -inf only gives `vocab`).
inline constexpr int kArgmaxChunks = 64;
struct ArgmaxPartial {
  float value;
  std::int32_t index;
};
static __global__ void argmax_partial_kernel(const bf16* __restrict__ logits, int vocab,
                                             ArgmaxPartial* __restrict__ partial) {
  const bf16* row = logits + static_cast<std::int64_t>(blockIdx.y) * vocab;
  const int per = (vocab + kArgmaxChunks - 1) / kArgmaxChunks;
  const int begin = static_cast<int>(blockIdx.x) * per, end = min(vocab, begin + per);
  float best = -INFINITY;
  int arg = vocab;
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    if (v > best) best = v, arg = i;
  }
  block_argmax(best, arg, vocab);
  if (threadIdx.x == 0)
    partial[static_cast<std::int64_t>(blockIdx.y) * kArgmaxChunks + blockIdx.x] = {best, arg};
}
static __global__ void argmax_final_kernel(const ArgmaxPartial* __restrict__ partial, int vocab,
                                           std::int32_t* __restrict__ out) {
  const int lane = threadIdx.x;
  float best = -INFINITY;
  int arg = vocab;
  for (int c = lane; c < kArgmaxChunks; c += 32) {
    const ArgmaxPartial p = partial[static_cast<std::int64_t>(blockIdx.x) * kArgmaxChunks + c];
    if (p.value > best || (p.value == best && p.index < arg)) best = p.value, arg = p.index;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
  }
  if (lane == 0) out[blockIdx.x] = arg;
}
// Bytes of argmax_rows' workspace for `rows` rows.
inline constexpr std::uint64_t argmax_workspace_bytes(std::uint64_t rows) {
  return rows * kArgmaxChunks * sizeof(ArgmaxPartial);
}
// out[r] = argmax of logits row r (rows x vocab); `partial` holds argmax_workspace_bytes(rows).
inline cudaError_t argmax_rows(const bf16* logits, int rows, int vocab, ArgmaxPartial* partial,
                               std::int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  argmax_partial_kernel<<<dim3(kArgmaxChunks, rows), 256, 0, stream>>>(logits, vocab, partial);
  argmax_final_kernel<<<rows, 32, 0, stream>>>(partial, vocab, out);
  return cudaGetLastError();
}

}  // namespace amoeba::kernels::decoder
