#include "lightning/fabric/utilities/error_file.h"

#include <cxxabi.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <typeinfo>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = (status == 0 && readable != nullptr) ? readable : name;
  std::free(readable);
  return result;
}

std::atomic<void (*)()> terminate_hook{nullptr};

std::terminate_handler& previous_handler() {
  static std::terminate_handler handler = nullptr;
  return handler;
}

void record_and_terminate() {
  const auto path = env::Reader().text(env::kErrorFile);
  if (path && !path->empty()) {
    if (auto current = std::current_exception()) {
      std::string type = "unknown exception";
      if (const std::type_info* info = abi::__cxa_current_exception_type()) type = demangle(info->name());
      std::string message;
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& error) {
        message = error.what();
      } catch (...) {
        message = "(not a std::exception)";
      }
      write_error_file(*path, type, message);
    }
  }
  if (auto hook = terminate_hook.load()) hook();
  if (auto handler = previous_handler()) handler();
  std::abort();
}

}  // namespace

void set_terminate_hook(void (*hook)()) { terminate_hook = hook; }

void install_error_file_handler() {
  static const bool installed = [] {
    previous_handler() = std::set_terminate(record_and_terminate);
    return true;
  }();
  (void)installed;
}

namespace {
// Installed when the library loads, so that an exception escaping main before or inside the Fabric
// constructor (a bad option, a launcher mismatch) is recorded too.
[[maybe_unused]] const bool installed_at_load = (install_error_file_handler(), true);

// The rank for the record. Never throws, as the process is already failing: a malformed RANK is
// recorded as 0 (the strategy reports it where it reads the rank).
int rank_for_record() {
  try {
    return env::Reader().int_value(env::kRank).value_or(0);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

bool write_error_file(const std::string& path, const std::string& type, const std::string& message) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json record = {
      {"message",
       {{"message", type + ": " + message},
        {"extraInfo", {{"timestamp", std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count())}}}}},
      {"type", type},
      {"rank", rank_for_record()}};
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    if (!out) return false;
    out << record.dump(2) << '\n';
    if (!out.flush()) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

std::string read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  try {
    const auto record = nlohmann::json::parse(in);
    const auto& message = record.at("message");
    if (message.is_string()) return message.get<std::string>();
    return message.at("message").get<std::string>();
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace lightning::fabric
