#include "lightning/fabric/hang/straggler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cctype>
#include <sstream>

namespace lightning::fabric {

namespace {
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}
}  // namespace

std::optional<StragglerVerdict> find_straggler(const std::vector<RankEntries>& ranks, const StragglerSettings& settings) {
  if (ranks.size() < 2 || settings.threshold_s <= 0 || settings.window == 0) return std::nullopt;
  // seq -> entry time per rank, for the seqs every rank holds.
  std::map<uint64_t, std::vector<int64_t>> entered;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& [seq, enter_ns] : ranks[r].entries) {
      auto& times = entered[seq];
      if (times.size() == r) times.push_back(enter_ns);  // a seq missing on an earlier rank stays short
    }
  }
  std::vector<std::vector<int64_t>> common;  // newest last
  for (const auto& [seq, times] : entered) {
    if (times.size() == ranks.size()) common.push_back(times);
  }
  if (common.size() < settings.window) return std::nullopt;
  common.erase(common.begin(), common.end() - static_cast<std::ptrdiff_t>(settings.window));
  std::vector<size_t> last_count(ranks.size(), 0);
  std::vector<std::vector<double>> lags(ranks.size());
  for (const auto& times : common) {
    const auto [first, last] = std::minmax_element(times.begin(), times.end());
    ++last_count[static_cast<size_t>(last - times.begin())];
    for (size_t r = 0; r < times.size(); ++r) lags[r].push_back(static_cast<double>(times[r] - *first) / 1e9);
  }
  const size_t slowest = static_cast<size_t>(std::max_element(last_count.begin(), last_count.end()) - last_count.begin());
  StragglerVerdict verdict;
  verdict.rank = ranks[slowest].rank;
  verdict.collectives = common.size();
  verdict.share = static_cast<double>(last_count[slowest]) / static_cast<double>(common.size());
  verdict.median_lag_s = median(lags[slowest]);
  if (verdict.share < settings.share || verdict.median_lag_s < settings.threshold_s) return std::nullopt;
  return verdict;
}

std::string serialize_entries(const std::vector<std::pair<uint64_t, int64_t>>& entries) {
  std::string text;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto [seq, ns] = entries[i];
    if (i > 0) text += ',';
    if (i > 0 && seq + 1 == entries[i - 1].first) {
      text += std::to_string(ns - entries[i - 1].second);  // the next older collective: its time as a difference
    } else {
      text += std::to_string(seq) + ':' + std::to_string(ns);
    }
  }
  return text;
}

std::vector<std::pair<uint64_t, int64_t>> parse_entries(const std::string& text) {
  std::vector<std::pair<uint64_t, int64_t>> entries;
  std::istringstream in(text);
  std::string pair;
  while (std::getline(in, pair, ',')) {
    const size_t colon = pair.find(':');
    try {
      size_t used = 0, seq_used = 0;
      if (colon != std::string::npos) {
        const std::string seq_text = pair.substr(0, colon);
        if (seq_text.empty() || !std::isdigit(static_cast<unsigned char>(seq_text[0]))) break;  // stoull takes "-1"
        const uint64_t seq = std::stoull(seq_text, &seq_used);
        const int64_t ns = std::stoll(pair.substr(colon + 1), &used);
        if (seq_used != seq_text.size() || used + colon + 1 != pair.size()) break;
        entries.emplace_back(seq, ns);
      } else {
        if (entries.empty() || entries.back().first == 0) break;
        const int64_t difference = std::stoll(pair, &used);
        if (used != pair.size()) break;
        entries.emplace_back(entries.back().first - 1, entries.back().second + difference);
      }
    } catch (const std::exception&) {
      break;
    }
  }
  return entries;
}

std::string describe_straggler(const StragglerVerdict& verdict, const std::string& host, double threshold_s) {
  std::ostringstream text;
  text << "rank " << verdict.rank << (host.empty() ? "" : " on " + host) << " arrives last at "
       << std::lround(verdict.share * 100) << "% of the last " << verdict.collectives << " collectives, median "
       << std::lround(verdict.median_lag_s * 1000) << " ms behind the first (straggler threshold " << threshold_s
       << " s)";
  return text.str();
}

}  // namespace lightning::fabric
