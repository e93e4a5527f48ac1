// The one Catch2 main of every GPU test binary: exits with 77 (ctest: skipped) when no CUDA device is
// present.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipping GPU tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
