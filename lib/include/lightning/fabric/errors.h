// Typed errors of the runtime. They mirror Python's built-in exception classes so
// that users coming from Lightning Fabric catch what they expect. Every message names the call or
// flag, the bad value, the valid choices and the fix.
#pragma once

#include "lightning/fabric/export.h"

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace lightning::fabric {

/// Base of every error the runtime throws on purpose.
class LF_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A value is not acceptable (Python's ValueError).
class LF_API ValueError : public Error {
 public:
  using Error::Error;
};

/// An object of the wrong kind was passed (Python's TypeError).
class LF_API TypeError : public Error {
 public:
  using Error::Error;
};

/// The call is not allowed in the current state (Python's RuntimeError).
class LF_API RuntimeError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// Concatenates every argument with operator<< (the message builder of the check macros).
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

}  // namespace lightning::fabric

/// LF_CHECK(cond, ErrorType, message parts...): throw ErrorType(concat(parts...)) unless cond.
#define LF_CHECK(cond, ErrorType, ...)                                        \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw ::lightning::fabric::ErrorType(::lightning::fabric::detail::concat(__VA_ARGS__)); \
    }                                                                         \
  } while (false)
