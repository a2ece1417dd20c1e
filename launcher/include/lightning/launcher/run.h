// lightning-run's job: rendezvous, spawn one worker per local device, supervise them (exits,
// signals, other nodes' failures, restarts), tear down within the grace, report, exit.
#pragma once

#include "lightning/launcher/args.h"

namespace lightning::launcher {

/// Exit codes: 0 success; a failed worker's code or 128 + signal; 128 + signal after the launcher
/// was signalled; 124 when --finish-timeout expired; 2 usage or configuration error; 1 when the
/// launcher itself failed (rendezvous timeout, lost contact with node 0).
/// The caller blocks every signal run_job may handle in every thread first
/// (block_launcher_signals), so that they are read from a signalfd; run_job unblocks those that
/// --signals-to-handle leaves out (but SIGUSR1 and SIGUSR2, which it forwards), so that they take
/// their default action.
int run_job(const LaunchArgs& args);

/// Blocks the signals run_job may handle (handleable_signals() and SIGCHLD); call before any
/// thread starts.
void block_launcher_signals();

/// --dry-run: prints each local worker's command line and environment; starts nothing.
int print_dry_run(const LaunchArgs& args);

}  // namespace lightning::launcher
