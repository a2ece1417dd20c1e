#include "lightning/launcher/output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

namespace lightning::launcher {
namespace {

std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[40];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &local);
  char result[48];
  std::snprintf(result, sizeof(result), "%s.%03d", text, static_cast<int>(millis));
  return result;
}

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t wrote = ::write(fd, data.data() + done, data.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;  // the console went away: keep supervising
    done += static_cast<size_t>(wrote);
  }
}

// What a terminal control sequence (ESC [ ... letter) adds to a log file or the failure report: nothing.
std::string without_escapes(const std::string& text) {
  std::string plain;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\033' && i + 1 < text.size() && text[i + 1] == '[') {
      i += 2;
      while (i < text.size() && !std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
      continue;
    }
    plain += text[i];
  }
  return plain;
}

// A redraw starts with "erase line" (ESC [ K); the router erases before the tag instead.
std::string without_leading_erase(const std::string& text) {
  return text.rfind("\033[K", 0) == 0 ? text.substr(3) : text;
}

std::string prefix_for(const OutputOptions& options, int global_rank) {
  std::string prefix;
  if (options.timestamp) prefix += timestamp() + " ";
  if (options.tag) prefix += "[rank " + std::to_string(global_rank) + "]: ";
  return prefix;
}

}  // namespace

OutputRouter::~OutputRouter() { reset(); }

std::pair<int, int> OutputRouter::open_worker(int global_rank, int local_rank, int attempt) {
  int ends[2][2];
  for (auto& pipe_ends : ends) {
    if (pipe2(pipe_ends, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  }
  for (int which = 0; which < 2; ++which) {
    Stream stream;
    stream.global_rank = global_rank;
    stream.local_rank = local_rank;
    stream.is_stderr = which == 1;
    if (options_.log_dir) {
      const auto dir = std::filesystem::path(*options_.log_dir) / ("attempt_" + std::to_string(attempt));
      std::filesystem::create_directories(dir);
      const auto file = dir / ("rank_" + std::to_string(global_rank) + (which == 1 ? ".stderr" : ".stdout"));
      stream.log = std::fopen(file.c_str(), "w");
      if (stream.log == nullptr) throw std::runtime_error("cannot write " + file.string() + ": " + std::strerror(errno));
    }
    streams_[ends[which][0]] = std::move(stream);
  }
  tails_[global_rank].clear();
  return {ends[0][1], ends[1][1]};
}

std::vector<int> OutputRouter::fds() const {
  std::vector<int> result;
  for (const auto& [fd, stream] : streams_) result.push_back(fd);
  return result;
}

void OutputRouter::write_console(int fd, const std::string& text, bool transient) {
  // A transient line on screen is cleared before anything else is written; a new one starts at
  // the line's beginning.
  const bool clear = transient_on_screen_ || transient;
  write_all(fd, clear ? "\r\033[K" + text : text);
  transient_on_screen_ = transient;
}

void OutputRouter::emit(Stream& stream, const std::string& line, bool complete) {
  const std::string plain = without_escapes(line);
  if (stream.log != nullptr) {
    const std::string text = complete ? plain + "\n" : plain;
    std::fwrite(text.data(), 1, text.size(), stream.log);
    std::fflush(stream.log);
  }
  auto& tail = tails_[stream.global_rank];
  tail.push_back(plain);
  while (tail.size() > options_.tail_lines) tail.pop_front();
  if (options_.console_local_ranks && options_.console_local_ranks->count(stream.local_rank) == 0) return;
  write_console(stream.is_stderr ? STDERR_FILENO : STDOUT_FILENO,
                prefix_for(options_, stream.global_rank) + without_leading_erase(line) + (complete ? "\n" : ""), false);
}

void OutputRouter::show_transient(Stream& stream, const std::string& text) {
  if (text.empty()) return;
  if (options_.console_local_ranks && options_.console_local_ranks->count(stream.local_rank) == 0) return;
  write_console(stream.is_stderr ? STDERR_FILENO : STDOUT_FILENO,
                prefix_for(options_, stream.global_rank) + without_leading_erase(text), true);
}

void OutputRouter::on_readable(int fd) {
  auto found = streams_.find(fd);
  if (found == streams_.end()) return;
  Stream& stream = found->second;
  char buffer[65536];
  const ssize_t got = ::read(fd, buffer, sizeof(buffer));
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    if (!stream.partial.empty()) emit(stream, stream.partial, true);
    close_stream(fd);
    return;
  }
  stream.partial.append(buffer, static_cast<size_t>(got));
  size_t end;
  while ((end = stream.partial.find_first_of("\r\n")) != std::string::npos) {
    const std::string piece = stream.partial.substr(0, end);
    const bool crlf = stream.partial[end] == '\r' && end + 1 < stream.partial.size() && stream.partial[end + 1] == '\n';
    if (stream.partial[end] == '\n' || crlf) {
      // "text\r" then "\n" in the next read is a CRLF line end: the text was the line.
      emit(stream, piece.empty() && stream.redrawing ? stream.last_transient : piece, true);
      stream.redrawing = false;
      stream.last_transient.clear();
    } else {
      show_transient(stream, piece);
      if (!piece.empty()) stream.last_transient = piece;
      stream.redrawing = true;
    }
    stream.partial.erase(0, end + (crlf ? 2 : 1));
  }
  // A redraw arrives without a line end: show it now rather than at the next redraw.
  if (stream.redrawing && !stream.partial.empty()) {
    show_transient(stream, stream.partial);
    stream.last_transient = stream.partial;
    stream.partial.clear();
  }
}

void OutputRouter::close_stream(int fd) {
  auto found = streams_.find(fd);
  if (found == streams_.end()) return;
  if (found->second.log != nullptr) std::fclose(found->second.log);
  ::close(fd);
  streams_.erase(found);
}

void OutputRouter::drain(int wait_ms) {
  while (!streams_.empty()) {
    std::vector<pollfd> polled;
    for (const auto& [fd, stream] : streams_) polled.push_back({fd, POLLIN, 0});
    const int ready = poll(polled.data(), polled.size(), wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (const auto& entry : polled) {
      if ((entry.revents & (POLLIN | POLLHUP | POLLERR)) != 0) on_readable(entry.fd);
    }
  }
}

std::vector<std::string> OutputRouter::tail(int global_rank) const {
  auto found = tails_.find(global_rank);
  if (found == tails_.end()) return {};
  return {found->second.begin(), found->second.end()};
}

void OutputRouter::reset() {
  while (!streams_.empty()) close_stream(streams_.begin()->first);
}

}  // namespace lightning::launcher
