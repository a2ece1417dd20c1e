// Python Fabric's devices rules, for CPU and CUDA (CUDA parsing is pure: it takes the
// number of visible GPUs as an argument, so it is tested here without a GPU).

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/devices.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

TEST_CASE("cpu devices: counts, digit strings and auto", "[devices]") {
  CHECK(lf::parse_cpu_devices(lf::DevicesSpec(3)) == 3);
  CHECK(lf::parse_cpu_devices(lf::DevicesSpec("4")) == 4);
  CHECK(lf::parse_cpu_devices(lf::DevicesSpec(" 2 ")) == 2);
  CHECK(lf::parse_cpu_devices(lf::DevicesSpec()) == 1);
  CHECK(lf::parse_cpu_devices(lf::DevicesSpec("auto")) == 1);
}

TEST_CASE("cpu devices: zero, negative, lists and index strings are refused", "[devices]") {
  CHECK_THROWS_AS(lf::parse_cpu_devices(lf::DevicesSpec(0)), lf::ValueError);
  CHECK_THROWS_AS(lf::parse_cpu_devices(lf::DevicesSpec(-1)), lf::ValueError);
  CHECK_THROWS_AS(lf::parse_cpu_devices(lf::DevicesSpec("0,2")), lf::TypeError);
  CHECK_THROWS_AS(lf::parse_cpu_devices(lf::DevicesSpec(std::vector<int>{0})), lf::TypeError);
  CHECK_THROWS_WITH(lf::parse_cpu_devices(lf::DevicesSpec("-1")), Contains("devices=-1") && Contains("int > 0"));
  CHECK_THROWS_WITH(lf::parse_cpu_devices(lf::DevicesSpec("two")), Contains("devices=two"));
}

TEST_CASE("cuda devices: the forms of the table", "[devices]") {
  using V = std::vector<int>;
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec(2), 4) == V{0, 1});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("2"), 4) == V{0, 1});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec(-1), 3) == V{0, 1, 2});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("-1"), 3) == V{0, 1, 2});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("auto"), 2) == V{0, 1});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("0,2"), 4) == V{0, 2});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("1, 3,"), 4) == V{1, 3});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec(V{3, 1}), 4) == V{3, 1});
  CHECK(lf::parse_cuda_devices(lf::DevicesSpec("1,"), 4) == V{1});
}

TEST_CASE("cuda devices: invalid values name themselves", "[devices]") {
  using V = std::vector<int>;
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec(0), 4), Contains("devices=0") && Contains("no GPU"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec("0"), 4), Contains("devices=0"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec(V{}), 4), Contains("devices=[]"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec("0,0"), 4), Contains("twice"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec(V{5}), 4), Contains("GPU 5") && Contains("0..3"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec(8), 4), Contains("only 4"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec("-2"), 4), Contains("devices=-2"));
  CHECK_THROWS_WITH(lf::parse_cuda_devices(lf::DevicesSpec("a,b"), 4), Contains("\"a,b\""));
}

TEST_CASE("devices spec prints as the CLI writes it", "[devices]") {
  CHECK(lf::DevicesSpec().to_string() == "auto");
  CHECK(lf::DevicesSpec(2).to_string() == "2");
  CHECK(lf::DevicesSpec(std::vector<int>{0, 2}).to_string() == "0,2");
}
