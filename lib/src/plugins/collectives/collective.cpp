#include "lightning/fabric/plugins/collectives/collective.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lightning::fabric {
namespace {
// What ProcessGroupGloo and ProcessGroupNCCL derive from, with the collectives we call: the
// ProcessGroup itself in LibTorch 1.x, c10d::Backend since 2.0 (the ProcessGroup became a
// dispatcher over backends).
#if TORCH_VERSION_MAJOR >= 2
using GroupBackend = c10d::Backend;
#else
using GroupBackend = c10d::ProcessGroup;
#endif

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::Product:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& main_address) {
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  }
  if (is_loopback(main_address)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

struct Collective::Impl {
  c10::intrusive_ptr<GroupBackend> group;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed; subgroups prefix it further
  CollectiveOptions options;
  std::string backend;
  int rank = 0;
  int world_size = 1;
  uint64_t operations = 0;
};

c10::intrusive_ptr<c10d::Store> host_store(const std::string& host, int port, std::chrono::milliseconds timeout,
                                           int* bound_port) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
  if (bound_port != nullptr) *bound_port = store->getPort();
  return store;
}

Collective::Collective(const CollectiveOptions& options, c10::intrusive_ptr<c10d::Store> store)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = options.rank;
  impl_->world_size = options.world_size;
  impl_->backend = options.backend;
  c10::intrusive_ptr<c10d::Store> base;
  if (store) {
    base = store;
  } else {
    c10d::TCPStoreOptions tcp;
    tcp.port = static_cast<uint16_t>(options.main_port);
    tcp.isServer = !options.use_agent_store && options.rank == 0;
    tcp.waitWorkers = false;
    tcp.timeout = options.timeout;
    base = c10::make_intrusive<c10d::TCPStore>(options.main_address, tcp);
  }
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(options.restart_count), base);
  impl_->options = options;
  create_group();
}

void Collective::create_group() {
  const CollectiveOptions& options = impl_->options;
  if (options.backend == "gloo") {
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo->devices.push_back(gloo_device(options.main_address));
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, impl_->rank, impl_->world_size, gloo);
  } else if (options.backend == "nccl") {
#ifdef USE_C10D_NCCL
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = options.timeout;
    impl_->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, impl_->rank, impl_->world_size, nccl);
#else
    throw RuntimeError("The nccl backend is not available: this LibTorch was built without NCCL. Use a CUDA "
                       "LibTorch (CMAKE_PREFIX_PATH) or accelerator=\"cpu\" (gloo).");
#endif
  } else {
    throw ValueError("Collective backend \"" + options.backend + "\" is not supported. Choose gloo or nccl.");
  }
}

Collective::Collective(const Collective& parent, const std::string& name, const std::vector<int>& ranks)
    : impl_(std::make_unique<Impl>()) {
  const auto position = std::find(ranks.begin(), ranks.end(), parent.rank());
  LF_CHECK(position != ranks.end(), ValueError, "Collective subgroup '", name, "': rank ", parent.rank(),
           " is not one of its ranks.");
  impl_->options = parent.impl_->options;
  impl_->backend = parent.impl_->backend;
  impl_->rank = static_cast<int>(position - ranks.begin());
  impl_->world_size = static_cast<int>(ranks.size());
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/subgroup/" + name, parent.impl_->store);
  create_group();
}

Collective::~Collective() = default;

int Collective::rank() const { return impl_->rank; }
uint64_t Collective::operation_count() const { return impl_->operations; }
int Collective::world_size() const { return impl_->world_size; }
const std::string& Collective::backend() const { return impl_->backend; }

void Collective::barrier() {
  ++impl_->operations;
  impl_->group->barrier()->wait();
}

void Collective::all_reduce_many_(std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  for (auto& tensor : tensors) {
    ++impl_->operations;
    std::vector<at::Tensor> one{tensor};
    works.push_back(impl_->group->allreduce(one, options));
  }
  for (auto& work : works) work->wait();
  if (op == ReduceOp::Mean) {
    for (auto& tensor : tensors) tensor.div_(impl_->world_size);
  }
}

std::function<void()> Collective::all_reduce_start_(at::Tensor& tensor) {
  ++impl_->operations;
  std::vector<at::Tensor> one{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  auto work = impl_->group->allreduce(one, options);
  return [work] { work->wait(); };
}

void Collective::all_reduce_(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> one{tensor};
  all_reduce_many_(one, op);
}

at::Tensor Collective::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int i = 0; i < impl_->world_size; ++i) output[0].push_back(at::empty_like(input[0]));
  ++impl_->operations;
  impl_->group->allgather(output, input)->wait();
  return at::stack(output[0]);
}

at::Tensor Collective::reduce_scatter_rows(const at::Tensor& rows) {
  LF_CHECK(rows.dim() == 2 && rows.size(0) == impl_->world_size, ValueError,
           "reduce_scatter_rows: expected a [world_size, n] tensor, got ", rows.sizes(), ".");
  if (impl_->world_size == 1) return rows[0].clone();
  // Gloo has no reduce-scatter: an all-to-all sends row j to rank j, then each rank sums what it got.
  at::Tensor input = rows.contiguous(), received = at::empty_like(input);
  std::vector<int64_t> equal_splits;
  ++impl_->operations;
  impl_->group->alltoall_base(received, input, equal_splits, equal_splits)->wait();
  return received.sum(0);
}

void Collective::broadcast_(at::Tensor& tensor, int src) {
  std::vector<at::Tensor> one{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  ++impl_->operations;
  impl_->group->broadcast(one, options)->wait();
}

std::string Collective::broadcast_bytes(const std::string& bytes, int src) {
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  broadcast_(size, src);
  at::Tensor data = at::empty({size.item<int64_t>()}, at::kByte);
  if (impl_->rank == src) std::copy(bytes.begin(), bytes.end(), data.data_ptr<uint8_t>());
  broadcast_(data, src);
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(data.numel()));
}

}  // namespace lightning::fabric
