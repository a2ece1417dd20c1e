// A soft check for programs that run inside multi-process jobs (ddp_checks, fsdp_checks): each
// failed check prints "FAIL: ..." (CTest's FAIL_REGULAR_EXPRESSION catches it) and is counted.
#pragma once

#include <exception>
#include <iostream>
#include <string>

namespace checks {

inline int& failures() {
  static int count = 0;
  return count;
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures();
    std::cout << "FAIL: " << what << std::endl;
  }
}

/// The message of the Error that fn throws, or "(nothing thrown)"; any other exception propagates
/// (a refusal of the wrong type fails the program).
template <class Error = std::exception, class Fn>
std::string refusal(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "(nothing thrown)";
}

}  // namespace checks
