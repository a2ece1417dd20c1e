#include "lightning/fabric/plugins/collectives/collective.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // gloo names: src/internal/gloo_interface
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "internal/wait_for_listener.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/flight_recorder.h"
#include "plugins/collectives/hang_watchdog.h"
#include "plugins/collectives/shm_backend.h"

namespace lightning::fabric {
namespace {
// What ProcessGroupGloo and ProcessGroupNCCL derive from: every collective goes through its
// virtual functions, whose code lives in LibTorch.
using GroupBackend = c10d::Backend;

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Mean:
      return c10d::ReduceOp::AVG;
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

std::string seconds_text(std::chrono::milliseconds duration) {
  std::ostringstream text;
  text << duration.count() / 1000.0 << " s";
  return text.str();
}

// Joins (rank 0: hosts) the TCPStore. A client first waits, quietly, for rank 0's store to listen,
// up to the rendezvous timeout; if it never does, the error says why that happens.
c10::intrusive_ptr<c10d::Store> connect_store(const CollectiveOptions& options) {
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(options.main_port);
  tcp.isServer = !options.use_agent_store && options.rank == 0;
  tcp.waitWorkers = false;
  tcp.timeout = options.rendezvous_timeout;
  LF_CHECK(tcp.isServer || internal::wait_for_listener(options.main_address, options.main_port, options.rendezvous_timeout),
           RuntimeError, "Rank ", options.rank, " could not reach the store ",
           options.use_agent_store ? "of the launcher" : "of rank 0", " at ", options.main_address, ":",
           options.main_port, " within the rendezvous timeout (", seconds_text(options.rendezvous_timeout), "): ",
           options.use_agent_store ? "the launcher is gone" : "rank 0 did not start or failed before joining",
           ", or the address is wrong. Set the timeout with LT_RENDEZVOUS_TIMEOUT (seconds) or "
           "DDPOptions::rendezvous_timeout.");
  return c10::make_intrusive<c10d::TCPStore>(options.main_address, tcp);
}

// Every rank announces itself and waits until all world_size ranks have: a rank that died before
// joining is named within the rendezvous timeout instead of hanging its peers in the first collective.
void await_all_ranks(c10d::Store& store, const CollectiveOptions& options) {
  const std::string counter = "lightning_fabric/arrivals";
  store.set("lightning_fabric/arrived/" + std::to_string(options.rank), std::vector<uint8_t>{'1'});
  int64_t arrived = store.add(counter, 1);
  const auto deadline = std::chrono::steady_clock::now() + options.rendezvous_timeout;
  auto pause = std::chrono::milliseconds(2);
  while (arrived < options.world_size) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (int rank = 0; rank < options.world_size; ++rank) {
        if (!store.check({"lightning_fabric/arrived/" + std::to_string(rank)})) missing.push_back(std::to_string(rank));
      }
      std::string names;
      for (const auto& rank : missing) names += (names.empty() ? "" : ", ") + rank;
      throw RuntimeError("Rank" + std::string(missing.size() == 1 ? " " : "s ") + names + " of " +
                         std::to_string(options.world_size) + " did not join the process group within the "
                         "rendezvous timeout (" + seconds_text(options.rendezvous_timeout) + "): " +
                         (missing.size() == 1 ? "it" : "they") + " failed before joining or never started; see " +
                         (missing.size() == 1 ? "its" : "their") + " output. Set the timeout with "
                         "LT_RENDEZVOUS_TIMEOUT (seconds) or DDPOptions::rendezvous_timeout.");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
    arrived = store.add(counter, 0);
  }
}

}  // namespace

struct Collective::Impl {
  c10::intrusive_ptr<GroupBackend> group;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed; subgroups prefix it further
  CollectiveOptions options;
  std::string backend;
  at::Device device = at::kCPU;
  int rank = 0;
  int world_size = 1;
  uint64_t operations = 0;
  std::string name = "world";                 // in flight records
  flight::Recorder* recorder = nullptr;       // the process's; null: recording off
  bool owns_watchdog = false;                 // this group started the watchdog and stops it
  bool ops_run_in_call = false;               // the backend (shm) completes each op inside its call
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
  impl_->device = options.backend == "nccl" ? options.device : at::Device(at::kCPU);
  LF_CHECK(options.backend != "nccl" || impl_->device.is_cuda(), ValueError, "Collective: the nccl backend needs a "
           "CUDA device (CollectiveOptions::device), got ", impl_->device, ". Use gloo for CPU tensors.");
  LF_CHECK(options.rendezvous_timeout.count() > 0, ValueError, "Collective: rendezvous_timeout must be positive.");
  c10::intrusive_ptr<c10d::Store> base = store ? store : connect_store(options);
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(options.restart_count), base);
  impl_->options = options;
  await_all_ranks(*impl_->store, options);
  base->setTimeout(options.timeout);  // from here on the store serves the collectives
  create_group();
  start_watch(store);
}

void Collective::start_watch(const c10::intrusive_ptr<c10d::Store>& hosted) {
  const CollectiveOptions& options = impl_->options;
  if (options.world_size < 2 || options.flight_records == 0) return;
  const std::string file = options.flight_dir.empty()
                               ? std::string()
                               : options.flight_dir + "/rank_" + std::to_string(options.rank) + ".flight";
  if (flight::Recorder::process() == nullptr) {
    flight::Recorder::install(flight::Recorder::create(options.rank, options.world_size, options.flight_records, file));
  }
  impl_->recorder = flight::Recorder::process();
  impl_->recorder->header().hang_timeout_ms = options.hang_timeout.count();
  internal::WatchdogSettings watch;
  watch.rank = options.rank;
  watch.world_size = options.world_size;
  watch.hang_timeout = options.hang_timeout;
  watch.launcher_watches = !options.flight_dir.empty();
  watch.store_host = options.main_address;
  watch.store_port = options.main_port;
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(hosted.get())) watch.store_port = tcp->getPort();
  watch.store_prefix = "/worker/attempt_" + std::to_string(options.restart_count);
  watch.dump_dir = options.hang_dump_dir;
  watch.error_file = options.error_file;
  impl_->owns_watchdog = internal::start_hang_watchdog(watch);
}

void apply_watch_environment(const env::EnvLookup& env, CollectiveOptions& options) {
  const env::Reader reader(env);
  if (auto seconds = reader.seconds(env::kHangTimeout)) {  // 0 turns hang detection off
    options.hang_timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  }
  if (auto records = reader.integer(env::kFlightRecords)) {
    LF_CHECK(*records >= 0 && *records <= 1000000, ValueError, env::kFlightRecords, "=\"", *env(env::kFlightRecords),
             "\" is not valid: give the number of collectives the flight recorder keeps, 0 to 1000000 "
             "(default 2048; 0 turns recording and hang detection off).");
    options.flight_records = static_cast<uint32_t>(*records);
  }
  options.flight_dir = reader.text(env::kFlightDir).value_or(options.flight_dir);
  options.hang_dump_dir = reader.text(env::kHangDumpDir).value_or(options.hang_dump_dir);
  options.error_file = reader.text(env::kErrorFile).value_or(options.error_file);
  // 1: compare every collective's op, dtype and shape across ranks.
  options.check_collectives = reader.flag(env::kCheckCollectives, options.check_collectives);
}

namespace {
// Whether every rank of the group runs on rank 0's machine: each rank publishes its host name,
// rank 0 compares them and publishes the verdict, so every rank gets the same answer. Collective.
bool all_ranks_on_one_host(c10d::Store& store, int rank, int world_size) {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  const std::string host(name);
  store.set("cpu-auto/host/" + std::to_string(rank), std::vector<uint8_t>(host.begin(), host.end()));
  if (rank == 0) {
    bool same = true;
    for (int peer = 1; peer < world_size; ++peer) {
      const std::vector<uint8_t> other = store.get("cpu-auto/host/" + std::to_string(peer));
      same = same && std::string(other.begin(), other.end()) == host;
    }
    store.set("cpu-auto/verdict", std::vector<uint8_t>{static_cast<uint8_t>(same ? 1 : 0)});
  }
  return store.get("cpu-auto/verdict").at(0) == 1;
}
}  // namespace

void Collective::create_group() {
  CollectiveOptions& options = impl_->options;
  if (options.backend == "cpu-auto") {
    const bool one_host = options.world_size > 1 && all_ranks_on_one_host(*impl_->store, impl_->rank, impl_->world_size);
    options.backend = one_host ? "shm" : "gloo";
    impl_->backend = options.backend;
  }
  impl_->ops_run_in_call = options.backend == "shm";
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
  } else if (options.backend == "shm") {
    impl_->group = c10::make_intrusive<internal::ShmBackend>(impl_->store, impl_->rank, impl_->world_size, options.timeout);
  } else {
    throw ValueError("Collective backend \"" + options.backend + "\" is not supported. Choose gloo, nccl or shm.");
  }
}

Collective::Collective(const Collective& parent, const std::string& name, const std::vector<int>& ranks,
                       const std::string& backend)
    : impl_(std::make_unique<Impl>()) {
  const auto position = std::find(ranks.begin(), ranks.end(), parent.rank());
  LF_CHECK(position != ranks.end(), ValueError, "Collective subgroup '", name, "': rank ", parent.rank(),
           " is not one of its ranks.");
  impl_->options = parent.impl_->options;
  if (!backend.empty()) {
    LF_CHECK(backend == "gloo" || backend == "shm", ValueError, "Collective subgroup '", name, "': backend \"",
             backend, "\" is not valid for a subgroup. Choose gloo or shm, or leave it empty (the parent's).");
    impl_->options.backend = backend;
  }
  impl_->backend = impl_->options.backend;
  impl_->device = impl_->options.backend == "nccl" ? parent.impl_->device : at::Device(at::kCPU);
  impl_->rank = static_cast<int>(position - ranks.begin());
  impl_->world_size = static_cast<int>(ranks.size());
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/subgroup/" + name, parent.impl_->store);
  impl_->name = name;
  impl_->recorder = parent.impl_->recorder;
  create_group();
}

Collective::~Collective() {
  if (impl_->owns_watchdog) internal::stop_hang_watchdog();
}

int Collective::rank() const { return impl_->rank; }
uint64_t Collective::operation_count() const { return impl_->operations; }
int Collective::world_size() const { return impl_->world_size; }
const std::string& Collective::backend() const { return impl_->backend; }
at::Device Collective::device() const { return impl_->device; }

namespace {
// The tensor a collective works on: tensor itself when it is on the group's device and contiguous,
// else a contiguous copy there. write_back() copies the result into tensor when they differ.
struct Staged {
  at::Tensor& original;
  at::Tensor work;
  Staged(at::Tensor& tensor, at::Device device)
      : original(tensor),
        work(tensor.device() == device && tensor.is_contiguous() ? tensor : tensor.to(device).contiguous()) {}
  void write_back() {
    if (!work.is_same(original)) original.copy_(work);
  }
};
}  // namespace

namespace {
// What check_call compares: the op, then dtype, rank and up to five sizes of its tensor.
enum CallOp { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };
const char* op_name(int64_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
  }
  return "?";
}
// Python's names (float32, not Float): the recorder and the mismatch errors print them.
const char* dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(type);
  }
}

constexpr int64_t kCallFields = 8;

std::string call_text(const int64_t* fields) {
  std::ostringstream text;
  text << op_name(fields[0]);
  if (fields[1] < 0) return text.str();
  text << " " << dtype_name(static_cast<c10::ScalarType>(fields[1])) << "[";
  for (int64_t d = 0; d < std::min<int64_t>(fields[2], 5); ++d) text << (d ? ", " : "") << fields[3 + d];
  text << (fields[2] > 5 ? ", ...]" : "]");
  return text.str();
}

flight::Scope record(flight::Recorder* recorder, const char* op, const std::string& group, const at::Tensor* tensor) {
  if (tensor == nullptr) return flight::Scope(recorder, op, group, "", nullptr, 0, 0);
  return flight::Scope(recorder, op, group, dtype_name(tensor->scalar_type()), tensor->sizes().data(),
                       tensor->sizes().size(), static_cast<uint64_t>(tensor->numel()));
}
}  // namespace

namespace {
// Issues an asynchronous op under the recorder. The shm backend runs its ops inside the call, so
// there the rank is marked waiting before it; an op that fails at issue ends its record as failed.
template <class Issue>
c10::intrusive_ptr<c10d::Work> issue_recorded(flight::Recorder* recorder, uint64_t seq, bool runs_in_call,
                                              Issue&& issue) {
  if (recorder != nullptr && runs_in_call) recorder->wait(seq);
  try {
    return issue();
  } catch (...) {
    if (recorder != nullptr) recorder->end(seq, true);
    throw;
  }
}
}  // namespace

void Collective::check_call(int op, const at::Tensor* tensor) {
  if (!impl_->options.check_collectives || impl_->world_size < 2) return;
  at::Tensor mine = at::full({kCallFields}, -1, at::kLong);
  int64_t* fields = mine.data_ptr<int64_t>();
  fields[0] = op;
  if (tensor != nullptr) {
    fields[1] = static_cast<int64_t>(tensor->scalar_type());
    fields[2] = tensor->dim();
    for (int64_t d = 0; d < std::min<int64_t>(tensor->dim(), 5); ++d) fields[3 + d] = tensor->size(d);
    if (tensor->dim() > 5) fields[7] = tensor->numel();
  }
  at::Tensor input = mine.to(impl_->device);
  at::Tensor output = at::empty({impl_->world_size * kCallFields}, input.options());
  impl_->group->_allgather_base(output, input)->wait();
  at::Tensor all = output.cpu();
  const int64_t* rows = all.data_ptr<int64_t>();
  bool same = true;
  for (int r = 1; r < impl_->world_size && same; ++r) {
    same = std::equal(rows, rows + kCallFields, rows + r * kCallFields);
  }
  if (same) return;
  std::ostringstream ranks;
  for (int r = 0; r < impl_->world_size; ++r) ranks << (r ? "; " : "") << "rank " << r << ": " << call_text(rows + r * kCallFields);
  const uint64_t seq = impl_->recorder ? impl_->recorder->header().entered.load() : 0;
  throw ValueError("Collective mismatch on group " + impl_->name + (seq ? " at collective #" + std::to_string(seq) : "") +
                   " (" + ranks.str() + "). Every rank must issue the same collectives in the same order, with the "
                   "same dtype and shape; found by LT_CHECK_COLLECTIVES=1 before any data moved.");
}

void Collective::check_same_tensors(const std::vector<at::Tensor>& tensors, const std::string& what) {
  if (impl_->world_size < 2) return;
  int64_t elements = 0;
  uint64_t layout = 1469598103934665603ULL;  // FNV-1a over dtypes and shapes
  const auto mix = [&layout](int64_t value) { layout = (layout ^ static_cast<uint64_t>(value)) * 1099511628211ULL; };
  for (const auto& tensor : tensors) {
    elements += tensor.numel();
    mix(static_cast<int64_t>(tensor.scalar_type()));
    mix(tensor.dim());
    for (int64_t size : tensor.sizes()) mix(size);
  }
  at::Tensor mine = at::tensor({static_cast<int64_t>(tensors.size()), elements, static_cast<int64_t>(layout)}, at::kLong);
  at::Tensor input = mine.to(impl_->device);
  at::Tensor output = at::empty({impl_->world_size * 3}, input.options());
  ++impl_->operations;
  {
    auto scope = record(impl_->recorder, "all_gather", impl_->name, &input);
    impl_->group->_allgather_base(output, input)->wait();
  }
  at::Tensor all = output.cpu();
  const int64_t* rows = all.data_ptr<int64_t>();
  bool same = true;
  for (int r = 1; r < impl_->world_size; ++r) same = same && std::equal(rows, rows + 3, rows + 3 * r);
  if (same) return;
  std::ostringstream ranks;
  for (int r = 0; r < impl_->world_size; ++r) {
    ranks << (r ? "; " : "") << "rank " << r << ": " << rows[3 * r] << " tensors, " << rows[3 * r + 1] << " elements";
  }
  throw ValueError(what + " differs across ranks (" + ranks.str() + (rows[0] == rows[3] && rows[1] == rows[4] ?
                   "; the counts agree but dtypes or shapes differ" : "") +
                   "). Every rank must build the same model: check code that depends on the rank or on per-rank files.");
}

void Collective::barrier() {
  ++impl_->operations;
  c10d::BarrierOptions options;
  if (impl_->device.is_cuda()) options.device_ids = {impl_->device.index()};  // else NCCL guesses a GPU
  auto scope = record(impl_->recorder, "barrier", impl_->name, nullptr);
  check_call(kBarrier, nullptr);
  impl_->group->barrier(options)->wait();
}

void Collective::all_reduce_many_(std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<Staged> staged;
  staged.reserve(tensors.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<uint64_t> seqs;
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  flight::Recorder* recorder = impl_->recorder;
  for (auto& tensor : tensors) {
    ++impl_->operations;
    staged.emplace_back(tensor, impl_->device);
    const at::Tensor& work = staged.back().work;
    if (recorder) {
      seqs.push_back(recorder->begin("all_reduce", impl_->name, dtype_name(work.scalar_type()), work.sizes().data(),
                                     work.sizes().size(), static_cast<uint64_t>(work.numel())));
    }
    if (impl_->options.check_collectives) {
      if (recorder) recorder->wait(seqs.back());
      try {
        check_call(kAllReduce, &work);
      } catch (...) {
        if (recorder) recorder->end(seqs.back(), true);
        throw;
      }
    }
    std::vector<at::Tensor> one{work};
    works.push_back(issue_recorded(recorder, recorder ? seqs.back() : 0, impl_->ops_run_in_call,
                                   [&] { return impl_->group->allreduce(one, options); }));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    if (!recorder) {
      works[i]->wait();
      continue;
    }
    recorder->wait(seqs[i]);
    try {
      works[i]->wait();
    } catch (...) {
      recorder->end(seqs[i], true);
      throw;
    }
    recorder->end(seqs[i], false);
  }
  for (auto& stage : staged) stage.write_back();
}

std::function<void()> Collective::all_reduce_start_(at::Tensor& tensor) {
  LF_CHECK(tensor.device() == impl_->device && tensor.is_contiguous(), ValueError, "Collective::all_reduce_start_: "
           "the tensor must be contiguous and on the group's device ", impl_->device, ", got ", tensor.device(), ".");
  ++impl_->operations;
  flight::Recorder* recorder = impl_->recorder;
  const uint64_t seq = recorder ? recorder->begin("all_reduce", impl_->name, dtype_name(tensor.scalar_type()),
                                                  tensor.sizes().data(), tensor.sizes().size(),
                                                  static_cast<uint64_t>(tensor.numel()))
                                : 0;
  if (impl_->options.check_collectives) {
    if (recorder) recorder->wait(seq);
    check_call(kAllReduce, &tensor);
  }
  std::vector<at::Tensor> one{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  auto work = issue_recorded(recorder, seq, impl_->ops_run_in_call, [&] { return impl_->group->allreduce(one, options); });
  return [work, recorder, seq]() -> void {
    if (!recorder) {
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
  };
}

void Collective::all_reduce_(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> one{tensor};
  all_reduce_many_(one, op);
}

at::Tensor Collective::all_gather(const at::Tensor& tensor) {
  std::vector<int64_t> shape{impl_->world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  // Nothing to move (and gloo divides by the element count) when every rank's part is empty:
  // LT_CHECK_COLLECTIVES=1 confirms that the others are empty too.
  if (tensor.numel() == 0) {
    auto scope = record(impl_->recorder, "all_gather", impl_->name, &tensor);
    check_call(kAllGather, &tensor);
    return at::empty(shape, tensor.options());
  }
  // Flat on both sides: c10d splits the output into world_size chunks shaped like the input.
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty({impl_->world_size * input.numel()}, input.options());
  ++impl_->operations;
  {
    auto scope = record(impl_->recorder, "all_gather", impl_->name, &tensor);
    check_call(kAllGather, &tensor);
    impl_->group->_allgather_base(output, input)->wait();
  }
  return output.view(shape).to(tensor.device());
}

at::Tensor Collective::reduce_scatter_rows(const at::Tensor& rows) {
  LF_CHECK(rows.dim() == 2 && rows.size(0) == impl_->world_size, ValueError,
           "reduce_scatter_rows: expected a [world_size, n] tensor, got ", rows.sizes(), ".");
  if (impl_->world_size == 1) return rows[0].clone();
  at::Tensor input = rows.to(impl_->device).contiguous().view(-1);  // c10d wants it flat
  at::Tensor output = at::empty({rows.size(1)}, input.options());
  ++impl_->operations;
  {
    auto scope = record(impl_->recorder, "reduce_scatter", impl_->name, &rows);
    check_call(kReduceScatter, &rows);
    impl_->group->_reduce_scatter_base(output, input)->wait();
  }
  return output.to(rows.device());
}

void Collective::broadcast_(at::Tensor& tensor, int src) {
  Staged stage(tensor, impl_->device);
  std::vector<at::Tensor> one{stage.work};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  ++impl_->operations;
  {
    auto scope = record(impl_->recorder, "broadcast", impl_->name, &stage.work);
    check_call(kBroadcast, &stage.work);
    impl_->group->broadcast(one, options)->wait();
  }
  stage.write_back();
}

at::Tensor Collective::all_to_all(const at::Tensor& tensor) {
  LF_CHECK(tensor.numel() % impl_->world_size == 0, ValueError, "all_to_all: ", tensor.numel(),
           " elements do not split into ", impl_->world_size, " equal parts.");
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty_like(input);
  if (input.numel() > 0) {
    std::vector<int64_t> equal;
    ++impl_->operations;
    auto scope = record(impl_->recorder, "all_to_all", impl_->name, &input);
    impl_->group->alltoall_base(output, input, equal, equal)->wait();
  }
  return output.to(tensor.device());
}

std::string Collective::broadcast_bytes(const std::string& bytes, int src) {
  // CPU tensors: broadcast_ stages them through the group's device.
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  broadcast_(size, src);
  const int64_t count = size.item<int64_t>();
  at::Tensor data = at::empty({count}, at::kByte);
  if (impl_->rank == src) std::copy(bytes.begin(), bytes.end(), data.data_ptr<uint8_t>());
  if (count > 0) broadcast_(data, src);
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(count));
}

}  // namespace lightning::fabric
