// Meta initialisation with one build for every rank (fsdp's engine and the composed strategy's
// tensor-parallel materialisation): each rank replays the build from rank 0's generator state.
#pragma once

#include <ATen/ATen.h>

#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/parallel.h"
#include "lightning/fabric/utilities/meta_init.h"

namespace lightning::fabric {

/// MaterializeOptions whose replay starts from rank 0's generator state (broadcast over the
/// strategy's process group: collective) and that refuse a build drawing from a generator ranks do
/// not share. The caller adds its install hook.
inline MaterializeOptions replay_rank_zero_build(ParallelStrategy& strategy) {
  MaterializeOptions options;
  options.agree_on_generator_state = [&strategy](at::Tensor& state) {
    at::Tensor on_device = state.to(strategy.root_device());
    strategy.collective().broadcast_(on_device, 0);
    state = on_device.cpu();
  };
  options.require_shared_generator = true;
  return options;
}

}  // namespace lightning::fabric
