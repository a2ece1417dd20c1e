// Loggers receive metrics from Fabric::log / log_dict. Concrete loggers (CSV, TensorBoard) live
// beside this header; this is the interface FabricOptions::loggers() accepts.
#pragma once

#include "lightning/fabric/export.h"

#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace lightning::fabric {

class LF_API Logger {
 public:
  virtual ~Logger() = default;
  virtual std::string name() const = 0;
  /// Records metrics at a step (rank 0 only: Fabric calls loggers on global rank zero).
  virtual void log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) = 0;
  /// Records hyperparameters once.
  virtual void log_hyperparams(const std::map<std::string, std::string>& params) { (void)params; }
  /// Flushes and closes; called once at the end of training.
  virtual void finalize(const std::string& status) { (void)status; }
};

/// Lightning's log folder layout: root/name/version_N, N = version when given, else one more
/// than the highest existing version_* (0 for the first run). Creates the folder.
LF_API std::filesystem::path versioned_log_dir(const std::filesystem::path& root, const std::string& name,
                                        std::optional<int> version);

}  // namespace lightning::fabric
