#include "lightning/fabric/utilities/env_vars.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "lightning/fabric/errors.h"

namespace lightning::fabric::env {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup map_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto found = values.find(name);
    if (found == values.end()) return std::nullopt;
    return found->second;
  };
}

namespace {

// Runs parse(value, used) and says whether it read the whole value; std::sto* throw on no digits
// and on overflow, which count as not read.
template <class Parse>
bool parses_whole(const std::string& value, Parse parse) {
  try {
    size_t used = 0;
    parse(value, used);
    return used == value.size();
  } catch (const std::exception&) {
    return false;
  }
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

}  // namespace

Reader::Reader(EnvLookup lookup) : lookup_(std::move(lookup)) {}

std::optional<std::string> Reader::text(const std::string& name) const { return lookup_(name); }

std::optional<long long> Reader::integer(const std::string& name) const {
  auto value = text(name);
  if (!value) return std::nullopt;
  long long parsed = 0;
  const bool ok = parses_whole(*value, [&](const std::string& v, size_t& used) { parsed = std::stoll(v, &used); });
  LF_CHECK(ok, ValueError, name, "=\"", *value, "\" is not an integer. Set it to a whole number, or unset it.");
  return parsed;
}

std::optional<long long> Reader::integer(const std::string& name, long long min, long long max) const {
  auto value = integer(name);
  if (!value) return std::nullopt;
  LF_CHECK(*value >= min && *value <= max, ValueError, name, "=\"", *text(name), "\" is out of range. Set it to a ",
           "whole number from ", min, " to ", max, ", or unset it.");
  return value;
}

std::optional<int> Reader::int_value(const std::string& name) const {
  auto value = integer(name, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

std::optional<unsigned long long> Reader::unsigned_integer(const std::string& name) const {
  auto value = text(name);
  if (!value) return std::nullopt;
  unsigned long long parsed = 0;
  // std::stoull reads "-1" as the largest value: a minus sign is refused before it wraps.
  const bool negative = value->find('-') != std::string::npos;
  const bool ok = !negative &&
                  parses_whole(*value, [&](const std::string& v, size_t& used) { parsed = std::stoull(v, &used); });
  LF_CHECK(ok, ValueError, name, "=\"", *value,
           "\" is not an unsigned integer. Set it to a whole number >= 0, or unset it.");
  return parsed;
}

bool Reader::flag(const std::string& name, bool fallback) const {
  auto value = text(name);
  if (!value) return fallback;
  const std::string word = lowercase(*value);
  if (word == "1" || word == "true" || word == "yes") return true;
  if (word == "0" || word == "false" || word == "no") return false;
  throw ValueError(detail::concat(name, "=\"", *value, "\" is not a flag. Set it to 1, true or yes (on) or to 0, ",
                                  "false or no (off), in any case, or unset it."));
}

std::optional<double> Reader::seconds(const std::string& name) const {
  auto value = text(name);
  if (!value) return std::nullopt;
  double parsed = -1;
  const bool ok = parses_whole(*value, [&](const std::string& v, size_t& used) { parsed = std::stod(v, &used); });
  LF_CHECK(ok && std::isfinite(parsed) && parsed >= 0, ValueError, name, "=\"", *value,
           "\" is not a number of seconds. Set it to 0 or a positive number (e.g. 30 or 0.5), or unset it.");
  return parsed;
}

}  // namespace lightning::fabric::env
