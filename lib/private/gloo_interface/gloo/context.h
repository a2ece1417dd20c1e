// Stand-in for gloo/context.h (README.md): only the member an inline c10d function names.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // defined in LibTorch's gloo; never called here
};
}  // namespace gloo
