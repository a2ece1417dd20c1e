// FabricOptions: the constructor arguments of Python's Fabric(...), as a LibTorch-style options
// object with chainable setters:
//   Fabric fabric(FabricOptions().accelerator("cpu").devices(2).precision("bf16-mixed"));
// Defaults match Python: accelerator "auto", strategy "auto", devices "auto", num_nodes 1,
// precision unset (= "32-true"). Under an external launcher (srun, mpirun, torchrun) devices
// "auto" and an unset num_nodes take the launcher's counts. The LT_* variables set by lightning-run override these values.
#pragma once

#include "lightning/fabric/export.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/callbacks/callback.h"
#include "lightning/fabric/loggers/logger.h"
#include "lightning/fabric/plugins/plugin.h"
#include "lightning/fabric/utilities/devices.h"
#include "lightning/fabric/utilities/profiler.h"

namespace lightning::fabric {

class Strategy;
struct StrategyContext;

/// A strategy chosen by name together with its settings: what a configured strategy object is in
/// Python (Fabric(strategy=DDPStrategy(timeout=...))). Made by e.g. ddp_strategy(DDPOptions)
/// (strategies/ddp.h); create is called by the Connector with the resolved devices and plugins.
struct LF_API StrategySpec {
  std::string name;
  std::function<std::shared_ptr<Strategy>(StrategyContext)> create;
};

class LF_API FabricOptions {
 public:
  FabricOptions& accelerator(std::string value) { accelerator_ = std::move(value); return *this; }
  FabricOptions& strategy(std::string value) { strategy_ = std::move(value); strategy_spec_.reset(); return *this; }
  /// A strategy with settings. LT_STRATEGY (lightning-run --strategy) naming another strategy
  /// replaces it, with a warning that its settings are unused.
  FabricOptions& strategy(StrategySpec spec) { strategy_ = spec.name; strategy_spec_ = std::move(spec); return *this; }
  FabricOptions& devices(DevicesSpec value) { devices_ = std::move(value); return *this; }
  FabricOptions& devices(std::initializer_list<int> indices) { devices_ = DevicesSpec(std::vector<int>(indices)); return *this; }
  FabricOptions& num_nodes(int value) { num_nodes_ = value; return *this; }
  FabricOptions& precision(std::string value) { precision_ = std::move(value); return *this; }
  /// Adds a plugin (a Precision or a ClusterEnvironment object).
  FabricOptions& plugin(std::shared_ptr<Plugin> value) { plugins_.push_back(std::move(value)); return *this; }
  FabricOptions& plugins(std::vector<std::shared_ptr<Plugin>> value) { plugins_ = std::move(value); return *this; }
  FabricOptions& callback(std::shared_ptr<Callback> value) { callbacks_.push_back(std::move(value)); return *this; }
  FabricOptions& callbacks(std::vector<std::shared_ptr<Callback>> value) { callbacks_ = std::move(value); return *this; }
  FabricOptions& logger(std::shared_ptr<Logger> value) { loggers_.push_back(std::move(value)); return *this; }
  FabricOptions& loggers(std::vector<std::shared_ptr<Logger>> value) { loggers_ = std::move(value); return *this; }
  /// Whether set-up optimizers step through ATen's fused kernels where those cover them (default
  /// true; utilities/fused_step.h). SetupOptions::fuse_optimizer_steps overrides it per setup call.
  FabricOptions& fused_optimizer_steps(bool on) { fused_optimizer_steps_ = on; return *this; }
  /// A Kineto trace of optimizer steps "FIRST-LAST" (or "STEP") on every rank (utilities/profiler.h);
  /// ValueError for a malformed range. LT_PROFILE (lightning-run --profile) wins over it.
  FabricOptions& profile(const std::string& steps) {
    profile_ = parse_profile_steps(steps, "FabricOptions::profile", profile_);
    return *this;
  }
  FabricOptions& profile(ProfileSettings settings) { profile_ = std::move(settings); return *this; }
  /// Finds where a step's first inf or NaN came from (utilities/nonfinite.h): off by default, it
  /// checks every operation of the set-up modules' forwards and costs far more than 5 % of a step.
  FabricOptions& detect_nonfinite(bool on) { detect_nonfinite_ = on; return *this; }

  const std::string& accelerator() const { return accelerator_; }
  const std::string& strategy() const { return strategy_; }
  const std::optional<StrategySpec>& strategy_spec() const { return strategy_spec_; }
  const DevicesSpec& devices() const { return devices_; }
  int num_nodes() const { return num_nodes_.value_or(1); }
  /// False when num_nodes was never set: under srun, mpirun or torchrun it then follows the launcher.
  bool num_nodes_given() const { return num_nodes_.has_value(); }
  const std::optional<std::string>& precision() const { return precision_; }
  const std::vector<std::shared_ptr<Plugin>>& plugins() const { return plugins_; }
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }
  bool fused_optimizer_steps() const { return fused_optimizer_steps_; }
  const ProfileSettings& profile_settings() const { return profile_; }
  bool detect_nonfinite() const { return detect_nonfinite_; }

 private:
  std::string accelerator_ = "auto";
  std::string strategy_ = "auto";
  std::optional<StrategySpec> strategy_spec_;
  DevicesSpec devices_;
  std::optional<int> num_nodes_;
  std::optional<std::string> precision_;
  std::vector<std::shared_ptr<Plugin>> plugins_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  bool fused_optimizer_steps_ = true;
  ProfileSettings profile_;
  bool detect_nonfinite_ = false;
};

}  // namespace lightning::fabric
