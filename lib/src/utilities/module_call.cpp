#include "lightning/fabric/utilities/module_call.h"

#include <mutex>
#include <unordered_map>

#include "lightning/fabric/utilities/activation_checkpoint.h"

namespace lightning::fabric {
namespace {

struct Entry {
  std::weak_ptr<const torch::nn::Module> module;  // tells a live module from one reusing a freed address
  std::weak_ptr<ForwardHooks> hooks;
};

std::mutex table_mutex;
std::unordered_map<const torch::nn::Module*, Entry>& table() {
  static std::unordered_map<const torch::nn::Module*, Entry> entries;
  return entries;
}

}  // namespace

void set_forward_hooks(const torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks) {
  std::lock_guard<std::mutex> lock(table_mutex);
  for (auto it = table().begin(); it != table().end();) {
    it = it->second.module.expired() || it->second.hooks.expired() ? table().erase(it) : std::next(it);
  }
  if (hooks) {
    table()[&module] = {module.shared_from_this(), hooks};
  } else {
    table().erase(&module);
  }
}

std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(table_mutex);
  const auto found = table().find(&module);
  if (found == table().end()) return nullptr;
  const auto alive = found->second.module.lock();
  if (!alive || alive.get() != &module) return nullptr;
  return found->second.hooks.lock();
}

at::Tensor detail::call_module(torch::nn::Module& module, const std::shared_ptr<ForwardHooks>& hooks,
                               const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& input) {
  const auto run = [&](const at::Tensor& x) {
    return is_checkpointed(module) ? checkpoint(forward, x, module.parameters()) : forward(x);
  };
  if (!hooks) return run(input);
  return hooks->after_forward(run(hooks->before_forward(input)));
}

}  // namespace lightning::fabric
