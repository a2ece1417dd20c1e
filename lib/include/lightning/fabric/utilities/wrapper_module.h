// A module that stands in for another one in a model's tree (the base of FSDPUnit and
// Checkpointed): its parameters, buffers and children are the wrapped module's, registered under
// the wrapped module's own names, so state dicts and checkpoints do not see the wrapper, and
// train()/eval() reach the wrapped module.
#pragma once

#include "lightning/fabric/export.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace lightning::fabric {

class LF_API WrapperModule : public torch::nn::Module {
 public:
  const std::shared_ptr<torch::nn::Module>& wrapped() const { return wrapped_; }
  void train(bool on = true) override;

 protected:
  explicit WrapperModule(std::shared_ptr<torch::nn::Module> wrapped);

 private:
  std::shared_ptr<torch::nn::Module> wrapped_;
};

/// The module a tree position really holds: a WrapperModule's wrapped module (through any number
/// of wrappers), else module itself.
LF_API const torch::nn::Module& unwrapped(const torch::nn::Module& module);

/// The Sequential a tree position holds, through any wrappers (an FSDPUnit of a Sequential);
/// null when it holds none.
LF_API torch::nn::SequentialImpl* sequential_at(torch::nn::Module& module);

/// For every Sequential inside root (root included, and those inside wrappers), replaces each child for which
/// replacement(child, name) returns a module by that module, in place and under the same name
/// (the model's own Sequential member sees the change). name: the child's dotted path from root
/// ("body.2"). Returns how many children it replaced.
using SequentialChildReplacement =
    std::function<std::optional<torch::nn::AnyModule>(const torch::nn::AnyModule& child, const std::string& name)>;
LF_API int replace_sequential_children(torch::nn::Module& root, const SequentialChildReplacement& replacement);

}  // namespace lightning::fabric
