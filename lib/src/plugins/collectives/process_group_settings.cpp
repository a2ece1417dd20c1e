#include "lightning/fabric/plugins/collectives/process_group_settings.h"

#include <climits>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

std::string to_string(ProcessGroupBackend backend) {
  switch (backend) {
    case ProcessGroupBackend::Gloo: return "gloo";
    case ProcessGroupBackend::Nccl: return "nccl";
    case ProcessGroupBackend::Shm: return "shm";
    case ProcessGroupBackend::ShmGloo: return "shm+gloo";
  }
  return "gloo";
}

ProcessGroupBackend parse_process_group_backend(const std::string& text, const std::string& setting) {
  for (auto backend : kProcessGroupBackends) {
    if (text == to_string(backend)) return backend;
  }
  throw ValueError(setting + "=\"" + text + "\" is not supported. Choose \"gloo\", \"nccl\", \"shm\" or \"shm+gloo\", or "
                   "leave it unset (nccl on CUDA; on CPU shm when every rank is on one machine, shm+gloo on several "
                   "machines with the same number of ranks each, else gloo).");
}

void check_process_group_settings(const std::string& owner, const ProcessGroupSettings& settings) {
  LF_CHECK(settings.timeout.count() > 0, ValueError, owner, ": process_group.timeout=", settings.timeout.count(),
           " ms must be positive (default 30 minutes).");
  LF_CHECK(settings.rendezvous_timeout.count() > 0, ValueError, owner, ": process_group.rendezvous_timeout=",
           settings.rendezvous_timeout.count(), " ms must be positive (default 5 minutes).");
  LF_CHECK(settings.hang_timeout.count() >= 0, ValueError, owner, ": process_group.hang_timeout=",
           settings.hang_timeout.count(), " ms must be 0 (off) or positive (default 5 minutes).");
  LF_CHECK(settings.straggler_threshold_s >= 0 && settings.straggler_threshold_s <= 2000, ValueError, owner,
           ": process_group.straggler_threshold_s=", settings.straggler_threshold_s,
           " must be 0 (off) or seconds up to 2000 (default 0.05).");
}

namespace {
std::chrono::milliseconds milliseconds_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}
}  // namespace

ProcessGroupSettings with_environment_overrides(ProcessGroupSettings settings, const env::EnvLookup& env) {
  const env::Reader reader(env);
  if (auto backend = reader.text(env::kProcessGroupBackend)) {
    settings.backend = parse_process_group_backend(*backend, env::kProcessGroupBackend);
  }
  if (auto seconds = reader.seconds(env::kRendezvousTimeout)) {
    LF_CHECK(*seconds > 0, ValueError, env::kRendezvousTimeout, "=\"", *env(env::kRendezvousTimeout),
             "\" is not valid: give the seconds ranks wait for each other to arrive, a positive number (default 300).");
    settings.rendezvous_timeout = milliseconds_of(*seconds);
  }
  if (auto seconds = reader.seconds(env::kHangTimeout)) settings.hang_timeout = milliseconds_of(*seconds);  // 0: off
  if (auto seconds = reader.seconds(env::kStragglerThreshold)) {
    LF_CHECK(*seconds <= 2000, ValueError, env::kStragglerThreshold, "=\"", *env(env::kStragglerThreshold),
             "\" is not valid: give the median lag in seconds that names a straggler, 0 (off) to 2000 (default 0.05).");
    settings.straggler_threshold_s = *seconds;
  }
  if (auto records = reader.integer(env::kFlightRecords)) {
    LF_CHECK(*records >= 0 && *records <= 1000000, ValueError, env::kFlightRecords, "=\"", *env(env::kFlightRecords),
             "\" is not valid: give the number of collectives the flight recorder keeps, 0 to 1000000 "
             "(default 2048; 0 turns recording and hang detection off).");
    settings.flight_records = static_cast<uint32_t>(*records);
  }
  settings.check_collectives = reader.flag(env::kCheckCollectives, settings.check_collectives);
  settings.socket_interface = reader.text(env::kGlooSocketInterface).value_or(settings.socket_interface);
  settings.hang_dump_dir = reader.text(env::kHangDumpDir).value_or(settings.hang_dump_dir);
  settings.flight_dir = reader.text(env::kFlightDir).value_or(settings.flight_dir);
  if (auto judge = reader.text(env::kHangJudge)) {
    LF_CHECK(*judge == "launcher" || *judge == "ranks", ValueError, env::kHangJudge, "=\"", *judge,
             "\" is not valid: \"launcher\" (lightning-run on one node judges hangs from the recorder files) or "
             "\"ranks\" (rank 0 judges through the store). lightning-run sets it; unset it to use the default.");
    settings.launcher_judges_hangs = *judge == "launcher";
  }
  settings.error_file = reader.text(env::kErrorFile).value_or(settings.error_file);
  return settings;
}

}  // namespace lightning::fabric
