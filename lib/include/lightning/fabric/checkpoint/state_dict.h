// State dicts as c10 generic dicts, the form checkpoints store (and Python's torch.load reads as
// plain dicts): modules, optimizers, LR schedulers; and the conversion of a whole State to and
// from a checkpoint. None of these is collective; Fabric::save/load add the file and the ranks.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include "lightning/fabric/checkpoint/state.h"

namespace lightning::fabric {

/// Parameters and buffers by their dotted names, as CPU tensors: the one state dict of a module
/// (FabricModule::state_dict() returns it too). As PyTorch's state_dict(), a CPU tensor here
/// shares storage with the module's (it changes as training goes on); take a snapshot to keep one.
LF_API StateDict module_state_dict(const torch::nn::Module& module);

/// A deep copy that shares nothing with the original: every tensor, also inside nested dicts,
/// lists and tuples (an optimizer's state), detached and copied to the CPU. Python's
/// copy.deepcopy(model.state_dict()): `best = lf::snapshot_state_dict(model.state_dict())` keeps
/// its values while training goes on.
LF_API StateDict snapshot_state_dict(const StateDict& state);
/// Copies values into the module's parameters and buffers (on their devices and dtypes). strict:
/// the keys must match both ways (RuntimeError listing missing and unexpected keys); shapes must
/// always match.
LF_API void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

/// PyTorch's layout for SGD, Adam, AdamW, RMSprop and Adagrad: {"state": {index: {name: value}},
/// "param_groups": [{option: value, ..., "params": [indices]}]}, parameters numbered across groups
/// in order. Any other optimizer (LBFGS, your own) is stored as its LibTorch archive:
/// {"libtorch_archive": uint8 tensor}.
LF_API StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);
/// Restores options and per-parameter state; ValueError when the group or parameter counts, the
/// optimizer type or a tensor shape do not match.
LF_API void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state);

/// {"_step_count": steps taken, "_last_lr": [current learning rates]}; the rates themselves live in
/// the optimizer's param_groups, so restore the optimizer too.
LF_API StateDict scheduler_state_dict(torch::optim::LRScheduler& scheduler);
LF_API void load_scheduler_state_dict(torch::optim::LRScheduler& scheduler, const StateDict& state);

/// What Fabric::save writes: every live object replaced by its state dict (filtered per key),
/// plain values as they are, nested States recursively.
LF_API StateDict to_checkpoint(const State& state, const StateFilter& filter = {});
/// A strategy's own way to restore some entries (fsdp: sharded modules and their optimizers);
/// returns false to leave the entry to the default.
using EntryRestorer = std::function<bool(const std::string& key, StateEntry& entry, const c10::IValue& saved)>;

/// Restores every entry of state from checkpoint in place and returns the checkpoint's entries
/// that state did not ask for. strict: a key of state missing from the checkpoint is a
/// RuntimeError naming it (modules are then also loaded strictly). custom, when given, is asked
/// first for every entry.
LF_API StateDict restore_from_checkpoint(State& state, const StateDict& checkpoint, bool strict = true,
                                  const EntryRestorer& custom = nullptr);
/// Loads a plain state dict into one live entry (module: strict as given; any other Stateful
/// object: its load_state_dict). ValueError for a plain value or a nested State.
LF_API void load_state_dict_into(const StateEntry& target, const StateDict& state, bool strict = true);

}  // namespace lightning::fabric
