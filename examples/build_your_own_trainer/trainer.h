// A reusable Trainer built only from Fabric's primitives: the C++ counterpart of Lightning's
// "build your own trainer" example (after Python Lightning's example of that name). Copy it and change what you need.
//
// It trains a classifier (batches of data and target, cross-entropy loss by default) with:
// max_epochs / max_steps, gradient accumulation through no_backward_sync, limit_train_batches /
// limit_val_batches, validation every validation_frequency epochs, a checkpoint every
// checkpoint_frequency epochs (and at max_steps) in checkpoint_dir, resuming from the newest
// checkpoint there, callbacks through fabric.call at each hook of §6, metrics to the loggers,
// and a progress bar on rank 0. It runs unchanged under lightning-run.
#pragma once

#include <lightning/fabric.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <regex>
#include <string>

#include "checkpoint_files.h"

namespace trainer {

namespace lf = lightning::fabric;

struct TrainerOptions {
  lf::FabricOptions fabric;  // accelerator, strategy, devices, precision, plugins, callbacks, loggers
  int max_epochs = 1;
  int64_t max_steps = -1;            // optimizer steps in total; -1: no limit
  int grad_accum_steps = 1;          // micro-batches per optimizer step
  int64_t limit_train_batches = -1;  // per epoch; -1: all
  int64_t limit_val_batches = -1;
  int validation_frequency = 1;      // validate every N epochs
  bool use_distributed_sampler = true;
  std::string checkpoint_dir = "checkpoints";  // "" disables checkpoints
  int checkpoint_frequency = 1;                // save every N epochs
  bool progress = true;                        // bars on rank 0 (stderr) while training and validating
};

template <class ModuleHolder>
class Trainer {
 public:
  explicit Trainer(TrainerOptions options) : options_(std::move(options)), fabric_(options_.fabric) {}

  lf::Fabric& fabric() { return fabric_; }
  int64_t global_step() const { return global_step_; }
  int current_epoch() const { return current_epoch_; }

  /// Trains model with optimizer on train_set, validating on val_set. ckpt_path: a checkpoint to
  /// start from; "last" (default) resumes from the newest one in checkpoint_dir when there is one.
  template <class Dataset>
  void fit(ModuleHolder net, torch::optim::Optimizer& optimizer, Dataset train_set, Dataset val_set,
           int64_t batch_size, const std::string& ckpt_path = "last") {
    auto [model, fabric_optimizer] = fabric_.setup(net, optimizer);
    lf::DataLoaderSettings settings;
    settings.shuffle = true;
    settings.use_distributed_sampler = options_.use_distributed_sampler;
    auto train_loader = fabric_.setup_dataloaders(std::move(train_set), torch::data::DataLoaderOptions(batch_size), settings);
    settings.shuffle = false;
    auto val_loader = fabric_.setup_dataloaders(std::move(val_set), torch::data::DataLoaderOptions(batch_size), settings);

    lf::State state{{"model", model}, {"optimizer", fabric_optimizer}, {"global_step", global_step_},
                    {"current_epoch", int64_t{current_epoch_}}, {"batches_done", int64_t{0}}};
    const std::string resume = ckpt_path == "last" ? newest_checkpoint(options_.checkpoint_dir) : ckpt_path;
    int64_t batches_done = 0;  // of current_epoch_, when resuming mid-epoch
    if (!resume.empty()) {
      fabric_.load(resume, state);
      global_step_ = state.at("global_step").template to<int64_t>();
      current_epoch_ = static_cast<int>(state.at("current_epoch").template to<int64_t>());
      batches_done = state.at("batches_done").template to<int64_t>();
      fabric_.print("trainer: resumed from", resume, "at epoch", current_epoch_, "step", global_step_);
    }

    while (!done() && current_epoch_ < options_.max_epochs) {
      const int64_t finished_batches = train_epoch(model, fabric_optimizer, train_loader, batches_done);
      const bool epoch_complete = !done() || finished_batches == epoch_batches(train_loader);
      if ((current_epoch_ + 1) % options_.validation_frequency == 0 && epoch_complete) validate(model, val_loader);
      if (epoch_complete) ++current_epoch_;
      if (epoch_complete ? current_epoch_ % options_.checkpoint_frequency == 0 || done() : true) {
        save(state, epoch_complete ? 0 : finished_batches);
      }
      batches_done = 0;
    }
  }

 private:
  bool done() const { return options_.max_steps >= 0 && global_step_ >= options_.max_steps; }

  template <class Loader>
  int64_t epoch_batches(const Loader& loader) const {
    const int64_t all = static_cast<int64_t>(loader.size().value_or(std::numeric_limits<int64_t>::max()));
    return options_.limit_train_batches >= 0 ? std::min(all, options_.limit_train_batches) : all;
  }

  // One epoch; returns how many batches of it are done (skipped ones included).
  template <class Model, class Optimizer, class Loader>
  int64_t train_epoch(Model& model, Optimizer& optimizer, Loader& loader, int64_t skip) {
    model.train();
    loader.set_epoch(current_epoch_);  // the same order after a resume
    const int64_t limit = epoch_batches(loader);
    lf::ProgressBar bar("epoch " + std::to_string(current_epoch_), limit, fabric_.is_global_zero() && options_.progress);
    fabric_.call("on_train_epoch_start", {{"epoch", current_epoch_}});
    int64_t batch_idx = 0;
    for (auto& batch : loader) {
      if (batch_idx >= limit || done()) break;
      if (batch_idx < skip) {
        ++batch_idx;
        bar.update();
        continue;
      }
      fabric_.call("on_train_batch_start", {{"batch_idx", batch_idx}});
      const bool step_now = (batch_idx + 1) % options_.grad_accum_steps == 0 || batch_idx + 1 == limit;
      torch::Tensor loss;
      {
        auto skip_sync = fabric_.no_backward_sync(model, /*enabled=*/!step_now);
        loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target) / options_.grad_accum_steps;
        fabric_.call("on_before_backward", {{"loss", loss}});
        fabric_.backward(loss);
        fabric_.call("on_after_backward");
      }
      if (step_now) {
        fabric_.call("on_before_optimizer_step", {{"optimizer", &optimizer.optimizer()}});
        optimizer.step();
        fabric_.call("on_before_zero_grad", {{"optimizer", &optimizer.optimizer()}});
        optimizer.zero_grad();
        ++global_step_;
        fabric_.log("train_loss", loss.detach() * options_.grad_accum_steps, global_step_);
      }
      const double loss_value = loss.item<double>() * options_.grad_accum_steps;
      fabric_.call("on_train_batch_end", {{"batch_idx", batch_idx}, {"loss", loss_value}});
      bar.update(1, loss_value);
      ++batch_idx;
    }
    bar.close();
    fabric_.call("on_train_epoch_end", {{"epoch", current_epoch_}});
    return batch_idx;
  }

  template <class Model, class Loader>
  void validate(Model& model, Loader& loader) {
    torch::NoGradGuard no_grad;
    model.eval();
    fabric_.call("on_validation_epoch_start");
    auto totals = torch::zeros({3}, torch::kFloat64);  // loss sum, correct, seen
    int64_t batch_idx = 0;
    std::optional<int64_t> total = loader.size();
    if (total && options_.limit_val_batches >= 0) total = std::min(*total, options_.limit_val_batches);
    lf::ProgressBar bar("validation", total, fabric_.is_global_zero() && options_.progress);
    for (auto& batch : loader) {
      if (options_.limit_val_batches >= 0 && batch_idx >= options_.limit_val_batches) break;
      bar.update();
      fabric_.call("on_validation_batch_start", {{"batch_idx", batch_idx}});
      auto output = model(batch.data);
      const double seen = static_cast<double>(batch.target.size(0));
      totals[0] += torch::nn::functional::cross_entropy(output, batch.target).template item<double>() * seen;
      totals[1] += output.argmax(1).eq(batch.target).sum().template item<double>();
      totals[2] += seen;
      fabric_.call("on_validation_batch_end", {{"batch_idx", batch_idx}});
      ++batch_idx;
    }
    bar.close();
    totals = fabric_.all_reduce(totals, "sum");
    const double count = std::max(totals[2].item<double>(), 1.0);
    const double val_loss = totals[0].item<double>() / count, val_acc = totals[1].item<double>() / count;
    fabric_.log_dict({{"val_loss", val_loss}, {"val_acc", val_acc}}, global_step_);
    fabric_.call("on_validation_epoch_end", {{"val_loss", val_loss}, {"val_acc", val_acc}});
    fabric_.print("epoch", current_epoch_, "step", global_step_, "val_loss", val_loss, "val_acc", val_acc);
    model.train();
  }

  void save(lf::State& state, int64_t batches_done) {
    if (options_.checkpoint_dir.empty()) return;
    state.at("global_step").set_value(global_step_);
    state.at("current_epoch").set_value(int64_t{current_epoch_});
    state.at("batches_done").set_value(batches_done);
    fabric_.save(options_.checkpoint_dir + "/epoch=" + std::to_string(current_epoch_) +
                     "-step=" + std::to_string(global_step_) + ".ckpt",
                 state);
  }

  TrainerOptions options_;
  lf::Fabric fabric_;
  int64_t global_step_ = 0;
  int current_epoch_ = 0;
};

}  // namespace trainer
