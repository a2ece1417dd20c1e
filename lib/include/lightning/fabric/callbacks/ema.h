// An exponential moving average of a model's weights (Python Lightning's EMAWeightAveraging, with
// torch.optim.swa_utils.AveragedModel's update): after each optimizer step that updates, every
// averaged tensor becomes decay * average + (1 - decay) * weight; the first update copies.
//   auto ema = std::make_shared<lf::EMA>(lf::EMAOptions().with_decay(0.999));
//   lf::Fabric fabric(lf::FabricOptions().callback(ema));
//   auto [model, optimizer] = fabric.setup(net, sgd);      // the EMA follows net
//   ... train ...
//   { auto averaged = ema->swap_into_model(); evaluate(model); }  // the average, then the weights again
//   fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"ema", ema}});
//
// It follows the first module set up after it was registered (or the one given to follow()):
// on_after_setup binds it, on_after_optimizer_step updates it when the optimizer steps one of the
// module's parameters. It averages what the strategy says this rank trains of each parameter
// (Strategy::trained_parts): the parameter itself, fsdp's shard (in its master dtype), a
// tensor-parallel slice under model_parallel or fsdp's shard of one; an update never communicates.
// Buffers (use_buffers) are averaged whole. It works under single_device, dp, ddp, fsdp and
// model_parallel (ddp or fsdp on the data dimension); the pipeline is refused (ValueError at bind).
//
// Checkpoints hold the full averaged tensors under "module.<name>" (AveragedModel's keys), with
// "n_averaged", "step" and "latest_update_step": the same file under every strategy, any number
// of ranks. state_dict() gathers each full value through the strategy (collective under fsdp and
// model_parallel: fabric.save calls it on every rank); load_state_dict cuts each full value back
// to this rank's part.
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lightning/fabric/callbacks/callback.h"
#include "lightning/fabric/checkpoint/stateful.h"
#include "lightning/fabric/utilities/scope_guard.h"

namespace lightning::fabric {

class Strategy;

struct LF_API EMAOptions {
  /// In [0, 1]: the weight of the old average (Python's default 0.999).
  double decay = 0.999;
  /// Update after optimizer step k (counted from 0) when k % update_every_n_steps == 0 and
  /// k >= update_starting_at_step (when set), as EMAWeightAveraging.should_update. 0: never.
  int64_t update_every_n_steps = 1;
  std::optional<int64_t> update_starting_at_step;
  /// Average the buffers too (AveragedModel's use_buffers=True, the callback's default); false:
  /// the buffers are copied from the model at each update.
  bool use_buffers = true;

  EMAOptions& with_decay(double value) { decay = value; return *this; }
  EMAOptions& every_n_steps(int64_t value) { update_every_n_steps = value; return *this; }
  EMAOptions& starting_at_step(int64_t value) { update_starting_at_step = value; return *this; }
  EMAOptions& averaging_buffers(bool on) { use_buffers = on; return *this; }
};

class LF_API EMA : public Callback, public Stateful {
 public:
  /// ValueError naming the option when decay is outside [0, 1] or update_every_n_steps < 0.
  explicit EMA(EMAOptions options = EMAOptions());
  ~EMA() override;

  /// Follows module from now on instead of the first one set up (call it after fabric.setup).
  void follow(const std::shared_ptr<torch::nn::Module>& module, Strategy& strategy);
  /// Whether optimizer step step_idx (from 0) updates the average (see EMAOptions).
  virtual bool should_update(int64_t step_idx) const;

  void on_after_setup(const HookArgs& args) override;
  void on_after_optimizer_step(const HookArgs& args) override;

  /// The averaged weights and buffers in the module until the guard ends, then the module's own
  /// again (Python's swap around validation). Not collective; under fsdp the next forward gathers.
  ScopeGuard swap_into_model();
  /// Copies the average into the module for good (Python's on_train_end).
  void copy_to_model();

  /// Optimizer steps seen, and updates made (AveragedModel's n_averaged).
  int64_t step() const { return step_; }
  int64_t n_averaged() const { return n_averaged_; }

  /// Collective where the strategy splits parameters (fsdp, model_parallel: the full tensors are
  /// gathered); not under single_device, dp and ddp.
  StateDict state_dict() const override;
  /// Before setup too: the values wait for the module, then each full value is cut to this rank's
  /// part. ValueError naming a missing or mis-shaped entry.
  void load_state_dict(const StateDict& state) override;

 private:
  struct Tracked;
  void bind(const std::shared_ptr<torch::nn::Module>& module, Strategy* strategy);
  void require_bound(const char* call) const;
  void apply_loaded();
  void swap_values();
  EMAOptions options_;
  std::weak_ptr<torch::nn::Module> module_;
  Strategy* strategy_ = nullptr;  // the followed module's
  std::vector<Tracked> tracked_;
  std::set<const c10::TensorImpl*> stepped_;  // the tensors an optimizer step of the module touches
  int64_t step_ = 0;
  int64_t n_averaged_ = 0;
  int64_t latest_update_step_ = 0;
  std::optional<StateDict> pending_;  // loaded before the module was bound
};

}  // namespace lightning::fabric
