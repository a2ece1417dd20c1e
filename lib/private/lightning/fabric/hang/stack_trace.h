// Native stack traces of a thread of this process, for the hang watchdog's dumps. A real-time
// signal (kStackSignal) makes the target thread record its return addresses into a static buffer
// (backtrace(), warmed up at install so the handler does not load libgcc); the caller then
// symbolizes them from each file's full symbol table (.symtab, so hidden and static functions and
// an executable's own functions are named without -rdynamic), else with dladdr, and demangles.
// Frames of a stripped file show as file+offset, which addr2line resolves.
#pragma once

#include <chrono>
#include <string>

namespace lightning::fabric::internal {

/// SIGRTMIN + 7: the signal the capture sends to the target thread.
int stack_signal();

/// Installs the handler once (idempotent; call from a normal context, e.g. watchdog start).
void install_stack_capture();

/// The stack of thread `tid` (a Linux thread id of this process), innermost first, one frame per
/// line; a one-line explanation when the thread does not answer within timeout. Not reentrant
/// (serialized inside); never call from a signal handler.
std::string capture_thread_stack(int tid, std::chrono::milliseconds timeout);

}  // namespace lightning::fabric::internal
