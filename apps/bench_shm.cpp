// P5 for the shm backends: all-reduce (float32, sum) bus bandwidth and latency of shm (or
// shm+gloo, across hosts) against gloo on the same ranks, 4 KB to 256 MB. Each rank holds a gloo
// world group and a group of the backend over the same ranks; the two are timed alternately after
// a barrier each; rank 0 prints one JSON line per size with the medians ("<backend>_us",
// "gloo_us", ...). Bus bandwidth = 2 (n-1)/n x bytes / time.
//   lightning-run model --accelerator cpu --devices 2 bench_shm [repeats [shm|shm+gloo]]
// shm+gloo is a second group of every rank (it needs lightning-run's store: both groups join it).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lf = lightning::fabric;

namespace {
int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  lf::CollectiveOptions options;
  options.settings = lf::with_environment_overrides({}, lf::env::process_env());  // GLOO_SOCKET_IFNAME, LT_*
  options.rank = env_int("RANK", 0);
  options.world_size = env_int("WORLD_SIZE", 1);
  options.main_address = std::getenv("MASTER_ADDR") != nullptr ? std::getenv("MASTER_ADDR") : "127.0.0.1";
  options.main_port = env_int("MASTER_PORT", 29400);
  options.use_agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE") != nullptr &&
                            std::string(std::getenv("TORCHELASTIC_USE_AGENT_STORE")) == "True";
  options.store_attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  options.settings.flight_records = 0;  // the transports alone
  lf::Collective gloo(options);
  std::vector<int> everyone;
  for (int r = 0; r < gloo.world_size(); ++r) everyone.push_back(r);
  const std::string backend = argc > 2 ? argv[2] : "shm";
  std::unique_ptr<lf::Collective> fast;
  if (backend == "shm") {
    fast = std::make_unique<lf::Collective>(gloo, "bench-shm", everyone, lf::ProcessGroupBackend::Shm);
  } else {
    lf::CollectiveOptions second = options;
    second.backend = lf::parse_process_group_backend(backend, "bench_shm's backend argument");
    second.store_attempt += 1;  // its own keys in the shared store
    fast = std::make_unique<lf::Collective>(second);
  }
  lf::Collective& shm = *fast;
  const double n = gloo.world_size();
  for (int64_t bytes : {int64_t{4} << 10, int64_t{1} << 20, int64_t{16} << 20, int64_t{256} << 20}) {
    // Small sizes are timed in batches of calls, so that the clock's resolution does not matter.
    const int calls = bytes <= (int64_t{1} << 20) ? 50 : 1;
    at::Tensor data = at::ones({bytes / 4});
    std::vector<double> on_shm, on_gloo;
    auto timed = [&](lf::Collective& group) {
      gloo.barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) group.all_reduce_(data, lf::ReduceOp::Sum);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
    };
    for (int i = 0; i <= repeats; ++i) {
      // Alternate which goes first, so that neither always absorbs the ranks' skew after a barrier.
      const double first = timed(i % 2 == 0 ? shm : gloo), second = timed(i % 2 == 0 ? gloo : shm);
      data.fill_(1);
      if (i == 0) continue;  // warm-up
      on_shm.push_back(i % 2 == 0 ? first : second);
      on_gloo.push_back(i % 2 == 0 ? second : first);
    }
    const double bus = 2 * (n - 1) / n * static_cast<double>(bytes) / 1e9;
    const double shm_s = median(on_shm), gloo_s = median(on_gloo);
    if (gloo.rank() == 0) {
      std::cout << "{\"benchmark\":\"P5 " << backend << " vs gloo\",\"ranks\":" << gloo.world_size() << ",\"bytes\":"
                << bytes << ",\"" << backend << "_us\":" << shm_s * 1e6 << ",\"gloo_us\":" << gloo_s * 1e6 << ",\""
                << backend << "_bus_GBps\":" << bus / shm_s << ",\"gloo_bus_GBps\":" << bus / gloo_s << ",\"" << backend
                << "_over_gloo_bandwidth\":" << gloo_s / shm_s << "}" << std::endl;
    }
  }
  return 0;
}
