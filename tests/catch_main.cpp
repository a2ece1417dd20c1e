// Catch2's main, compiled once into lf_catch_main.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

int main(int argc, char* argv[]) {
  // c10d's own flight recorder (on by default for gloo in LibTorch 2.11, 2000 entries) is one
  // process-wide object, and its record step races when several ranks of a test run as threads of
  // one process: a std::map insert in FlightRecorder::recordWithResetEnabled crashed
  // unit.test_device_mesh about 1 run in 10 (SIGSEGV). A real job has one rank per process; the
  // project's hang detection keeps its own recorder. Off in the test programs unless set.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  const int failed = Catch::Session().run(argc, argv);
  return failed == 77 ? 1 : failed;  // the number of failed assertions; 77 would read as a skip
}
