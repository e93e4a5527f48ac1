// Shared set-up of the policy tests: a small host-memory pool (4 KiB expert pages, 1 KiB KV pages).
#pragma once

#include <cstdint>

#include "amoeba/pool.hpp"

namespace amoeba::testing {

struct PoolFixture {
  explicit PoolFixture(std::uint32_t expert_pages)
      : arena(std::uint64_t(expert_pages) * 4096), pool(arena.span(), {PageSpec{4096}, PageSpec{1024}}) {}
  HostArena arena;
  MoePool pool;
};

}  // namespace amoeba::testing
