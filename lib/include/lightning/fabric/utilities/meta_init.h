// Building a module without parameter memory (Python's meta-device initialisation), for models
// whose full parameters do not fit one process. Fabric::init_module(true) under fsdp uses it, and
// it works on its own:
//
//   Gpt net = nullptr;
//   { auto guard = lf::meta_init_guard(); net = Gpt(settings); }   // no parameter memory
//   lf::materialize_module(*net);                                  // or fabric.setup(net, ...)
//
// While the guard lives, factory functions (empty, zeros, randn, arange, ...) make meta tensors
// (shape and dtype, no storage), and every operation that makes or changes one is recorded in
// order, with the CPU random generator's state at the guard's start. materialize_module replays
// the record on the real devices, so the values equal those of the same build without the guard
// under the same seed, bit for bit; fsdp keeps each parameter's shard as soon as its last
// recorded operation ran. A module whose constructor initialises each parameter before making
// the next (LibTorch's layers do) thus holds one full parameter at a time; one that makes several
// and initialises them afterwards (LibTorch's LSTM, say) holds those together.
//
// Limits (the build runs on meta tensors, which have no values):
//   - reading values while building (item(), data_ptr(), torch::tensor({...}) from C++ data,
//     printing) fails with LibTorch's meta-tensor error: make such constants before the guard;
//   - operations on the module's tensors after the guard ended are not recorded: initialise
//     inside the guard (reset() does);
//   - an explicit generator argument replays from that generator's state at materialisation;
//     the CPU default generator replays from its state at the guard's start.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>

#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

/// While the guard lives (on this thread), tensors are made on the meta device and the operations
/// on them recorded for materialize_module. A nested guard adds to the outer one's record.
LF_API ScopeGuard meta_init_guard();

/// True when some parameter or buffer of module (submodules included) is on the meta device.
LF_API bool has_meta_tensors(const torch::nn::Module& module);

struct LF_API MaterializeOptions {
  /// Called once per record before its replay with the CPU generator state recorded at the guard's
  /// start (a uint8 CPU tensor); may replace it. fsdp broadcasts rank 0's here (collective), so
  /// every rank replays the same values. Unset: the recorded state.
  std::function<void(at::Tensor& generator_state)> agree_on_generator_state;
  /// Called once per meta parameter and buffer, in replay order, with its name, whether it is a
  /// parameter, and its full value once final; returns the tensor the module's own tensor becomes
  /// (the same object stays in the module, in optimizers and in module members). fsdp returns an
  /// empty (0-element) tensor and keeps only its shard. Unset: the full value.
  std::function<at::Tensor(const std::string& name, bool is_parameter, const at::Tensor& full)> install;
  /// Refuse (ValueError) a build that drew random numbers from an explicit generator or on a
  /// device other than the CPU: ranks do not share those states. fsdp sets it.
  bool require_shared_generator = false;
};

/// Gives every meta parameter and buffer of module its recorded value on its real device, by
/// replaying the guard's record from the generator state at the guard's start. A full value lives
/// from the operation that made it until the last recorded operation on its storage. Afterwards the
/// CPU generator continues from where the build would have left it when nothing drew from it since
/// the guard's start, and from its state before the call otherwise. ValueError naming the tensor
/// for a meta tensor that no guard recorded (made on the meta device by hand), or one whose record
/// was already replayed for another module (build each model under a guard of its own); a
/// RuntimeError naming the operation when a recorded operation fails on real tensors (the module
/// is then half materialised and its record dropped: build it again). While building, an
/// operator without a meta-device kernel in LibTorch's C++ build is a RuntimeError naming it.
LF_API void materialize_module(torch::nn::Module& module, const MaterializeOptions& options = {});

}  // namespace lightning::fabric
