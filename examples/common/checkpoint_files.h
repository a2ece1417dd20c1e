// The examples' checkpoint files: DIR/epoch=E-step=S.ckpt (Lightning's naming), and the newest
// of them, which `--resume last` continues from (after a restart by the launcher, or by hand).
#pragma once

#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>

/// The newest checkpoint in folder (highest step in "epoch=E-step=S.ckpt"), or "" when there is none.
inline std::string newest_checkpoint(const std::string& folder) {
  if (folder.empty() || !std::filesystem::is_directory(folder)) return "";
  static const std::regex pattern(R"(epoch=(\d+)-step=(\d+)\.ckpt)");
  std::string best;
  int64_t best_step = -1;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern) && std::stoll(match[2]) > best_step) {
      best_step = std::stoll(match[2]);
      best = entry.path().string();
    }
  }
  return best;
}
