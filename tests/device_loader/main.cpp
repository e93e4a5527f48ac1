// Entry point of the loader's GPU tests: exits 77 (ctest: skipped) when no CUDA device is present.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
