// Fabric: the facade a training loop calls. It owns the Connector's choices and forwards to the
// strategy; it owns nothing clever itself.
//
//   Fabric fabric(FabricOptions().accelerator("cpu"));
//   fabric.launch();
//   auto [model, optimizer] = fabric.setup(net, adam);    // adam: a torch::optim::Adam lvalue
//   auto loader = fabric.setup_dataloaders(dataset, torch::data::DataLoaderOptions(64));
//   for (auto& batch : loader) { ...; fabric.backward(loss); optimizer.step(); }
#pragma once

#include "lightning/fabric/export.h"

#include <torch/data/dataloader.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <c10/util/Type.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "lightning/fabric/checkpoint/resume_state.h"
#include "lightning/fabric/checkpoint/state_dict.h"
#include "lightning/fabric/accelerators/accelerator.h"
#include "lightning/fabric/backward_options.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/options.h"
#include "lightning/fabric/plugins/precision/precision.h"
#include "lightning/fabric/process_group.h"
#include "lightning/fabric/resolved_config.h"
#include "lightning/fabric/strategies/strategy.h"
#include "lightning/fabric/utilities/data.h"
#include "lightning/fabric/utilities/scope_guard.h"
#include "lightning/fabric/utilities/seed.h"
#include "lightning/fabric/wrappers.h"

namespace lightning::fabric {
namespace internal {
class NonFiniteWatch;
}

struct Connector;  // private to the library
class StreamingDataLoader;  // data/streaming_loader.h

/// Per-call options of Fabric::setup / setup_module.
struct LF_API SetupOptions {
  bool move_to_device = true;
  /// Whether these optimizers step through ATen's fused kernels where they cover them
  /// (utilities/fused_step.h); unset: FabricOptions::fused_optimizer_steps (default true).
  std::optional<bool> fuse_optimizer_steps;
  /// The submodules whose activations are recomputed in backward instead of kept
  /// (activation_checkpoint.h); unset: the strategy's (DDPOptions / FSDPOptions
  /// ::activation_checkpointing; none for the others). Applies to setup and setup_module.
  std::optional<ModulePolicy> activation_checkpointing;
};

/// What Fabric::clip_gradients does: exactly one of clip_val (clamp every gradient element to
/// [-clip_val, clip_val]) or max_norm (scale all gradients so their norm_type-norm is at most
/// max_norm).
struct LF_API GradientClipping {
  std::optional<double> clip_val;
  std::optional<double> max_norm;
  double norm_type = 2.0;
  bool error_if_nonfinite = true;
  GradientClipping& value(double v) { clip_val = v; return *this; }
  GradientClipping& norm(double v, double type = 2.0) { max_norm = v; norm_type = type; return *this; }
  GradientClipping& nonfinite_is_error(bool on) { error_if_nonfinite = on; return *this; }
};

/// Per-call options of Fabric::setup_dataloaders.
struct LF_API DataLoaderSettings {
  bool shuffle = false;                  // reshuffle every epoch (seeded by PL_GLOBAL_SEED + epoch)
  bool use_distributed_sampler = true;   // each rank reads its own share
  bool move_to_device = true;            // batches arrive on fabric.device()
  /// The distributed sampler's tail: false (default) pads each rank's share to ceil(N / ranks) by
  /// wrapping around, as PyTorch's DistributedSampler; true drops the samples that do not divide
  /// evenly. (Dropping an incomplete last batch is DataLoaderOptions::drop_last, LibTorch's own.)
  bool drop_uneven_tail = false;
};

namespace detail {
// What setup() accepts as a module: std::shared_ptr<Impl> or a ModuleHolder<Impl> (TORCH_MODULE).
template <class T> struct ModuleArg { static constexpr bool is_module = false; };
template <class Impl> struct ModuleArg<std::shared_ptr<Impl>> {
  static constexpr bool is_module = std::is_base_of_v<torch::nn::Module, Impl>;
  using impl = Impl;
  static std::shared_ptr<Impl> get(const std::shared_ptr<Impl>& m) { return m; }
};
template <class Impl> struct ModuleArg<torch::nn::ModuleHolder<Impl>> {
  static constexpr bool is_module = true;
  using impl = Impl;
  static std::shared_ptr<Impl> get(const torch::nn::ModuleHolder<Impl>& m) { return m.ptr(); }
};
template <class T>
struct ModuleArgOf : ModuleArg<std::decay_t<T>> {};
// Holders made by TORCH_MODULE derive from ModuleHolder<Impl>: map them to their base.
template <class T, class = void> struct HolderBase { using type = std::decay_t<T>; };
template <class T>
struct HolderBase<T, std::void_t<typename std::decay_t<T>::ContainedType>> {
  using type = torch::nn::ModuleHolder<typename std::decay_t<T>::ContainedType>;
};
template <class T> using module_arg = ModuleArg<typename HolderBase<T>::type>;

template <class T> struct SharedTarget { using type = std::decay_t<T>; static constexpr bool shared = false; };
template <class T> struct SharedTarget<std::shared_ptr<T>> { using type = T; static constexpr bool shared = true; };
template <class T> using pointee_t = typename SharedTarget<std::decay_t<T>>::type;

template <class T> constexpr bool is_optimizer_arg = std::is_base_of_v<torch::optim::Optimizer, pointee_t<T>>;
template <class T> constexpr bool is_scheduler_arg = std::is_base_of_v<torch::optim::LRScheduler, pointee_t<T>>;
template <class T> constexpr bool is_fabric_optimizer_arg = std::is_same_v<std::decay_t<T>, FabricOptimizer>;

// The type setup() returns for one optimizer-or-scheduler argument.
template <class T>
using setup_result_t = std::conditional_t<
    is_optimizer_arg<T> || is_fabric_optimizer_arg<T>, FabricOptimizer,
    std::conditional_t<SharedTarget<std::decay_t<T>>::shared, std::decay_t<T>, T>>;

template <class T> struct IsFabricModule : std::false_type {};
template <class I> struct IsFabricModule<FabricModule<I>> : std::true_type {};

/// Shares ownership of a shared_ptr argument; borrows an lvalue (the caller keeps it alive).
template <class T>
std::shared_ptr<pointee_t<T>> share(T&& arg) {
  if constexpr (SharedTarget<std::decay_t<T>>::shared) {
    return arg;
  } else {
    return std::shared_ptr<pointee_t<T>>(std::shared_ptr<void>(), &arg);
  }
}
}  // namespace detail

class LF_API Fabric {
 public:
  /// Resolves options with the process environment (LT_* overrides) and builds the strategy.
  explicit Fabric(FabricOptions options = FabricOptions());
  /// Same, under an explicit environment (tests, embedding).
  Fabric(FabricOptions options, env::EnvLookup env);
  /// One Fabric per job: a copy would share the strategy but not the launch state, and could start
  /// the workers twice. Pass it by reference.
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  ~Fabric();

  // ---- where this process stands ----
  torch::Device device() const { return strategy()->root_device(); }
  int global_rank() const { return strategy()->global_rank(); }
  int local_rank() const { return strategy()->local_rank(); }
  int node_rank() const { return strategy()->node_rank(); }
  int world_size() const { return strategy()->world_size(); }
  bool is_global_zero() const { return global_rank() == 0; }
  /// How many times the launcher has restarted the job after a failure (TORCHELASTIC_RESTART_COUNT,
  /// as lightning-run and torchrun set it; 0 on the first start or without a launcher). A restart
  /// for a change of membership (an elastic job gaining a node) does not count, as under torchrun.
  int restart_count() const { return restart_count_; }
  const std::shared_ptr<Strategy>& strategy() const;
  /// The strategy as its concrete type, e.g. fabric.strategy_as<lf::FSDPStrategy>() to call
  /// summon_full_parameters; TypeError naming the active strategy when it is not a T.
  template <class T>
  T& strategy_as() const {
    return strategy_cast<T>(*strategy(), c10::demangle_type<T>());
  }
  const std::shared_ptr<Accelerator>& accelerator() const;
  const std::shared_ptr<Precision>& precision() const;
  const ResolvedConfig& config() const;
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }
  /// FabricOptions' callbacks, then each set-up module that derives from lf::Callback.
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return *callbacks_; }
  /// The first logger (Python's fabric.logger), or null without loggers.
  std::shared_ptr<Logger> logger() const { return loggers_.empty() ? nullptr : loggers_.front(); }

  // ---- callbacks and loggers ----
  /// Calls hook `name` on every callback, in the order they were given; callbacks that do not
  /// override it are skipped. args gains {"fabric": this} unless it has a "fabric" (Python's
  /// hooks take fabric= from the caller). Not collective: call it on every rank that should run
  /// the hooks (a collective callback such as SpikeDetection needs every rank).
  void call(const std::string& name, const HookArgs& args = HookArgs());
  /// Sends a metric to every logger, on global rank zero only (other ranks return at once).
  /// step: the x-axis value (default: the logger's next step).
  void log(const std::string& name, double value, std::optional<int64_t> step = std::nullopt);
  void log(const std::string& name, const at::Tensor& value, std::optional<int64_t> step = std::nullopt);
  void log_dict(const std::map<std::string, double>& metrics, std::optional<int64_t> step = std::nullopt);

  // ---- launching ----
  /// Prepares this process for the strategy (device, process group). Refused with RuntimeError
  /// when lightning-run already created the processes (LT_CLI_USED=1), as Python does.
  void launch();
  /// launch(), then fn(*this); returns what fn returns.
  template <class Fn>
  decltype(auto) launch(Fn&& fn) {
    static_assert(std::is_invocable_v<Fn, Fabric&>, "Fabric::launch(fn): fn must accept a Fabric& argument");
    launch();
    return std::forward<Fn>(fn)(*this);
  }

  // ---- setup ----
  /// setup(module, optimizers..., scheduler): validates, converts the module to the precision
  /// dtype, moves it to device(), lets the strategy prepare it, and returns the wrapped objects
  /// in input order: the FabricModule alone, or a tuple for structured bindings. Optimizers may be
  /// lvalues (borrowed) or shared_ptrs; a scheduler (an LRScheduler, last) is returned unchanged.
  template <class M, class... Rest, std::enable_if_t<!std::is_same_v<std::decay_t<M>, SetupOptions>, int> = 0>
  auto setup(M&& module, Rest&&... rest) {
    return setup(SetupOptions{}, std::forward<M>(module), std::forward<Rest>(rest)...);
  }
  template <class M, class... Rest>
  auto setup(SetupOptions options, M&& module, Rest&&... rest) {
    validate_setup_rest<Rest...>();
    if constexpr (detail::IsFabricModule<std::decay_t<M>>::value) {
      refuse_wrapped_module();
      return wrap_results(options, std::forward<M>(module), std::forward<Rest>(rest)...);
    } else {
      using Arg = detail::module_arg<M>;
      static_assert(Arg::is_module, "Fabric::setup: the first argument must be a torch::nn::Module (shared_ptr or TORCH_MODULE holder)");
      std::shared_ptr<typename Arg::impl> impl = Arg::get(module);
      std::vector<torch::optim::Optimizer*> optimizers;
      bool scheduler_seen = false;
      (collect_setup_arg(rest, optimizers, scheduler_seen), ...);
      validate_setup(impl, optimizers);
      prepare_module(impl, options);
      for (auto* optimizer : optimizers) prepare_optimizer(*optimizer);
      auto results = wrap_results(options, FabricModule<typename Arg::impl>(impl, strategy()), std::forward<Rest>(rest)...);
      after_setup(impl, /*call_hook=*/true);
      return results;
    }
  }

  /// First half of the two-step form (needed when the optimizer must be built over parameters
  /// the strategy prepared). Refused by strategies that require joint setup. SetupOptions, when
  /// given, comes first, as in setup().
  template <class M, std::enable_if_t<!std::is_same_v<std::decay_t<M>, SetupOptions>, int> = 0>
  auto setup_module(M&& module) {
    return setup_module(SetupOptions{}, std::forward<M>(module));
  }
  template <class M>
  auto setup_module(SetupOptions options, M&& module) {
    if constexpr (detail::IsFabricModule<std::decay_t<M>>::value) {
      refuse_wrapped_module();
      return module;
    } else {
      using Arg = detail::module_arg<M>;
      static_assert(Arg::is_module, "Fabric::setup_module: the argument must be a torch::nn::Module");
      refuse_if_joint_setup_required("setup_module");
      std::shared_ptr<typename Arg::impl> impl = Arg::get(module);
      validate_setup(impl, {});
      prepare_module(impl, options);
      after_setup(impl, /*call_hook=*/false);  // Python calls on_after_setup from setup() only
      return FabricModule<typename Arg::impl>(impl, strategy());
    }
  }

  /// Second half of the two-step form: one FabricOptimizer, or a tuple for several.
  template <class... Opts>
  auto setup_optimizers(Opts&&... optimizers) {
    static_assert(((detail::is_optimizer_arg<Opts> || detail::is_fabric_optimizer_arg<Opts>) && ...),
                  "Fabric::setup_optimizers accepts torch::optim optimizers only");
    refuse_if_joint_setup_required("setup_optimizers");
    if constexpr (sizeof...(Opts) == 0) {
      refuse_empty_setup_optimizers();
    } else {
      std::vector<torch::optim::Optimizer*> list;
      bool scheduler_seen = false;
      (collect_setup_arg(optimizers, list, scheduler_seen), ...);
      validate_setup(nullptr, list);
      for (auto* optimizer : list) prepare_optimizer(*optimizer);
      if constexpr (sizeof...(Opts) == 1) {
        return FabricOptimizer(wrap_one(SetupOptions{}, std::forward<Opts>(optimizers))...);
      } else {
        return std::make_tuple(FabricOptimizer(wrap_one(SetupOptions{}, std::forward<Opts>(optimizers)))...);
      }
    }
  }

  /// Builds a data loader over dataset for this rank: a DistributedSampler (num_replicas and rank
  /// from the strategy's sampler_share(): world_size() and global_rank(), or the data-parallel size
  /// and rank under model_parallel; seeded from PL_GLOBAL_SEED) unless
  /// use_distributed_sampler is false, and batches moved to device() unless move_to_device is false.
  /// A dataset with no size, a LibTorch StatefulDataset (a stream), is split item by item instead:
  /// rank r reads items r, r + W, ... (ShardedStream), with no padding and no batch count.
  template <class Dataset>
  auto setup_dataloaders(Dataset dataset, torch::data::DataLoaderOptions options,
                         DataLoaderSettings settings = DataLoaderSettings()) {
    const auto share = strategy()->sampler_share();
    const int replicas = settings.use_distributed_sampler ? share.replicas : 1;
    const int rank = settings.use_distributed_sampler ? share.rank : 0;
    if constexpr (Dataset::is_stateful) {
      refuse_shuffled_stream(settings.shuffle);
      ShardedStream<Dataset> stream(std::move(dataset), replicas, rank);
      auto set_epoch = [control = stream](int64_t epoch) mutable { control.set_epoch(epoch); };  // shares the source
      constexpr bool items_are_elements = detail::IsVector<typename Dataset::BatchType::value_type>::value;
      auto progress = track_loader(stream.pass_control(), /*stream=*/true,
                                   items_are_elements ? static_cast<int64_t>(options.batch_size()) : 1, replicas, rank);
      auto loader = torch::data::make_data_loader(std::move(stream), std::move(options));
      using Loader = typename decltype(loader)::element_type;
      return FabricDataLoader<Loader>(std::move(loader), loader_device(settings), std::nullopt, std::move(set_epoch),
                                      std::move(progress));
    } else {
      const auto size = dataset.size();
      if (!size) refuse_unsized_dataset();
      DistributedSampler sampler(*size, replicas, rank, settings.shuffle, global_seed(), settings.drop_uneven_tail);
      return loader_over(std::move(dataset), std::move(sampler), std::move(options), settings);
    }
  }
  /// Over the indices your sampler yields, distributed as Python's DistributedSamplerWrapper does:
  /// each epoch the sampler's list (drawn alike on every rank) is split over the ranks like a
  /// dataset's indices, padded and, with settings.shuffle, permuted by position
  /// (distribute_sampler). With use_distributed_sampler false or one rank, this rank reads the
  /// whole list, in its order unless settings.shuffle.
  ///   auto loader = fabric.setup_dataloaders(dataset, EvenThenOdd(n), torch::data::DataLoaderOptions(8));
  template <class Dataset, class Sampler,
            std::enable_if_t<std::is_base_of_v<torch::data::samplers::Sampler<>, Sampler>, int> = 0>
  auto setup_dataloaders(Dataset dataset, Sampler sampler, torch::data::DataLoaderOptions options,
                         DataLoaderSettings settings = DataLoaderSettings()) {
    const auto share = strategy()->sampler_share();
    const int replicas = settings.use_distributed_sampler ? share.replicas : 1;
    const int rank = settings.use_distributed_sampler ? share.rank : 0;
    DistributedSampler distributed = distribute_sampler(std::move(sampler), replicas, rank, settings.shuffle, global_seed(),
                                                        settings.drop_uneven_tail);
    return loader_over(std::move(dataset), std::move(distributed), std::move(options), settings);
  }
  /// Several datasets at once (Python's setup_dataloaders(*dataloaders)), each as above with the
  /// same options and settings; a tuple of loaders, in order:
  ///   auto [train, val] = fabric.setup_dataloaders(std::make_tuple(train_set, val_set), DataLoaderOptions(32));
  /// Call once per dataset for different batch sizes or settings.
  template <class... Datasets>
  auto setup_dataloaders(std::tuple<Datasets...> datasets, torch::data::DataLoaderOptions options,
                         DataLoaderSettings settings = DataLoaderSettings()) {
    static_assert(sizeof...(Datasets) > 0, "Fabric::setup_dataloaders: the tuple holds no dataset");
    // A braced list evaluates left to right (make_tuple's arguments may not): loaders are set up,
    // and so tracked for exact resume, in the tuple's order.
    return std::apply(
        [&](auto&... each) {
          return std::tuple<decltype(setup_dataloaders(std::move(each), options, settings))...>{
              setup_dataloaders(std::move(each), options, settings)...};
        },
        datasets);
  }

  /// Wraps a loader the user built: batches are moved to the device; its sampler is kept. With
  /// more than one process its sampler must already split the data (a DistributedSampler), or
  /// use_distributed_sampler must be false.
  template <class Loader>
  FabricDataLoader<Loader> setup_dataloaders(std::unique_ptr<Loader> loader,
                                             DataLoaderSettings settings = DataLoaderSettings()) {
    validate_prebuilt_loader<Loader>(settings);
    return FabricDataLoader<Loader>(std::move(loader), loader_device(settings), std::nullopt);
  }
  /// Streaming loaders (data/streaming_loader.h; Python's setup_dataloaders of litdata's
  /// StreamingDataLoader), each set up in place: its data is split over the strategy's data ranks
  /// (sampler_share(): tensor, context and pipe peers read the same batches), its batches arrive
  /// on device() (read into pinned memory and copied without blocking on CUDA), and
  /// fabric.resume_state() saves and restores its position, in set-up order; a rollback
  /// (roll_back_on_bad_steps) leaves it reading on. Call before a loader's first pass; each
  /// loader must outlive its use. ValueError when a loader's options set world_size or rank to
  /// other values, or its pass has begun.
  template <class... More>
  void setup_dataloaders(StreamingDataLoader& loader, More&... more) {
    static_assert((std::is_same_v<More, StreamingDataLoader> && ...),
                  "fabric.setup_dataloaders(loader, more...): every argument must be an lf::StreamingDataLoader");
    setup_streaming_loader(loader);
    (setup_streaming_loader(more), ...);
  }

  // ---- the training step ----
  /// loss.backward() through the strategy and precision plugin. Call this instead of
  /// loss.backward() on anything computed by a FabricModule. Under ddp/fsdp with several ranks, a
  /// loss that depends on no set-up model is a RuntimeError (its gradients would not be averaged).
  /// options: Python's retain_graph, create_graph (one process only) and inputs.
  void backward(at::Tensor loss, const BackwardOptions& options = BackwardOptions());

  /// torch::autograd::grad through the precision (under 16-mixed the outputs are scaled and the
  /// gradients unscaled, in the graph) on outputs of set-up modules, which refuse a plain
  /// autograd call. Local to this rank: nothing is averaged or reduced (the next fabric.backward
  /// averages what a penalty built from the result contributes). A gradient penalty:
  ///   auto g = fabric.grad({critic(mixed)}, {mixed}, GradOptions().higher_order())[0];
  ///   fabric.backward(loss + 10 * (g.flatten(1).norm(2, 1) - 1).pow(2).mean());
  /// Non-scalar outputs need grad_outputs (GradOptions::outputs_grad), as in Python.
  std::vector<at::Tensor> grad(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                               const GradOptions& options = GradOptions());

  /// Clips the gradients of the optimizer's parameters, after the precision plugin unscaled them.
  /// Returns the total norm before clipping (max_norm), or nullopt (clip_val). The module is
  /// accepted for Python's signature and for strategies that shard.
  ///   fabric.clip_gradients(model, optimizer, GradientClipping().norm(1.0));
  template <class Module>
  std::optional<at::Tensor> clip_gradients(const Module& module, FabricOptimizer& optimizer,
                                           const GradientClipping& clipping) {
    (void)module;
    return clip_optimizer_gradients(optimizer.optimizer(), clipping);
  }

  /// Moves tensors (also nested in containers) to device().
  template <class T>
  std::decay_t<T> to_device(T&& data) const { return move_data_to_device(std::forward<T>(data), device()); }
  /// Moves a module to device() in place and returns it.
  std::shared_ptr<torch::nn::Module> to_device(const std::shared_ptr<torch::nn::Module>& module) const;
  template <class Impl>
  torch::nn::ModuleHolder<Impl> to_device(const torch::nn::ModuleHolder<Impl>& module) const {
    module->to(device());
    return module;
  }

  /// Skips the gradient all-reduce of `module` while the guard lives (gradient accumulation):
  ///   { auto skip = fabric.no_backward_sync(model, !last_micro_batch); fabric.backward(loss); }
  /// TypeError, as Python, when the module was not set up by this Fabric (whatever `enabled`
  /// says). Under single_device a silent no-op, as Python; under a strategy without gradient
  /// synchronisation ("dp") a no-op with a warning.
  ScopeGuard no_backward_sync(const torch::nn::Module& module, bool enabled = true);
  template <class Impl>
  ScopeGuard no_backward_sync(const FabricModule<Impl>& module, bool enabled = true) {
    return no_backward_sync(*module.module(), enabled);
  }

  // ---- collectives (every process must call them) ----
  // Devices: tensors may be on the CPU or on this rank's device, whatever the backend (gloo: CPU,
  // nccl: this rank's GPU); a tensor on the other device is staged through the group's device, and
  // results come back on the device of the tensor passed in (plugins/collectives/collective.h).
  void barrier(const std::string& name = {});

  /// Saves state (modules, optimizers, schedulers, loss scalers as state dicts; plain values as
  /// they are) to path. Collective: every rank calls it. One file, written by rank 0 atomically
  /// (see checkpoint/checkpoint_io.h), then every rank learns the outcome (a failure is raised on
  /// all ranks alike). filter: per key, which items of that entry's state dict to keep.
  void save(const std::filesystem::path& path, const State& state, const StateFilter& filter = {});
  /// save, with training going on while the files are written: returns once the state is copied
  /// to host memory (pinned when it lives on a GPU); a background thread then writes the same
  /// files with the same atomicity (path holds its previous checkpoint until the new one is
  /// whole). Collective. The save completes (and a failure is raised, on every rank alike, naming
  /// the path and the cause) at the first of barrier, all_reduce, all_gather, broadcast, backward
  /// and rank_zero_first after every rank's write finished, or at the latest at the next save,
  /// load or wait_for_background_save. One save is in flight at a time. The host copy's memory is
  /// kept for the next background save (docs/checkpoints.md).
  void save_in_background(const std::filesystem::path& path, const State& state, const StateFilter& filter = {});
  /// Blocks until the background save in flight (if any) is complete on disk, and raises its
  /// failure. Collective. With a save in flight, the destructor does the same (so it is then
  /// collective too) and reports a failure on stderr; while an exception unwinds it only waits
  /// for this rank's write and discards the save.
  void wait_for_background_save();
  /// Restores state in place from path (modules, optimizers, ... loaded; plain values replaced)
  /// and returns the checkpoint's entries that state did not ask for. strict: an entry of state
  /// missing from the file is an error. Every rank reads the file.
  StateDict load(const std::filesystem::path& path, State& state, bool strict = true);
  /// The entry that makes a resume exact (checkpoint/resume_state.h): put it into the State you
  /// save and load, {"resume", fabric.resume_state()}, and save/load also store and restore every
  /// rank's random generators and the position of every loader this Fabric set up.
  std::shared_ptr<ResumeState> resume_state() const { return std::make_shared<ResumeState>(*this); }
  /// The whole checkpoint as stored, nothing restored.
  StateDict load(const std::filesystem::path& path);

  // ---- in-memory replicas (docs/launcher.md, "In-memory replicas") ----
  /// Call once per step, at a step boundary, on every rank. Under `lightning-run
  /// --in-memory-replicas K`, every K-th call saves state (and fabric.resume_state(), added when
  /// state has no such entry) into the memory of this node's lightning-run, as fabric.save would
  /// to memory://snapshot-N; on several nodes each lightning-run copies it to a buddy node in the
  /// background. Before it saves, it waits until the previous snapshot is whole and copied on every
  /// node (at once unless copying is slower than K steps), then drops the ones before that. A
  /// worker restarted after a failure resumes with restore_snapshot. Returns whether this call took
  /// one. Without the flag it does nothing (no collective) and returns false. Collective when it saves.
  bool snapshot(const State& state);
  /// Call once before training, on every rank, after setup: restores state in place from the
  /// newest whole snapshot the job's lightning-runs hold, on any node (every rank the same one;
  /// strict, as load), and returns true. False (nothing changed) on a first start, or when the job
  /// was started without --in-memory-replicas. When snapshots were taken but none survived whole
  /// (a node and its buddy lost together), it loads `fallback_checkpoint` (a checkpoint on disk or
  /// s3://; a warning names what was lost) and returns true, or, without one, raises RuntimeError
  /// naming the lost parts: never a silent start from scratch. snapshot() then counts on from the
  /// restored one.
  bool restore_snapshot(State& state, const std::string& fallback_checkpoint = "");
  /// The snapshot() calls counted so far; after restore_snapshot, the restored snapshot's number.
  int64_t snapshot_number() const { return snapshot_calls_; }

  // ---- rollback on bad steps (docs/toolkit.md, "Rolling back a bad step") ----
  /// Turns rollback on: from now on a bad step no longer throws, neither a non-finite value found
  /// by FabricOptions::detect_nonfinite (in fabric.backward) nor a spike found by SpikeDetection.
  /// Instead every rank reloads the live objects of `state` (modules, optimizers, LR schedulers,
  /// your Stateful objects; not its plain values nor a resume_state() entry, so loaders,
  /// generators and your counters go on) from rollback_checkpoint(), drops the gradients of the
  /// set-up modules and of the state's optimizers (after a backward, the optimizer step that
  /// follows then changes nothing), and rank 0 warns, naming the finding and the file. The loop
  /// goes on with the next batch: the bad one is skipped. Before any such checkpoint a bad step
  /// throws as without rollback, saying there was none to go back to. The state's objects must
  /// live until stop_rolling_back() or the Fabric's end. ValueError when state has no live object.
  void roll_back_on_bad_steps(const State& state);
  void stop_rolling_back();
  bool rolls_back_on_bad_steps() const { return rollback_state_ != nullptr; }
  /// The checkpoint a rollback goes back to: the newest one this Fabric saved (save or
  /// save_in_background, without a filter) or loaded (strict) whose State named every entry of the
  /// rollback state (any, with rollback off) and that exists on disk; nullopt before any.
  std::optional<std::filesystem::path> rollback_checkpoint() const;
  /// Rolls back now, as a bad step does; `finding` starts the warning. Collective. RuntimeError
  /// naming the fix when rollback is off or there is no checkpoint yet. Returns the file.
  std::filesystem::path roll_back(const std::string& finding);
  /// The line a bad step's error gains when rollback is on but there is no checkpoint yet.
  static std::string no_rollback_checkpoint();
  /// Loads a file holding one plain state dict into target (a module, optimizer, scheduler, loss
  /// scaler or your own lf::Stateful), e.g. weights from a consolidated checkpoint's "model" entry or a file written by
  /// torch::save(module) (modules only).
  void load_raw(const std::filesystem::path& path, const StateEntry& target, bool strict = true);
  /// op: lf::ReduceOp, or Python's strings "sum", "mean" (default), "max", "min", "product".
  /// Tensors, numbers, and tensors nested in containers (each tensor reduced on its own).
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op);
  at::Tensor all_reduce(const at::Tensor& tensor, const std::string& reduce_op = "mean") {
    return all_reduce(tensor, parse_reduce_op(reduce_op));
  }
  double all_reduce(double value, ReduceOp op);
  double all_reduce(double value, const std::string& reduce_op = "mean") {
    return all_reduce(value, parse_reduce_op(reduce_op));
  }
  template <class T, std::enable_if_t<!std::is_arithmetic_v<T> && !std::is_same_v<T, at::Tensor>, int> = 0>
  T all_reduce(const T& data, ReduceOp op) {
    return apply_to_tensors(data, [&](const at::Tensor& tensor) { return all_reduce(tensor, op); });
  }
  template <class T, std::enable_if_t<!std::is_arithmetic_v<T> && !std::is_same_v<T, at::Tensor>, int> = 0>
  T all_reduce(const T& data, const std::string& reduce_op = "mean") {
    return all_reduce(data, parse_reduce_op(reduce_op));
  }
  /// Gathers from every rank into a new leading dimension of size world_size() (none with one
  /// process); with options.group, from its members into a dimension of the group's size (every
  /// member calls it). options.sync_grads: differentiable, as Python's sync_grads=True (a
  /// contrastive loss over the global batch). Every rank passes the same shape and dtype.
  at::Tensor all_gather(const at::Tensor& tensor, const AllGatherOptions& options = AllGatherOptions());
  /// Each tensor gathered as above, in order.
  std::vector<at::Tensor> all_gather(const std::vector<at::Tensor>& tensors,
                                     const AllGatherOptions& options = AllGatherOptions());
  /// all_reduce over a group's members (each member calls it); ValueError on a non-member.
  at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group);
  at::Tensor all_reduce(const at::Tensor& tensor, const std::string& reduce_op, const ProcessGroup& group) {
    return all_reduce(tensor, parse_reduce_op(reduce_op), group);
  }
  at::Tensor broadcast(const at::Tensor& tensor, int src = 0);
  /// broadcast from global rank src to the group's members (each member calls it).
  at::Tensor broadcast(const at::Tensor& tensor, int src, const ProcessGroup& group);
  // Python's torch.distributed collectives beyond Fabric's own (as TorchCollective has them).
  // Ranks (dst, src) are global ranks; with a group, its members call and the ranks must be
  // members. Tensors of any device; every participant passes the same dtype and shape. Blocking.
  /// Sends tensor to rank dst, which calls recv; dst is another rank.
  void send(const at::Tensor& tensor, int dst);
  void send(const at::Tensor& tensor, int dst, const ProcessGroup& group);
  /// Fills tensor (its shape and dtype are what src sends) from rank src; returns it.
  at::Tensor recv(at::Tensor tensor, int src);
  at::Tensor recv(at::Tensor tensor, int src, const ProcessGroup& group);
  /// The op over every participant's tensor, on rank dst (a new tensor); the other ranks get their
  /// tensor back unchanged.
  at::Tensor reduce(const at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::Sum);
  at::Tensor reduce(const at::Tensor& tensor, int dst, ReduceOp op, const ProcessGroup& group);
  /// On rank dst every participant's tensor stacked in a new leading dimension (group-rank order);
  /// an undefined tensor on the others.
  at::Tensor gather(const at::Tensor& tensor, int dst);
  at::Tensor gather(const at::Tensor& tensor, int dst, const ProcessGroup& group);
  /// Fills output with rows[i] on the participant i (group-rank order) and returns it. rows:
  /// [participants, output's shape] on rank src, ignored (pass {}) on the others.
  at::Tensor scatter(at::Tensor output, const at::Tensor& rows, int src);
  at::Tensor scatter(at::Tensor output, const at::Tensor& rows, int src, const ProcessGroup& group);
  /// rows: [participants, ...]; returns on participant i the op over every participant's rows[i].
  at::Tensor reduce_scatter(const at::Tensor& rows, ReduceOp op = ReduceOp::Sum);
  at::Tensor reduce_scatter(const at::Tensor& rows, ReduceOp op, const ProcessGroup& group);
  /// torch.distributed.all_to_all_single with equal splits: tensor's first dimension in as many
  /// equal blocks as participants, block i sent to participant i; returns the blocks received,
  /// in group-rank order, in a tensor of tensor's shape.
  at::Tensor all_to_all(const at::Tensor& tensor);
  at::Tensor all_to_all(const at::Tensor& tensor, const ProcessGroup& group);
  /// A group of some of the job's ranks (torch.distributed.new_group): collective over EVERY rank,
  /// members or not, called in the same order everywhere. ranks: global ranks, each once; the
  /// group ranks follow their ascending order. ValueError naming the bad rank and the valid range.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
  /// Any serialisable value as bytes: strings, JSON dumps, pickled state.
  std::string broadcast(const std::string& value, int src = 0);
  std::string broadcast(const char* value, int src = 0) { return broadcast(std::string(value), src); }
  /// Rank 0 (local rank 0 with local=true) runs the block first, the others after it, e.g. to
  /// prepare a data set once:  { auto first = fabric.rank_zero_first(); prepare(); }
  /// When rank 0's block throws, its closing barrier is skipped and the error propagates (the
  /// other ranks then wait at their entry barrier until the job is stopped, as in Python).
  ScopeGuard rank_zero_first(bool local = false);

  // ---- utilities ----
  /// Prints the arguments separated by spaces, on local rank 0 only.
  template <class... Parts>
  void print(const Parts&... parts) const {
    if (local_rank() != 0) return;
    std::ostringstream line;
    bool first = true;
    ((line << (first ? "" : " ") << parts, first = false), ...);
    std::cout << line.str() << std::endl;
  }
  /// Seeds every generator and records the seed for samplers and workers; returns it. workers
  /// defaults to true here, as Python's Fabric.seed_everything (PL_SEED_WORKERS=1); the free
  /// function lf::seed_everything defaults it to false, as Python's. ValueError for a seed above
  /// 2**32 - 1, as lf::seed_everything.
  static uint64_t seed_everything(std::optional<uint64_t> seed = std::nullopt, bool workers = true);
  /// The precision's forward context (autocast for the mixed precisions) for code outside a
  /// FabricModule's forward, e.g. a loss:  { auto cast = fabric.autocast(); loss = criterion(out); }
  ScopeGuard autocast() const;
  /// New floating tensors get the precision's dtype while the guard lives.
  ScopeGuard init_tensor() const;
  /// Modules built while the guard lives get the precision's dtype. empty_init=true also skips
  /// their random initialisation (see utilities/empty_init.h): use it when a checkpoint will
  /// overwrite the weights anyway. Under fsdp, empty_init=true builds on the meta device instead
  /// (utilities/meta_init.h): no parameter memory until fabric.setup, which gives each rank only
  /// its shards, with the values a normal build under the same seed has.
  ScopeGuard init_module(bool empty_init = false) const;

 private:
  template <class T>
  void collect_setup_arg(T& arg, std::vector<torch::optim::Optimizer*>& optimizers, bool& scheduler_seen) {
    if constexpr (detail::is_fabric_optimizer_arg<T>) {
      refuse_wrapped_optimizer();
    } else if constexpr (detail::is_optimizer_arg<T>) {
      if (scheduler_seen) refuse_scheduler_order();
      if constexpr (detail::SharedTarget<std::decay_t<T>>::shared) {
        optimizers.push_back(arg.get());
      } else {
        optimizers.push_back(&arg);
      }
    } else {
      scheduler_seen = true;
    }
  }
  template <class... Rest>
  static constexpr void validate_setup_rest() {
    static_assert(((detail::is_optimizer_arg<Rest> || detail::is_scheduler_arg<Rest> ||
                    detail::is_fabric_optimizer_arg<Rest>) && ...),
                  "Fabric::setup(module, optimizers..., scheduler): after the module only torch::optim "
                  "optimizers and one LRScheduler are accepted");
    static_assert(((detail::is_scheduler_arg<Rest> ? 1 : 0) + ... + 0) <= 1,
                  "Fabric::setup accepts at most one scheduler");
  }
  template <class Wrapped, class... Rest>
  auto wrap_results(const SetupOptions& options, Wrapped&& module, Rest&&... rest) {
    if constexpr (sizeof...(Rest) == 0) {
      return std::forward<Wrapped>(module);
    } else {
      return std::tuple<std::decay_t<Wrapped>, detail::setup_result_t<Rest>...>(
          std::forward<Wrapped>(module), wrap_one(options, std::forward<Rest>(rest))...);
    }
  }
  template <class T>
  decltype(auto) wrap_one(const SetupOptions& options, T&& arg) {
    if constexpr (detail::is_fabric_optimizer_arg<T>) {
      return arg;
    } else if constexpr (detail::is_optimizer_arg<T>) {
      return FabricOptimizer(detail::share(std::forward<T>(arg)), strategy(),
                             options.fuse_optimizer_steps.value_or(fused_optimizer_steps_), step_observer_, callbacks_);
    } else {
      return std::forward<T>(arg);
    }
  }
  template <class Loader>
  void validate_prebuilt_loader(const DataLoaderSettings& settings) const {
    if (settings.use_distributed_sampler && strategy()->sampler_share().replicas > 1) refuse_prebuilt_loader();
  }
  std::optional<torch::Device> loader_device(const DataLoaderSettings& settings) const {
    if (!settings.move_to_device) return std::nullopt;
    return device();
  }

  std::optional<at::Tensor> clip_optimizer_gradients(torch::optim::Optimizer& optimizer, const GradientClipping& clipping);
  void validate_setup(const std::shared_ptr<torch::nn::Module>& module,
                      const std::vector<torch::optim::Optimizer*>& optimizers);
  void prepare_module(const std::shared_ptr<torch::nn::Module>& module, const SetupOptions& options);
  void prepare_optimizer(torch::optim::Optimizer& optimizer);
  /// A module deriving from lf::Callback joins the callbacks (as Python adds a LightningModule);
  /// call_hook: then on_after_setup runs.
  void after_setup(const std::shared_ptr<torch::nn::Module>& module, bool call_hook);
  void ensure_environment_ready();
  /// The loader setup_dataloaders returns for a sized dataset and its distributed sampler.
  template <class Dataset>
  auto loader_over(Dataset dataset, DistributedSampler sampler, torch::data::DataLoaderOptions options,
                   const DataLoaderSettings& settings) {
    const size_t per_rank = sampler.num_samples();
    const size_t batch = options.batch_size();
    const size_t batches = options.drop_last() ? per_rank / batch : (per_rank + batch - 1) / batch;
    auto set_epoch = [control = sampler.pass_control()](int64_t epoch) { control->next_epoch = epoch; };
    auto progress = track_loader(sampler.pass_control(), /*stream=*/false, static_cast<int64_t>(batch), sampler.num_replicas(),
                                 sampler.rank());
    auto loader = torch::data::make_data_loader(std::move(dataset), std::move(sampler), std::move(options));
    using Loader = typename decltype(loader)::element_type;
    return FabricDataLoader<Loader>(std::move(loader), loader_device(settings), batches, std::move(set_epoch),
                                    std::move(progress));
  }
  /// A new loader's position, kept (weakly, in set-up order) for resume_state().
  std::shared_ptr<LoaderProgress> track_loader(std::shared_ptr<PassControl> control, bool stream, int64_t units_per_batch,
                                               int64_t replicas, int64_t rank);
  /// The loaders set up and still alive, in set-up order.
  std::vector<std::shared_ptr<LoaderProgress>> live_loaders() const;
  /// state, with its ResumeState entries replaced by what they save (a collective); nullopt when it has none.
  /// --in-memory-replicas K from the environment (0: off), read once.
  int64_t snapshot_interval();
  /// state, with a fabric.resume_state() entry added when it has none.
  State with_snapshot_resume(const State& state, const char* call);
  std::optional<State> with_resume_values(const State& state, const char* call);
  [[noreturn]] void refuse_unsized_dataset() const;
  void refuse_shuffled_stream(bool shuffle) const;
  /// Every rank of the job as a group (Python's group.WORLD); its communicator is the strategy's.
  /// ValueError when several ranks run without a process group (a strategy that has none).
  ProcessGroup world_group();
  /// For a collective named call: readies the environment, settles a background save when every
  /// rank of the job takes part (every_member and a group of all ranks), and returns group's
  /// communicator: null when only this process takes part, ValueError for a non-member.
  Collective* participants(const ProcessGroup& group, const char* call, bool every_member = true);
  std::shared_ptr<StepObserver> make_step_observer(const FabricOptions& options, const env::EnvLookup& env) const;
  [[noreturn]] void refuse_wrapped_module() const;
  // Under ddp/fsdp with several ranks: a loss that reaches no set-up model's parameter is an error.
  void refuse_loss_from_unset_model(const at::Tensor& loss) const;
  [[noreturn]] void refuse_wrapped_optimizer() const;
  [[noreturn]] void refuse_scheduler_order() const;
  [[noreturn]] void refuse_empty_setup_optimizers() const;
  [[noreturn]] void refuse_prebuilt_loader() const;
  void refuse_if_joint_setup_required(const char* call) const;

  std::unique_ptr<Connector> connector_;  // the resolved plugins and strategy (lib/private: connector.h)
  bool cli_used_ = false;
  int restart_count_ = 0;
  int64_t snapshot_calls_ = 0;  // snapshot() calls so far (counting on from a restored snapshot)
  int64_t snapshot_every_ = -1;  // --in-memory-replicas K (0: off); -1: not read yet
  bool fused_optimizer_steps_ = true;  // FabricOptions::fused_optimizer_steps
  std::shared_ptr<StepObserver> step_observer_;  // the profiler switch's StepProfiler, when on for this rank
  bool environment_ready_ = false;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::shared_ptr<std::vector<std::shared_ptr<Callback>>> callbacks_;  // shared with the FabricOptimizers
  // What this Fabric set up, by identity; expired entries are objects the user has destroyed,
  // whose addresses may be reused by new ones.
  struct OptimizerRecord {
    const torch::optim::Optimizer* address;
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> first_parameter;
  };
  std::vector<std::weak_ptr<torch::nn::Module>> setup_modules_;
  /// Modules setup marked for activation checkpointing and not yet seen checkpointed, by name:
  /// Fabric::backward refuses one that ran without a checkpointed call.
  std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>> unverified_checkpointed_;
  void refuse_checkpointing_that_did_nothing();
  std::vector<OptimizerRecord> setup_optimizers_;
  std::vector<std::weak_ptr<LoaderProgress>> setup_loaders_;
  std::vector<std::weak_ptr<StreamingDataLoader*>> streaming_loaders_;  // set up, in order (resume_state)
  void setup_streaming_loader(StreamingDataLoader& loader);
  /// The streaming loaders set up and still alive, in set-up order.
  std::vector<StreamingDataLoader*> live_streaming_loaders() const;
  std::shared_ptr<internal::NonFiniteWatch> nonfinite_watch_;  // FabricOptions::detect_nonfinite
  std::shared_ptr<State> rollback_state_;                       // roll_back_on_bad_steps: its live objects
  /// Checkpoints saved or loaded, oldest first (the last 16), with the State's top-level names.
  std::vector<std::pair<std::filesystem::path, std::set<std::string>>> checkpoints_;
  void note_checkpoint(const std::filesystem::path& path, const State& state);
  /// Calls f(name, tensor) for every tensor the optimizers train on this rank, by parameter name:
  /// the set-up modules' parameters, or under fsdp this rank's shards of them.
  void for_each_trained_tensor(const std::function<void(const std::string&, const at::Tensor&)>& f) const;

  bool was_set_up(const torch::optim::Optimizer& optimizer) const;
};

}  // namespace lightning::fabric
