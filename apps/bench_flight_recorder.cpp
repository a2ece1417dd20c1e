// The flight recorder's cost per collective: begin + wait + end for a 2-d float32 tensor, as the
// process group calls them, timed over many calls (median of repeats). Prints one JSON object.
//   bench_flight_recorder [calls] [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "lightning/fabric/hang/flight_recorder.h"

namespace flight = lightning::fabric::flight;

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::stoi(argv[1]) : 1000000;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 7;
  auto recorder = flight::Recorder::create(0, 2, 2048, "/tmp/bench_flight_recorder.flight");  // shared file, as under lightning-run
  const std::string group = "world";
  const int64_t shape[2] = {1024, 1024};
  std::vector<double> per_call_ns;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      flight::Scope scope(recorder.get(), "all_reduce", group, "float32", shape, 2, 1024 * 1024);
    }
    const auto took = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    per_call_ns.push_back(took / calls);
  }
  std::remove("/tmp/bench_flight_recorder.flight");
  std::sort(per_call_ns.begin(), per_call_ns.end());
  std::printf("{\"bench\":\"flight_recorder\",\"calls\":%d,\"repeats\":%d,\"median_ns_per_collective\":%.1f,\"min_ns\":%.1f}\n",
              calls, repeats, per_call_ns[per_call_ns.size() / 2], per_call_ns.front());
  return 0;
}
