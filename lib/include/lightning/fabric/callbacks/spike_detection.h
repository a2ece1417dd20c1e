// Loss-spike detection (Python Lightning Fabric's SpikeDetection): at each on_train_batch_end,
// the loss is compared with the running mean of the last `window` losses; a loss that is worse
// than the previous one and farther from the mean than atol and rtol * mean (either unset: no
// limit) is a spike, and so is a non-finite loss while finite_only. A spike on any rank is a
// spike on every rank: each writes the batch indices to skip when resuming (the previous and the
// current one; rank 0 writes the JSON file) and throws lf::TrainingSpikeException, or, with
// fabric.roll_back_on_bad_steps(state) on, rolls back to the last checkpoint and skips the batch.
//   auto spikes = std::make_shared<lf::SpikeDetection>(lf::SpikeDetectionOptions().relative(2.0));
//   lf::Fabric fabric(lf::FabricOptions().callback(spikes));
//   fabric.call("on_train_batch_end", {{"loss", loss}, {"batch_idx", i}});   // loss: a tensor or a double
// Collective: every rank calls the hook at every batch (a boolean all-reduce decides).
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/callbacks/callback.h"
#include "lightning/fabric/checkpoint/stateful.h"
#include "lightning/fabric/errors.h"

namespace lightning::fabric {

/// Thrown on every rank when SpikeDetection finds a spike: "Training spike detected in batch N".
class LF_API TrainingSpikeException : public RuntimeError {
 public:
  /// note: a further line (e.g. why rollback could not happen).
  explicit TrainingSpikeException(int64_t batch_idx, const std::string& note = "");
  int64_t batch_idx() const { return batch_idx_; }

 private:
  int64_t batch_idx_;
};

struct LF_API SpikeDetectionOptions {
  /// "min" (a loss) or "max" (a metric to maximise): a value that improves on the last is never a spike.
  std::string mode = "min";
  /// Losses in the running mean.
  int64_t window = 10;
  /// Batches (by batch_idx) before detection starts.
  int64_t warmup = 1;
  /// A spike differs from the running mean by at least atol, and by at least rtol x the mean (unset: no limit).
  std::optional<double> atol;
  std::optional<double> rtol = 2.0;
  /// The JSON file of batch indices to skip (a folder gets skip_batches.json); unset: the current folder.
  std::optional<std::filesystem::path> exclude_batches_path;
  /// True: a non-finite loss is a spike (Python's code; its docstring says the opposite).
  bool finite_only = true;

  SpikeDetectionOptions& maximize(bool on = true) { mode = on ? "max" : "min"; return *this; }
  SpikeDetectionOptions& over(int64_t batches) { window = batches; return *this; }
  SpikeDetectionOptions& after(int64_t batches) { warmup = batches; return *this; }
  SpikeDetectionOptions& absolute(std::optional<double> value) { atol = value; return *this; }
  SpikeDetectionOptions& relative(std::optional<double> value) { rtol = value; return *this; }
  SpikeDetectionOptions& exclude_to(std::filesystem::path path) { exclude_batches_path = std::move(path); return *this; }
};

class LF_API SpikeDetection : public Callback, public Stateful {
 public:
  /// ValueError naming the option for a mode other than "min"/"max", window < 1 or warmup < 0.
  explicit SpikeDetection(SpikeDetectionOptions options = SpikeDetectionOptions());

  /// args: "loss" (at::Tensor or double), "batch_idx" (integer) and "fabric" (lf::Fabric*, which
  /// fabric.call passes itself). Collective.
  void on_train_batch_end(const HookArgs& args) override;

  /// Batch indices found bad so far (two per spike), as written to the file.
  const std::vector<int64_t>& bad_batches() const { return bad_batches_; }
  /// Where the file goes.
  std::filesystem::path exclude_batches_file() const;
  /// The running mean of the last `window` losses taken, NaN ones left out (NaN before any).
  double running_mean() const;

  /// Keys named as Python's (last_val, mode, warmup, atol, rtol, bad_batches, bad_batches_path),
  /// with the window's losses as "running": a list, where Python keeps torchmetrics' state, so a
  /// C++ and a Python detector do not load each other's.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  bool is_spike(double loss) const;
  SpikeDetectionOptions options_;
  double last_value_ = 0.0;
  std::deque<double> window_;
  std::vector<int64_t> bad_batches_;
};

}  // namespace lightning::fabric
