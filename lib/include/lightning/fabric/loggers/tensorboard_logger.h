// TensorBoardLogger: scalars as a TensorBoard event file (root/name/version_N/
// events.out.tfevents.TIME.HOST.PID.0) that TensorBoard reads: TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around Event protocol buffers
// (a first Event with file_version "brain.Event:2", then one Event per step holding a Summary of
// simple_value scalars), encoded here without a protobuf library. Hyperparameters go to
// hparams.yaml beside it. Written on global rank zero only; flushed after every write.
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "lightning/fabric/loggers/logger.h"

namespace lightning::fabric {

class LF_API TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(std::filesystem::path root_dir, std::string name = "lightning_logs",
                             std::optional<int> version = std::nullopt);
  std::string name() const override { return name_; }
  void log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) override;
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  void finalize(const std::string& status) override;
  const std::filesystem::path& log_dir();
  /// The event file being written (created on the first write).
  const std::filesystem::path& event_file();

 private:
  void write_record(std::string_view record);

  std::filesystem::path root_;
  std::string name_;
  std::optional<int> version_;
  std::filesystem::path dir_, file_;
  std::ofstream out_;
  int64_t last_step_ = -1;
};

/// CRC-32C (Castagnoli), and the masked form TFRecord stores.
LF_API uint32_t crc32c(std::string_view data);
LF_API uint32_t masked_crc32c(std::string_view data);

}  // namespace lightning::fabric
