// The worker side of TORCHELASTIC_ERROR_FILE: an uncaught exception's type and message, with the
// rank, written as JSON where the launcher looks for it, without any user code. The library
// installs the handler when it loads (so constructor errors are recorded); the launcher prints the file in its failure report.
#pragma once

#include <exception>
#include <string>

namespace lightning::fabric {

/// Installs a std::terminate handler that records the active exception into
/// $TORCHELASTIC_ERROR_FILE (when set), then aborts as before. Idempotent.
void install_error_file_handler();

/// A function the terminate handler runs after recording the error and before aborting (one at a
/// time; Fabric::launch() uses it to let a failed child's exit code win over rank 0's abort).
void set_terminate_hook(void (*hook)());

/// Writes {"message": {"message": "<type>: <what>", "extraInfo": {...}}, "rank": R, "type": T}
/// (torchelastic's layout plus two fields) to path. Returns false if it could not be written.
bool write_error_file(const std::string& path, const std::string& type, const std::string& message);

/// Reads the "<type>: <message>" text back from such a file; empty when absent or unreadable.
std::string read_error_file(const std::string& path);

}  // namespace lightning::fabric
