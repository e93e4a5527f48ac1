// Portability macros for headers shared by host code and CUDA kernels. Host-only translation units never
// include a CUDA header; under nvcc the same functions become callable from device code.
#pragma once

#if defined(__CUDACC__)
#define AMOEBA_HOST_DEVICE __host__ __device__
#define AMOEBA_FORCEINLINE __forceinline__
#else
#define AMOEBA_HOST_DEVICE
#define AMOEBA_FORCEINLINE inline
#endif
