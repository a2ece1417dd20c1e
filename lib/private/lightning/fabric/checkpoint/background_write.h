// Background saves (Fabric::save_in_background): a host copy of the state taken on the calling
// thread, and the thread that then writes it. Nothing here is collective: Strategy::save_checkpoint
// and Strategy::settle_background_save decide when ranks agree on the outcome and commit.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace lightning::fabric {

/// A copy of value that shares nothing the caller can change: every tensor's storage copied to
/// host memory (pinned when it lives on a GPU, so the copy is one DMA), containers rebuilt.
/// Tensors that shared a storage share the copy, with their offsets and strides, and a tensor met
/// twice is one copy, so the saved bytes equal those of a save of the original.
c10::IValue host_copy(const c10::IValue& value);

/// Runs `write` on a thread of its own from construction; the destructor waits for it.
class BackgroundWrite {
 public:
  BackgroundWrite(std::string call, std::function<void()> write);
  ~BackgroundWrite();
  BackgroundWrite(const BackgroundWrite&) = delete;
  BackgroundWrite& operator=(const BackgroundWrite&) = delete;

  /// The Fabric call that started it, e.g. "fabric.save_in_background(ckpt)", for messages.
  const std::string& call() const { return call_; }
  /// Whether the write has returned or thrown (does not wait).
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  /// Waits for the write; what it threw, or null when it succeeded.
  std::exception_ptr wait();

 private:
  std::string call_;
  std::exception_ptr error_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace lightning::fabric
