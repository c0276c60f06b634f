// The single Catch2 main() shared by every unit and integration test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
