// The one Catch2 main shared by every CPU test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
