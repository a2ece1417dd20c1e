// What the checkpoint file formats (zip container, pickle) share: little-endian integer fields,
// and the text of the last system error for their messages.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lightning::fabric::internal {

/// The width-byte little-endian ("le") integer at bytes[at]; the caller has checked the bounds.
inline uint64_t read_le(std::string_view bytes, uint64_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + static_cast<uint64_t>(i)]);
  return value;
}

/// Appends the low width bytes of value to out, least significant first.
inline void append_le(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

/// strerror(errno) as a string, for "... failed: <reason>" messages.
inline std::string system_error_text() { return std::strerror(errno); }

}  // namespace lightning::fabric::internal
