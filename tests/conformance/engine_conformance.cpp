// Compile-time checks of the step contract (amoeba/engine/): the device-shared ExpertLocation is trivially
// copyable with a fixed layout, a minimal archetype models `backend`, and types missing a member or with a
// wrong signature do not; the optional members (kMeasured, populate) are detected only where they are.
#include <optional>
#include <string_view>
#include <type_traits>

#include "amoeba/engine/backend.hpp"
#include "amoeba/engine/expert_location.hpp"
#include "amoeba/engine/step.hpp"
#include "amoeba/pool.hpp"

namespace {
using namespace amoeba;

static_assert(std::is_trivially_copyable_v<ExpertLocation> && std::is_standard_layout_v<ExpertLocation>);
static_assert(ExpertLocation{}.absent() && !ExpertLocation{}.in_buffer());
static_assert(ExpertLocation{{4, 5, 6}, -1}.in_pages() &&
              ExpertLocation{{4, 5, 6}, -1}.page_of(ExpertMatrix::kW2) == 6);
static_assert(ExpertLocation{{-1, -1, -1}, 2}.in_buffer());
static_assert(static_cast<int>(ExpertMatrix::kW1) == 0 && static_cast<int>(ExpertMatrix::kW3) == 1 &&
              static_cast<int>(ExpertMatrix::kW2) == 2 && kMatricesPerExpert == 3);
static_assert(std::is_abstract_v<RoutingSource>);

// ---- the least a backend must provide
struct BackendArchetype {
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>&, StepResult&) {
    return std::nullopt;
  }
  double idle_step_s() const { return 0; }
  std::string_view name() const { return "archetype"; }
};
static_assert(backend<BackendArchetype, MoePool> && backend<BackendArchetype, HybridMoePool>);

// ---- non-models
struct BackendWithoutIdle {
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>&, StepResult&) {
    return std::nullopt;
  }
  std::string_view name() const { return "x"; }
};
struct BackendWithoutName {
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>&, StepResult&) {
    return std::nullopt;
  }
  double idle_step_s() const { return 0; }
};
struct BackendReturningVoid {  // a forward that cannot refuse a bad change list
  template <class Pool>
  void forward(const StepInput<Pool>&, StepResult&) {}
  double idle_step_s() const { return 0; }
  std::string_view name() const { return "x"; }
};
struct BackendOnlyForOnePool {  // the engine instantiates it for the pool the model needs
  std::optional<ChangeError> forward(const StepInput<MoePool>&, StepResult&) { return std::nullopt; }
  double idle_step_s() const { return 0; }
  std::string_view name() const { return "x"; }
};
static_assert(!backend<BackendWithoutIdle, MoePool> && !backend<BackendWithoutName, MoePool>);
static_assert(!backend<BackendReturningVoid, MoePool>);
static_assert(backend<BackendOnlyForOnePool, MoePool> && !backend<BackendOnlyForOnePool, HybridMoePool>);

// ---- the optional members
struct MeasuredArchetype : BackendArchetype {
  static constexpr bool kMeasured = true;
  void populate(const ResidencyTable&) {}
};
struct MarkedSimulated : BackendArchetype {
  static constexpr bool kMeasured = false;
};
struct PopulateWithoutResidency : BackendArchetype {  // populate must take the residency table
  void populate() {}
};
static_assert(backend<MeasuredArchetype, MoePool>);
static_assert(measured_backend<MeasuredArchetype> && populating_backend<MeasuredArchetype>);
static_assert(!measured_backend<BackendArchetype> && !measured_backend<MarkedSimulated>);
static_assert(!populating_backend<BackendArchetype> && !populating_backend<PopulateWithoutResidency>);
}  // namespace
