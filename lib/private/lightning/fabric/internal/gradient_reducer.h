// Private to the ddp strategy: averages one module's gradients over all ranks while backward is
// still running. Parameters are grouped into buckets in reverse order (the order backward produces
// them; the first bucket small so communication starts early). A post-hook on each parameter's
// gradient accumulator marks it ready; a bucket whose parameters are all ready is flattened and
// its all-reduce started, buckets strictly in order so every rank issues the same sequence; a
// callback queued on the autograd engine finishes at the end of backward: it starts what is left
// (a parameter without a gradient counts as zero), waits, divides by the world size and copies
// the averages back. Hooks act only while armed (fabric.backward without no_backward_sync).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "lightning/fabric/plugins/collectives/collective.h"

namespace lightning::fabric::internal {

class GradientReducer {
 public:
  GradientReducer(const std::shared_ptr<torch::nn::Module>& module, std::shared_ptr<Collective> collective,
                  double first_bucket_mb, double bucket_mb);
  /// Called by the strategy right before backward: the next backward averages this module's
  /// gradients; with `only` (a backward's inputs), only those of its parameters among them, the
  /// others' gradients left as they are. Every rank must pass the same parameters.
  void arm(const std::vector<at::Tensor>& only = {});
  /// After backward: hooks ignore further gradients until the next arm().
  void disarm();
  bool expired() const { return module_.expired(); }
  const torch::nn::Module* module() const { return raw_module_; }
  size_t bucket_count() const;

  struct State;  // shared with the autograd hooks, which hold it weakly

 private:
  std::shared_ptr<State> state_;
  std::weak_ptr<torch::nn::Module> module_;
  const torch::nn::Module* raw_module_;
};

}  // namespace lightning::fabric::internal
