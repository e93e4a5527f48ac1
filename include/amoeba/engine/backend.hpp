// The `backend` concept: what Engine<Pool, Adjuster, Backend> needs from whatever runs a forward pass
// (DESIGN §3.7). Models: SimBackend (reference_engine/engine/sim_backend.hpp, a cost model over the
// LoadPlanner's copies) and a GPU backend (real kernels and copies). docs/concepts/backend.md lists the
// expressions with their preconditions.
//
//   b.forward(in, out)  runs one forward over in.batch applying in.changes; returns the ChangeError that
//                       LoadPlanner::begin_forward() found in the list (nothing ran then), or nothing. On
//                       success `out` holds this forward's routing, copies, lookups and times, and every
//                       copy the forward issued has completed; the evicted experts are no longer read, so
//                       the caller may commit the ChangeList right after.
//   cb.idle_step_s()    seconds that pass when a step runs no forward (nothing scheduled);
//   cb.name()           "sim", "cuda", ... (reported with every result).
//
// Three optional members, used by the engine where a backend has them:
//   B::kMeasured        a constexpr bool; true (measured_backend): the times the backend reports are
//                       measured, so the engine adds its own host time to the clock (a simulated backend's
//                       clock holds only modelled time, which keeps its output deterministic);
//   b.populate(r)       (populating_backend) writes the experts resident in ResidencyTable `r` into their
//                       pages; called once, after the adjuster's initial placement, before the first forward;
//   b.release(request)  (releasing_backend) forgets what the backend keeps of a finished request (its
//                       tokens); called once per request, after the step that finished it.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/engine/step.hpp"
#include "amoeba/expert/residency_table.hpp"

namespace amoeba {

// The inputs of one forward. Residency is the adjuster's table before this step's ChangeList is committed:
// experts evicted this step are still resident in it, restores are not yet.
template <class Pool>
struct StepInput {
  const StepBatch& batch;
  const ChangeList& changes;
  const ResidencyTable& residency;
  const Pool& pool;
  RoutingSource& routing;
};

template <class B, class Pool>
concept backend = requires(B& b, const B& cb, const StepInput<Pool>& in, StepResult& out) {
  { b.forward(in, out) } -> std::same_as<std::optional<ChangeError>>;
  { cb.idle_step_s() } -> std::convertible_to<double>;
  { cb.name() } -> std::convertible_to<std::string_view>;
};

// True where B::kMeasured is a constant true; false where it is false or absent.
template <class B>
concept measured_backend = requires {
  requires B::kMeasured;
};

template <class B>
concept populating_backend = requires(B& b, const ResidencyTable& residency) {
  b.populate(residency);
};

template <class B>
concept releasing_backend = requires(B& b, std::uint64_t request) {
  b.release(request);
};

}  // namespace amoeba
