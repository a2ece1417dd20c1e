#include "lightning/fabric/utilities/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "lightning/fabric/utilities/env_vars.h"

namespace lightning::fabric {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string clock_text(double seconds) {
  const auto total = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(text, sizeof(text), "%02lld:%02lld", static_cast<long long>(total / 60), static_cast<long long>(total % 60));
  }
  return text;
}
// stdout or stderr on a terminal, directly or through lightning-run (which sets LT_TERMINAL=1 when
// its console is one and forwards the redraws).
bool writes_to_terminal(const std::ostream& out) {
  const int fd = &out == &std::cout ? STDOUT_FILENO : (&out == &std::cerr || &out == &std::clog) ? STDERR_FILENO : -1;
  if (fd < 0) return false;
  return ::isatty(fd) == 1 || env::Reader().flag(env::kTerminal);
}
}  // namespace

ProgressBar::ProgressBar(std::string description, std::optional<int64_t> total, bool enabled, std::ostream& out,
                         ProgressBarOptions options)
    : description_(std::move(description)), total_(total), enabled_(enabled), out_(out), options_(std::move(options)) {
  if (!options_.clock) options_.clock = steady_seconds;
  terminal_ = options_.terminal.value_or(writes_to_terminal(out_));
  start_ = options_.clock();
}

ProgressBar::~ProgressBar() { close(); }

std::string ProgressBar::line() const {
  const double elapsed = options_.clock() - start_;
  const double rate = elapsed > 0 ? static_cast<double>(count_) / elapsed : 0.0;
  std::ostringstream text;
  text << description_ << ": ";
  if (total_ && *total_ > 0) {
    const int percent = static_cast<int>(100.0 * static_cast<double>(count_) / static_cast<double>(*total_));
    if (terminal_) {
      constexpr int kWidth = 20;
      const int filled = static_cast<int>(kWidth * std::min<int64_t>(count_, *total_) / *total_);
      text << std::string(static_cast<size_t>(filled), '#') << std::string(static_cast<size_t>(kWidth - filled), '.')
           << " ";
    }
    text << count_ << "/" << *total_ << " (" << percent << "%) " << clock_text(elapsed);
    if (rate > 0) text << "<" << clock_text(static_cast<double>(*total_ - count_) / rate);
  } else {
    text << count_ << " " << clock_text(elapsed);
  }
  char rate_text[32];
  std::snprintf(rate_text, sizeof(rate_text), "%.2f it/s", rate);
  text << ", " << rate_text;
  if (loss_) {
    char loss_text[32];
    std::snprintf(loss_text, sizeof(loss_text), "%.4g", *loss_);
    text << ", loss " << loss_text;
  }
  return text.str();
}

void ProgressBar::draw(bool final) {
  const double now = options_.clock();
  const double interval = terminal_ ? 0.1 : options_.plain_interval_s;
  if (!final && now - last_draw_ < interval) return;
  last_draw_ = now;
  // One write per draw (stderr is unbuffered), so a reader such as lightning-run sees whole redraws.
  const std::string text = terminal_ ? "\r\033[K" + line() + (final ? "\n" : "") : line() + "\n";
  out_ << text;
  out_.flush();
}

void ProgressBar::update(int64_t n, std::optional<double> loss) {
  count_ += n;
  if (loss) loss_ = loss;
  if (enabled_ && !closed_) draw(false);
}

void ProgressBar::close() {
  if (closed_) return;
  closed_ = true;
  if (enabled_) draw(true);
}

}  // namespace lightning::fabric
