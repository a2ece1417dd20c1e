// fsdp checkpoints (docs/checkpoints.md): the sharded-checkpoint engine does the saving and
// loading ("sharded": a torch.distributed.checkpoint folder, every shard-holding rank its own
// file, read back on any number of ranks; "full": one file of whole tensors); the Engine answers
// where each shard lies and restores shards.
#include <torch/types.h>

#include "lightning/fabric/checkpoint/optimizer_names.h"
#include "lightning/fabric/checkpoint/sharded_checkpoint.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/fsdp_engine.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

CheckpointWrite FSDPStrategy::prepare_checkpoint(const std::string& call, const fs::path& path, const State& state,
                                                 const StateFilter& filter, bool host_copy) {
  return prepare_sharded_save(collective(), call, path, state, filter, host_copy, *engine_,
                              fsdp_options_.state_dict_type == "full");
}

StateDict FSDPStrategy::load_checkpoint(const fs::path& path, State* state, bool strict) {
  return load_sharded(collective(), path, state, strict, *engine_);
}

const FSDPStrategy::Engine::ShardedParameter* FSDPStrategy::Engine::find_parameter(const at::Tensor& tensor) const {
  auto found = by_tensor_.find(tensor.unsafeGetTensorImpl());
  return found == by_tensor_.end() ? nullptr : found->second;
}

std::optional<Placement> FSDPStrategy::Engine::placement(const at::Tensor& parameter) const {
  const ShardedParameter* p = find_parameter(parameter);
  if (p == nullptr) return std::nullopt;
  Placement placement = Placement::whole(p->shape);
  placement.flat = p->slice;
  // One replica of each shard writes it (HYBRID_SHARD: the first node's ranks; NO_SHARD: rank 0).
  placement.writes = placement.writes && strategy_.data_group().rank() < strategy_.shard_group_size();
  return placement;
}

at::Tensor FSDPStrategy::Engine::saved_value(const at::Tensor& parameter) const {
  const ShardedParameter* p = find_parameter(parameter);
  // A shard that views its full parameter (SHARD_GRAD_OP, NO_SHARD) would save the whole storage.
  const bool owns_storage = p->shard.storage().nbytes() == static_cast<size_t>(p->shard.nbytes());
  return owns_storage ? p->shard : p->shard.clone();
}

std::vector<std::string> FSDPStrategy::Engine::optimizer_parameter_names(const State& state,
                                                                        torch::optim::Optimizer& optimizer) const {
  const std::vector<std::string> in_modules = lightning::fabric::optimizer_parameter_names(state, optimizer);
  size_t index = 0;
  return lightning::fabric::optimizer_parameter_names(optimizer, [&](const at::Tensor& parameter) -> std::optional<std::string> {
    const ShardedParameter* p = find_shard(parameter);
    const std::string& fallback = in_modules[index++];
    return p ? p->name : fallback;
  });
}

StateDict FSDPStrategy::Engine::restore(State& state, const StateDict& local, bool strict) {
  torch::NoGradGuard no_grad;
  auto restore_sharded = [&](const std::string& key, StateEntry& entry, const c10::IValue& saved) {
    ShardedModule* sharded = entry.module() != nullptr ? find(*entry.module()) : nullptr;
    if (sharded == nullptr) return false;  // optimizers load their (local) state as saved
    StateDict values = saved.toGenericDict();
    for (auto& p : sharded->parameters) {
      auto value = values.find(p.name);
      LF_CHECK(value != values.end() || !strict, RuntimeError, "load(strict=true): the checkpoint's '", key,
               "' lacks parameter ", p.name, ".");
      if (value == values.end()) continue;
      const at::Tensor tensor = value->value().toTensor();
      LF_CHECK(tensor.numel() == p.slice.length, RuntimeError, "load: '", key, "/", p.name, "' gives this rank ",
               tensor.numel(), " elements for a shard of ", p.slice.length, ".");
      p.shard.copy_(tensor.reshape(-1));
    }
    for (auto& buffer : entry.module()->named_buffers(true)) {
      auto value = values.find(buffer.key());
      if (value != values.end()) buffer.value().copy_(value->value().toTensor());
    }
    settle_prefetch(/*use=*/false);  // gathered before the load
    ++shard_version_;
    for (auto& unit : sharded->units) unit.stale = true;  // the next forward gathers the restored shards
    return true;
  };
  return restore_from_checkpoint(state, local, strict, restore_sharded);
}

}  // namespace lightning::fabric
