#include "lightning/fabric/strategies/ddp.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "internal/gradient_reducer.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/rank_zero.h"

namespace lightning::fabric {
namespace {
bool env_true(const env::EnvLookup& env, const char* name) {
  auto value = env(name);
  return value && (*value == "True" || *value == "true" || *value == "1");
}
int env_int(const env::EnvLookup& env, const char* name, int fallback) {
  auto value = env(name);
  return value ? std::stoi(*value) : fallback;
}
}  // namespace

DDPStrategy::DDPStrategy(StrategyContext context, DDPOptions options)
    : Strategy(std::move(context)), options_(std::move(options)) {}

DDPStrategy::~DDPStrategy() = default;

torch::Device DDPStrategy::root_device() const {
  const int local = local_rank();
  LF_CHECK(local >= 0 && local < num_processes(), RuntimeError, "LOCAL_RANK=", local, " is outside the ",
           num_processes(), " devices of this node.");
  return context_.parallel_devices[static_cast<size_t>(local)];
}

// The Lightning environment learns ranks from the strategy; the others (torchelastic, ...) know.
int DDPStrategy::world_size() const {
  auto& environment = *context_.cluster_environment;
  if (environment.name() == "lightning") return num_processes() * num_nodes();
  return environment.world_size();
}

int DDPStrategy::global_rank() const {
  auto& environment = *context_.cluster_environment;
  if (environment.name() != "lightning") return environment.global_rank();
  return environment.node_rank() * num_processes() + environment.local_rank();
}

void DDPStrategy::launch_processes() {
  if (context_.cluster_environment->creates_processes_externally() || num_processes() == 1) return;
  launcher_ = std::make_unique<SubprocessLauncher>(num_processes(), num_nodes(), env::process_env());
  launcher_->launch();
}

void check_process_group_backend(const std::string& setting, const std::optional<std::string>& backend) {
  if (!backend) return;
  LF_CHECK(*backend == "gloo" || *backend == "nccl" || *backend == "shm", ValueError, setting, "=\"", *backend,
           "\" is not supported. Choose \"gloo\", \"nccl\" or \"shm\", or leave it "
           "unset (nccl on CUDA; on CPU shm when every rank is on one machine, else gloo).");
}

StrategySpec ddp_strategy(DDPOptions options) {
  LF_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_mb > 0, ValueError, "DDPOptions: bucket_cap_mb=",
           options.bucket_cap_mb, " and first_bucket_mb=", options.first_bucket_mb,
           " must be positive (defaults 25 and 1 MiB).");
  LF_CHECK(options.timeout.count() > 0, ValueError, "DDPOptions: timeout=", options.timeout.count(),
           " ms must be positive (default 30 minutes).");
  LF_CHECK(options.rendezvous_timeout.count() > 0, ValueError, "DDPOptions: rendezvous_timeout=",
           options.rendezvous_timeout.count(), " ms must be positive (default 5 minutes).");
  LF_CHECK(options.hang_timeout.count() >= 0, ValueError, "DDPOptions: hang_timeout=", options.hang_timeout.count(),
           " ms must be 0 (off) or positive (default 5 minutes).");
  check_process_group_backend("DDPOptions: process_group_backend", options.process_group_backend);
  return StrategySpec{options.name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<DDPStrategy>(std::move(context), options);
                      }};
}

void DDPStrategy::setup_environment() {
  if (collective_) return;
  context_.cluster_environment->set_world_size(world_size());
  context_.cluster_environment->set_global_rank(global_rank());
  context_.accelerator->setup_device(root_device());
  CollectiveOptions options;
  const auto& environment = *context_.cluster_environment;
  options.main_address = environment.main_address();
  options.main_port = environment.main_port();
  options.rank = global_rank();
  options.world_size = world_size();
  options.restart_count = env_int(context_.env, env::kRestartCount, 0);
  options.use_agent_store = env_true(context_.env, env::kUseAgentStore);
  options.backend = options_.process_group_backend.value_or(
      root_device().is_cuda() ? "nccl" : (num_nodes() == 1 ? "cpu-auto" : "gloo"));
  if (auto chosen = context_.env(env::kProcessGroupBackend)) {
    check_process_group_backend(env::kProcessGroupBackend, chosen);
    options.backend = *chosen;
  }
  options.device = root_device();
  options.timeout = options_.timeout;
  options.rendezvous_timeout = rendezvous_timeout_from(context_.env, options_.rendezvous_timeout);
  options.hang_timeout = options_.hang_timeout;
  apply_watch_environment(context_.env, options);
  c10::intrusive_ptr<c10d::Store> store;
  if (launcher_) store = launcher_->hosted_store();
  collective_ = std::make_shared<Collective>(options, store);
}

Collective& DDPStrategy::collective() {
  LF_CHECK(collective_ != nullptr, RuntimeError, "The process group of strategy '", name(),
           "' does not exist yet: call fabric.launch() (or any setup) first.");
  return *collective_;
}

void DDPStrategy::setup_module(const std::shared_ptr<torch::nn::Module>& module) {
  setup_environment();
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> state = module->parameters();
  for (auto& buffer : module->buffers()) state.push_back(buffer);
  collective().check_same_tensors(state, "The model passed to fabric.setup");
  for (auto& parameter : module->parameters()) {
    at::Tensor data = parameter.data();
    collective().broadcast_(data, 0);
  }
  for (auto& buffer : module->buffers()) collective().broadcast_(buffer, 0);
  reducers_.push_back(std::make_unique<internal::GradientReducer>(module, collective_, options_.first_bucket_mb,
                                                                   options_.bucket_cap_mb));
}

void DDPStrategy::backward(at::Tensor& loss, torch::nn::Module* module) {
  reducers_.erase(std::remove_if(reducers_.begin(), reducers_.end(), [](const auto& r) { return r->expired(); }),
                  reducers_.end());
  if (world_size() > 1) {
    for (auto& reducer : reducers_) {
      if (sync_disabled_.count(reducer->module()) == 0) reducer->arm();
    }
  }
  // Disarm even if backward throws, so that a later plain autograd call does not communicate.
  ScopeGuard disarm([this] {
    for (auto& reducer : reducers_) reducer->disarm();
  });
  Strategy::backward(loss, module);
}

ScopeGuard DDPStrategy::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  if (!enabled) return ScopeGuard();
  const bool inserted = sync_disabled_.insert(&module).second;
  if (!inserted) return ScopeGuard();
  return ScopeGuard([this, pointer = &module] { sync_disabled_.erase(pointer); });
}

void DDPStrategy::barrier(const std::string&) { collective().barrier(); }

// In place on a contiguous input, as Python Fabric does (and much faster than reducing a fresh
// copy: see docs/benchmarks.md, P5).
at::Tensor DDPStrategy::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  at::Tensor result = tensor.contiguous();
  collective().all_reduce_(result, op);
  return result;
}

at::Tensor DDPStrategy::all_gather(const at::Tensor& tensor) { return collective().all_gather(tensor); }

at::Tensor DDPStrategy::broadcast(const at::Tensor& tensor, int src) {
  at::Tensor result = tensor.clone().contiguous();
  collective().broadcast_(result, src);
  return result;
}

std::string DDPStrategy::broadcast_bytes(const std::string& bytes, int src) {
  return collective().broadcast_bytes(bytes, src);
}

}  // namespace lightning::fabric
