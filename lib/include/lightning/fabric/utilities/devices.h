// The `devices` setting: what the user may write (an int, a string such as "2", "0,2", "-1" or
// "auto", or a list of indices) and how each accelerator turns it into concrete devices
// (Python Fabric's devices rules).
#pragma once

#include "lightning/fabric/export.h"

#include <string>
#include <variant>
#include <vector>

namespace lightning::fabric {

/// What FabricOptions::devices() holds. Default: "auto".
class LF_API DevicesSpec {
 public:
  DevicesSpec() : value_(std::string("auto")) {}
  DevicesSpec(int count) : value_(count) {}                        // NOLINT: implicit by design
  DevicesSpec(std::string text) : value_(std::move(text)) {}       // NOLINT
  DevicesSpec(const char* text) : value_(std::string(text)) {}     // NOLINT
  DevicesSpec(std::vector<int> indices) : value_(std::move(indices)) {}  // NOLINT

  bool is_auto() const;
  /// The form the CLI would write: "auto", "2", "0,2" (used to compare code with LT_DEVICES).
  std::string to_string() const;
  const std::variant<int, std::string, std::vector<int>>& value() const { return value_; }

 private:
  std::variant<int, std::string, std::vector<int>> value_;
};

/// CPU: a positive int or digit string -> that many processes; "auto" -> 1. Anything else is a
/// TypeError/ValueError that names the value.
LF_API int parse_cpu_devices(const DevicesSpec& spec);

/// CUDA: N -> the first N, -1 or "-1" -> all, "0,2" or {0,2} -> those. 0, "0" and {} are
/// invalid; duplicates and indices >= available are errors. "auto" -> all available.
LF_API std::vector<int> parse_cuda_devices(const DevicesSpec& spec, int available);

}  // namespace lightning::fabric
