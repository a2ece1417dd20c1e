// Collective's cross-rank checks: check_call (LT_CHECK_COLLECTIVES), check_same_shapes and
// check_same_tensors.
#include "lightning/fabric/plugins/collectives/collective_impl.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/hang/flight_recorder.h"

namespace lightning::fabric {

namespace {
constexpr int64_t kCallFields = 8;

std::string call_text(const int64_t* fields) {
  std::ostringstream text;
  text << collective_detail::op_name(fields[0]);
  if (fields[1] < 0) return text.str();
  text << " " << collective_detail::dtype_name(static_cast<c10::ScalarType>(fields[1])) << "[";
  for (int64_t d = 0; d < std::min<int64_t>(fields[2], 5); ++d) text << (d ? ", " : "") << fields[3 + d];
  text << (fields[2] > 5 ? ", ...]" : "]");
  return text.str();
}
}  // namespace

void Collective::check_call(int op, const at::Tensor* tensor) {
  if (impl_->options.settings.check_collectives) compare_calls(op, tensor, "");
}

void Collective::check_same_shapes(const std::string& call, const at::Tensor& tensor) {
  ++impl_->operations;
  auto scope = collective_detail::record(impl_->recorder, "all_gather", impl_->name, nullptr);
  compare_calls(collective_detail::kAllGather, &tensor, call);
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
    auto scope = collective_detail::record(impl_->recorder, "all_gather", impl_->name, &input);
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

}  // namespace lightning::fabric
