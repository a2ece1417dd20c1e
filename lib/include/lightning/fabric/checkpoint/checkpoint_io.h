// Checkpoint files: a StateDict pickled with torch::pickle_save (the zip format of torch.save, so
// Python's torch.load reads it as a plain dict), written atomically. Not collective: Fabric::save
// decides which rank writes.
#pragma once

#include <filesystem>
#include <functional>
#include <string_view>

#include "lightning/fabric/checkpoint/state_dict.h"

namespace lightning::fabric {

/// Writes bytes to path so that path holds either its previous content or all of bytes, never a
/// part: a temporary file beside it (".NAME.tmp-PID"), written and fsync'ed, renamed over path,
/// then the folder fsync'ed. Missing parent folders are created. On error the temporary is removed
/// and a RuntimeError names the path and the system's reason. A process killed mid-write leaves
/// at most the temporary behind.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);
/// The same, with the content streamed: produce receives a sink and calls it with each piece.
using ByteSink = std::function<void(const void* data, size_t size)>;
void write_file_atomically(const std::filesystem::path& path, const std::function<void(const ByteSink&)>& produce);

/// Pickles state and writes it atomically to path.
void save_state_dict_file(const std::filesystem::path& path, const StateDict& state);

/// Reads a file written by save_state_dict_file (or by torch::pickle_save / Python's torch.save of
/// a plain dict of tensors and numbers). RuntimeError for a missing path, a folder, or a file
/// that is not such a checkpoint (truncated, corrupted, another format), naming the path.
StateDict load_state_dict_file(const std::filesystem::path& path);

}  // namespace lightning::fabric
