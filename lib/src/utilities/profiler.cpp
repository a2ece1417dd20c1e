#include "lightning/fabric/utilities/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

namespace {
using env::kProfile;
using env::kProfileDir;
using env::kProfileRanks;

// A whole number >= 0 that is all of text; nullopt otherwise.
std::optional<int64_t> whole_number(const std::string& text) {
  if (text.empty() || text.size() > 18 || !std::all_of(text.begin(), text.end(), ::isdigit)) return std::nullopt;
  return std::stoll(text);
}
}  // namespace

ProfileSettings parse_profile_steps(const std::string& text, const std::string& setting, ProfileSettings settings) {
  const auto dash = text.find('-');
  const auto first = whole_number(text.substr(0, dash));
  const auto last = dash == std::string::npos ? first : whole_number(text.substr(dash + 1));
  LF_CHECK(first && last && *first >= 1 && *last >= *first, ValueError, setting, "=", text,
           " is not a step range: give FIRST-LAST or one STEP, counted from 1 in optimizer steps, e.g. 10-15 or 12.");
  settings.first_step = *first;
  settings.last_step = *last;
  return settings;
}

std::vector<int> parse_profile_ranks(const std::string& text, const std::string& setting) {
  std::vector<int> ranks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto rank = whole_number(item);
    LF_CHECK(rank && *rank <= (1 << 24), ValueError, setting, "=", text,
             " is not a rank list: give global ranks separated by commas, e.g. 0 or 0,3.");
    ranks.push_back(static_cast<int>(*rank));
  }
  LF_CHECK(!ranks.empty(), ValueError, setting, " is empty: give global ranks separated by commas, e.g. 0 or 0,3.");
  return ranks;
}

ProfileSettings profile_settings_from_environment(ProfileSettings settings, const env::EnvLookup& env) {
  const env::Reader reader(env);
  if (auto steps = reader.text(kProfile)) settings = parse_profile_steps(*steps, kProfile, settings);
  if (auto ranks = reader.text(kProfileRanks)) settings.ranks = parse_profile_ranks(*ranks, kProfileRanks);
  if (auto dir = reader.text(kProfileDir)) settings.dir = *dir;
  return settings;
}

bool profiles_rank(const ProfileSettings& settings, int rank) {
  return settings.enabled() &&
         (settings.ranks.empty() || std::find(settings.ranks.begin(), settings.ranks.end(), rank) != settings.ranks.end());
}

StepProfiler::StepProfiler(ProfileSettings settings, int rank) : settings_(std::move(settings)), rank_(rank) {
  LF_CHECK(settings_.enabled(), ValueError, "StepProfiler: no steps to profile (ProfileSettings::first_step is 0).");
  if (settings_.first_step == 1) start();
}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    stop_and_write();
  } catch (const std::exception& error) {
    std::cerr << "lightning-fabric: the profiler trace could not be written: " << error.what() << std::endl;
  }
}

std::string StepProfiler::trace_file() const {
  return (std::filesystem::path(settings_.dir) / ("trace-rank" + std::to_string(rank_) + ".json")).string();
}

void StepProfiler::after_optimizer_step() {
  ++steps_;
  if (recording_ && steps_ >= settings_.last_step) stop_and_write();
  if (!recording_ && steps_ == settings_.first_step - 1) start();
}

namespace {
using torch::profiler::impl::ActivityType;
std::set<ActivityType> activities() {
  std::set<ActivityType> kinds{ActivityType::CPU};
  if (torch::cuda::is_available()) kinds.insert(ActivityType::CUDA);
  return kinds;
}
const torch::profiler::impl::ProfilerConfig& kineto_config() {
  static const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                            /*report_input_shapes=*/true);
  return config;
}
}  // namespace

void StepProfiler::start() {
  namespace profiler = torch::autograd::profiler;
  profiler::prepareProfiler(kineto_config(), activities());
  profiler::enableProfiler(kineto_config(), activities());
  recording_ = true;
}

void StepProfiler::stop_and_write() {
  recording_ = false;
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  auto result = torch::autograd::profiler::disableProfiler();
  const std::filesystem::path file = trace_file();
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  result->save(file.string());
}

}  // namespace lightning::fabric
