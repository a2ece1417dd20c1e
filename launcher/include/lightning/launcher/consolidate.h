// `lightning-run model consolidate DIR [--output-file PATH]`: merges a sharded fsdp checkpoint
// folder into one file (default DIR.consolidated, never overwritten) that fabric.load,
// fabric.load_raw (per entry) and Python's torch.load read. Does not use LibTorch, so the
// lightning-run front end runs it without loading LibTorch (docs/launcher.md).
#pragma once

#include <ostream>

namespace lightning::launcher {

/// True when argv is `lightning-run model consolidate ...`.
bool is_consolidate_command(int argc, const char* const* argv);

/// Runs the command. Exit codes: 0 done; 2 bad arguments (no DIR, DIR missing or a file, not a
/// sharded checkpoint, output exists); 1 the checkpoint's content is broken (a shard missing or
/// truncated) or the output cannot be written.
int run_consolidate(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace lightning::launcher
