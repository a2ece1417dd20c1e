#include "lightning/fabric/context_parallel/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lightning::fabric::context_parallel {
namespace {

constexpr int kKeyValueTag = 0;  // keys and values, forward and backward
constexpr int kGradientTag = 1;  // the key and value gradients' partial sums, backward

// A run of local rows [offset, offset + length) that hold the global positions
// [position, position + length).
struct Part {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t position = 0;
};

// How rank's local sequence of length maps to global positions. Without a causal mask positions
// do not matter: one part. Plain: one contiguous chunk; load-balanced: chunks rank and 2n-1-rank.
std::vector<Part> parts_of(int rank, int size, int64_t length, bool causal, bool load_balance) {
  if (!causal) return {Part{0, length, 0}};
  if (!load_balance) return {Part{0, length, rank * length}};
  const int64_t half = length / 2;
  return {Part{0, half, rank * half}, Part{half, half, (2 * static_cast<int64_t>(size) - 1 - rank) * half}};
}

// Under a causal mask, queries of part q see keys of part k (chunks of one length, aligned):
// all of them (k lies before q), none (after) or the lower triangle (the same chunk).
enum class Sees { None, All, Triangle };

Sees sees(bool causal, const Part& q, const Part& k) {
  if (!causal) return Sees::All;
  if (k.position == q.position) return Sees::Triangle;
  return k.position + k.length <= q.position ? Sees::All : Sees::None;
}

at::Tensor rows(const at::Tensor& tensor, const Part& part) { return tensor.narrow(2, part.offset, part.length); }

// Scores of queries against keys, scaled, -inf where the causal triangle hides a key.
at::Tensor scores_of(const at::Tensor& q, const at::Tensor& k, Sees how, double scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (how == Sees::Triangle) {
    const int64_t n = q.size(2);
    const at::Tensor hidden = at::ones({n, n}, q.options().dtype(at::kBool)).triu(1);
    scores.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  }
  return scores;
}

// Attention of one block of queries against one block of keys: its normalised output and the
// log-sum-exp of each query row's scores ([..., rows, 1]). Every row sees at least one key (the
// triangle keeps the diagonal), so the log-sum-exp is finite.
struct Partial {
  at::Tensor out;
  at::Tensor lse;
};

Partial attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Sees how, double scale) {
  const at::Tensor scores = scores_of(q, k, how, scale);
  at::Tensor lse = at::logsumexp(scores, {-1}, /*keepdim=*/true);
  return {at::matmul(at::exp(scores - lse), v), lse};
}

// Online softmax: the attention over the union of two key sets from each set's normalised
// output and log-sum-exp.
void merge(Partial& running, const Partial& block) {
  if (!running.out.defined()) {
    running = block;
    return;
  }
  const at::Tensor lse = at::logaddexp(running.lse, block.lse);
  running.out = running.out * at::exp(running.lse - lse) + block.out * at::exp(block.lse - lse);
  running.lse = lse;
}

// Adds one block's share of the gradients: to dq (the queries' rows) and to dk, dv (the block's
// rows; views written in place). delta = rowsum(dout * out), lse: the whole row's log-sum-exp.
void attend_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                     const at::Tensor& lse, const at::Tensor& delta, Sees how, double scale, at::Tensor dq, at::Tensor dk,
                     at::Tensor dv) {
  const at::Tensor probs = at::exp(scores_of(q, k, how, scale) - lse);  // 0 where hidden
  dv.add_(at::matmul(probs.transpose(-2, -1), dout));
  const at::Tensor dscores = probs * (at::matmul(dout, v.transpose(-2, -1)) - delta);
  dq.add_(at::matmul(dscores, k), scale);
  dk.add_(at::matmul(dscores.transpose(-2, -1), q), scale);
}

// Starts passing tensors one step around the ring (to the next rank of the group, from the
// previous one), packed into one buffer on the group's device; returns the function that waits
// and gives the previous rank's tensors (same shapes), on the first tensor's device. Even ranks
// issue their send first and odd ranks their receive, so that backends whose connections form on
// first use (nccl) pair each send with a receive; gloo and shm do not depend on the order.
std::function<std::vector<at::Tensor>()> pass_around(Collective& group, const std::vector<at::Tensor>& tensors, int tag) {
  const int size = group.world_size();
  const int rank = group.rank();
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  std::vector<at::Tensor> flat;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& tensor : tensors) {
    flat.push_back(tensor.reshape({-1}));
    shapes.push_back(tensor.sizes().vec());
  }
  const at::Tensor outgoing = at::cat(flat).to(group.device()).contiguous();
  at::Tensor incoming = at::empty(outgoing.sizes(), outgoing.options());
  std::function<void()> sent, received;
  if (rank % 2 == 0) {
    sent = group.send_start(outgoing, next, tag);
    received = group.recv_start_(incoming, previous, tag);
  } else {
    received = group.recv_start_(incoming, previous, tag);
    sent = group.send_start(outgoing, next, tag);
  }
  const at::Device device = tensors.front().device();
  return [sent, received, incoming, shapes, device] {
    received();
    sent();
    const at::Tensor here = incoming.to(device);
    std::vector<at::Tensor> result;
    int64_t offset = 0;
    for (const auto& shape : shapes) {
      int64_t count = 1;
      for (int64_t extent : shape) count *= extent;
      result.push_back(here.narrow(0, offset, count).view(shape));
      offset += count;
    }
    return result;
  };
}

std::string shape_text(const int64_t* sizes, int64_t count) {
  std::ostringstream text;
  text << "[";
  for (int64_t d = 0; d < count; ++d) text << (d ? ", " : "") << sizes[d];
  text << "]";
  return text.str();
}

// Keys and values travel: every rank's must have one shape and dtype (one small all_gather).
void check_same_blocks(Collective& group, const at::Tensor& key, const at::Tensor& value) {
  constexpr int64_t kFields = 9;
  at::Tensor mine = at::empty({kFields}, at::kLong);
  int64_t* fields = mine.data_ptr<int64_t>();
  for (int64_t d = 0; d < 4; ++d) {
    fields[d] = key.size(d);
    fields[4 + d] = value.size(d);
  }
  fields[8] = static_cast<int64_t>(key.scalar_type());
  const at::Tensor all = group.all_gather(mine).cpu().contiguous();
  const int64_t* table = all.data_ptr<int64_t>();
  bool same = true;
  for (int r = 1; r < group.world_size(); ++r) same = same && std::equal(table, table + kFields, table + r * kFields);
  if (same) return;
  std::ostringstream ranks;
  for (int r = 0; r < group.world_size(); ++r) {
    const int64_t* row = table + r * kFields;
    ranks << (r ? "; " : "") << "context rank " << r << ": key " << shape_text(row, 4) << ", value "
          << shape_text(row + 4, 4) << ", " << c10::toString(static_cast<at::ScalarType>(row[8]));
  }
  throw ValueError("ring_attention: keys and values travel around the context group, so every rank must pass them "
                   "with one shape and dtype, but they differ (" + ranks.str() + "). Split the sequence evenly "
                   "(shard_sequence) and give every rank the same batch and heads.");
}

void check_inputs(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, bool causal,
                  bool load_balance) {
  LF_CHECK(query.defined() && key.defined() && value.defined(), ValueError,
           "ring_attention: query, key and value must be defined tensors.");
  LF_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, ValueError,
           "ring_attention: query, key and value must be [batch, heads, local_seq, head_dim], but their shapes are ",
           query.sizes(), ", ", key.sizes(), " and ", value.sizes(), ". Reshape them (heads before the sequence).");
  const auto dtype = query.scalar_type();
  LF_CHECK((dtype == at::kFloat || dtype == at::kDouble) && key.scalar_type() == dtype && value.scalar_type() == dtype,
           ValueError, "ring_attention: query, key and value must share one dtype, float32 or float64, but they are ",
           query.scalar_type(), ", ", key.scalar_type(), " and ", value.scalar_type(), ". Convert them (.to(at::kFloat)).");
  LF_CHECK(key.device() == query.device() && value.device() == query.device(), ValueError,
           "ring_attention: query, key and value must be on one device, but they are on ", query.device(), ", ",
           key.device(), " and ", value.device(), ".");
  LF_CHECK(key.size(0) == query.size(0) && value.size(0) == query.size(0) && key.size(1) == query.size(1) &&
               value.size(1) == query.size(1) && key.size(3) == query.size(3) && value.size(2) == key.size(2),
           ValueError, "ring_attention: query ", query.sizes(), ", key ", key.sizes(), " and value ", value.sizes(),
           " must agree: one batch and head count, the query's head_dim equal to the key's, and as many values as "
           "keys.");
  LF_CHECK(query.size(2) > 0 && key.size(2) > 0, ValueError, "ring_attention: the local sequence is empty (query ",
           query.sizes(), ", key ", key.sizes(), "); every rank needs at least one position.");
  LF_CHECK(!causal || key.size(2) == query.size(2), ValueError, "ring_attention: with causal=true the local query and "
           "key lengths must be equal (positions follow the split), but they are ", query.size(2), " and ",
           key.size(2), ".");
  LF_CHECK(!(causal && load_balance) || query.size(2) % 2 == 0, ValueError, "ring_attention: with causal=true and "
           "load_balance=true each rank holds two equal chunks, so the local length must be even, but it is ",
           query.size(2), ". Split the sequence with shard_sequence(..., load_balance=true).");
}

// What the backward needs besides the saved tensors.
struct RingCall : torch::CustomClassHolder {
  Collective* group = nullptr;
  bool causal = false;
  bool load_balance = false;
};

Partial ring_forward(const RingCall& call, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  Collective& group = *call.group;
  const int size = group.world_size();
  const int rank = group.rank();
  const double scale = 1.0 / std::sqrt(static_cast<double>(query.size(3)));
  const auto queries = parts_of(rank, size, query.size(2), call.causal, call.load_balance);
  std::vector<Partial> running(queries.size());
  at::Tensor k = key.contiguous();
  at::Tensor v = value.contiguous();
  for (int step = 0; step < size; ++step) {
    const int source = (rank - step + size) % size;  // whose keys and values are here
    std::function<std::vector<at::Tensor>()> arriving;
    if (step + 1 < size) arriving = pass_around(group, {k, v}, kKeyValueTag);
    const auto keys = parts_of(source, size, k.size(2), call.causal, call.load_balance);
    for (size_t i = 0; i < queries.size(); ++i) {
      for (const Part& part : keys) {
        const Sees how = sees(call.causal, queries[i], part);
        if (how == Sees::None) continue;
        merge(running[i], attend(rows(query, queries[i]), rows(k, part), rows(v, part), how, scale));
      }
    }
    if (arriving) {
      const auto next = arriving();
      k = next[0];
      v = next[1];
    }
  }
  // Every query part saw its own chunk at step 0, so each running result is defined.
  std::vector<at::Tensor> outs, lses;
  for (const auto& part : running) {
    outs.push_back(part.out);
    lses.push_back(part.lse);
  }
  return {at::cat(outs, 2), at::cat(lses, 2)};
}

torch::autograd::variable_list ring_backward(const RingCall& call, const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value, const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& dout) {
  Collective& group = *call.group;
  const int size = group.world_size();
  const int rank = group.rank();
  const double scale = 1.0 / std::sqrt(static_cast<double>(query.size(3)));
  const auto queries = parts_of(rank, size, query.size(2), call.causal, call.load_balance);
  const at::Tensor delta = (dout * out).sum(-1, /*keepdim=*/true);
  at::Tensor dq = at::zeros(query.sizes(), query.options());
  at::Tensor k = key.contiguous();
  at::Tensor v = value.contiguous();
  // The gradients of the keys and values here, summed over the ranks they have visited.
  at::Tensor dk = at::zeros(k.sizes(), k.options());
  at::Tensor dv = at::zeros(v.sizes(), v.options());
  for (int step = 0; step < size; ++step) {
    const int source = (rank - step + size) % size;
    std::function<std::vector<at::Tensor>()> arriving;
    if (step + 1 < size) arriving = pass_around(group, {k, v}, kKeyValueTag);
    const auto keys = parts_of(source, size, k.size(2), call.causal, call.load_balance);
    for (const Part& q_part : queries) {
      for (const Part& k_part : keys) {
        const Sees how = sees(call.causal, q_part, k_part);
        if (how == Sees::None) continue;
        attend_backward(rows(query, q_part), rows(k, k_part), rows(v, k_part), rows(dout, q_part), rows(lse, q_part),
                        rows(delta, q_part), how, scale, rows(dq, q_part), rows(dk, k_part), rows(dv, k_part));
      }
    }
    // The sums move on with their keys and values; after the n-th pass each is back at its owner.
    if (size > 1) {
      const auto sums = pass_around(group, {dk, dv}, kGradientTag)();
      dk = sums[0];
      dv = sums[1];
    }
    if (arriving) {
      const auto next = arriving();
      k = next[0];
      v = next[1];
    }
  }
  return {dq, dk, dv};
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<RingCall> call,
                            const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
    Partial result = ring_forward(*call, query, key, value);
    ctx->save_for_backward({query, key, value, result.out, result.lse});
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return result.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto holder = ctx->saved_data["call"].toCapsule();
    const auto* call = static_cast<RingCall*>(holder.get());
    at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    auto grad = ring_backward(*call, saved[0], saved[1], saved[2], saved[3], saved[4], dout);
    return {at::Tensor(), grad[0], grad[1], grad[2]};
  }
};

struct Split {
  int size;
  int rank;
  int64_t dim;
};

Split split_of(const char* call, const at::Tensor& tensor, int64_t dim, const DeviceMesh& mesh) {
  LF_CHECK(tensor.defined() && tensor.dim() > 0, ValueError, call, ": needs a tensor with a sequence dimension, got ",
           tensor.defined() ? "a scalar" : "an undefined tensor", ".");
  return {mesh.size("context"), mesh.coordinate("context"), at::maybe_wrap_dim(dim, tensor.dim())};
}
}  // namespace

at::Tensor shard_sequence(const at::Tensor& full, int64_t dim, const DeviceMesh& mesh, bool load_balance) {
  const Split split = split_of("shard_sequence", full, dim, mesh);
  const int64_t chunks = load_balance ? 2 * static_cast<int64_t>(split.size) : split.size;
  const int64_t length = full.size(split.dim);
  LF_CHECK(length % chunks == 0, ValueError, "shard_sequence: dimension ", split.dim, " has length ", length,
           ", which does not split into ", chunks, " equal chunks (the context size ", split.size,
           load_balance ? " x 2, for load_balance=true" : "", "). Make the sequence length a multiple of ", chunks,
           " (pad it).");
  const int64_t chunk = length / chunks;
  if (!load_balance) return full.narrow(split.dim, split.rank * chunk, chunk).clone(at::MemoryFormat::Contiguous);
  const int64_t mirror = chunks - 1 - split.rank;
  return at::cat({full.narrow(split.dim, split.rank * chunk, chunk), full.narrow(split.dim, mirror * chunk, chunk)},
                 split.dim);
}

at::Tensor unshard_sequence(const at::Tensor& local, int64_t dim, const DeviceMesh& mesh, bool load_balance) {
  const Split split = split_of("unshard_sequence", local, dim, mesh);
  const int64_t length = local.size(split.dim);
  LF_CHECK(!load_balance || length % 2 == 0, ValueError, "unshard_sequence: with load_balance=true each rank holds "
           "two equal chunks, so dimension ", split.dim, " must have an even length, but it is ", length,
           ". Pass what shard_sequence(..., load_balance=true) gave.");
  if (split.size == 1) return local.clone(at::MemoryFormat::Contiguous);
  const at::Tensor all = mesh.group("context").all_gather(local.contiguous());  // [size, ...local]
  if (!load_balance) return all.movedim(0, split.dim).flatten(split.dim, split.dim + 1);
  const int64_t chunk = length / 2;
  std::vector<at::Tensor> ordered(2 * static_cast<size_t>(split.size));
  for (int r = 0; r < split.size; ++r) {
    const at::Tensor part = all.select(0, r);
    ordered[static_cast<size_t>(r)] = part.narrow(split.dim, 0, chunk);
    ordered[ordered.size() - 1 - static_cast<size_t>(r)] = part.narrow(split.dim, chunk, chunk);
  }
  return at::cat(ordered, split.dim);
}

at::Tensor ring_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const DeviceMesh& mesh, bool causal, bool load_balance) {
  check_inputs(query, key, value, causal, load_balance);
  auto call = c10::make_intrusive<RingCall>();
  call->group = &mesh.group("context");
  call->causal = causal;
  call->load_balance = load_balance;
  Collective& group = *call->group;
  if (group.world_size() > 1) {
    check_same_blocks(group, key, value);
    // On shm, the pair rings with the neighbours are made now rather than by the first transfer
    // (a no-op on gloo and nccl).
    const int next = (group.rank() + 1) % group.world_size();
    const int previous = (group.rank() + group.world_size() - 1) % group.world_size();
    std::vector<int> peers{std::min(next, previous), std::max(next, previous)};
    if (next == previous) peers.pop_back();
    group.connect_point_to_point(peers);
  }
  return RingAttention::apply(std::move(call), query, key, value);
}

}  // namespace lightning::fabric::context_parallel
