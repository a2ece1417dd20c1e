// Files that appear whole or not at all: the writer fills a temporary file beside the target,
// fsyncs it and renames it over the target, then fsyncs the folder. Not collective; no LibTorch.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
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
/// Moves the finished folder `staging` to `path`, replacing what was there. Where the file system
/// swaps two names atomically (Linux's RENAME_EXCHANGE) there is no moment without a folder at
/// path; otherwise the old folder is moved aside first and back if the second rename fails. The
/// old content is deleted only once the new folder is in place, its `first_to_remove` file first
/// (a checkpoint's metadata: a kill during the removal leaves nothing that looks complete).
void replace_folder(const std::filesystem::path& staging, const std::filesystem::path& path,
                    const std::string& first_to_remove);

}  // namespace lightning::fabric
