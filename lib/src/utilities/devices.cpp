#include "lightning/fabric/utilities/devices.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <sstream>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {
namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return {};
  const auto end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

bool is_integer(const std::string& text) {
  if (text.empty()) return false;
  const size_t start = (text[0] == '-') ? 1 : 0;
  return start < text.size() &&
         std::all_of(text.begin() + start, text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string join(const std::vector<int>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

// "0,2" / "1, 3," -> {0, 2} / {1, 3}; anything that is not a comma list of integers -> nullopt.
std::optional<std::vector<int>> parse_index_list(const std::string& text) {
  std::vector<int> indices;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    if (!is_integer(item)) return std::nullopt;
    indices.push_back(std::stoi(item));
  }
  return indices;
}

}  // namespace

bool DevicesSpec::is_auto() const {
  const auto* text = std::get_if<std::string>(&value_);
  return text != nullptr && trim(*text) == "auto";
}

std::string DevicesSpec::to_string() const {
  if (const auto* count = std::get_if<int>(&value_)) return std::to_string(*count);
  if (const auto* text = std::get_if<std::string>(&value_)) return trim(*text);
  return join(std::get<std::vector<int>>(value_));
}

int parse_cpu_devices(const DevicesSpec& spec) {
  if (spec.is_auto()) return 1;
  std::optional<int> count;
  if (const auto* number = std::get_if<int>(&spec.value())) count = *number;
  if (const auto* text = std::get_if<std::string>(&spec.value())) {
    const std::string trimmed = trim(*text);
    if (is_integer(trimmed) && trimmed[0] != '-') count = std::stoi(trimmed);
  }
  LF_CHECK(count.has_value(), TypeError, "devices=", spec.to_string().empty() ? "[]" : spec.to_string(),
           " is not valid with the CPU accelerator: it takes a number of processes, an int > 0 "
           "(e.g. devices=2) or \"auto\" (= 1). Device index lists such as \"0,2\" are for CUDA.");
  LF_CHECK(*count > 0, ValueError, "devices=", *count,
           " is not valid with the CPU accelerator: it must be an int > 0 (e.g. devices=1).");
  return *count;
}

std::vector<int> parse_cuda_devices(const DevicesSpec& spec, int available) {
  std::vector<int> indices;
  const std::string shown = spec.to_string().empty() ? "[]" : spec.to_string();
  auto first_n = [&](int n) {
    LF_CHECK(n != 0, ValueError, "devices=", shown, " selects no GPU. Use a count > 0, -1 for all GPUs, ",
             "an index list such as \"0,2\", or \"auto\".");
    LF_CHECK(n >= -1, ValueError, "devices=", shown, " is not valid: use a count > 0, -1 for all GPUs, ",
             "an index list such as \"0,2\", or \"auto\".");
    const int count = n == -1 ? available : n;
    LF_CHECK(count <= available, ValueError, "devices=", shown, " asks for ", count, " GPU(s) but only ",
             available, " are visible (CUDA_VISIBLE_DEVICES and the driver decide).");
    for (int i = 0; i < count; ++i) indices.push_back(i);
  };
  if (spec.is_auto()) {
    first_n(-1);
  } else if (const auto* number = std::get_if<int>(&spec.value())) {
    first_n(*number);
  } else if (const auto* list = std::get_if<std::vector<int>>(&spec.value())) {
    LF_CHECK(!list->empty(), ValueError, "devices=[] selects no GPU. Give at least one index, e.g. {0}.");
    indices = *list;
  } else {
    const std::string text = trim(std::get<std::string>(spec.value()));
    if (is_integer(text) && text.find(',') == std::string::npos) {
      first_n(std::stoi(text));
    } else {
      auto parsed = parse_index_list(text);
      LF_CHECK(parsed.has_value() && !parsed->empty(), ValueError, "devices=\"", text,
               "\" is not valid for CUDA: use a count (\"2\"), \"-1\" for all GPUs, an index list "
               "(\"0,2\") or \"auto\".");
      indices = *parsed;
    }
  }
  std::set<int> seen;
  for (int index : indices) {
    LF_CHECK(index >= 0 && index < available, ValueError, "devices=", shown, " names GPU ", index,
             ", but the visible GPUs are 0..", available - 1, " (", available, " in all).");
    LF_CHECK(seen.insert(index).second, ValueError, "devices=", shown, " names GPU ", index,
             " twice. List each GPU once.");
  }
  return indices;
}

}  // namespace lightning::fabric
