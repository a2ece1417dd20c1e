// Declarations of the checkpoint state types (defined in checkpoint/state.h), for headers that
// only pass them along (strategies).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <string>

namespace lightning::fabric {

class StateEntry;
/// Names to entries; see checkpoint/state.h.
using State = std::map<std::string, StateEntry>;
/// Per top-level key of a State: which items of that entry's state dict to save, called with the
/// item's name and value (Python Fabric's `filter` argument). Keys without a filter save whole.
using StateFilter = std::map<std::string, std::function<bool(const std::string& name, const c10::IValue& value)>>;
/// A state dict as checkpoints store it: string keys, any values.
using StateDict = c10::impl::GenericDict;

}  // namespace lightning::fabric
