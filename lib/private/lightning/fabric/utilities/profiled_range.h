// A profiler range (utilities/profiler.h) whose name is made only while a profiler runs: free
// otherwise. The collectives name theirs as the flight recorder names the call, the pipeline's
// executor each micro-batch's forward and backward.
#pragma once

#include <ATen/record_function.h>

namespace lightning::fabric {

class ProfiledRange {
 public:
  /// name: a callable returning the range's name (a std::string).
  template <class Name>
  explicit ProfiledRange(Name&& name) : range_(at::RecordScope::USER_SCOPE) {
    if (range_.isActive()) range_.before(name());
  }

 private:
  at::RecordFunction range_;
};

}  // namespace lightning::fabric
