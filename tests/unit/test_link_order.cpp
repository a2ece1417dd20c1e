// A program that links lightning::fabric may use std::filesystem: the system libstdc++ comes before
// the LibTorch wheel's exported copies in symbol lookup (docs/decisions.md, "libstdc++ is linked
// before LibTorch"). Without that order this test dies of SIGSEGV inside remove_all.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

TEST_CASE("link order: std::filesystem::remove_all works next to LibTorch", "[build]") {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / ("lf-link-order-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "a" / "b");
  std::error_code error;
  CHECK(std::filesystem::remove_all(root, error) == 3);
  CHECK_FALSE(error);
  CHECK_FALSE(std::filesystem::exists(root));
}
