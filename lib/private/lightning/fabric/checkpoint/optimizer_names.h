// Optimizer state keyed by parameter name, as Python keys it in sharded (FSDP) checkpoints and as
// consolidated sharded checkpoints hold it, next to LibTorch's and PyTorch's index keys. Used by
// the fsdp strategy's sharded saves and loads and by every strategy's load of a file. Not collective.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/state.h"
#include "lightning/fabric/checkpoint/state_dict.h"

namespace lightning::fabric {

/// Every parameter of the optimizer in index order (groups in order): name_of(parameter), or the
/// index in decimal where it gives none.
std::vector<std::string> optimizer_parameter_names(
    torch::optim::Optimizer& optimizer, const std::function<std::optional<std::string>(const at::Tensor&)>& name_of);
/// The names the module entries of `state` give the optimizer's parameters.
std::vector<std::string> optimizer_parameter_names(const State& state, torch::optim::Optimizer& optimizer);
/// True when an optimizer state dict keys "state" by name rather than by index.
bool keys_state_by_name(const StateDict& optimizer_dict);
/// The same state keyed by index again ("state" and each group's "params"); `entry` names the
/// checkpoint entry in errors. A name that no parameter has is a RuntimeError when strict and
/// dropped otherwise.
StateDict optimizer_state_by_index(const StateDict& named, const std::vector<std::string>& names, const std::string& entry,
                                   bool strict);

}  // namespace lightning::fabric
