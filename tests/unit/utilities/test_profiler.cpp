// The profiler switch on one process (utilities/profiler.h): parsing the step range and ranks, the
// environment winning over code, and a trace written over exactly the chosen optimizer steps.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

TEST_CASE("profile steps and ranks parse, and malformed ones are refused by name", "[profiler]") {
  const auto range = lf::parse_profile_steps("10-15", "--profile");
  CHECK(range.first_step == 10);
  CHECK(range.last_step == 15);
  const auto one = lf::parse_profile_steps("12", "--profile");
  CHECK(one.first_step == 12);
  CHECK(one.last_step == 12);
  for (const char* bad : {"", "0", "5-2", "a-3", "3-", "-3", "1.5"}) {
    CHECK_THROWS_WITH(lf::parse_profile_steps(bad, "LT_PROFILE"), Contains("LT_PROFILE=") && Contains("e.g. 10-15"));
  }
  CHECK(lf::parse_profile_ranks("0,3", "--profile-ranks") == std::vector<int>{0, 3});
  CHECK_THROWS_WITH(lf::parse_profile_ranks("0,x", "--profile-ranks"), Contains("--profile-ranks=0,x"));
  CHECK_THROWS_WITH(lf::FabricOptions().profile("2-1"), Contains("FabricOptions::profile=2-1"));
}

TEST_CASE("LT_PROFILE, LT_PROFILE_RANKS and LT_PROFILE_DIR win over the code's settings", "[profiler]") {
  lf::ProfileSettings code;
  code.first_step = 1;
  code.last_step = 2;
  const auto settings = lf::profile_settings_from_environment(
      code, lf::env::map_env({{"LT_PROFILE", "4-6"}, {"LT_PROFILE_RANKS", "1"}, {"LT_PROFILE_DIR", "/tmp/x"}}));
  CHECK(settings.first_step == 4);
  CHECK(settings.last_step == 6);
  CHECK(settings.ranks == std::vector<int>{1});
  CHECK(settings.dir == "/tmp/x");
  CHECK(lf::profiles_rank(settings, 1));
  CHECK_FALSE(lf::profiles_rank(settings, 0));
  CHECK_FALSE(lf::profiles_rank(lf::ProfileSettings{}, 0));
  CHECK_THROWS_WITH(lf::profile_settings_from_environment({}, lf::env::map_env({{"LT_PROFILE", "x"}})),
                    Contains("LT_PROFILE=x"));
}

namespace {
std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
size_t occurrences(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++count;
  return count;
}
}  // namespace

TEST_CASE("a profiled Fabric writes one trace over exactly the chosen steps", "[profiler]") {
  const fs::path dir = fs::temp_directory_path() / ("lf-profile-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    lf::ProfileSettings settings = lf::parse_profile_steps("2-3", "test");
    settings.dir = dir.string();
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").profile(settings), lf::env::map_env({}));
    torch::nn::Linear net(4, 2);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, optimizer] = fabric.setup(net, sgd);
    for (int step = 1; step <= 5; ++step) {
      optimizer.zero_grad();
      fabric.backward(model(torch::ones({3, 4})).sum());
      optimizer.step();
      if (step == 2) CHECK_FALSE(fs::exists(dir / "trace-rank0.json"));  // written once step 3 ends
      if (step == 3) CHECK(fs::exists(dir / "trace-rank0.json"));
    }
  }
  const std::string trace = read_file(dir / "trace-rank0.json");
  CHECK_THAT(trace, Contains("\"traceEvents\""));
  CHECK(occurrences(trace, "\"name\": \"lf::forward\"") == 2);
  CHECK(occurrences(trace, "\"name\": \"lf::backward\"") == 2);
  CHECK(occurrences(trace, "\"name\": \"lf::optimizer_step\"") == 2);
  fs::remove_all(dir);
}

TEST_CASE("without profiling a Fabric writes no trace", "[profiler]") {
  const fs::path dir = fs::temp_directory_path() / ("lf-no-profile-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({{"LT_PROFILE_DIR", dir.string()}}));
  torch::nn::Linear net(4, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  fabric.backward(model(torch::ones({3, 4})).sum());
  optimizer.step();
  CHECK_FALSE(fs::exists(dir));
}
