#include "lightning/fabric/loggers/csv_logger.h"

#include <algorithm>
#include <iomanip>
#include <limits>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

fs::path versioned_log_dir(const fs::path& root, const std::string& name, std::optional<int> version) {
  const fs::path base = root / name;
  std::error_code error;
  fs::create_directories(base, error);
  LF_CHECK(!error, RuntimeError, "Cannot create the log folder ", base.string(), ": ", error.message(), ".");
  int chosen = 0;
  if (version) {
    chosen = *version;
  } else {
    for (const auto& entry : fs::directory_iterator(base)) {
      const std::string folder = entry.path().filename().string();
      if (entry.is_directory() && folder.rfind("version_", 0) == 0) {
        try {
          chosen = std::max(chosen, std::stoi(folder.substr(8)) + 1);
        } catch (const std::exception&) {
        }
      }
    }
  }
  const fs::path dir = base / ("version_" + std::to_string(chosen));
  fs::create_directories(dir, error);
  LF_CHECK(!error, RuntimeError, "Cannot create the log folder ", dir.string(), ": ", error.message(), ".");
  return dir;
}

CSVLogger::CSVLogger(fs::path root_dir, std::string name, std::optional<int> version)
    : root_(std::move(root_dir)), name_(std::move(name)), version_(version) {}

const fs::path& CSVLogger::log_dir() {
  if (dir_.empty()) dir_ = versioned_log_dir(root_, name_, version_);
  return dir_;
}

namespace {
void write_row(std::ostream& out, const std::vector<std::string>& columns, std::optional<int64_t> step,
               const std::map<std::string, double>& row) {
  if (step) out << *step;
  for (const auto& column : columns) {
    out << ',';
    auto found = row.find(column);
    if (found != row.end()) out << std::setprecision(std::numeric_limits<double>::max_digits10) << found->second;
  }
  out << '\n';
}
}  // namespace

void CSVLogger::rewrite() {
  std::ofstream out(log_dir() / "metrics.csv", std::ios::trunc);
  out << "step";
  for (const auto& column : columns_) out << ',' << column;
  out << '\n';
  for (const auto& [step, row] : rows_) write_row(out, columns_, step, row);
  LF_CHECK(out.good(), RuntimeError, "CSVLogger: cannot write ", (log_dir() / "metrics.csv").string(), ".");
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, std::optional<int64_t> step) {
  bool widened = rows_.empty();
  for (const auto& [key, value] : metrics) {
    LF_CHECK(key.find_first_of(",\n\"") == std::string::npos, ValueError, "CSVLogger: metric name '", key,
             "' contains a comma, quote or newline; choose a plain name.");
    if (std::find(columns_.begin(), columns_.end(), key) == columns_.end()) {
      columns_.push_back(key);
      widened = true;
    }
  }
  rows_.emplace_back(step, metrics);
  if (widened) {
    rewrite();
    return;
  }
  std::ofstream out(log_dir() / "metrics.csv", std::ios::app);
  write_row(out, columns_, step, metrics);
}

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  std::ofstream out(log_dir() / "hparams.yaml", std::ios::trunc);
  for (const auto& [key, value] : params) out << key << ": " << value << '\n';
}

}  // namespace lightning::fabric
