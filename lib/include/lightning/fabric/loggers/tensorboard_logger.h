// TensorBoardLogger: a TensorBoard event file (root/name/version_N/
// events.out.tfevents.TIME.HOST.PID.0) that TensorBoard reads: TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around Event protocol buffers
// (a first Event with file_version "brain.Event:2", then one Event per write holding a Summary),
// encoded here without a protobuf library. Scalars (simple_value), images (PNG), histograms,
// text (the text plugin) and hyperparameters with their metrics (the HParams plugin, as PyTorch's
// SummaryWriter.add_hparams writes them; also hparams.yaml beside the file, as Lightning's).
// Fabric calls log_metrics (fabric.log, log_dict) on global rank zero only; the other methods
// you call yourself: call them on rank zero too. Flushed after every write.
//   auto board = std::make_shared<lf::TensorBoardLogger>("logs");
//   board->log_image("samples", grid, step);           // [C, H, W] in [0, 1], or uint8
//   board->log_histogram("fc1/weight", weight, step);
//   board->log_text("notes", "**lr** warmed up", step);
//   board->log_hyperparams({{"lr", 0.1}, {"optimizer", "adam"}}, {{"val/loss", 0.25}});
#pragma once

#include "lightning/fabric/export.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>

#include "lightning/fabric/loggers/logger.h"

namespace lightning::fabric {

/// A hyperparameter's value in TensorBoard's HParams tab: text, a number (sortable, plottable)
/// or a flag, as Python's str, int/float and bool. A flag is written as the number 1 or 0, as
/// PyTorch's hparams writes a bool; hparams.yaml keeps true/false.
class LF_API HParam {
 public:
  enum class Kind { Text, Number, Flag };
  HParam(const char* text) : kind_(Kind::Text), text_(text) {}
  HParam(std::string text) : kind_(Kind::Text), text_(std::move(text)) {}
  HParam(std::string_view text) : kind_(Kind::Text), text_(text) {}
  /// Any integer or floating type (stored as a double, as TensorBoard does); a char is refused at
  /// compile time, since 'x' would silently be 120.
  template <class Number, std::enable_if_t<std::is_arithmetic_v<Number> && !std::is_same_v<Number, bool> &&
                                               !std::is_same_v<Number, char>, int> = 0>
  HParam(Number number) : kind_(Kind::Number), number_(static_cast<double>(number)) {}
  HParam(bool flag) : kind_(Kind::Flag), flag_(flag) {}
  /// A number from a tensor, as PyTorch's hparams reads one: the first element of a 1-D tensor
  /// (bfloat16 through float16), or a 0-D tensor's value (which PyTorch refuses). ValueError
  /// naming the shape for an empty, complex or more than 1-D tensor.
  HParam(const at::Tensor& value);
  Kind kind() const { return kind_; }
  const std::string& text() const { return text_; }
  double number() const { return number_; }
  bool flag() const { return flag_; }
  /// As hparams.yaml writes it.
  std::string to_string() const;

 private:
  Kind kind_;
  std::string text_;
  double number_ = 0;
  bool flag_ = false;
};

class LF_API TensorBoardLogger : public Logger {
 public:
  /// default_hp_metric: as Lightning's, log_hyperparams without metrics also logs hp_metric = -1,
  /// so the HParams tab lists the run; false logs the parameters only.
  explicit TensorBoardLogger(std::filesystem::path root_dir, std::string name = "lightning_logs",
                             std::optional<int> version = std::nullopt, bool default_hp_metric = true);
  std::string name() const override { return name_; }
  void log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) override;
  /// hparams.yaml, and the HParams tab with the values as text (the Logger interface).
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  /// hparams.yaml and the HParams tab with typed values, against metrics: each metric is logged
  /// as a scalar at step 0 (hp_metric = -1 when none and default_hp_metric), as Lightning's
  /// log_hyperparams(params, metrics); log the same tags later to update them.
  void log_hyperparams(const std::map<std::string, HParam>& params, const std::map<std::string, double>& metrics);
  /// An image (SummaryWriter.add_image, CHW): [C, H, W] with C = 1, 3 or 4 (grey, RGB, RGBA), or
  /// [H, W]; floating values in [0, 1] or uint8. Stored as PyTorch's summary.image stores it: an
  /// RGB or RGBA PNG (grey repeated into three channels), floats times 255 in float32, clipped to
  /// [0, 255] and truncated (NaN gives 0), uint8 as given.
  /// step: the last step logged when unset. ValueError naming the shape or dtype otherwise.
  void log_image(const std::string& tag, const at::Tensor& image, std::optional<int64_t> step = std::nullopt);
  /// A histogram (add_histogram) of values' finite elements: bins equal-width buckets between
  /// their min and max, with count, sum and sum of squares. ValueError when none is finite.
  void log_histogram(const std::string& tag, const at::Tensor& values, std::optional<int64_t> step = std::nullopt,
                     int bins = 64);
  /// Text for the Text tab (add_text; TensorBoard renders Markdown).
  void log_text(const std::string& tag, const std::string& text, std::optional<int64_t> step = std::nullopt);
  void finalize(const std::string& status) override;
  const std::filesystem::path& log_dir();
  /// The event file being written (created on the first write).
  const std::filesystem::path& event_file();

 private:
  void write_record(std::string_view record);
  /// One Event holding summary (serialized Summary) at step.
  void write_summary(int64_t step, const std::string& summary);
  int64_t step_or_last(std::optional<int64_t> step) const { return step.value_or(last_step_ < 0 ? 0 : last_step_); }
  void write_hparams_yaml(const std::map<std::string, std::string>& params);

  std::filesystem::path root_;
  std::string name_;
  std::optional<int> version_;
  std::filesystem::path dir_, file_;
  std::ofstream out_;
  int64_t last_step_ = -1;
  bool default_hp_metric_ = true;
};

/// Images [N, C, H, W] tiled into one [C, H', W'] grid, nrow to a row, padding pixels of
/// pad_value between and around them (torchvision.utils.make_grid's layout): for log_image or
/// encode_png. ValueError naming the shape when images is not 4-D.
LF_API at::Tensor make_image_grid(const at::Tensor& images, int64_t nrow = 8, int64_t padding = 2, double pad_value = 0);

/// An 8-bit PNG of height x width pixels with 1 to 4 channels (grey, grey+alpha, RGB, RGBA),
/// rows top to bottom, channels interleaved: the bytes of a .png file.
LF_API std::string encode_png(const uint8_t* pixels, int width, int height, int channels);

/// CRC-32C (Castagnoli), and the masked form TFRecord stores.
LF_API uint32_t crc32c(std::string_view data);
LF_API uint32_t masked_crc32c(std::string_view data);

}  // namespace lightning::fabric
