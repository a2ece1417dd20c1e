// CSVLogger: metrics as a CSV table (root/name/version_N/metrics.csv: a "step" column, then one
// column per metric in the order metrics first appear; a row per log call) and hyperparameters as
// hparams.yaml. A metric first logged late rewrites the file with the wider header, as Lightning's
// CSV logger does. Written on global rank zero only (Fabric calls loggers there).
#pragma once

#include "lightning/fabric/export.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "lightning/fabric/loggers/logger.h"

namespace lightning::fabric {

class LF_API CSVLogger : public Logger {
 public:
  explicit CSVLogger(std::filesystem::path root_dir, std::string name = "lightning_logs",
                     std::optional<int> version = std::nullopt);
  std::string name() const override { return name_; }
  void log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) override;
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  /// root/name/version_N (created on the first write).
  const std::filesystem::path& log_dir();

 private:
  void rewrite();
  void append(const std::map<std::string, double>& row, std::optional<int64_t> step);

  std::filesystem::path root_;
  std::string name_;
  std::optional<int> version_;
  std::filesystem::path dir_;
  std::vector<std::string> columns_;
  std::vector<std::pair<std::optional<int64_t>, std::map<std::string, double>>> rows_;
};

}  // namespace lightning::fabric
