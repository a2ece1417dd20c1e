#include "internal/stack_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace lightning::fabric::internal {
namespace {

constexpr int kMaxFrames = 64;
void* captured_frames[kMaxFrames];
std::atomic<int> captured_count{-1};

void on_stack_signal(int) {
  const int saved_errno = errno;
  captured_count.store(backtrace(captured_frames, kMaxFrames), std::memory_order_release);
  errno = saved_errno;
}

std::string frame_text(void* address) {
  Dl_info info{};
  char line[1024];
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    std::snprintf(line, sizeof(line), "%p ??", address);
    return line;
  }
  const char* file = std::strrchr(info.dli_fname, '/');
  file = file != nullptr ? file + 1 : info.dli_fname;
  if (info.dli_sname == nullptr) {
    std::snprintf(line, sizeof(line), "%p ?? (%s+0x%lx)", address, file,
                  static_cast<unsigned long>(static_cast<char*>(address) - static_cast<char*>(info.dli_fbase)));
    return line;
  }
  int status = 0;
  char* readable = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::snprintf(line, sizeof(line), "%p %s+0x%lx (%s)", address, status == 0 && readable ? readable : info.dli_sname,
                static_cast<unsigned long>(static_cast<char*>(address) - static_cast<char*>(info.dli_saddr)), file);
  std::free(readable);
  return line;
}

}  // namespace

int stack_signal() { return SIGRTMIN + 7; }

void install_stack_capture() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[2];
    backtrace(warm, 2);  // loads the unwinder now, not inside the handler
    struct sigaction action {};
    action.sa_handler = on_stack_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(stack_signal(), &action, nullptr);
  });
}

std::string capture_thread_stack(int tid, std::chrono::milliseconds timeout) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  install_stack_capture();
  captured_count.store(-1, std::memory_order_relaxed);
  if (::syscall(SYS_tgkill, ::getpid(), tid, stack_signal()) != 0) {
    return "no stack: thread " + std::to_string(tid) + " is gone (" + std::strerror(errno) + ")\n";
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int count = -1;
  while ((count = captured_count.load(std::memory_order_acquire)) < 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return "no stack: thread " + std::to_string(tid) + " did not answer within " +
             std::to_string(timeout.count()) + " ms (blocked in the kernel with signals masked?)\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string text;
  // Frame 0 is the handler, frame 1 the kernel's signal trampoline.
  for (int i = 2; i < count; ++i) text += "  #" + std::to_string(i - 2) + " " + frame_text(captured_frames[i]) + "\n";
  return text;
}

}  // namespace lightning::fabric::internal
