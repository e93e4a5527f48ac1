// Umbrella header for the unified page pool: kinds, arenas, the pool and its memory views.
#pragma once

#include "amoeba/pool/arena.hpp"
#include "amoeba/pool/memory_views.hpp"
#include "amoeba/pool/page_kinds.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
