// The Qwen MoE decoders' small operations on the GPU, rounding where transformers' bf16 modules round (the
// host formulas they are tested against: reference_engine/engine/decoder_ops.hpp): RMSNorm per row,
// rotate-half RoPE per head, SiLU(gate) x up, the residual add, the embedding gather and the greedy argmax
// per row. bf16 in and out, float32 inside. The projections and the MoE are GEMMs (cuBLASLt, PagedMoe), not
// here. The kernels are static: each translation unit that includes this header gets its own copy, where
// plain __global__ definitions would be defined twice at link time.
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

// In place over v [tokens][heads][head_dim]; one block per token, one thread per (head, pair j < head_dim /
// 2). inv_freq [head_dim / 2]: float32, computed on the host as transformers does.
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

// Greedy sampling: the index of each row's largest logit, the lowest index on a tie (as the host reference
// and torch.argmax on a CPU); one block of 256 threads per row.
static __global__ void argmax_kernel(const bf16* __restrict__ logits, int vocab,
                                     std::int32_t* __restrict__ out) {
  const bf16* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int arg = vocab;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    if (v > best) best = v, arg = i;  // i grows per thread: the first maximum of this thread wins
  }
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
    arg = threadIdx.x < blockDim.x / 32 ? sa[threadIdx.x] : vocab;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = arg;
  }
}

}  // namespace amoeba::kernels::decoder
