// The order in which the grouped GEMMs run their units (a work tile × a weight slice). The tile list holds
// the shared chunks' tiles first (moe/routing.cuh), so their units are the list's first `chunk_units`. A
// chunk takes every token, so from ~128 tokens on its units read their weight slices from the L2 and are
// bound by the tensor cores, where the routed experts' units are bound by DRAM. MoeConfig::chunk_spread
// spreads the chunks' units over the first min(units, spread · chunk_units) positions of the run order,
// evenly among routed units, each kind keeping its list order: 1 runs them first (the list's order), a
// large value spreads them over the whole call. Host and device, no CUDA header, so the CPU tests check it.
#pragma once

#include "amoeba/core/host_device.hpp"

namespace amoeba::kernels::unit_order {

// The list unit that runs at position u (0 <= u < units) when the list's first chunk_units units are the
// chunks' (0 <= chunk_units <= units) and spread >= 1: over the span's positions, position u runs a chunk's
// unit where ⌊(u+1)·C/span⌋ passes ⌊u·C/span⌋ (C: chunk_units), the chunk unit ⌊u·C/span⌋, else routed
// unit u − ⌊u·C/span⌋; past the span, the list's own unit u. A bijection on [0, units).
AMOEBA_HOST_DEVICE constexpr long long list_unit(long long u, long long units, long long chunk_units,
                                                 long long spread) {
  if (chunk_units <= 0 || spread <= 1) return u;
  const long long span = chunk_units * spread < units ? chunk_units * spread : units;
  if (u >= span) return u;
  const long long before = u * chunk_units / span;
  const bool chunk = (u + 1) * chunk_units / span > before;
  return chunk ? before : chunk_units + (u - before);
}

}  // namespace amoeba::kernels::unit_order
