// AMOEBA_CUDA_CHECK: every CUDA runtime call in the loader goes through it; a failure throws CudaError naming
// the call, the file and line, and the runtime's message (exit code 0 proves nothing on a GPU).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace amoeba::kernels {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const char* call, const char* file, int line)
      : std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")"),
        code_(code) {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

}  // namespace amoeba::kernels

#define AMOEBA_CUDA_CHECK(call)                                                   \
  do {                                                                            \
    const cudaError_t amoeba_err_ = (call);                                       \
    if (amoeba_err_ != cudaSuccess)                                               \
      throw ::amoeba::kernels::CudaError(amoeba_err_, #call, __FILE__, __LINE__); \
  } while (0)
