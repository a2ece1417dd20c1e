// Collective: construction of the world group and subgroups, and what every op goes through
// (run_blocking, begin_async, wait_recorded). The ops live in collective_*.cpp by family.
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <algorithm>
#include <numeric>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/hang_watchdog.h"
#include "lightning/fabric/plugins/collectives/collective_backend.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"
#include "lightning/fabric/utilities/profiled_range.h"

namespace lightning::fabric {

namespace {
// The backend after the host vote (see CollectiveOptions::shm_within_hosts): a Gloo choice may
// become shm or shm+gloo; shm+gloo asked for explicitly needs the same number of ranks per host.
ProcessGroupBackend chosen_backend(const CollectiveOptions& options, const internal::HostLayout& layout, bool voted) {
  if (options.backend == ProcessGroupBackend::ShmGloo) {
    LF_CHECK(layout.equal, ValueError, "The shm+gloo backend (LT_PROCESS_GROUP_BACKEND, process_group.backend) needs "
             "the same number of ranks on every host, but the job has ", layout.counts, ". Start as many workers on "
             "each node, or choose gloo.");
    return options.backend;
  }
  if (!voted) return options.backend;
  if (layout.one_host()) return ProcessGroupBackend::Shm;
  if (layout.equal && layout.ranks_per_host >= 2) return ProcessGroupBackend::ShmGloo;
  return options.backend;
}
}  // namespace

Collective::Collective(const CollectiveOptions& options, c10::intrusive_ptr<c10d::Store> store)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = options.rank;
  impl_->world_size = options.world_size;
  impl_->global_ranks.resize(static_cast<size_t>(options.world_size));
  std::iota(impl_->global_ranks.begin(), impl_->global_ranks.end(), 0);
  impl_->backend = options.backend;
  impl_->device = options.backend == ProcessGroupBackend::Nccl ? options.device : at::Device(at::kCPU);
  LF_CHECK(options.backend != ProcessGroupBackend::Nccl || impl_->device.is_cuda(), ValueError, "Collective: the "
           "nccl backend needs a CUDA device (CollectiveOptions::device), got ", impl_->device,
           ". Use gloo or shm for CPU tensors.");
  LF_CHECK(options.settings.rendezvous_timeout.count() > 0, ValueError,
           "Collective: rendezvous_timeout must be positive.");
  c10::intrusive_ptr<c10d::Store> base = store ? store : internal::connect_store(options);
  const std::string prefix = "/worker/attempt_" + std::to_string(options.store_attempt);
  impl_->store = c10::make_intrusive<c10d::PrefixStore>(prefix, base);
  impl_->options = options;
  internal::await_all_ranks(*impl_->store, options);
  base->setTimeout(options.settings.timeout);  // from here on the store serves the collectives
  const bool votes = options.backend == ProcessGroupBackend::ShmGloo ||
                     (options.shm_within_hosts && options.backend == ProcessGroupBackend::Gloo && options.world_size > 1);
  if (votes) impl_->layout = internal::vote_host_layout(*impl_->store, impl_->rank, impl_->world_size);
  impl_->backend = chosen_backend(options, impl_->layout, votes);
  create_group();
  internal::WatchdogSettings watch;
  watch.rank = options.rank;
  watch.world_size = options.world_size;
  watch.group = options.settings;
  watch.store_host = options.main_address;
  watch.store_port = options.main_port;
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get())) watch.store_port = tcp->getPort();
  watch.store_prefix = prefix;
  watch.store_relay = options.use_agent_store ? options.store_relay : "";
  watch.local_world_size = options.local_world_size;
  const internal::CollectiveWatch watching = internal::watch_collectives(watch);
  impl_->recorder = watching.recorder;
  impl_->owns_watchdog = watching.owns_watchdog;
}

void Collective::create_group() {
  impl_->ops_run_in_call = impl_->backend == ProcessGroupBackend::Shm;
  impl_->group = internal::make_group_backend(impl_->backend, impl_->store, impl_->rank, impl_->world_size,
                                              impl_->options, impl_->layout);
}

Collective::Collective(const Collective& parent, const std::string& name, const std::vector<int>& ranks,
                       std::optional<ProcessGroupBackend> backend)
    : impl_(std::make_unique<Impl>()) {
  const auto position = std::find(ranks.begin(), ranks.end(), parent.rank());
  LF_CHECK(position != ranks.end(), ValueError, "Collective subgroup '", name, "': rank ", parent.rank(),
           " is not one of its ranks.");
  impl_->options = parent.impl_->options;
  LF_CHECK(!backend || *backend == ProcessGroupBackend::Gloo || *backend == ProcessGroupBackend::Shm, ValueError,
           "Collective subgroup '", name, "': backend \"", to_string(*backend), "\" is not valid for a subgroup. "
           "Choose gloo or shm, or leave it unset (the parent's; under shm+gloo, as its ranks' hosts decide).");
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/subgroup/" + name, parent.impl_->store);
  impl_->rank = static_cast<int>(position - ranks.begin());
  impl_->world_size = static_cast<int>(ranks.size());
  impl_->backend = backend.value_or(parent.impl_->backend);
  if (!backend && parent.impl_->backend == ProcessGroupBackend::ShmGloo) {
    // The subgroup's own host vote: shm on one host (a pipeline's or a node's ranks), shm+gloo over
    // hosts with the same count of at least 2, gloo otherwise.
    impl_->layout = internal::vote_host_layout(*impl_->store, impl_->rank, impl_->world_size);
    CollectiveOptions gloo = impl_->options;
    gloo.backend = ProcessGroupBackend::Gloo;
    impl_->backend = chosen_backend(gloo, impl_->layout, /*voted=*/true);
  }
  impl_->device = impl_->backend == ProcessGroupBackend::Nccl ? parent.impl_->device : at::Device(at::kCPU);
  for (int member : ranks) impl_->global_ranks.push_back(parent.impl_->global_ranks.at(static_cast<size_t>(member)));
  impl_->name = name;
  impl_->recorder = parent.impl_->recorder;
  create_group();
}

Collective::~Collective() {
  if (impl_->owns_watchdog) internal::stop_hang_watchdog();
}

std::string Collective::next_group_name(const std::string& base) {
  return base + "-" + std::to_string(impl_->group_names++);
}

int Collective::rank() const { return impl_->rank; }
uint64_t Collective::operation_count() const { return impl_->operations; }
int Collective::world_size() const { return impl_->world_size; }
ProcessGroupBackend Collective::backend() const { return impl_->backend; }
at::Device Collective::device() const { return impl_->device; }

void Collective::run_blocking(int op, const at::Tensor* tensor, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  ++impl_->operations;
  auto scope = collective_detail::record(impl_->recorder, collective_detail::op_name(op), impl_->name, tensor);
  // point-to-point: the peer alone takes part
  if (op != collective_detail::kSend && op != collective_detail::kRecv) check_call(op, tensor);
  issue()->wait();
}

void Collective::barrier() {
  c10d::BarrierOptions options;
  if (impl_->device.is_cuda()) options.device_ids = {impl_->device.index()};  // else NCCL guesses a GPU
  run_blocking(collective_detail::kBarrier, nullptr, [&] { return impl_->group->barrier(options); });
}

uint64_t Collective::begin_async(int op, const at::Tensor& tensor) {
  ++impl_->operations;
  flight::Recorder* recorder = impl_->recorder;
  const uint64_t seq = recorder ? recorder->begin(collective_detail::op_name(op), impl_->name,
                                                  collective_detail::dtype_name(tensor.scalar_type()),
                                                  tensor.sizes().data(), tensor.sizes().size(),
                                                  static_cast<uint64_t>(tensor.numel()))
                                : 0;
  if (impl_->options.settings.check_collectives && op != collective_detail::kSend &&
      op != collective_detail::kRecv) {  // point-to-point: the peer alone
    if (recorder) recorder->wait(seq);
    try {
      check_call(op, &tensor);
    } catch (...) {
      if (recorder) recorder->end(seq, true);
      throw;
    }
  }
  return seq;
}

void Collective::wait_recorded(const c10::intrusive_ptr<c10d::Work>& work, uint64_t seq) const {
  flight::Recorder* recorder = impl_->recorder;
  const ProfiledRange range([&] {
    const auto call = recorder ? recorder->call(seq) : std::nullopt;
    return (call ? call->describe() : "collective on " + impl_->name) + " (wait)";
  });
  if (recorder == nullptr) {
    work->wait();
    return;
  }
  recorder->wait(seq);
  try {
    work->wait();
  } catch (...) {
    recorder->end(seq, true);
    throw;
  }
  recorder->end(seq, false);
}

}  // namespace lightning::fabric
