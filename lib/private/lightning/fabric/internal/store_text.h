// Text values in a c10d store, which holds bytes: the conversions both ways.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lightning::fabric::internal {

inline std::vector<uint8_t> store_bytes(const std::string& text) { return {text.begin(), text.end()}; }
inline std::string store_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace lightning::fabric::internal
