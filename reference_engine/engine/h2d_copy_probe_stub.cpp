// H2dCopyProbe where this build has no CUDA backend: the constructor refuses, naming --backend (as
// CudaBackend's stub does); no object exists, so time() is never reached.
#include <stdexcept>

#include "amoeba/core/errors.hpp"
#include "engine/h2d_copy_probe.hpp"

namespace amoeba::engine {

struct H2dCopyProbe::Impl {};

H2dCopyProbe::H2dCopyProbe(std::uint64_t, std::uint64_t, int) {
  throw ConfigError("--backend", "cuda",
                    "this build has no CUDA backend: configure with the gpu preset (cmake --preset gpu) on a "
                    "machine with nvcc and a GPU");
}
H2dCopyProbe::~H2dCopyProbe() = default;

double H2dCopyProbe::time(std::uint64_t, std::uint64_t) {
  throw std::logic_error("H2dCopyProbe::time: this build has no CUDA backend (the constructor refuses)");
}

}  // namespace amoeba::engine
