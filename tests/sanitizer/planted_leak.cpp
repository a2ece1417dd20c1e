// A leak planted in code of ours that LibTorch calls: a gradient hook (a function taking a tensor,
// run by LibTorch's autograd engine, so LibTorch frames lie under it) allocates with `new` and never
// frees. The sanitizer pass must report it (tests/sanitizer/CMakeLists.txt): lsan.supp suppresses
// named LibTorch-internal leaks only, never any stack that merely passes through LibTorch.
#include <torch/torch.h>

#include <cstdio>

namespace {
int* volatile planted = nullptr;  // volatile: the compiler may not drop the allocation

// Called by autograd with the gradient; the allocation is lost when the pointer is overwritten.
__attribute__((noinline)) torch::Tensor leak_in_a_tensor_hook(const torch::Tensor& gradient) {
  planted = new int[64 * 1024];
  planted[0] = static_cast<int>(gradient.numel());
  planted = nullptr;
  return gradient;
}
}  // namespace

int main() {
  auto weight = torch::ones({4}, torch::requires_grad());
  weight.register_hook(leak_in_a_tensor_hook);
  (weight * 2).sum().backward();
  std::printf("backward ran the hook; the leak is planted\n");
  return 0;
}
