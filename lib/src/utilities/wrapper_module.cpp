#include "lightning/fabric/utilities/wrapper_module.h"

#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace lightning::fabric {

WrapperModule::WrapperModule(std::shared_ptr<torch::nn::Module> wrapped) : wrapped_(std::move(wrapped)) {
  // The wrapped module's own names, one level up: checkpoints do not see the wrapper.
  for (const auto& item : wrapped_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : wrapped_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : wrapped_->named_children()) register_module(item.key(), item.value());
}

void WrapperModule::train(bool on) {
  torch::nn::Module::train(on);
  wrapped_->train(on);  // not a registered child: its own flag is set here
}

const torch::nn::Module& unwrapped(const torch::nn::Module& module) {
  const torch::nn::Module* current = &module;
  while (const auto* wrapper = dynamic_cast<const WrapperModule*>(current)) current = wrapper->wrapped().get();
  return *current;
}

torch::nn::SequentialImpl* sequential_at(torch::nn::Module& module) {
  torch::nn::Module* current = &module;
  while (auto* wrapper = dynamic_cast<WrapperModule*>(current)) current = wrapper->wrapped().get();
  return dynamic_cast<torch::nn::SequentialImpl*>(current);
}

int replace_sequential_children(torch::nn::Module& root, const SequentialChildReplacement& replacement) {
  int replaced = 0;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    auto* sequential = sequential_at(*item.value());
    if (sequential == nullptr) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    const auto names = sequential->named_children();
    std::vector<std::optional<torch::nn::AnyModule>> replacements;
    bool changes = false;
    size_t position = 0;
    for (const auto& child : *sequential) {
      replacements.push_back(replacement(child, prefix + names[position++].key()));
      changes |= replacements.back().has_value();
    }
    if (!changes) continue;
    torch::nn::SequentialImpl rebuilt;
    size_t index = 0;
    for (const auto& child : *sequential) {
      const std::string name = names[index].key();
      if (replacements[index]) {
        rebuilt.push_back(name, std::move(*replacements[index]));
        ++replaced;
      } else {
        rebuilt.push_back(name, child);
      }
      ++index;
    }
    const bool training = sequential->is_training();
    *sequential = std::move(rebuilt);  // in place: the model's own Sequential member sees the change
    sequential->train(training);
  }
  return replaced;
}

}  // namespace lightning::fabric
