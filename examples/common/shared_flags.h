// The flags every example shares: the Fabric options and the progress display.
// Each Fabric option stays unset unless its user gives it, so that what the user did not choose is
// decided as without the flag: by lightning-run's flags (--accelerator, --devices, --precision, ...),
// by the launcher's counts under srun, mpirun or torchrun, or by Fabric's defaults. An example never
// pins a value its user did not ask for.
#pragma once

#include <CLI/CLI.hpp>
#include <lightning/fabric.h>

#include <cmath>
#include <optional>
#include <string>

namespace examples {

struct SharedFlags {
  std::string accelerator, devices, strategy, precision;  // empty: not given
  bool no_progress = false;

  void add_to(CLI::App& app) {
    app.add_option("--accelerator", accelerator, "cpu, cuda, gpu or auto (default auto)");
    app.add_option("--devices", devices, "Processes/devices on this node (default auto: the launcher's count, else 1)");
    app.add_option("--strategy", strategy, "auto, ddp, fsdp, ... (default auto)");
    app.add_option("--precision", precision, "32-true, bf16-mixed, 16-mixed, ... (default 32-true)");
    app.add_flag("--no-progress", no_progress, "No progress display on stderr (stdout is unaffected either way)");
  }
  /// options with the given Fabric flags set on it.
  lightning::fabric::FabricOptions apply(lightning::fabric::FabricOptions options = {}) const {
    if (!accelerator.empty()) options.accelerator(accelerator);
    if (!devices.empty()) options.devices(lightning::fabric::DevicesSpec(devices));
    if (!strategy.empty()) options.strategy(strategy);
    if (!precision.empty()) options.precision(precision);
    return options;
  }
  /// Whether this process shows progress: rank 0, unless --no-progress.
  template <class Fabric>
  bool show_progress(const Fabric& fabric) const {
    return fabric.is_global_zero() && !no_progress;
  }
};

/// x rounded to `digits` decimals, for the JSON lines the examples print.
inline double rounded(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

}  // namespace examples
