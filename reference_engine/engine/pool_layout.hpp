// The unified pool's page layout for a model's page geometry: what the engine, the generate driver and the
// GPU backend build their MoePool / HybridMoePool with.
#pragma once

#include <type_traits>

#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/model.hpp"

namespace amoeba::engine {

template <class Pool>
typename Pool::Layout pool_layout(const PageGeometry& g) {
  // A padded (quantized) expert page reports its payload; a bf16 page is all payload.
  const PageSpec expert{g.expert_page_bytes, g.expert_padding_bytes() > 0 ? g.expert_payload_bytes : 0};
  if constexpr (std::is_same_v<Pool, HybridMoePool>) {
    return {expert, PageSpec{g.ssm_page_bytes, 0}, PageSpec{g.kv_page_bytes, g.kv_payload_bytes},
            PageSpec{g.conv_page_bytes, g.conv_payload_bytes}};
  } else {
    static_assert(std::is_same_v<Pool, MoePool>, "no layout for this pool");
    return {expert, PageSpec{g.kv_page_bytes, g.kv_payload_bytes}};
  }
}

}  // namespace amoeba::engine
