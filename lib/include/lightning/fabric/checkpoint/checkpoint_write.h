// CheckpointWrite: one fabric.save as a strategy (or the sharded-checkpoint engine) carries it
// out, in three steps after the collective preparation (Strategy::prepare_checkpoint).
#pragma once

#include "lightning/fabric/export.h"

#include <functional>

namespace lightning::fabric {

/// Any of the steps may be empty.
struct LF_API CheckpointWrite {
  /// Writes this rank's files. Not collective: it may run on a background thread, so it touches
  /// only what the preparation handed it (a host copy of the state when saving in the background).
  std::function<void()> write;
  /// Collective, on the calling thread, once every rank's write succeeded: makes the checkpoint
  /// visible at its path (e.g. the metadata and the folder's rename).
  std::function<void()> commit;
  /// Not collective: after a failed write or commit, removes what they left (a staging folder).
  std::function<void()> discard;
};

}  // namespace lightning::fabric
