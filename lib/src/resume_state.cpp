#include "lightning/fabric/checkpoint/resume_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch/cuda.h>

#include <mutex>
#include <numeric>

#include "lightning/fabric/checkpoint/resume.h"
#include "lightning/fabric/checkpoint/state.h"
#include "lightning/fabric/data/streaming_loader.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {

StateDict ResumeState::state_dict() const {
  throw RuntimeError(
      "ResumeState::state_dict(): the entry fabric.resume_state() is saved by fabric.save or "
      "fabric.save_in_background only (they gather every rank's generators and loader positions), and only at the "
      "top level of the State they get; move it out of a nested State or save_raw.");
}

void ResumeState::load_state_dict(const StateDict&) {
  throw RuntimeError(
      "ResumeState::load_state_dict(): the entry fabric.resume_state() is restored by fabric.load only; pass the "
      "State to it.");
}

namespace resume {
namespace {

constexpr int64_t kFormat = 2;
// Per loader and rank, in the "loaders" tensor [world, loaders, kFields]:
enum Field : int64_t { kEpoch, kPhase, kTaken, kStream, kReplicas, kFields };
enum Phase : int64_t { kNotStarted, kInProgress, kFinished };

// The generators a rank draws from: the CPU one, then each visible CUDA device's.
std::vector<at::Generator> generators() {
  std::vector<at::Generator> all{at::detail::getDefaultCPUGenerator()};
  const int64_t cuda_devices = at::globalContext().hasCUDA() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  for (int64_t device = 0; device < cuda_devices; ++device) {
    all.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
  }
  return all;
}

std::string entry_in(const std::filesystem::path& path, const std::string& name) {
  return "fabric.load(" + path.string() + "): the entry '" + name + "'";
}

at::Tensor tensor_at(const c10::impl::GenericDict& dict, const char* key, const std::string& where) {
  auto found = dict.find(key);
  LF_CHECK(found != dict.end() && found->value().isTensor(), RuntimeError, where, " has no tensor '", key,
           "': it is not what fabric.resume_state() saves. Was another value saved under that name?");
  return found->value().toTensor();
}

}  // namespace

std::vector<std::string> entry_names(const State& state, const Fabric& fabric, const char* call) {
  std::vector<std::string> names;
  for (const auto& [name, entry] : state) {
    if (entry.kind() != StateEntry::Kind::Object || entry.module() != nullptr || entry.optimizer() != nullptr) continue;
    const auto* marker = dynamic_cast<const ResumeState*>(&entry.object());
    if (marker == nullptr) continue;
    LF_CHECK(marker->fabric() == &fabric, ValueError, call, ": the entry '", name,
             "' is the resume_state() of another Fabric; use this Fabric's: {\"", name, "\", fabric.resume_state()}.");
    names.push_back(name);
  }
  return names;
}

c10::IValue gather(Fabric& fabric, const std::vector<std::shared_ptr<LoaderProgress>>& loaders,
                   const std::vector<StreamingDataLoader*>& streaming) {
  std::vector<at::Tensor> states;
  c10::List<int64_t> sizes;
  for (auto& generator : generators()) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const at::Tensor state = generator.get_state().contiguous().view(-1);
    states.push_back(state);
    sizes.push_back(state.numel());
  }
  at::Tensor positions = at::empty({static_cast<int64_t>(loaders.size()), kFields}, at::kLong);
  auto rows = positions.accessor<int64_t, 2>();
  for (size_t i = 0; i < loaders.size(); ++i) {
    const LoaderProgress& loader = *loaders[i];
    const PassControl& control = *loader.control;
    rows[i][kStream] = loader.stream ? 1 : 0;
    rows[i][kReplicas] = loader.replicas;
    if (control.next_epoch) {  // a next pass already chosen (a restore, set_epoch) and not begun
      rows[i][kEpoch] = *control.next_epoch;
      rows[i][kPhase] = kInProgress;
      rows[i][kTaken] = loader.stream ? loader.items_of(control.skip) : control.skip;
    } else {
      rows[i][kEpoch] = control.epoch;
      rows[i][kPhase] = !loader.started ? kNotStarted : loader.finished ? kFinished : kInProgress;
      rows[i][kTaken] = loader.taken();
    }
  }
  // One collective: this rank's generator bytes, then its positions as bytes.
  states.push_back(positions.view(-1).view(at::kByte));
  at::Tensor mine = at::cat(states);
  const int64_t world = fabric.world_size();
  at::Tensor all = world == 1 ? mine.unsqueeze(0) : fabric.all_gather(mine.to(fabric.device())).cpu();
  const int64_t generator_bytes = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  at::Tensor gathered_positions = all.narrow(1, generator_bytes, all.size(1) - generator_bytes)
                                      .contiguous()
                                      .view(at::kLong)
                                      .view({world, static_cast<int64_t>(loaders.size()), kFields})
                                      .clone();  // a storage of its own type, as the file stores it
  StateDict saved = make_state_dict();
  saved.insert("format", kFormat);
  saved.insert("world_size", world);
  saved.insert("generators", all.narrow(1, 0, generator_bytes).contiguous());
  saved.insert("generator_bytes", sizes);
  saved.insert("loaders", gathered_positions);
  if (!streaming.empty()) {  // absent without streaming loaders: files of earlier versions read alike
    c10::impl::GenericList states(c10::AnyType::get());
    for (const StreamingDataLoader* loader : streaming) states.push_back(loader->state_dict());
    saved.insert("streaming_loaders", states);
  }
  return saved;
}

void restore(Fabric& fabric, const c10::IValue& saved, const std::vector<std::shared_ptr<LoaderProgress>>& loaders,
             const std::vector<StreamingDataLoader*>& streaming, const std::filesystem::path& path,
             const std::string& name) {
  const std::string where = entry_in(path, name);
  LF_CHECK(saved.isGenericDict(), RuntimeError, where, " holds a ", saved.tagKind(),
           ", not what fabric.resume_state() saves. Was another value saved under that name?");
  const auto dict = saved.toGenericDict();
  auto format = dict.find("format");
  LF_CHECK(format != dict.end() && format->value().isInt() && format->value().toInt() == kFormat, RuntimeError, where,
           " is not in the format this version writes (format ", kFormat, "); save it again with this version.");
  auto world_value = dict.find("world_size");
  LF_CHECK(world_value != dict.end() && world_value->value().isInt() && world_value->value().toInt() > 0, RuntimeError,
           where, " has no world size: it is not what fabric.resume_state() saves.");
  const int64_t saved_world = world_value->value().toInt();
  const at::Tensor states = tensor_at(dict, "generators", where);
  const at::Tensor positions = tensor_at(dict, "loaders", where);
  std::vector<int64_t> sizes;  // a list of ints (read back from a file: a generic list)
  auto listed = dict.find("generator_bytes");
  LF_CHECK(listed != dict.end() && listed->value().isList(), RuntimeError, where,
           " has no list 'generator_bytes': it is not what fabric.resume_state() saves.");
  for (const c10::IValue& size : listed->value().toListRef()) {
    LF_CHECK(size.isInt(), RuntimeError, where, " has a non-integer in 'generator_bytes': it is damaged.");
    sizes.push_back(size.toInt());
  }
  LF_CHECK(states.dim() == 2 && states.size(0) == saved_world && positions.dim() == 3 &&
               positions.size(0) == saved_world && positions.size(2) == kFields,
           RuntimeError, where, " has tensors of unexpected shapes (generators ", states.sizes(), ", loaders ",
           positions.sizes(), " for world size ", saved_world, "): it is damaged or was written by other code.");
  LF_CHECK(!sizes.empty() && std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == states.size(1), RuntimeError,
           where, "'s generator sizes do not add up to its generator bytes: it is damaged.");
  LF_CHECK(positions.size(1) == static_cast<int64_t>(loaders.size()), RuntimeError, where, " holds the positions of ",
           positions.size(1), " loader(s), and this Fabric has set up ", loaders.size(),
           ": call fabric.setup_dataloaders for the same loaders, in the same order, before fabric.load.");

  std::vector<c10::IValue> streaming_states;
  if (auto found = dict.find("streaming_loaders"); found != dict.end()) {
    LF_CHECK(found->value().isList(), RuntimeError, where, "'s 'streaming_loaders' is not a list: it is damaged.");
    for (const c10::IValue& state : found->value().toListRef()) {
      LF_CHECK(state.isGenericDict(), RuntimeError, where, "'s 'streaming_loaders' holds a ", state.tagKind(),
               ": it is damaged.");
      streaming_states.push_back(state);
    }
  }
  LF_CHECK(streaming_states.size() == streaming.size(), RuntimeError, where, " holds the positions of ",
           streaming_states.size(), " streaming loader(s), and this Fabric has set up ", streaming.size(),
           ": call fabric.setup_dataloaders for the same streaming loaders, in the same order, before fabric.load.");

  const int64_t world = fabric.world_size(), rank = fabric.global_rank();
  const bool same_world = saved_world == world;
  auto rows = positions.accessor<int64_t, 3>();
  for (size_t i = 0; i < loaders.size(); ++i) {  // every check before anything changes
    const auto mine = rows[same_world ? rank : 0][static_cast<int64_t>(i)];
    LF_CHECK((mine[kStream] != 0) == loaders[i]->stream, RuntimeError, where, ": loader ", i, " (in set-up order) was a ",
             mine[kStream] != 0 ? "stream" : "sized dataset", " when saved and is a ",
             loaders[i]->stream ? "stream" : "sized dataset", " now: set up the same loaders, in the same order.");
  }

  // A streaming loader's state is the job's position; it checks itself (same dataset and order
  // options) before it changes anything, and goes on with exactly the samples not yet taken, on
  // any world size.
  for (size_t i = 0; i < streaming.size(); ++i) streaming[i]->load_state_dict(streaming_states[i].toGenericDict());

  if (same_world) {
    std::vector<at::Generator> here = generators();
    if (static_cast<size_t>(sizes.size()) != here.size()) {
      rank_zero_warn(where + " holds the generators of 1 CPU and " + std::to_string(sizes.size() - 1) +
                     " CUDA device(s); this process sees " + std::to_string(here.size() - 1) +
                     " CUDA device(s): only the CPU generator is restored, the resume is not exact on the GPUs.");
    }
    const at::Tensor row = states[rank];
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (i < here.size() && (i == 0 || sizes.size() == here.size())) {
        std::lock_guard<std::mutex> lock(here[i].mutex());
        here[i].set_state(row.narrow(0, offset, sizes[i]).clone());
      }
      offset += sizes[i];
    }
  } else {
    rank_zero_warn(where + " was saved by " + std::to_string(saved_world) + " ranks and this job has " +
                   std::to_string(world) + ": the resume is not exact. Each loader goes on at the same global sample " +
                   "(every rank skips its share of what all ranks had taken); the generators keep their seeded states.");
  }

  for (size_t i = 0; i < loaders.size(); ++i) {
    LoaderProgress& loader = *loaders[i];
    const auto mine = rows[same_world ? rank : 0][static_cast<int64_t>(i)];
    if (mine[kPhase] == kNotStarted) {  // as a loader just set up: its first pass is epoch 0
      loader.control->next_epoch = 0;
      loader.control->skip = 0;
      continue;
    }
    if (mine[kPhase] == kFinished) {
      loader.control->next_epoch = mine[kEpoch] + 1;
      loader.control->skip = 0;
      continue;
    }
    loader.control->next_epoch = mine[kEpoch];
    const int64_t saved_replicas = std::max<int64_t>(mine[kReplicas], 1);
    // How far the epoch's sequence was read: every rank's count, each data-parallel share counted
    // once (ranks that read the same share, as tensor-parallel ones, count together once).
    int64_t taken_by_all = 0;
    for (int64_t r = 0; r < saved_world; ++r) taken_by_all += rows[r][static_cast<int64_t>(i)][kTaken];
    const int64_t position = taken_by_all * saved_replicas / saved_world;
    if (loader.stream) {  // the source's items up to there: every rank's next item is its own again
      loader.control->skip = position;
    } else if (same_world && saved_replicas == loader.replicas) {
      loader.control->skip = mine[kTaken];  // this rank's own samples
    } else {
      loader.control->skip = position / loader.replicas;
    }
    if (same_world && saved_replicas == loader.replicas) continue;
    if (same_world) {  // another world size has warned above
      rank_zero_warn(where + ": loader " + std::to_string(i) + " was split over " + std::to_string(saved_replicas) +
                     " ranks and is now split over " + std::to_string(loader.replicas) +
                     ": it goes on at the same global sample, not exactly.");
    }
  }
}

}  // namespace resume
}  // namespace lightning::fabric
