// ProcessGroupSettings: the backend enum and its parser, the defaults, the checks, and every
// environment override applied by with_environment_overrides.
#include <catch2/catch.hpp>

#include <chrono>

#include "lightning/fabric/plugins/collectives/process_group_settings.h"
#include "lightning/fabric/strategies/ddp.h"
#include "lightning/fabric/strategies/fsdp.h"

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;
using std::chrono::milliseconds;

namespace {
lf::ProcessGroupSettings overridden(std::map<std::string, std::string> values, lf::ProcessGroupSettings code = {}) {
  return lf::with_environment_overrides(std::move(code), lf::env::map_env(std::move(values)));
}
}  // namespace

TEST_CASE("the process-group backend is an enum with to_string and a parser", "[process_group]") {
  for (auto backend : lf::kProcessGroupBackends) {
    CHECK(lf::parse_process_group_backend(lf::to_string(backend), "test") == backend);
  }
  CHECK(lf::to_string(lf::ProcessGroupBackend::Shm) == "shm");
  CHECK(lf::to_string(lf::ProcessGroupBackend::ShmGloo) == "shm+gloo");
  CHECK_THROWS_WITH(lf::parse_process_group_backend("mpi", "DDPOptions: process_group.backend"),
                    Contains("DDPOptions: process_group.backend=\"mpi\" is not supported") && Contains("\"gloo\"") &&
                        Contains("\"nccl\"") && Contains("\"shm\"") && Contains("\"shm+gloo\"") &&
                        Contains("leave it unset"));
}

TEST_CASE("ddp and fsdp compose one ProcessGroupSettings with one set of defaults", "[process_group]") {
  const lf::ProcessGroupSettings defaults;
  CHECK(defaults.timeout == std::chrono::minutes(30));
  CHECK(defaults.rendezvous_timeout == std::chrono::minutes(5));
  CHECK(defaults.hang_timeout == std::chrono::minutes(5));
  CHECK(defaults.straggler_threshold_s == 0.05);
  CHECK_FALSE(defaults.backend.has_value());
  CHECK(defaults.flight_records == 2048);
  CHECK_FALSE(defaults.check_collectives);
  CHECK(defaults.socket_interface.empty());
  CHECK(std::is_same_v<decltype(lf::DDPOptions::process_group), lf::ProcessGroupSettings>);
  CHECK(std::is_same_v<decltype(lf::FSDPOptions::process_group), lf::ProcessGroupSettings>);
  CHECK(lf::DDPOptions().process_group.timeout == defaults.timeout);
  CHECK(lf::FSDPOptions().process_group.hang_timeout == defaults.hang_timeout);
}

TEST_CASE("check_process_group_settings names the owner, the field and the default", "[process_group]") {
  lf::ProcessGroupSettings bad;
  bad.timeout = milliseconds(0);
  CHECK_THROWS_WITH(lf::check_process_group_settings("MyOptions", bad),
                    Contains("MyOptions: process_group.timeout=0 ms must be positive (default 30 minutes)"));
  bad = {};
  bad.straggler_threshold_s = -1;
  CHECK_THROWS_WITH(lf::check_process_group_settings("MyOptions", bad),
                    Contains("MyOptions: process_group.straggler_threshold_s=-1 must be 0 (off)") &&
                        Contains("default 0.05"));
  bad = {};
  bad.hang_timeout = milliseconds(0);  // off
  bad.straggler_threshold_s = 0;       // off
  CHECK_NOTHROW(lf::check_process_group_settings("MyOptions", bad));
}

TEST_CASE("with_environment_overrides: the environment wins over code for every setting", "[process_group]") {
  lf::ProcessGroupSettings code;
  code.backend = lf::ProcessGroupBackend::Gloo;
  code.hang_timeout = std::chrono::seconds(9);
  code.socket_interface = "eth7";
  CHECK(overridden({}, code).backend == lf::ProcessGroupBackend::Gloo);  // unset variables change nothing
  CHECK(overridden({}, code).socket_interface == "eth7");
  const auto set = overridden({{"LT_PROCESS_GROUP_BACKEND", "shm"},
                               {"LT_RENDEZVOUS_TIMEOUT", "2.5"},
                               {"LT_HANG_TIMEOUT", "0.5"},
                               {"LT_STRAGGLER_THRESHOLD", "0.2"},
                               {"LT_FLIGHT_RECORDS", "16"},
                               {"LT_CHECK_COLLECTIVES", "1"},
                               {"GLOO_SOCKET_IFNAME", "lo"},
                               {"LT_HANG_DUMP_DIR", "/tmp/dumps"},
                               {"LT_FLIGHT_DIR", "/tmp/flight"},
                               {"TORCHELASTIC_ERROR_FILE", "/tmp/error.json"}},
                              code);
  CHECK(set.backend == lf::ProcessGroupBackend::Shm);
  CHECK(set.rendezvous_timeout == milliseconds(2500));
  CHECK(set.hang_timeout == milliseconds(500));
  CHECK(set.straggler_threshold_s == 0.2);
  CHECK(set.flight_records == 16);
  CHECK(set.check_collectives);
  CHECK(set.socket_interface == "lo");
  CHECK(set.hang_dump_dir == "/tmp/dumps");
  CHECK(set.flight_dir == "/tmp/flight");
  CHECK(set.error_file == "/tmp/error.json");
  CHECK(set.timeout == code.timeout);  // no variable overrides the collective timeout
  CHECK(overridden({{"LT_HANG_TIMEOUT", "0"}}).hang_timeout == milliseconds(0));  // off
  code.check_collectives = true;
  CHECK_FALSE(overridden({{"LT_CHECK_COLLECTIVES", "0"}}, code).check_collectives);
}

TEST_CASE("with_environment_overrides: a malformed variable names itself and what is valid", "[process_group]") {
  CHECK_THROWS_WITH(overridden({{"LT_PROCESS_GROUP_BACKEND", "mpi"}}),
                    Contains("LT_PROCESS_GROUP_BACKEND=\"mpi\" is not supported") && Contains("\"shm\""));
  CHECK_THROWS_WITH(overridden({{"LT_RENDEZVOUS_TIMEOUT", "soon"}}), Contains("LT_RENDEZVOUS_TIMEOUT=\"soon\""));
  CHECK_THROWS_WITH(overridden({{"LT_RENDEZVOUS_TIMEOUT", "0"}}),
                    Contains("LT_RENDEZVOUS_TIMEOUT=\"0\"") && Contains("positive number"));
  CHECK_THROWS_WITH(overridden({{"LT_HANG_TIMEOUT", "soon"}}), Contains("LT_HANG_TIMEOUT=\"soon\""));
  CHECK_THROWS_WITH(overridden({{"LT_STRAGGLER_THRESHOLD", "-1"}}), Contains("LT_STRAGGLER_THRESHOLD=\"-1\""));
  CHECK_THROWS_WITH(overridden({{"LT_STRAGGLER_THRESHOLD", "5000"}}),
                    Contains("LT_STRAGGLER_THRESHOLD=\"5000\"") && Contains("0 (off) to 2000"));
  CHECK_THROWS_WITH(overridden({{"LT_CHECK_COLLECTIVES", "maybe"}}), Contains("LT_CHECK_COLLECTIVES=\"maybe\""));
  CHECK_THROWS_WITH(overridden({{"LT_FLIGHT_RECORDS", "many"}}), Contains("LT_FLIGHT_RECORDS=\"many\""));
  CHECK_THROWS_WITH(overridden({{"LT_FLIGHT_RECORDS", "2000000"}}), Contains("0 to 1000000"));
}
