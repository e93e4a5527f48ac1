// Plain fp32 GPU reference of one MoE layer for a sample of tokens: for token counts where the double CPU
// reference would take too long. No tensor cores, no tiling, no routing preparation: one warp per output
// value, fp32 accumulation over bf16 inputs, the intermediate kept in fp32 (not rounded to bf16). Expert
// matrices are given as an explicit [E+m][3] table of base pointers, computed by the caller independently of
// the kernel's addressing policies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe/moe_shape.hpp"

namespace amoeba::reference {

struct GpuReferenceParams {
  const __nv_bfloat16* const* matrices;  // [E+m][3]: W1, W3 (F×H), W2 (H×F)
  const __nv_bfloat16* input;            // [T, H]
  const std::int32_t* topk_ids;          // [T, k]
  const float* topk_weights;             // [T, k]
  const float* shared_weights;           // [T] or null
  const int* tokens;                     // [n] sampled token indices
  int num_sampled;
  int hidden, intermediate, num_experts, top_k, slots_per_token;
  float* act;  // [n, k+m, F] scratch
  float* out;  // [n, H]
};

__device__ inline int reference_expert(const GpuReferenceParams& p, int t, int j) {
  if (j < p.top_k) {
    const int e = p.topk_ids[static_cast<std::int64_t>(t) * p.top_k + j];
    return (e >= 0 && e < p.num_experts) ? e : -1;
  }
  return p.num_experts + j - p.top_k;
}

// grid (num_sampled·(k+m), ceil(F/8)), 256 threads: warp w computes feature blockIdx.y·8 + w.
__global__ void reference_act_kernel(GpuReferenceParams p) {
  const int i = blockIdx.x / p.slots_per_token, j = blockIdx.x % p.slots_per_token;
  const int f = blockIdx.y * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (f >= p.intermediate) return;
  const int t = p.tokens[i];
  const int e = reference_expert(p, t, j);
  float g = 0.f, u = 0.f;
  if (e >= 0) {
    const __nv_bfloat16* x = p.input + static_cast<std::int64_t>(t) * p.hidden;
    const __nv_bfloat16* w1 = p.matrices[3 * e + 0] + static_cast<std::int64_t>(f) * p.hidden;
    const __nv_bfloat16* w3 = p.matrices[3 * e + 1] + static_cast<std::int64_t>(f) * p.hidden;
    for (int h = lane; h < p.hidden; h += 32) {
      const float xv = __bfloat162float(x[h]);
      g += __bfloat162float(w1[h]) * xv;
      u += __bfloat162float(w3[h]) * xv;
    }
    for (int o = 16; o > 0; o /= 2) {
      g += __shfl_xor_sync(0xffffffffu, g, o);
      u += __shfl_xor_sync(0xffffffffu, u, o);
    }
  }
  if (lane == 0)
    p.act[(static_cast<std::int64_t>(i) * p.slots_per_token + j) * p.intermediate + f] =
        e >= 0 ? g / (1.f + expf(-g)) * u : 0.f;
}

// grid (num_sampled, ceil(H/8)), 256 threads: warp w computes hidden value blockIdx.y·8 + w.
__global__ void reference_out_kernel(GpuReferenceParams p) {
  const int i = blockIdx.x, h = blockIdx.y * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (h >= p.hidden) return;
  const int t = p.tokens[i];
  float total = 0.f;
  for (int j = 0; j < p.slots_per_token; ++j) {
    const int e = reference_expert(p, t, j);
    if (e < 0) continue;
    const float w = j < p.top_k ? p.topk_weights[static_cast<std::int64_t>(t) * p.top_k + j]
                                : (p.shared_weights != nullptr ? p.shared_weights[t] : 1.f);
    const __nv_bfloat16* w2 = p.matrices[3 * e + 2] + static_cast<std::int64_t>(h) * p.intermediate;
    const float* a = p.act + (static_cast<std::int64_t>(i) * p.slots_per_token + j) * p.intermediate;
    float d = 0.f;
    for (int f = lane; f < p.intermediate; f += 32) d += __bfloat162float(w2[f]) * a[f];
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    total += w * d;
  }
  if (lane == 0) p.out[static_cast<std::int64_t>(i) * p.hidden + h] = total;
}

inline cudaError_t run_reference(const GpuReferenceParams& p, cudaStream_t stream) {
  if (p.num_sampled == 0) return cudaSuccess;
  reference_act_kernel<<<dim3(p.num_sampled * p.slots_per_token, (p.intermediate + 7) / 8), 256, 0, stream>>>(
      p);
  reference_out_kernel<<<dim3(p.num_sampled, (p.hidden + 7) / 8), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace amoeba::reference
