// The profiler switch: a Kineto (Chrome/Perfetto) trace of chosen optimizer steps on chosen ranks,
// with no code in the training loop. Turned on by any of
//   lightning-run model --profile 10-15 [--profile-ranks 0,1] ...   (LT_PROFILE, LT_PROFILE_RANKS)
//   LT_PROFILE=10-15 with any launcher (LT_PROFILE_DIR: where the files go)
//   FabricOptions().profile("10-15")
// Steps count FabricOptimizer::step calls of the Fabric's optimizers, from 1: "10-15" records from
// the end of step 9 to the end of step 15, i.e. the forward, backward and optimizer step of
// iterations 10 to 15. Each profiled rank writes DIR/trace-rank<R>.json once the last step ends
// (or when the Fabric is destroyed first). The trace shows lf::forward, lf::backward,
// lf::optimizer_step and every collective under the flight recorder's name for it
// ("#7 all_reduce float32[676] on world (wait)"). Off, it costs a thread-local check per range.
#pragma once

#include "lightning/fabric/export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

struct LF_API ProfileSettings {
  int64_t first_step = 0;  // 0: off
  int64_t last_step = 0;   // inclusive
  std::vector<int> ranks;  // global ranks to profile; empty: every rank
  std::string dir = "profile";  // relative to the working directory unless absolute
  bool enabled() const { return first_step > 0; }
};

/// "10-15" (steps 10 to 15) or "12" (step 12 alone) into settings' steps. ValueError naming
/// `setting` (the flag or variable) for anything else, a 0 step or a range that runs backwards.
LF_API ProfileSettings parse_profile_steps(const std::string& text, const std::string& setting,
                                           ProfileSettings settings = {});
/// "0,2" into global ranks; ValueError naming `setting` otherwise.
LF_API std::vector<int> parse_profile_ranks(const std::string& text, const std::string& setting);
/// settings with LT_PROFILE, LT_PROFILE_RANKS and LT_PROFILE_DIR applied (each wins when set).
LF_API ProfileSettings profile_settings_from_environment(ProfileSettings settings, const env::EnvLookup& env);

/// Told of every optimizer step by FabricOptimizer (after the step ran or was skipped).
class LF_API StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void after_optimizer_step() = 0;
};

/// Records this rank's trace over settings' steps (Fabric makes one when profiling is on and this
/// rank is chosen). Not thread-safe: one training loop drives it.
class LF_API StepProfiler : public StepObserver {
 public:
  StepProfiler(ProfileSettings settings, int rank);
  ~StepProfiler() override;  // a trace still recording is written (the job ended before its last step)
  void after_optimizer_step() override;
  /// Where the trace goes: settings.dir/trace-rank<R>.json.
  std::string trace_file() const;

 private:
  void start();
  void stop_and_write();
  ProfileSettings settings_;
  int rank_;
  int64_t steps_ = 0;
  bool recording_ = false;
};

/// Whether `rank` is profiled under settings.
LF_API bool profiles_rank(const ProfileSettings& settings, int rank);

}  // namespace lightning::fabric
