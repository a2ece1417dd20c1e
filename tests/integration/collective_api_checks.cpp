// Fabric's torch.distributed collectives (send, recv, reduce, gather, scatter, reduce_scatter,
// all_to_all) over every rank and over a group, and their refusals:
//   lf_collective_api_checks [single]
// Under lightning-run with 2 or 4 ranks (ddp; the backend from LT_PROCESS_GROUP_BACKEND: gloo,
// or shm, where point-to-point goes over a pair's gloo group and reduce, gather and scatter fall
// back to all-reduce, all-gather and broadcast); "single" checks one process. Every value is
// computed from the ranks, so each rank checks its result exactly. Each rank prints
// "FAIL: ..." per failed check and exits 1 if any failed.
#include <torch/torch.h>

#include <iostream>
#include <numeric>

#include "expect.h"
#include "lightning/fabric.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;
const auto refusal = [](auto&& fn) { return checks::refusal<lf::ValueError>(fn); };

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

torch::Tensor mine(int rank) { return torch::arange(6, torch::kDouble).view({2, 3}) + 10 * rank; }

// Ring: rank r sends to r + 1 and receives from r - 1; even ranks send first (blocking calls).
void check_point_to_point(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  if (world == 1) return;
  const int next = (rank + 1) % world, previous = (rank + world - 1) % world;
  const torch::Tensor outgoing = mine(rank).t();  // not contiguous: sent by its values
  torch::Tensor incoming = torch::zeros({2, 3}, torch::kDouble).t();
  if (rank % 2 == 0) {
    fabric.send(outgoing, next);
    incoming = fabric.recv(incoming, previous);
  } else {
    incoming = fabric.recv(incoming, previous);
    fabric.send(outgoing, next);
  }
  expect(torch::equal(incoming, mine(previous).t()), "recv got rank " + std::to_string(previous) + "'s tensor");
  // A second exchange on the same pair, integers, the other way round.
  if (rank == 0) fabric.send(torch::full({5}, 7, torch::kLong), world - 1);
  if (rank == world - 1) {
    expect(torch::equal(fabric.recv(torch::zeros({5}, torch::kLong), 0), torch::full({5}, 7, torch::kLong)),
           "recv of an int64 tensor from rank 0");
  }
  expect(has(refusal([&] { fabric.send(outgoing, rank); }), "is this process"), "send to oneself is refused");
  expect(has(refusal([&] { fabric.recv(incoming, world); }), "is not in the group of ranks"),
         "recv from a rank outside the job is refused");
}

// reduce, gather, scatter, reduce_scatter and all_to_all over members (global ranks, ascending),
// group: null for every rank.
void check_collectives(lf::Fabric& fabric, const std::vector<int>& members, const lf::ProcessGroup* group,
                       const std::string& where) {
  const int rank = fabric.global_rank();
  const int n = static_cast<int>(members.size());
  const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  const int last = members.back(), first = members.front();
  torch::Tensor sum = torch::zeros({2, 3}, torch::kDouble);
  for (int r : members) sum += mine(r);

  const auto reduced = group ? fabric.reduce(mine(rank), last, lf::ReduceOp::Sum, *group) : fabric.reduce(mine(rank), last);
  expect(torch::equal(reduced, rank == last ? sum : mine(rank)), "reduce (sum) to rank " + std::to_string(last) + where);
  const auto largest = group ? fabric.reduce(mine(rank), first, lf::ReduceOp::Max, *group)
                             : fabric.reduce(mine(rank), first, lf::ReduceOp::Max);
  expect(torch::equal(largest, rank == first ? mine(last) : mine(rank)), "reduce (max) to rank " + std::to_string(first) + where);
  const auto mean = group ? fabric.reduce(mine(rank), last, lf::ReduceOp::Mean, *group)
                          : fabric.reduce(mine(rank), last, lf::ReduceOp::Mean);
  expect(torch::allclose(mean, rank == last ? sum / n : mine(rank)), "reduce (mean)" + where);

  const auto gathered = group ? fabric.gather(mine(rank), last, *group) : fabric.gather(mine(rank), last);
  if (rank == last) {
    bool rows = gathered.defined() && gathered.size(0) == n;
    for (int i = 0; rows && i < n; ++i) rows = torch::equal(gathered[i], mine(members[i]));
    expect(rows, "gather: one row per member in rank order on rank " + std::to_string(last) + where);
  } else {
    expect(!gathered.defined(), "gather: nothing on a rank that is not the destination" + where);
  }

  torch::Tensor rows;
  if (rank == first) rows = torch::arange(n * 6, torch::kDouble).view({n, 2, 3});
  const auto scattered = group ? fabric.scatter(torch::zeros({2, 3}, torch::kDouble), rows, first, *group)
                               : fabric.scatter(torch::zeros({2, 3}, torch::kDouble), rows, first);
  expect(torch::equal(scattered, torch::arange(me * 6, me * 6 + 6, torch::kDouble).view({2, 3})),
         "scatter: row " + std::to_string(me) + " from rank " + std::to_string(first) + where);

  const auto stacked = torch::stack(std::vector<torch::Tensor>(n, mine(rank))) +
                       torch::arange(n, torch::kDouble).view({n, 1, 1});  // row i: mine + i
  const auto summed = group ? fabric.reduce_scatter(stacked, lf::ReduceOp::Sum, *group) : fabric.reduce_scatter(stacked);
  expect(torch::equal(summed, sum + n * me), "reduce_scatter (sum): row " + std::to_string(me) + where);
  const auto maximum = group ? fabric.reduce_scatter(stacked, lf::ReduceOp::Max, *group)
                             : fabric.reduce_scatter(stacked, lf::ReduceOp::Max);
  expect(torch::equal(maximum, mine(last) + me), "reduce_scatter (max)" + where);
  const auto averaged = group ? fabric.reduce_scatter(stacked, lf::ReduceOp::Mean, *group)
                              : fabric.reduce_scatter(stacked, lf::ReduceOp::Mean);
  expect(torch::allclose(averaged, sum / n + me), "reduce_scatter (mean)" + where);

  if (group != nullptr) {  // Fabric's own collectives over the same group, on this backend
    expect(torch::equal(fabric.all_reduce(mine(rank).clone(), lf::ReduceOp::Sum, *group), sum), "all_reduce" + where);
    expect(torch::equal(fabric.broadcast(mine(rank), last, *group), mine(last)), "broadcast from rank " + std::to_string(last) + where);
    auto shared = std::shared_ptr<lf::ProcessGroup>(std::shared_ptr<lf::ProcessGroup>(), const_cast<lf::ProcessGroup*>(group));
    const auto x = mine(rank).requires_grad_(true);
    const auto rows_with_grad = fabric.all_gather(x, lf::AllGatherOptions().in(shared).with_gradients());
    (rows_with_grad * (torch::arange(n, torch::kDouble).view({n, 1, 1}) + 1)).sum().backward();
    // Every member's loss weighs row i by i + 1: this member's input gets n (me + 1) per element.
    expect(x.grad().defined() && x.grad().eq(static_cast<double>(n * (me + 1))).all().item<bool>(),
           "all_gather with gradients: each member gets the sum over members of its slice's gradient" + where);
  }
  if (group == nullptr) {
    const auto pair = fabric.all_gather(std::vector<torch::Tensor>{mine(rank), mine(rank) * 2});
    bool rows = pair.size() == 2 && torch::equal(pair[1], pair[0] * 2);
    for (int i = 0; rows && n > 1 && i < n; ++i) rows = torch::equal(pair[0][i], mine(members[i]));
    expect(rows, "all_gather of a vector of tensors: each gathered in order");
  }

  // Block p (two rows) of rank r holds 100 r + p: after the exchange, block p holds 100 members[p] + me.
  auto blocks = torch::empty({2 * n, 3}, torch::kLong);
  for (int p = 0; p < n; ++p) blocks.narrow(0, 2 * p, 2).fill_(100 * rank + p);
  const auto exchanged = group ? fabric.all_to_all(blocks, *group) : fabric.all_to_all(blocks);
  bool each = exchanged.sizes() == blocks.sizes();
  for (int p = 0; each && p < n; ++p) each = exchanged.narrow(0, 2 * p, 2).eq(100 * members[p] + me).all().item<bool>();
  expect(each, "all_to_all: block p from member p" + where);
}

void check_refusals(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  expect(has(refusal([&] { fabric.reduce(mine(rank), world); }), "rank " + std::to_string(world) + " is not in the group"),
         "reduce to a rank outside the job is refused");
  expect(has(refusal([&] { fabric.reduce(torch::ones({2}, torch::kLong), 0, lf::ReduceOp::Mean); }), "mean of a Long") ||
             world == 1,
         "reduce (mean) of an integer tensor is refused");
  expect(has(refusal([&] { fabric.reduce_scatter(torch::ones({world + 1, 2})); }), "one row per participant"),
         "reduce_scatter with a row count other than the world size is refused");
  expect(world == 1 || has(refusal([&] { fabric.all_to_all(torch::ones({2 * world + 1, 2})); }), "equal blocks"),
         "all_to_all of a first dimension that does not split is refused");
  {
    // Every rank refuses the source's rows, not the source alone (the others would wait).
    const auto message = refusal([&] { fabric.scatter(torch::zeros({3}), rank == 0 ? torch::zeros({world, 4}) : torch::Tensor(), 0); });
    expect(world == 1 || (has(message, "fabric.scatter: rank 0's rows are Float[" + std::to_string(world) + ", 4]") &&
                          has(message, "expects Float[" + std::to_string(world) + ", 3]")),
           "scatter refuses rows of the wrong shape on every rank, got: " + message);
    expect(world > 1 || has(message, "rows must be"), "scatter with one process refuses rows of the wrong shape, got: " + message);
  }
  if (world > 1) {
    // Shapes that differ across ranks: every rank gets the error naming each rank's shape.
    const auto message = refusal([&] { fabric.all_gather(torch::ones({rank + 1, 2})); });
    expect(has(message, "fabric.all_gather") && has(message, "rank 1: all_gather float32[2, 2]") && has(message, "Pad"),
           "all_gather of shapes that differ across ranks is refused on every rank, got: " + message);
    if (world >= 4) {  // in a group, the ranks are named as the job numbers them
      const auto pair = fabric.new_group({1, 3});
      if (pair->is_member()) {
        const auto differing = refusal([&] { fabric.all_gather(torch::ones({rank, 2}), lf::AllGatherOptions().in(pair)); });
        expect(has(differing, "rank 1: all_gather float32[1, 2]; rank 3: all_gather float32[3, 2]"),
               "a group's all_gather of differing shapes names global ranks, got: " + differing);
      }
    }
    const auto odd = fabric.new_group({1});
    if (rank != 1) {
      expect(has(refusal([&] { fabric.send(mine(rank), 1, *odd); }), "is_member"), "send in a group one is not in is refused");
    } else {
      expect(has(refusal([&] { fabric.gather(mine(rank), 0, *odd); }), "rank 0 is not in the group of ranks [1]"),
             "gather to a rank outside the group is refused");
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  const bool single = argc > 1 && std::string(argv[1]) == "single";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(single ? "single_device" : "ddp"));
  const int world = fabric.world_size();
  std::vector<int> everyone(static_cast<size_t>(world));
  std::iota(everyone.begin(), everyone.end(), 0);
  check_point_to_point(fabric);
  check_collectives(fabric, everyone, nullptr, "");
  std::vector<int> odd;
  for (int r = world > 1 ? 1 : 0; r < world; r += 2) odd.push_back(r);
  const auto odd_ranks = fabric.new_group(odd);
  if (odd_ranks->is_member()) check_collectives(fabric, odd, odd_ranks.get(), " in the group of the odd ranks");
  // Under shm+gloo a group holds its own host vote: all on this machine, it is shm.
  auto* ddp = dynamic_cast<lf::ParallelStrategy*>(fabric.strategy().get());
  if (odd_ranks->is_member() && ddp != nullptr && ddp->collective().backend() == lf::ProcessGroupBackend::ShmGloo) {
    const lf::Collective* odd_group = odd_ranks->communicator("collective_api_checks", fabric.global_rank());
    expect(odd_group != nullptr && odd_group->backend() == lf::ProcessGroupBackend::Shm,
           "a group of ranks on one machine under shm+gloo is shm");
  }
  check_refusals(fabric);
  fabric.barrier();
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << " of " << world << ": collective API checks pass" << std::endl;
  return 0;
}
