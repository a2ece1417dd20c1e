#include "lightning/fabric/loggers/tensorboard_logger.h"

#include <ATen/ATen.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> built{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t value = i;
      for (int bit = 0; bit < 8; ++bit) value = (value >> 1) ^ (0x82F63B78u & (0u - (value & 1u)));
      built[i] = value;
    }
    return built;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {
// Protocol-buffer wire format, just what Event/Summary need.
void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
template <class T>
void fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian host, as the wire format
  out.append(bytes, sizeof(T));
}
void length_delimited(std::string& out, int field, std::string_view payload) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, payload.size());
  out.append(payload);
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
// Fields in number order and step 0 left out, as protobuf serializes them (PyTorch's bytes).
std::string event(double wall_time, int64_t step, const std::string& file_version, const std::string& summary) {
  std::string out;
  varint(out, 1 << 3 | 1);
  fixed(out, wall_time);
  if (step != 0) {
    varint(out, 2 << 3 | 0);
    varint(out, static_cast<uint64_t>(step));
  }
  if (!file_version.empty()) length_delimited(out, 3, file_version);
  if (!summary.empty()) length_delimited(out, 5, summary);
  return out;
}

void varint_field(std::string& out, int field, uint64_t value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 0);
  varint(out, value);
}
void double_field(std::string& out, int field, double value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 1);
  fixed(out, value);
}
void packed_doubles(std::string& out, int field, const std::vector<double>& values) {
  std::string payload;
  for (double value : values) fixed(payload, value);
  length_delimited(out, field, payload);
}

// Summary.Value { tag = 1; one of simple_value = 2, image = 4, histo = 5, tensor = 8; metadata = 9 }
// inside a Summary { value = 1 }. value_field 0: none (the hparams summaries).
std::string summary_of(const std::string& tag, int value_field, const std::string& value, const std::string& metadata = "") {
  std::string entry;
  length_delimited(entry, 1, tag);
  if (value_field != 0) length_delimited(entry, value_field, value);
  if (!metadata.empty()) length_delimited(entry, 9, metadata);
  std::string summary;
  length_delimited(summary, 1, entry);
  return summary;
}

// SummaryMetadata { plugin_data = 1 { plugin_name = 1; content = 2 } }
std::string plugin_metadata(const std::string& plugin, const std::string& content) {
  std::string data;
  length_delimited(data, 1, plugin);
  if (!content.empty()) length_delimited(data, 2, content);
  std::string metadata;
  length_delimited(metadata, 1, data);
  return metadata;
}

// PNG chunk: length (big-endian), type, data, CRC-32 of type and data.
void png_chunk(std::string& out, const char* type, const std::string& data) {
  const auto big_endian = [&out](uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((value >> shift) & 0xFF));
  };
  big_endian(static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  big_endian(static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string encode_png(const uint8_t* pixels, int width, int height, int channels) {
  LF_CHECK(width > 0 && height > 0 && channels >= 1 && channels <= 4, ValueError, "encode_png: ", width, " x ", height,
           " pixels of ", channels, " channels; expected a positive size and 1 to 4 channels.");
  static constexpr uint8_t kColorType[] = {0, 0, 4, 2, 6};  // grey, grey + alpha, RGB, RGBA
  const size_t row = static_cast<size_t>(width) * static_cast<size_t>(channels);
  std::string raw;
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    raw.append(reinterpret_cast<const char*>(pixels) + static_cast<size_t>(y) * row, row);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  LF_CHECK(compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, reinterpret_cast<const Bytef*>(raw.data()),
                     static_cast<uLong>(raw.size()), 6) == Z_OK, RuntimeError, "encode_png: zlib failed.");
  packed.resize(packed_size);
  std::string header;
  for (uint32_t value : {static_cast<uint32_t>(width), static_cast<uint32_t>(height)}) {
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<char>((value >> shift) & 0xFF));
  }
  header += std::string{8, static_cast<char>(kColorType[channels]), 0, 0, 0};  // depth, color, compression, filter, interlace
  std::string png("\x89PNG\r\n\x1a\n", 8);
  png_chunk(png, "IHDR", header);
  png_chunk(png, "IDAT", packed);
  png_chunk(png, "IEND", "");
  return png;
}

at::Tensor make_image_grid(const at::Tensor& images, int64_t nrow, int64_t padding, double pad_value) {
  LF_CHECK(images.dim() == 4 && images.size(0) > 0, ValueError, "make_image_grid: expected images [N, C, H, W] with N > 0, got ",
           images.sizes(), ".");
  LF_CHECK(nrow > 0 && padding >= 0, ValueError, "make_image_grid: nrow is ", nrow, " and padding ", padding,
           "; nrow must be positive and padding not negative.");
  const int64_t count = images.size(0), height = images.size(2), width = images.size(3);
  const int64_t columns = std::min(nrow, count), rows = (count + columns - 1) / columns;
  at::Tensor grid = at::full({images.size(1), rows * (height + padding) + padding, columns * (width + padding) + padding},
                             pad_value, images.options());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t top = padding + (i / columns) * (height + padding), left = padding + (i % columns) * (width + padding);
    grid.narrow(1, top, height).narrow(2, left, width).copy_(images[i]);
  }
  return grid;
}

HParam::HParam(const at::Tensor& value) : kind_(Kind::Number) {
  LF_CHECK(value.defined() && value.dim() <= 1 && value.numel() >= 1 && !value.is_complex(), ValueError,
           "HParam(tensor): expected a real 1-D tensor with at least one element (its first element is the value, as "
           "torch.utils.tensorboard's hparams reads a tensor) or a 0-D tensor; got ",
           value.defined() ? c10::str(c10::toString(value.scalar_type()), " of shape ", value.sizes())
                           : std::string("an undefined tensor"),
           ". Pass a number instead (tensor.item<double>()), or text.");
  at::Tensor first = (value.dim() == 1 ? value[0] : value).detach().to(at::kCPU);
  if (first.scalar_type() == at::kBFloat16) first = first.to(at::kHalf);  // PyTorch's make_np goes through float16
  number_ = first.to(at::kDouble).item<double>();
}

std::string HParam::to_string() const {
  switch (kind_) {
    case Kind::Text: return text_;
    case Kind::Flag: return flag_ ? "true" : "false";
    case Kind::Number: {  // the shortest form that reads back as the same double (0.0002, not 0.00020000000000000001)
      for (int digits = 6; digits <= 17; ++digits) {
        std::ostringstream out;
        out.precision(digits);
        out << number_;
        if (std::stod(out.str()) == number_ || digits == 17) return out.str();
      }
      return std::to_string(number_);
    }
  }
  return text_;
}

TensorBoardLogger::TensorBoardLogger(fs::path root_dir, std::string name, std::optional<int> version, bool default_hp_metric)
    : root_(std::move(root_dir)), name_(std::move(name)), version_(version), default_hp_metric_(default_hp_metric) {}

const fs::path& TensorBoardLogger::log_dir() {
  if (dir_.empty()) dir_ = versioned_log_dir(root_, name_, version_);
  return dir_;
}

const fs::path& TensorBoardLogger::event_file() {
  if (file_.empty()) {
    const auto seconds = static_cast<int64_t>(now_seconds());
    file_ = log_dir() / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                         std::to_string(::getpid()) + ".0");
    out_.open(file_, std::ios::binary | std::ios::trunc);
    LF_CHECK(out_.good(), RuntimeError, "TensorBoardLogger: cannot create ", file_.string(), ".");
    write_record(event(now_seconds(), 0, "brain.Event:2", ""));
  }
  return file_;
}

void TensorBoardLogger::write_record(std::string_view record) {
  std::string header;
  fixed(header, static_cast<uint64_t>(record.size()));
  std::string framed = header;
  fixed(framed, masked_crc32c(header));
  framed.append(record);
  fixed(framed, masked_crc32c(record));
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  out_.flush();
  LF_CHECK(out_.good(), RuntimeError, "TensorBoardLogger: writing ", file_.string(), " failed.");
}

void TensorBoardLogger::write_summary(int64_t step, const std::string& summary) {
  event_file();
  write_record(event(now_seconds(), step, "", summary));
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) {
  const int64_t at = step.value_or(last_step_ + 1);
  last_step_ = at;
  std::string summary;
  for (const auto& [tag, value] : metrics) {
    std::string entry;
    length_delimited(entry, 1, tag);
    varint(entry, 2 << 3 | 5);
    fixed(entry, static_cast<float>(value));
    length_delimited(summary, 1, entry);
  }
  write_summary(at, summary);
}

void TensorBoardLogger::write_hparams_yaml(const std::map<std::string, std::string>& params) {
  std::ofstream out(log_dir() / "hparams.yaml", std::ios::trunc);
  for (const auto& [key, value] : params) out << key << ": " << value << '\n';
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  std::map<std::string, HParam> typed;
  for (const auto& [key, value] : params) typed.emplace(key, value);
  log_hyperparams(typed, {});
}

// The three summaries of the HParams plugin, as torch.utils.tensorboard.summary.hparams writes
// them: HParamsPluginData { version = 1; experiment = 2 | session_start_info = 3 |
// session_end_info = 4 }, each in the metadata of a value with no payload.
void TensorBoardLogger::log_hyperparams(const std::map<std::string, HParam>& params,
                                        const std::map<std::string, double>& metrics) {
  std::map<std::string, std::string> yaml;
  for (const auto& [key, value] : params) yaml[key] = value.to_string();
  write_hparams_yaml(yaml);
  std::map<std::string, double> shown = metrics;
  if (shown.empty() && default_hp_metric_) shown["hp_metric"] = -1;
  if (!shown.empty()) log_metrics(shown, 0);
  // HParamsPluginData.version (field 1) is PLUGIN_DATA_VERSION = 0, which protobuf leaves out.
  const auto plugin_data = [](int field, const std::string& message) {
    std::string data;
    length_delimited(data, field, message);
    return plugin_metadata("hparams", data);
  };
  // Experiment { hparam_infos = 4 { name = 1; type = 4 }; metric_infos = 5 { name = 1 { tag = 2 } } }
  // SessionStartInfo { hparams = 1 (map<string, google.protobuf.Value { number_value = 2;
  // string_value = 3 }>) } in key order (the std::map's), no start time, as PyTorch writes it.
  // A flag is the number 1 or 0 (DATA_TYPE_FLOAT64), as PyTorch's hparams writes a Python bool: it
  // tests isinstance(v, (int, float)) first, and bool is an int.
  std::string experiment, start;
  for (const auto& [key, value] : params) {
    std::string info, typed;
    length_delimited(info, 1, key);
    switch (value.kind()) {
      case HParam::Kind::Text:
        varint_field(info, 4, 1);  // DATA_TYPE_STRING
        length_delimited(typed, 3, value.text());
        break;
      case HParam::Kind::Number:
        varint_field(info, 4, 3);  // DATA_TYPE_FLOAT64
        double_field(typed, 2, value.number());
        break;
      case HParam::Kind::Flag:
        varint_field(info, 4, 3);  // DATA_TYPE_FLOAT64
        double_field(typed, 2, value.flag() ? 1.0 : 0.0);
        break;
    }
    length_delimited(experiment, 4, info);
    std::string entry;
    length_delimited(entry, 1, key);
    length_delimited(entry, 2, typed);
    length_delimited(start, 1, entry);
  }
  for (const auto& [tag, value] : shown) {
    std::string name, info;
    length_delimited(name, 2, tag);
    length_delimited(info, 1, name);
    length_delimited(experiment, 5, info);
  }
  std::string end;
  varint_field(end, 1, 1);  // STATUS_SUCCESS, as PyTorch writes it
  write_summary(0, summary_of("_hparams_/experiment", 0, "", plugin_data(2, experiment)));
  write_summary(0, summary_of("_hparams_/session_start_info", 0, "", plugin_data(3, start)));
  write_summary(0, summary_of("_hparams_/session_end_info", 0, "", plugin_data(4, end)));
}

void TensorBoardLogger::log_image(const std::string& tag, const at::Tensor& image, std::optional<int64_t> step) {
  LF_CHECK(image.defined() && (image.dim() == 2 || (image.dim() == 3 && image.size(0) >= 1 && image.size(0) <= 4 &&
                                                    image.size(0) != 2)),
           ValueError, "TensorBoardLogger::log_image(\"", tag, "\"): expected [C, H, W] with C = 1, 3 or 4, or [H, W]; got ",
           image.defined() ? c10::str(image.sizes()) : std::string("an undefined tensor"), ".");
  LF_CHECK(image.is_floating_point() || image.scalar_type() == at::kByte, ValueError, "TensorBoardLogger::log_image(\"",
           tag, "\"): expected floating values in [0, 1] or uint8, got ", c10::toString(image.scalar_type()), ".");
  // As torch.utils.tensorboard.summary.image: grey ([H, W] or one channel) becomes RGB; floats are
  // taken as float32 (bfloat16 through float16, as make_np), times 255 in float32, clipped to
  // [0, 255] and truncated to uint8 (NaN gives 0); uint8 is kept as it is.
  at::Tensor chw = (image.dim() == 2 ? image.unsqueeze(0) : image).detach().to(at::kCPU);
  if (chw.size(0) == 1) chw = chw.expand({3, chw.size(1), chw.size(2)});
  at::Tensor hwc = chw.permute({1, 2, 0});
  if (hwc.is_floating_point()) {
    if (hwc.scalar_type() == at::kBFloat16) hwc = hwc.to(at::kHalf);
    const at::Tensor values = hwc.to(at::kFloat).contiguous();
    at::Tensor bytes = at::empty(values.sizes(), at::TensorOptions().dtype(at::kByte));
    const float* in = values.data_ptr<float>();
    uint8_t* out = bytes.data_ptr<uint8_t>();
    for (int64_t i = 0; i < values.numel(); ++i) {
      const float scaled = in[i] * 255.0f;
      out[i] = std::isnan(scaled) ? uint8_t{0} : static_cast<uint8_t>(std::min(std::max(scaled, 0.0f), 255.0f));
    }
    hwc = bytes;
  } else {
    hwc = hwc.contiguous();
  }
  const int height = static_cast<int>(hwc.size(0)), width = static_cast<int>(hwc.size(1)), channels = static_cast<int>(hwc.size(2));
  // Summary.Image { height = 1; width = 2; colorspace = 3; encoded_image_string = 4 }
  std::string encoded;
  varint_field(encoded, 1, static_cast<uint64_t>(height));
  varint_field(encoded, 2, static_cast<uint64_t>(width));
  varint_field(encoded, 3, static_cast<uint64_t>(channels));
  length_delimited(encoded, 4, encode_png(hwc.data_ptr<uint8_t>(), width, height, channels));
  write_summary(step_or_last(step), summary_of(tag, 4, encoded));
}

void TensorBoardLogger::log_histogram(const std::string& tag, const at::Tensor& values, std::optional<int64_t> step, int bins) {
  LF_CHECK(bins >= 1, ValueError, "TensorBoardLogger::log_histogram(\"", tag, "\"): bins is ", bins, "; it must be at least 1.");
  at::Tensor flat = values.detach().to(at::kCPU).to(at::kDouble).reshape(-1);
  flat = flat.masked_select(flat.isfinite());
  LF_CHECK(flat.numel() > 0, ValueError, "TensorBoardLogger::log_histogram(\"", tag, "\"): no finite value among the ",
           values.numel(), " given.");
  const double low = flat.min().item<double>(), high = flat.max().item<double>();
  const int used = high > low ? bins : 1;  // every value equal: one bucket holds them
  const at::Tensor counts = used > 1 ? at::histc(flat, used, low, high) : at::full({1}, static_cast<double>(flat.numel()));
  std::vector<double> limits, buckets;
  const double width = (high - low) / used;
  for (int b = 0; b < used; ++b) {
    limits.push_back(b + 1 == used ? high : low + width * (b + 1));
    buckets.push_back(counts[b].item<double>());
  }
  // HistogramProto { min = 1; max = 2; num = 3; sum = 4; sum_squares = 5; bucket_limit = 6; bucket = 7 }
  std::string histogram;
  double_field(histogram, 1, low);
  double_field(histogram, 2, high);
  double_field(histogram, 3, static_cast<double>(flat.numel()));
  double_field(histogram, 4, flat.sum().item<double>());
  double_field(histogram, 5, flat.square().sum().item<double>());
  packed_doubles(histogram, 6, limits);
  packed_doubles(histogram, 7, buckets);
  write_summary(step_or_last(step), summary_of(tag, 5, histogram));
}

void TensorBoardLogger::log_text(const std::string& tag, const std::string& text, std::optional<int64_t> step) {
  // TensorProto { dtype = 1 (DT_STRING = 7); tensor_shape = 2 { dim = 2 { size = 1 } }; string_val = 8 }
  std::string dim, shape, tensor;
  varint_field(dim, 1, 1);
  length_delimited(shape, 2, dim);
  varint_field(tensor, 1, 7);
  length_delimited(tensor, 2, shape);
  length_delimited(tensor, 8, text);
  write_summary(step_or_last(step), summary_of(tag, 8, tensor, plugin_metadata("text", "")));
}

void TensorBoardLogger::finalize(const std::string&) {
  if (out_.is_open()) out_.flush();
}

}  // namespace lightning::fabric
