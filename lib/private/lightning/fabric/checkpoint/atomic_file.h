// Files that appear whole or not at all: the writer fills a temporary file beside the target,
// fsyncs it and renames it over the target, then fsyncs the folder. Not collective; no LibTorch.
#pragma once

#include <filesystem>
#include <functional>
#include <string_view>

namespace lightning::fabric {

/// Gives produce an open, empty file descriptor of a temporary ".NAME.tmp-PID" beside path, then
/// makes it path. Missing parent folders are created. When produce throws, or a write, fsync or
/// rename fails, the temporary is removed and a RuntimeError names the path and the reason; path
/// keeps its previous content. A process killed mid-write leaves at most the temporary behind.
void write_file_atomically_fd(const std::filesystem::path& path, const std::function<void(int fd)>& produce);
/// The same with the content streamed through a sink: produce calls it with each piece.
using ByteSink = std::function<void(const void* data, size_t size)>;
void write_file_atomically(const std::filesystem::path& path, const std::function<void(const ByteSink&)>& produce);
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace lightning::fabric
