// A soft check for programs that run inside multi-process jobs (ddp_checks, fsdp_checks): each
// failed check prints "FAIL: ..." (CTest's FAIL_REGULAR_EXPRESSION catches it) and is counted.
#pragma once

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

}  // namespace checks
