// Device memory for the decoder GPU tests: a CUDA error check and a device array whose put/get copy host
// vectors at an element offset.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace amoeba::test {

inline void check_cuda(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

// A device array of n elements.
template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) {
    check_cuda(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& v, std::size_t at = 0) {
    if (at + v.size() > n) throw std::out_of_range("Dev::put past the end");
    check_cuda(cudaMemcpy(p + at, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // `count` elements from `at`; all n by default.
  std::vector<T> get(std::size_t count, std::size_t at = 0) const {
    if (at + count > n) throw std::out_of_range("Dev::get past the end");
    std::vector<T> v(count);
    check_cuda(cudaMemcpy(v.data(), p + at, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<T> get() const { return get(n); }
  void poison() { check_cuda(cudaMemset(p, 0xff, n * sizeof(T))); }  // bf16 NaN, float NaN, int -1
};

}  // namespace amoeba::test
