// Ring attention over the mesh's context group on 2 and 4 ranks (threads of this process on
// gloo): each rank's output, and the gathered gradients of query, key and value, equal
// one-process attention on the whole sequence, causal or not, with the plain and the
// load-balanced split. The references are computed in the calling thread (LibTorch's random
// generator is one per process).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../thread_ranks.h"
#include "lightning/fabric/context_parallel/ring_attention.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/device_mesh.h"

namespace lf = lightning::fabric;
namespace cp = lightning::fabric::context_parallel;

namespace {
bool close(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::allclose(a, b, 1e-5, 1e-5); }

template <class Body>
void on_ranks(int count, Body body) {
  const auto failures = lf_test::on_thread_ranks(count, [&](lf::Collective& world, lf_test::RankChecks& checks) {
    lf::DeviceMesh mesh(world, std::vector<lf::MeshDimension>{{"context", count}});
    body(mesh, checks);
  });
  CHECK(failures == std::vector<std::string>());
}

template <class Call>
std::string value_error_of(Call call) {
  try {
    call();
  } catch (const lf::ValueError& error) {
    return error.what();
  }
  return "no ValueError";
}

// softmax(q k^T / sqrt(head_dim) [+ causal mask]) v on the whole sequence, and the gradients of
// sum(output * upstream).
struct AttentionReference {
  at::Tensor query, key, value, upstream, output, query_grad, key_grad, value_grad;
  AttentionReference(int64_t sequence, bool causal) {
    torch::manual_seed(causal ? 23 : 17);
    query = torch::randn({2, 3, sequence, 8}, torch::requires_grad());
    key = torch::randn({2, 3, sequence, 8}, torch::requires_grad());
    value = torch::randn({2, 3, sequence, 5}, torch::requires_grad());
    upstream = torch::randn({2, 3, sequence, 5});
    at::Tensor scores = at::matmul(query, key.transpose(-2, -1)) / std::sqrt(8.0);
    if (causal) {
      scores = scores.masked_fill(torch::ones({sequence, sequence}, torch::kBool).triu(1),
                                  -std::numeric_limits<double>::infinity());
    }
    output = at::matmul(at::softmax(scores, -1), value);
    (output * upstream).sum().backward();
    query_grad = query.grad().clone();
    key_grad = key.grad().clone();
    value_grad = value.grad().clone();
  }
};
}  // namespace

TEST_CASE("context parallel: ring attention equals one-process attention, gradients included", "[context_parallel]") {
  const AttentionReference full(16, false);
  const AttentionReference causal_reference(16, true);
  for (int ranks : {2, 4}) {
    on_ranks(ranks, [&](lf::DeviceMesh& mesh, lf_test::RankChecks& checks) {
      for (bool causal : {false, true}) {
        for (bool balanced : {false, true}) {
          const AttentionReference& reference = causal ? causal_reference : full;
          const std::string who = std::to_string(ranks) + " ranks, rank " + std::to_string(mesh.coordinate("context")) +
                                  (causal ? ", causal" : ", not causal") + (balanced ? ", load-balanced: " : ", plain: ");
          const auto local = [&](const at::Tensor& whole) { return cp::shard_sequence(whole.detach(), 2, mesh, balanced); };
          const auto gathered = [&](const at::Tensor& part) { return cp::unshard_sequence(part, 2, mesh, balanced); };
          const at::Tensor query = local(reference.query).requires_grad_(true);
          const at::Tensor key = local(reference.key).requires_grad_(true);
          const at::Tensor value = local(reference.value).requires_grad_(true);
          const at::Tensor output = cp::ring_attention(query, key, value, mesh, causal, balanced);
          checks.expect(close(output, local(reference.output)), who + "this rank's output rows");
          checks.expect(close(gathered(output.detach()), reference.output.detach()), who + "the gathered output");
          (output * local(reference.upstream)).sum().backward();
          checks.expect(close(gathered(query.grad()), reference.query_grad), who + "query gradient");
          checks.expect(close(gathered(key.grad()), reference.key_grad), who + "key gradient (sums around the ring)");
          checks.expect(close(gathered(value.grad()), reference.value_grad), who + "value gradient (sums around the ring)");
        }
      }
    });
  }
}

TEST_CASE("context parallel: the load-balanced split gives rank i chunks i and 2n-1-i", "[context_parallel]") {
  const at::Tensor positions = torch::arange(16, torch::kLong).view({2, 8});  // the sequence on dim 1 (and -1)
  on_ranks(2, [&](lf::DeviceMesh& mesh, lf_test::RankChecks& checks) {
    const int rank = mesh.coordinate("context");
    const at::Tensor balanced = cp::shard_sequence(positions, -1, mesh, true);
    const at::Tensor expected = rank == 0 ? torch::tensor({0, 1, 6, 7}, torch::kLong) : torch::tensor({2, 3, 4, 5}, torch::kLong);
    checks.expect(balanced.sizes() == at::IntArrayRef({2, 4}) && at::equal(balanced[0], expected),
                  "rank " + std::to_string(rank) + " holds chunks " + std::to_string(rank) + " and " + std::to_string(3 - rank));
    const at::Tensor plain = cp::shard_sequence(positions, 1, mesh, false);
    checks.expect(at::equal(plain[0], torch::arange(4 * rank, 4 * rank + 4, torch::kLong)), "plain: one contiguous chunk");
    checks.expect(at::equal(cp::unshard_sequence(balanced, -1, mesh, true), positions), "unshard inverts the balanced split");
    checks.expect(at::equal(cp::unshard_sequence(plain, 1, mesh, false), positions), "unshard inverts the plain split");
  });
}

TEST_CASE("context parallel: a sequence that does not split is a ValueError naming the sizes", "[context_parallel]") {
  on_ranks(2, [&](lf::DeviceMesh& mesh, lf_test::RankChecks& checks) {
    const at::Tensor six = torch::zeros({1, 1, 6, 4});
    const std::string balanced = value_error_of([&] { cp::shard_sequence(six, 2, mesh, true); });
    checks.expect(balanced.find("length 6, which does not split into 4 equal chunks") != std::string::npos, balanced);
    const std::string plain = value_error_of([&] { cp::shard_sequence(torch::zeros({1, 1, 5, 4}), 2, mesh, false); });
    checks.expect(plain.find("length 5, which does not split into 2 equal chunks") != std::string::npos, plain);
    const std::string odd = value_error_of([&] {
      const at::Tensor three = torch::zeros({1, 1, 3, 4});
      cp::ring_attention(three, three, three, mesh, true, true);
    });
    checks.expect(odd.find("the local length must be even, but it is 3") != std::string::npos, odd);
    const std::string flat = value_error_of([&] {
      const at::Tensor matrix = torch::zeros({4, 4});
      cp::ring_attention(matrix, matrix, matrix, mesh, false, false);
    });
    checks.expect(flat.find("[batch, heads, local_seq, head_dim]") != std::string::npos, flat);
  });
}
