#include "lightning/fabric/loggers/tensorboard_logger.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

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
std::string event(double wall_time, int64_t step, const std::string& file_version, const std::string& summary) {
  std::string out;
  varint(out, 1 << 3 | 1);
  fixed(out, wall_time);
  varint(out, 2 << 3 | 0);
  varint(out, static_cast<uint64_t>(step));
  if (!file_version.empty()) length_delimited(out, 3, file_version);
  if (!summary.empty()) length_delimited(out, 5, summary);
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardLogger::TensorBoardLogger(fs::path root_dir, std::string name, std::optional<int> version)
    : root_(std::move(root_dir)), name_(std::move(name)), version_(version) {}

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

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) {
  event_file();
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
  write_record(event(now_seconds(), at, "", summary));
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  std::ofstream out(log_dir() / "hparams.yaml", std::ios::trunc);
  for (const auto& [key, value] : params) out << key << ": " << value << '\n';
}

void TensorBoardLogger::finalize(const std::string&) {
  if (out_.is_open()) out_.flush();
}

}  // namespace lightning::fabric
