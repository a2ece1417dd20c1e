#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/shm_backend.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <torch/csrc/distributed/c10d/Backend.hpp>
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
// What ProcessGroupGloo and ProcessGroupNCCL derive from: every collective goes through its
// virtual functions, whose code lives in LibTorch.
using GroupBackend = c10d::Backend;

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

}  // namespace

struct Collective::Impl {
  c10::intrusive_ptr<GroupBackend> group;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed; subgroups prefix it further
  CollectiveOptions options;
  ProcessGroupBackend backend = ProcessGroupBackend::Gloo;  // as resolved (after the host vote)
  at::Device device = at::kCPU;
  int rank = 0;
  int world_size = 1;
  uint64_t operations = 0;
  std::string name = "world";                 // in flight records
  flight::Recorder* recorder = nullptr;       // the process's; null: recording off
  bool owns_watchdog = false;                 // this group started the watchdog and stops it
  bool ops_run_in_call = false;               // the backend (shm) completes each op inside its call
  internal::HostLayout layout;                // from the host vote; one host when there was none
  int group_names = 0;                        // next_group_name calls so far
  std::map<int, std::unique_ptr<Collective>> pairs;  // pair_with's groups, by peer
  std::vector<int> global_ranks;              // each member's rank in the job, by group rank
};

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
  // A subgroup of an shm+gloo job may span hosts with any number of ranks each: gloo, unless named.
  const ProcessGroupBackend inherited =
      parent.impl_->backend == ProcessGroupBackend::ShmGloo ? ProcessGroupBackend::Gloo : parent.impl_->backend;
  impl_->backend = backend.value_or(inherited);
  LF_CHECK(!backend || *backend == ProcessGroupBackend::Gloo || *backend == ProcessGroupBackend::Shm, ValueError,
           "Collective subgroup '", name, "': backend \"", to_string(*backend), "\" is not valid for a subgroup. "
           "Choose gloo or shm, or leave it unset (the parent's; gloo under shm+gloo).");
  impl_->device = impl_->backend == ProcessGroupBackend::Nccl ? parent.impl_->device : at::Device(at::kCPU);
  impl_->rank = static_cast<int>(position - ranks.begin());
  impl_->world_size = static_cast<int>(ranks.size());
  for (int member : ranks) impl_->global_ranks.push_back(parent.impl_->global_ranks.at(static_cast<size_t>(member)));
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("/subgroup/" + name, parent.impl_->store);
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
enum CallOp { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier, kReduce, kGather, kScatter, kAllToAll, kSend, kRecv };
const char* op_name(int64_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kReduce: return "reduce";
    case kGather: return "gather";
    case kScatter: return "scatter";
    case kAllToAll: return "all_to_all";
    case kSend: return "send";
    case kRecv: return "recv";
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

std::string call_name(uint64_t seq, const char* op, const std::string& group, const at::Tensor* tensor) {
  std::ostringstream name;
  if (seq != 0) name << "#" << seq << " ";
  name << op;
  if (tensor != nullptr) name << " " << dtype_name(tensor->scalar_type()) << tensor->sizes();
  name << " on " << group;
  return name.str();
}

// One blocking collective: its flight record and its profiler range, for the enclosing block.
class RecordedCall {
 public:
  RecordedCall(flight::Recorder* recorder, const char* op, const std::string& group, const at::Tensor* tensor)
      : scope_(recorder, op, group, tensor ? dtype_name(tensor->scalar_type()) : "",
               tensor ? tensor->sizes().data() : nullptr, tensor ? tensor->sizes().size() : 0,
               tensor ? static_cast<uint64_t>(tensor->numel()) : 0),
        range_([&] { return call_name(scope_.seq(), op, group, tensor); }) {}

 private:
  flight::Scope scope_;
  ProfiledRange range_;
};

RecordedCall record(flight::Recorder* recorder, const char* op, const std::string& group, const at::Tensor* tensor) {
  return RecordedCall(recorder, op, group, tensor);
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
  if (impl_->options.settings.check_collectives) compare_calls(op, tensor, "");
}

void Collective::check_same_shapes(const std::string& call, const at::Tensor& tensor) {
  ++impl_->operations;
  auto scope = record(impl_->recorder, "all_gather", impl_->name, nullptr);
  compare_calls(kAllGather, &tensor, call);
}

void Collective::compare_calls(int op, const at::Tensor* tensor, const std::string& call) {
  if (impl_->world_size < 2) return;
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
  for (int r = 0; r < impl_->world_size; ++r) {
    // The public calls name ranks as the job does; the generic check names the group's ranks.
    const int shown = call.empty() ? r : impl_->global_ranks[static_cast<size_t>(r)];
    ranks << (r ? "; " : "") << "rank " << shown << ": " << call_text(rows + r * kCallFields);
  }
  if (!call.empty()) {
    throw ValueError(call + ": every member of group " + impl_->name + " must pass a tensor of the same dtype and shape, "
                     "but they differ (" + ranks.str() + "). Pad each rank's tensor to the largest shape (gather the "
                     "sizes first to know it), or gather a list of equal-shaped pieces.");
  }
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

void Collective::run_blocking(int op, const at::Tensor* tensor, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  ++impl_->operations;
  auto scope = record(impl_->recorder, op_name(op), impl_->name, tensor);
  if (op != kSend && op != kRecv) check_call(op, tensor);  // point-to-point: the peer alone takes part
  issue()->wait();
}

void Collective::barrier() {
  c10d::BarrierOptions options;
  if (impl_->device.is_cuda()) options.device_ids = {impl_->device.index()};  // else NCCL guesses a GPU
  run_blocking(kBarrier, nullptr, [&] { return impl_->group->barrier(options); });
}

uint64_t Collective::begin_async(int op, const at::Tensor& tensor) {
  ++impl_->operations;
  flight::Recorder* recorder = impl_->recorder;
  const uint64_t seq = recorder ? recorder->begin(op_name(op), impl_->name, dtype_name(tensor.scalar_type()),
                                                  tensor.sizes().data(), tensor.sizes().size(),
                                                  static_cast<uint64_t>(tensor.numel()))
                                : 0;
  if (impl_->options.settings.check_collectives && op != kSend && op != kRecv) {  // point-to-point: the peer alone
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

c10::intrusive_ptr<c10d::Work> Collective::issue_all_reduce(at::Tensor& work, ReduceOp op, uint64_t& seq) {
  flight::Recorder* recorder = impl_->recorder;
  seq = begin_async(kAllReduce, work);
  std::vector<at::Tensor> one{work};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  return issue_recorded(recorder, seq, impl_->ops_run_in_call, [&] { return impl_->group->allreduce(one, options); });
}

void Collective::all_reduce_many_(std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<Staged> staged;
  staged.reserve(tensors.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<uint64_t> seqs(tensors.size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    staged.emplace_back(tensors[i], impl_->device);
    works.push_back(issue_all_reduce(staged.back().work, op, seqs[i]));
  }
  for (size_t i = 0; i < works.size(); ++i) wait_recorded(works[i], seqs[i]);
  for (auto& stage : staged) stage.write_back();
}

std::function<void()> Collective::all_reduce_start_(at::Tensor& tensor) {
  LF_CHECK(tensor.device() == impl_->device && tensor.is_contiguous(), ValueError, "Collective::all_reduce_start_: "
           "the tensor must be contiguous and on the group's device ", impl_->device, ", got ", tensor.device(), ".");
  uint64_t seq = 0;
  auto work = issue_all_reduce(tensor, ReduceOp::Sum, seq);
  return [this, work, seq]() -> void { wait_recorded(work, seq); };
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
  run_blocking(kAllGather, &tensor, [&] { return impl_->group->_allgather_base(output, input); });
  return output.view(shape).to(tensor.device());
}

std::function<at::Tensor()> Collective::all_gather_start(const at::Tensor& tensor) {
  if (tensor.numel() == 0 || impl_->world_size == 1) {
    at::Tensor result = all_gather(tensor);
    return [result] { return result; };
  }
  std::vector<int64_t> shape{impl_->world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty({impl_->world_size * input.numel()}, input.options());
  flight::Recorder* recorder = impl_->recorder;
  const uint64_t seq = begin_async(kAllGather, tensor);
  auto* shm = dynamic_cast<internal::ShmBackend*>(impl_->group.get());
  auto work = issue_recorded(recorder, seq, /*runs_in_call=*/false, [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (shm == nullptr) return impl_->group->_allgather_base(output, input);
    return shm->in_background(c10d::OpType::_ALLGATHER_BASE, [shm, output, input]() mutable {
      shm->_allgather_base(output, input, c10d::AllgatherOptions());
    });
  });
  return [this, work, seq, output, shape, device = tensor.device()] {
    wait_recorded(work, seq);
    return output.view(shape).to(device);
  };
}

namespace {
// Mean as the sum divided by the group's size: c10d's AVG is NCCL's alone for reduce and
// reduce-scatter. Integer tensors have no mean here (as in all_reduce on gloo).
c10d::ReduceOp summed_for_mean(ReduceOp op, const at::Tensor& tensor, const char* call) {
  LF_CHECK(op != ReduceOp::Mean || tensor.is_floating_point() || tensor.is_complex(), ValueError, call, ": mean of a ",
           c10::toString(tensor.scalar_type()), " tensor; use sum (and divide) or pass a floating-point tensor.");
  return op == ReduceOp::Mean ? c10d::ReduceOp(c10d::ReduceOp::SUM) : to_c10d(op);
}
}  // namespace

at::Tensor Collective::reduce_scatter(const at::Tensor& rows, ReduceOp op) {
  LF_CHECK(rows.dim() >= 1 && rows.size(0) == impl_->world_size, ValueError, "reduce_scatter: expected a tensor of ",
           impl_->world_size, " rows (one per rank of the group) in its first dimension, got shape ", rows.sizes(), ".");
  const c10d::ReduceOp reduce_op = summed_for_mean(op, rows, "reduce_scatter");
  if (impl_->world_size == 1) return rows[0].clone();
  at::Tensor input = rows.to(impl_->device).contiguous().view(-1);  // c10d wants it flat
  at::Tensor output = at::empty(rows[0].sizes(), input.options());
  at::Tensor flat_output = output.view(-1);
  c10d::ReduceScatterOptions options;
  options.reduceOp = reduce_op;
  run_blocking(kReduceScatter, &rows, [&] { return impl_->group->_reduce_scatter_base(flat_output, input, options); });
  if (op == ReduceOp::Mean) output.div_(impl_->world_size);
  return output.to(rows.device());
}

at::Tensor Collective::reduce(const at::Tensor& tensor, int dst, ReduceOp op) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size, ValueError, "reduce: destination ", dst, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  const c10d::ReduceOp reduce_op = summed_for_mean(op, tensor, "reduce");
  at::Tensor work = tensor.to(impl_->device).contiguous().clone();
  if (impl_->world_size > 1) {
    std::vector<at::Tensor> one{work};
    run_blocking(kReduce, &work, [&] {
      if (impl_->backend == ProcessGroupBackend::Shm) {  // shm has no reduce: all ranks get the result
        c10d::AllreduceOptions options;
        options.reduceOp = reduce_op;
        return impl_->group->allreduce(one, options);
      }
      c10d::ReduceOptions options;
      options.reduceOp = reduce_op;
      options.rootRank = dst;
      return impl_->group->reduce(one, options);
    });
  }
  if (impl_->rank != dst) return tensor;
  if (op == ReduceOp::Mean) work.div_(impl_->world_size);
  return work.to(tensor.device());
}

at::Tensor Collective::gather(const at::Tensor& tensor, int dst) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size, ValueError, "gather: destination ", dst, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  if (impl_->world_size == 1 || impl_->backend == ProcessGroupBackend::Shm || tensor.numel() == 0) {
    at::Tensor all = all_gather(tensor);  // shm has no gather: every rank gathers, dst keeps it
    return impl_->rank == dst ? all : at::Tensor();
  }
  at::Tensor input = tensor.to(impl_->device).contiguous();
  std::vector<at::Tensor> inputs{input};
  std::vector<std::vector<at::Tensor>> outputs;
  at::Tensor stacked;
  if (impl_->rank == dst) {
    std::vector<int64_t> shape{impl_->world_size};
    shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
    stacked = at::empty(shape, input.options());
    outputs.emplace_back(stacked.unbind(0));
  }
  c10d::GatherOptions options;
  options.rootRank = dst;
  run_blocking(kGather, &input, [&] { return impl_->group->gather(outputs, inputs, options); });
  return impl_->rank == dst ? stacked.to(tensor.device()) : at::Tensor();
}

at::Tensor& Collective::scatter_(at::Tensor& output, const at::Tensor& rows, int src) {
  LF_CHECK(src >= 0 && src < impl_->world_size, ValueError, "scatter: source ", src, " is not a rank of the group (0..",
           impl_->world_size - 1, ").");
  if (impl_->rank == src) {
    std::vector<int64_t> shape{impl_->world_size};
    shape.insert(shape.end(), output.sizes().begin(), output.sizes().end());
    LF_CHECK(rows.defined() && rows.sizes() == at::IntArrayRef(shape) && rows.scalar_type() == output.scalar_type(),
             ValueError, "scatter: the source rank's rows must be ", c10::toString(output.scalar_type()), shape,
             " (one row shaped like the output per rank of the group), got ",
             rows.defined() ? c10::str(c10::toString(rows.scalar_type()), rows.sizes()) : std::string("none"), ".");
  }
  if (impl_->world_size == 1 || output.numel() == 0) {
    if (impl_->world_size == 1) output.copy_(rows[0]);
    return output;
  }
  Staged stage(output, impl_->device);
  if (impl_->backend == ProcessGroupBackend::Shm) {  // shm has no scatter: every rank gets the rows, keeps its own
    at::Tensor all = impl_->rank == src ? rows.to(impl_->device).contiguous().clone()
                                        : at::empty({impl_->world_size * output.numel()}, stage.work.options());
    all = all.view({impl_->world_size, -1});
    broadcast_(all, src);
    stage.work.view(-1).copy_(all[impl_->rank]);
  } else {
    std::vector<at::Tensor> outputs{stage.work};
    std::vector<std::vector<at::Tensor>> inputs;
    if (impl_->rank == src) inputs.emplace_back(rows.to(impl_->device).contiguous().unbind(0));
    c10d::ScatterOptions options;
    options.rootRank = src;
    run_blocking(kScatter, &stage.work, [&] { return impl_->group->scatter(outputs, inputs, options); });
  }
  stage.write_back();
  return output;
}

Collective& Collective::pair_with(int peer) {
  auto& pair = impl_->pairs[peer];
  if (!pair) {
    const int low = std::min(impl_->rank, peer);
    const int high = std::max(impl_->rank, peer);
    pair = std::make_unique<Collective>(*this, "p2p-" + std::to_string(low) + "-" + std::to_string(high),
                                        std::vector<int>{low, high}, ProcessGroupBackend::Gloo);
  }
  return *pair;
}

c10::intrusive_ptr<c10d::Work> Collective::point_to_point(
    int peer, const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, int)>& issue) {
  if (impl_->backend != ProcessGroupBackend::Shm) return issue(*impl_->group, peer);
  Collective& pair = pair_with(peer);
  return issue(*pair.impl_->group, peer > impl_->rank ? 1 : 0);
}

void Collective::send(const at::Tensor& tensor, int dst) {
  LF_CHECK(dst >= 0 && dst < impl_->world_size && dst != impl_->rank, ValueError, "send: destination ", dst,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  std::vector<at::Tensor> one{tensor.to(impl_->device).contiguous()};
  run_blocking(kSend, &one[0], [&] {
    return point_to_point(dst, [&](c10d::Backend& group, int peer) { return group.send(one, peer, 0); });
  });
}

void Collective::recv_(at::Tensor& tensor, int src) {
  LF_CHECK(src >= 0 && src < impl_->world_size && src != impl_->rank, ValueError, "recv: source ", src,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  Staged stage(tensor, impl_->device);
  std::vector<at::Tensor> one{stage.work};
  run_blocking(kRecv, &stage.work, [&] {
    return point_to_point(src, [&](c10d::Backend& group, int peer) { return group.recv(one, peer, 0); });
  });
  stage.write_back();
}


std::function<void()> Collective::send_start(const at::Tensor& tensor, int dst, int tag) {
  return start_point_to_point(kSend, tensor, dst, tag);
}

std::function<void()> Collective::recv_start_(at::Tensor& tensor, int src, int tag) {
  return start_point_to_point(kRecv, tensor, src, tag);
}

std::function<void()> Collective::start_point_to_point(int op, const at::Tensor& tensor, int peer, int tag) {
  const char* call = op == kSend ? "send_start" : "recv_start_";
  LF_CHECK(peer >= 0 && peer < impl_->world_size && peer != impl_->rank, ValueError, call, ": peer ", peer,
           " must be another rank of the group (0..", impl_->world_size - 1, ", not this rank ", impl_->rank, ").");
  LF_CHECK(tensor.device() == impl_->device && tensor.is_contiguous() && tag >= 0, ValueError, call, ": the tensor "
           "must be contiguous and on the group's device ", impl_->device, " and the tag non-negative; got ",
           tensor.device(), tensor.is_contiguous() ? "" : " (not contiguous)", ", tag ", tag, ".");
  const uint64_t seq = begin_async(op, tensor);
  std::vector<at::Tensor> one{tensor};
  auto work = issue_recorded(impl_->recorder, seq, /*runs_in_call=*/false, [&] {
    return point_to_point(peer, [&](c10d::Backend& group, int rank) {
      return op == kSend ? group.send(one, rank, tag) : group.recv(one, rank, tag);
    });
  });
  return [this, work, seq, one] { wait_recorded(work, seq); };  // one: the bytes stay alive until done
}

void Collective::connect_point_to_point(const std::vector<int>& peers) {
  if (impl_->backend != ProcessGroupBackend::Shm) return;  // gloo and nccl connect within the group itself
  for (int peer : peers) pair_with(peer);
}

void Collective::broadcast_(at::Tensor& tensor, int src) {
  Staged stage(tensor, impl_->device);
  std::vector<at::Tensor> one{stage.work};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  run_blocking(kBroadcast, &stage.work, [&] { return impl_->group->broadcast(one, options); });
  stage.write_back();
}

void Collective::broadcast_many_(const std::vector<at::Tensor>& tensors, int src, size_t bucket_bytes) {
  constexpr int64_t kAlignment = 16;  // each tensor's bytes start aligned for any dtype's view
  const auto aligned = [](int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; };
  size_t begin = 0;
  while (begin < tensors.size()) {
    const at::Device device = tensors[begin].device();
    size_t end = begin + 1;
    int64_t bytes = aligned(static_cast<int64_t>(tensors[begin].nbytes()));
    while (end < tensors.size() && tensors[end].device() == device &&
           static_cast<size_t>(bytes + aligned(static_cast<int64_t>(tensors[end].nbytes()))) <= bucket_bytes) {
      bytes += aligned(static_cast<int64_t>(tensors[end++].nbytes()));
    }
    if (bytes == 0) {  // nothing but empty tensors
      begin = end;
      continue;
    }
    // One broadcast of the bucket's bytes, whatever their dtypes (PyTorch sends one per dtype).
    at::Tensor bucket = at::empty({bytes}, at::TensorOptions(at::kByte).device(device));
    std::vector<int64_t> offsets;
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const at::Tensor& tensor = tensors[i];
      const int64_t size = static_cast<int64_t>(tensor.nbytes());
      if (size > 0) bucket.narrow(0, offset, size).copy_(tensor.contiguous().view(-1).view(at::kByte));
      offsets.push_back(offset);
      offset += aligned(size);
    }
    broadcast_(bucket, src);
    for (size_t i = begin; i < end; ++i) {
      at::Tensor target = tensors[i];
      const int64_t size = static_cast<int64_t>(target.nbytes());
      if (size == 0) continue;
      target.copy_(bucket.narrow(0, offsets[i - begin], size).view(target.scalar_type()).view(target.sizes()));
    }
    begin = end;
  }
}

at::Tensor Collective::all_to_all(const at::Tensor& tensor) {
  LF_CHECK(tensor.numel() % impl_->world_size == 0, ValueError, "all_to_all: ", tensor.numel(),
           " elements do not split into ", impl_->world_size, " equal parts.");
  at::Tensor input = tensor.to(impl_->device).contiguous().view(-1);
  at::Tensor output = at::empty_like(input);
  if (input.numel() > 0) {
    std::vector<int64_t> equal;
    run_blocking(kAllToAll, &input, [&] { return impl_->group->alltoall_base(output, input, equal, equal); });
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
