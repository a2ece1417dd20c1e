// Background saves (Fabric::save_in_background): a host copy of the state taken on the calling
// thread, and the thread that then writes it. Nothing here is collective: Strategy::save_checkpoint
// and Strategy::settle_background_save decide when ranks agree on the outcome and commit.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>

namespace lightning::fabric {

/// Host memory kept from one background save's copy for the next: copying into pages already
/// mapped is two to eight times as fast as into fresh ones (benchmark P9). It holds what the last
/// copy took, and nothing more. Used by one thread at a time.
class HostBufferPool {
 public:
  /// A byte tensor of `bytes` (pinned when asked): one the previous copy used, or a new one.
  at::Tensor take(int64_t bytes, bool pinned);
  /// Before a copy: every buffer is free again. The caller guarantees no write still reads them.
  void start_copy();
  /// After a copy: frees the buffers it did not take.
  void finish_copy();

 private:
  std::multimap<std::pair<int64_t, bool>, at::Tensor> free_, taken_;
};

/// While one is alive on this thread, the tensors a save collects (saved_tensor) stay on their
/// device, so that host_copy copies them from there straight into pinned memory, once, and
/// host_copy takes its memory from `pool`. The collecting steps of a background save run under
/// one (Strategy::save_checkpoint).
class HostCopyScope {
 public:
  explicit HostCopyScope(HostBufferPool& pool);
  ~HostCopyScope();
  HostCopyScope(const HostCopyScope&) = delete;
  HostCopyScope& operator=(const HostCopyScope&) = delete;

 private:
  HostBufferPool* previous_;
};
/// A tensor as a state dict holds it for a save: detached, and copied to the CPU unless a
/// HostCopyScope is alive on this thread.
at::Tensor saved_tensor(const at::Tensor& tensor);

/// A copy of value that shares nothing the caller can change, containers rebuilt, laid out as
/// fabric.save writes the original, so the saved bytes are the same: a CPU tensor's whole storage
/// is copied (tensors that shared a storage share the copy, with their offsets and strides; a
/// tensor met twice is one copy); a device tensor is copied on its own into pinned memory, as
/// fabric.save's .cpu() copies it.
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
