// Checkpoint files: a StateDict pickled with torch::pickle_save (the zip format of torch.save, so
// Python's torch.load reads it as a plain dict), written atomically. Not collective: Fabric::save
// decides which rank writes.
#pragma once

#include "lightning/fabric/export.h"

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "lightning/fabric/checkpoint/state_dict.h"

namespace lightning::fabric {

/// Pickles state and writes it atomically to path.
LF_API void save_state_dict_file(const std::filesystem::path& path, const StateDict& state);

/// Reads a file written by save_state_dict_file (or by torch::pickle_save / Python's torch.save of
/// a plain dict of tensors and numbers). RuntimeError for a missing path, a folder, or a file
/// that is not such a checkpoint (truncated, corrupted, another format), naming the path.
LF_API StateDict load_state_dict_file(const std::filesystem::path& path);

/// One value as the bytes of a torch.save archive (what torch.load reads), and back; `what` names
/// the bytes in errors (RuntimeError for a truncated, corrupted or foreign archive).
LF_API std::string archive_bytes(const c10::IValue& value);
/// The same bytes handed to `sink` piece by piece as they are made, without holding them all.
LF_API void stream_archive(const c10::IValue& value, const std::function<void(const void* data, size_t size)>& sink);
LF_API c10::IValue value_of_archive(std::string_view bytes, const std::string& what);

}  // namespace lightning::fabric
