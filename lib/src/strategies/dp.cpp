#include "lightning/fabric/strategies/dp.h"

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

DataParallelStrategy::DataParallelStrategy(StrategyContext context)
    : Strategy(std::move(context)) {
  for (const auto& device : context_.parallel_devices) {
    LF_CHECK(device.is_cuda(), ValueError, "strategy=\"dp\" splits each batch over CUDA devices, but device ",
             device.str(), " was selected. Use accelerator=\"cuda\", or strategy=\"ddp\" on CPU.");
  }
  LF_CHECK(context_.num_nodes == 1, ValueError, "strategy=\"dp\" runs one process on one node, but num_nodes=",
           context_.num_nodes, ". Use strategy=\"ddp\" for several nodes.");
}

}  // namespace lightning::fabric
