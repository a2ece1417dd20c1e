#include "lightning/fabric/callbacks/spike_detection.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "lightning/fabric/fabric.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

TrainingSpikeException::TrainingSpikeException(int64_t batch_idx, const std::string& note)
    : RuntimeError("Training spike detected in batch " + std::to_string(batch_idx) + (note.empty() ? "" : "\n" + note)),
      batch_idx_(batch_idx) {}

SpikeDetection::SpikeDetection(SpikeDetectionOptions options) : options_(std::move(options)) {
  LF_CHECK(options_.mode == "min" || options_.mode == "max", ValueError, "SpikeDetectionOptions::mode is \"",
           options_.mode, "\"; choose \"min\" (a loss) or \"max\" (a metric to maximise).");
  LF_CHECK(options_.window >= 1, ValueError, "SpikeDetectionOptions::window is ", options_.window, "; it must be at least 1.");
  LF_CHECK(options_.warmup >= 0, ValueError, "SpikeDetectionOptions::warmup is ", options_.warmup, "; it must not be negative.");
}

fs::path SpikeDetection::exclude_batches_file() const {
  fs::path path = options_.exclude_batches_path.value_or(fs::current_path());
  if (path.extension() != ".json") path /= "skip_batches.json";
  return path;
}

double SpikeDetection::running_mean() const {
  double sum = 0;
  int64_t count = 0;
  for (double value : window_) {
    if (std::isnan(value)) continue;
    sum += value;
    ++count;
  }
  return count == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(count);
}

// Python's _is_spike: non-finite (while finite_only), else not an improvement on the last value
// and beyond both tolerances from the running mean (a comparison with NaN, before any mean, is false).
bool SpikeDetection::is_spike(double loss) const {
  if (options_.finite_only && !std::isfinite(loss)) return true;
  const double change = loss - last_value_;
  if (options_.mode == "min" ? change <= 0.0 : change >= 0.0) return false;
  const double mean = running_mean();
  const bool beyond_atol = !options_.atol || std::abs(loss - mean) >= std::abs(*options_.atol);
  const bool beyond_rtol = !options_.rtol || std::abs(loss - mean) >= std::abs(*options_.rtol * mean);
  return beyond_atol && beyond_rtol;
}

void SpikeDetection::on_train_batch_end(const HookArgs& args) {
  Fabric* fabric = args.get<Fabric*>("fabric");
  const int64_t batch_idx = args.get<int64_t>("batch_idx");
  double loss = 0;
  if (const auto* tensor = args.find<at::Tensor>("loss")) {
    LF_CHECK(tensor->numel() == 1, ValueError, "SpikeDetection: the loss has ", tensor->numel(),
             " elements; pass the scalar the step minimised.");
    loss = tensor->detach().item<double>();
  } else {
    loss = args.get<double>("loss");
  }
  const bool spike_here = batch_idx >= options_.warmup && is_spike(loss);
  // One decision for every rank: a spike anywhere (Python's reduce_boolean_decision(all=False)).
  const bool spike = fabric->all_reduce(spike_here ? 1.0 : 0.0, ReduceOp::Max) > 0.5;
  if (spike) {
    bad_batches_.push_back(batch_idx - 1);
    bad_batches_.push_back(batch_idx);
    if (fabric->is_global_zero()) {
      const fs::path file = exclude_batches_file();
      if (file.has_parent_path()) fs::create_directories(file.parent_path());
      std::ofstream out(file, std::ios::trunc);
      out << "[";
      for (size_t i = 0; i < bad_batches_.size(); ++i) out << (i ? ",\n    " : "\n    ") << bad_batches_[i];
      out << "\n]";
      LF_CHECK(out.good(), RuntimeError, "SpikeDetection: cannot write ", file.string(), ".");
    }
    if (!fabric->rolls_back_on_bad_steps()) throw TrainingSpikeException(batch_idx);
    if (!fabric->rollback_checkpoint()) throw TrainingSpikeException(batch_idx, Fabric::no_rollback_checkpoint());
    // Rolled back instead: the spiking batch is skipped, and its loss stays out of the statistics.
    std::ostringstream finding;
    finding << "SpikeDetection: training spike detected in batch " << batch_idx << " (loss " << loss << " on rank "
            << fabric->global_rank() << (spike_here ? "" : ": a spike on another rank") << ", running mean " << running_mean() << ")";
    const std::vector<int64_t> found = bad_batches_;  // a detector in the rolled-back State must not forget them
    fabric->roll_back(finding.str());
    bad_batches_ = found;
    return;
  }
  // Without finite_only, the statistics take the loss only when it is finite on every rank.
  const bool take = options_.finite_only || fabric->all_reduce(std::isfinite(loss) ? 1.0 : 0.0, ReduceOp::Min) > 0.5;
  if (!take) return;
  // The window counts every taken loss; a NaN fills its slot with no weight (torchmetrics'
  // MeanMetric drops NaN, with a warning), so the mean stays that of the finite ones.
  window_.push_back(loss);
  if (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
  last_value_ = loss;
}

StateDict SpikeDetection::state_dict() const {
  StateDict state = make_state_dict();
  state.insert("last_val", last_value_);
  state.insert("mode", options_.mode);
  state.insert("warmup", options_.warmup);
  state.insert("atol", options_.atol ? c10::IValue(*options_.atol) : c10::IValue());
  state.insert("rtol", options_.rtol ? c10::IValue(*options_.rtol) : c10::IValue());
  state.insert("bad_batches", c10::List<int64_t>(bad_batches_));
  state.insert("bad_batches_path", exclude_batches_file().string());
  state.insert("running", c10::List<double>(std::vector<double>(window_.begin(), window_.end())));
  return state;
}

void SpikeDetection::load_state_dict(const StateDict& state) {
  for (const char* key : {"last_val", "mode", "warmup", "bad_batches", "running"}) {
    LF_CHECK(state.contains(key), ValueError, "SpikeDetection::load_state_dict: the entry has no '", key,
             "'; pass what SpikeDetection::state_dict() saved.");
  }
  last_value_ = state.at("last_val").toDouble();
  options_.mode = state.at("mode").toStringRef();
  options_.warmup = state.at("warmup").toInt();
  if (state.contains("atol")) options_.atol = state.at("atol").isNone() ? std::nullopt : std::optional<double>(state.at("atol").toDouble());
  if (state.contains("rtol")) options_.rtol = state.at("rtol").isNone() ? std::nullopt : std::optional<double>(state.at("rtol").toDouble());
  if (state.contains("bad_batches_path") && state.at("bad_batches_path").isString()) {
    options_.exclude_batches_path = fs::path(state.at("bad_batches_path").toStringRef());
  }
  LF_CHECK(options_.mode == "min" || options_.mode == "max", ValueError, "SpikeDetection::load_state_dict: mode is \"",
           options_.mode, "\"; expected \"min\" or \"max\".");
  const auto bad = state.at("bad_batches").toIntVector();
  bad_batches_.assign(bad.begin(), bad.end());
  const auto running = state.at("running").toDoubleVector();
  window_.assign(running.begin(), running.end());
  while (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
}

}  // namespace lightning::fabric
