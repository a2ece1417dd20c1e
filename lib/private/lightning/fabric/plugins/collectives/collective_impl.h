// What the sources of Collective (lib/src/plugins/collectives/collective*.cpp) share, private to
// them: the group's state (Collective::Impl), the staging of tensors through the group's device,
// the op codes that check_call compares, and the flight-recorder and profiler bookkeeping of each
// call. Header-only and in its own namespace, so that the sources can share a unity batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"
#include "lightning/fabric/utilities/profiled_range.h"

namespace lightning::fabric {

struct Collective::Impl {
  // What ProcessGroupGloo and ProcessGroupNCCL derive from: every collective goes through its
  // virtual functions, whose code lives in LibTorch.
  c10::intrusive_ptr<c10d::Backend> group;
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
  std::vector<int> global_ranks;              // each member's rank in the job, by group rank
};

namespace collective_detail {

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

// What check_call compares: the op, then dtype, rank and up to five sizes of its tensor.
enum CallOp { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier, kReduce, kGather, kScatter, kAllToAll, kSend, kRecv };
inline const char* op_name(int64_t op) {
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
inline const char* dtype_name(c10::ScalarType type) {
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

inline std::string call_name(uint64_t seq, const char* op, const std::string& group, const at::Tensor* tensor) {
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

inline RecordedCall record(flight::Recorder* recorder, const char* op, const std::string& group,
                           const at::Tensor* tensor) {
  return RecordedCall(recorder, op, group, tensor);
}

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

}  // namespace collective_detail
}  // namespace lightning::fabric
