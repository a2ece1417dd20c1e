// A port agreed on through a file that every rank of a one-node job can see: rank 0 picks a free
// port and publishes it, the others wait for the file. Used by the MPI environment, which has no
// rendezvous address of its own; the file lives in the job's own session directory.
#pragma once

#include <chrono>
#include <string>

namespace lightning::fabric::internal {

/// Rank 0: binds port 0 to learn a free port, writes it to path (atomically: a temporary file,
/// then rename) and returns it. Throws RuntimeError when the file cannot be written.
int publish_free_port(const std::string& path);

/// Other ranks: waits up to timeout for path to appear, returns the port in it. Throws
/// RuntimeError naming the file and the timeout when rank 0 never published one.
int read_published_port(const std::string& path, std::chrono::milliseconds timeout);

}  // namespace lightning::fabric::internal
