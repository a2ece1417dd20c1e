// P5: all-reduce bus bandwidth through Fabric::all_reduce against the raw c10d ProcessGroupGloo
// underneath it, 1 MB to 256 MB, float32, sum. Run under lightning-run with 2 workers; the two
// are timed alternately; rank 0 prints one JSON line per size. Bus bandwidth = 2 (n-1)/n x bytes /
// time (the NCCL-tests convention).
//   lightning-run model --accelerator cpu --devices 2 bench_allreduce [repeats]
#include <lightning/fabric.h>
#include "lightning/fabric/plugins/collectives/collective.h"
#include <lightning/fabric/strategies/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>

namespace lf = lightning::fabric;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::stoi(argv[1]) : 5;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
  fabric.barrier();
  auto& collective = fabric.strategy_as<lf::DDPStrategy>().collective();
  const double n = fabric.world_size();
  for (int64_t megabytes : {1, 4, 16, 64, 256}) {
    const int64_t elements = megabytes * 1000 * 1000 / 4;
    auto data = torch::ones({elements});
    std::vector<double> fabric_s, raw_s, clone_s;
    for (int i = 0; i < repeats + 1; ++i) {
      // Alternate which goes first, so that neither always absorbs the ranks' skew after a barrier.
      double f = 0, r = 0, c = 0;
      auto time_fabric = [&] {
        fabric.barrier();
        const auto start = std::chrono::steady_clock::now();
        auto reduced = fabric.all_reduce(data, "sum");
        f = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      auto time_clone_raw = [&] {
        fabric.barrier();
        const auto start = std::chrono::steady_clock::now();
        auto copy = data.clone();
        collective.all_reduce_(copy, lf::ReduceOp::Sum);
        c = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      auto time_raw = [&] {
        fabric.barrier();
        const auto start = std::chrono::steady_clock::now();
        collective.all_reduce_(data, lf::ReduceOp::Sum);
        r = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      if (i % 2 == 0) {
        time_fabric();
        time_raw();
      } else {
        time_raw();
        time_fabric();
      }
      time_clone_raw();
      if (i > 0) clone_s.push_back(c);
      data.fill_(1);
      if (i == 0) continue;  // warm-up
      fabric_s.push_back(f);
      raw_s.push_back(r);
    }
    std::sort(fabric_s.begin(), fabric_s.end());
    std::sort(raw_s.begin(), raw_s.end());
    std::sort(clone_s.begin(), clone_s.end());
    const double bytes = static_cast<double>(elements) * 4;
    const double bus = 2 * (n - 1) / n * bytes / 1e9;
    const double fabric_gbps = bus / fabric_s[fabric_s.size() / 2], raw_gbps = bus / raw_s[raw_s.size() / 2];
    if (fabric.is_global_zero()) {
      std::cout << "{\"benchmark\":\"P5 all_reduce\",\"megabytes\":" << megabytes << ",\"fabric_bus_GBps\":" << fabric_gbps
                << ",\"raw_gloo_bus_GBps\":" << raw_gbps << ",\"ratio\":" << fabric_gbps / raw_gbps << ",\"clone_then_raw_GBps\":" << bus / clone_s[clone_s.size() / 2] << "}" << std::endl;
    }
  }
  return 0;
}
