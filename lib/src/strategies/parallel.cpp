#include "lightning/fabric/strategies/parallel.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <climits>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/launchers/subprocess_launcher.h"

namespace lightning::fabric {

namespace {
constexpr size_t kSetupBroadcastBucketBytes = size_t{250} << 20;  // as PyTorch DDP's setup broadcast
}  // namespace

ParallelStrategy::ParallelStrategy(StrategyContext context, ProcessGroupSettings settings)
    : Strategy(std::move(context)), settings_(std::move(settings)) {}

ParallelStrategy::~ParallelStrategy() = default;

torch::Device ParallelStrategy::root_device() const {
  const int local = local_rank();
  LF_CHECK(local >= 0 && local < num_processes(), RuntimeError, "LOCAL_RANK=", local, " is outside the ",
           num_processes(), " devices of this node.");
  return context_.parallel_devices[static_cast<size_t>(local)];
}

// The Lightning environment learns ranks from the strategy; the others (torchelastic, ...) know.
int ParallelStrategy::world_size() const {
  auto& environment = *context_.cluster_environment;
  if (environment.name() == "lightning") return num_processes() * num_nodes();
  return environment.world_size();
}

int ParallelStrategy::global_rank() const {
  auto& environment = *context_.cluster_environment;
  if (environment.name() != "lightning") return environment.global_rank();
  return environment.node_rank() * num_processes() + environment.local_rank();
}

void ParallelStrategy::launch_processes() {
  if (context_.cluster_environment->creates_processes_externally() || num_processes() == 1) return;
  launcher_ = std::make_unique<SubprocessLauncher>(num_processes(), num_nodes(), env::process_env());
  launcher_->launch();
}

void ParallelStrategy::setup_environment() {
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
  const env::Reader reader(context_.env);
  // lightning-run names every start of the workers (LT_ATTEMPT, trusted only from it: a process
  // started from a worker's environment inherits the variable); torchrun only its restart count.
  const auto restarts = reader.integer(env::kRestartCount, 0, INT_MAX).value_or(0);
  options.store_attempt = static_cast<int>(
      reader.flag(env::kCliUsed) ? reader.integer(env::kAttempt, 0, INT_MAX).value_or(restarts) : restarts);
  options.use_agent_store = reader.flag(env::kUseAgentStore);
  if (options.use_agent_store) options.store_relay = reader.text(env::kStoreRelay).value_or("");
  options.local_world_size = num_processes();
  options.settings = with_environment_overrides(settings_, context_.env);
  const bool cuda = root_device().is_cuda();
  options.backend = options.settings.backend.value_or(cuda ? ProcessGroupBackend::Nccl : ProcessGroupBackend::Gloo);
  options.shm_within_hosts = !options.settings.backend && !cuda;
  options.device = root_device();
  c10::intrusive_ptr<c10d::Store> store;
  if (launcher_) store = launcher_->hosted_store();
  collective_ = std::make_shared<Collective>(options, store);
}

Collective& ParallelStrategy::collective() {
  LF_CHECK(collective_ != nullptr, RuntimeError, "The process group of strategy '", name(),
           "' does not exist yet: call fabric.launch() (or any setup) first.");
  return *collective_;
}

void ParallelStrategy::run_on(std::shared_ptr<Collective> world, DataGroups groups) {
  collective_ = std::move(world);
  data_group_ = std::move(groups.data);
  shard_group_ = std::move(groups.shard);
  replica_group_ = std::move(groups.replicate);
  module_copies_group_ = std::move(groups.module_copies);
}

Collective& ParallelStrategy::data_group() { return data_group_ ? *data_group_ : collective(); }

const std::shared_ptr<Collective>& ParallelStrategy::shared_data_group() {
  collective();  // formed
  return data_group_ ? data_group_ : collective_;
}

Collective& ParallelStrategy::module_copies_group() { return module_copies_group_ ? *module_copies_group_ : collective(); }

Collective& ParallelStrategy::shard_group() { return shard_group_ ? *shard_group_ : collective(); }

void ParallelStrategy::use_node_groups(const std::string& prefix) {
  if (shard_group_) return;
  const int local = num_processes(), node = global_rank() / local, local_rank = global_rank() % local;
  std::vector<int> node_ranks, replica_ranks;
  for (int r = 0; r < local; ++r) node_ranks.push_back(node * local + r);
  for (int n = 0; n < world_size() / local; ++n) replica_ranks.push_back(n * local + local_rank);
  shard_group_ = std::make_shared<Collective>(collective(), prefix + "-node-" + std::to_string(node), node_ranks);
  replica_group_ =
      std::make_shared<Collective>(collective(), prefix + "-replica-" + std::to_string(local_rank), replica_ranks);
}

uint64_t ParallelStrategy::operation_count() const {
  uint64_t count = 0;
  std::set<const Collective*> groups{collective_.get(), shard_group_.get(), replica_group_.get(), data_group_.get()};
  for (const Collective* group : groups) {
    if (group != nullptr) count += group->operation_count();
  }
  return count;
}

void ParallelStrategy::broadcast_module_from_rank_zero(torch::nn::Module& module,
                                                       const std::set<const c10::TensorImpl*>& already_equal,
                                                       Collective* group) {
  torch::NoGradGuard no_grad;
  Collective& over = group != nullptr ? *group : collective();
  std::vector<at::Tensor> state = module.parameters();
  for (auto& buffer : module.buffers()) state.push_back(buffer);
  over.check_same_tensors(state, "The model passed to fabric.setup");
  std::vector<at::Tensor> sent;
  for (const at::Tensor& tensor : state) {
    if (already_equal.count(tensor.unsafeGetTensorImpl()) == 0) sent.push_back(tensor.data());
  }
  over.broadcast_many_(sent, 0, kSetupBroadcastBucketBytes);
}

ScopeGuard ParallelStrategy::no_backward_sync(const torch::nn::Module& module, bool enabled) {
  if (!enabled) return ScopeGuard();
  const bool inserted = sync_disabled_.insert(&module).second;
  if (!inserted) return ScopeGuard();
  return ScopeGuard([this, pointer = &module] { sync_disabled_.erase(pointer); });
}

void ParallelStrategy::barrier(const std::string&) { collective().barrier(); }

// In place on a contiguous input, as Python Fabric does (and much faster than reducing a fresh
// copy: see docs/benchmarks.md, P5).
at::Tensor ParallelStrategy::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  at::Tensor result = tensor.contiguous();
  collective().all_reduce_(result, op);
  return result;
}

at::Tensor ParallelStrategy::all_gather(const at::Tensor& tensor) { return collective().all_gather(tensor); }

at::Tensor ParallelStrategy::broadcast(const at::Tensor& tensor, int src) {
  at::Tensor result = tensor.clone().contiguous();
  collective().broadcast_(result, src);
  return result;
}

std::string ParallelStrategy::broadcast_bytes(const std::string& bytes, int src) {
  return collective().broadcast_bytes(bytes, src);
}

}  // namespace lightning::fabric
