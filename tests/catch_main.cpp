// Catch2's main, compiled once into lf_catch_main.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
