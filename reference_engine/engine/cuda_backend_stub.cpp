// CudaBackend where this build has no CUDA backend (AMOEBA_HAS_CUDA_BACKEND off: no nvcc, or no FlashInfer,
// as in the default and host presets): the class of cuda_backend.hpp with every member defined, so that the
// engine, the dispatch table and the CLI build and link everywhere. The constructor refuses, naming
// --backend; no object exists, so the other members are never reached (they throw std::logic_error).
#include <stdexcept>
#include <string>

#include "amoeba/core/errors.hpp"
#include "engine/cuda_backend.hpp"

namespace amoeba::engine {

namespace {
[[noreturn]] void unreachable(const char* member) {
  throw std::logic_error(std::string("CudaBackend::") + member +
                         ": this build has no CUDA backend (the constructor refuses)");
}
}  // namespace

struct CudaBackend::Impl {};

std::uint64_t CudaMemoryReport::device_free_now() const {
  return 0;
}

CudaBackend::CudaBackend(const CudaBackendConfig&, TokenSource) {
  throw ConfigError("--backend", "cuda",
                    "this build has no CUDA backend: configure with the gpu preset (cmake --preset gpu) on a "
                    "machine with nvcc and a GPU");
}
CudaBackend::~CudaBackend() = default;
CudaBackend::CudaBackend(CudaBackend&&) noexcept = default;
CudaBackend& CudaBackend::operator=(CudaBackend&&) noexcept = default;

void CudaBackend::populate(const ResidencyTable&) {
  unreachable("populate");
}
std::span<const std::int32_t> CudaBackend::tokens(std::uint64_t) const {
  unreachable("tokens");
}
void CudaBackend::release(std::uint64_t) {
  unreachable("release");
}

void CudaBackend::replace_last_token(std::uint64_t, std::int32_t) {
  unreachable("replace_last_token");
}
const std::vector<std::vector<float>>& CudaBackend::last_logits() const {
  unreachable("last_logits");
}
const CudaMemoryReport& CudaBackend::memory() const {
  unreachable("memory");
}
const CudaBackendConfig& CudaBackend::config() const {
  unreachable("config");
}
std::optional<ChangeError> CudaBackend::forward_impl(const StepBatch&, const ChangeList&,
                                                     const ResidencyTable&, const PoolOwners&, RoutingSource&,
                                                     StepResult&) {
  unreachable("forward");
}

bool cuda_backend_available() noexcept {
  return false;
}

}  // namespace amoeba::engine
