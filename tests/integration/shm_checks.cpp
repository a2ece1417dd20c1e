// The shm backend against gloo, op by op, on the same ranks: a gloo world group and an shm group
// over the same ranks, the same inputs, the results compared (bitwise where the arithmetic is
// order-free: max, min, copies, and sums of 2 ranks; within the reduction-order tolerance
// otherwise). Run under lightning-run with 2, 3 or 4 ranks; each rank prints one PASS line.
//   lightning-run model --accelerator cpu --devices 3 lf_shm_checks [--large]
// Point-to-point (send/recv and their tagged asynchronous forms) is checked against what each
// sender sent, from a byte to 64 MB (--large), every dtype, out-of-order tags.
// --peer-dies (2 ranks, started without a launcher by shm_failures.sh): rank 1 kills itself with
// SIGKILL while rank 0 waits in an shm all_reduce; rank 0 must fail at once, naming rank 1.
// --peer-dies-mid-transfer: the same in the middle of a 64 MB send to rank 0; a small message it
// sent whole before is still received.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "expect.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/strategy.h"

namespace lf = lightning::fabric;

namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

at::Tensor input_for(int rank, int64_t count, at::ScalarType dtype, int salt) {
  at::manual_seed(1000 * salt + rank);
  if (at::isFloatingType(dtype)) return at::randn({count}, at::kDouble).to(dtype);
  return at::randint(-50, 50, {count}, at::kLong).to(dtype);
}

bool order_free(lf::ReduceOp op, int world) {
  return op == lf::ReduceOp::Max || op == lf::ReduceOp::Min || (world == 2 && op != lf::ReduceOp::Mean);
}

void compare(const at::Tensor& shm, const at::Tensor& gloo, bool bitwise, const std::string& what) {
  if (bitwise || !at::isFloatingType(shm.scalar_type())) {
    checks::expect(at::equal(shm, gloo), what + ": shm and gloo differ");
    return;
  }
  // Summing world_size values of magnitude ~3 in another order: a few units in the last place of
  // the result (bfloat16 keeps 8 bits, float16 11, float32 24).
  const bool half = shm.scalar_type() == at::kBFloat16 || shm.scalar_type() == at::kHalf;
  const double rtol = half ? 2e-2 : 1e-5, atol = half ? 0.125 : 1e-5;
  checks::expect(at::allclose(shm.to(at::kDouble), gloo.to(at::kDouble), rtol, atol),
         what + ": shm and gloo differ beyond the reduction-order tolerance");
}

// Rank 1 dies (SIGKILL) while rank 0 waits for it in an shm all_reduce.
int peer_dies(lf::Collective& shm) {
  if (shm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  at::Tensor x = at::ones({1000});
  try {
    shm.all_reduce_(x, lf::ReduceOp::Sum);
    std::cout << "FAIL: the all_reduce returned although rank 1 died" << std::endl;
  } catch (const std::exception& error) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = error.what();
    std::cout << "rank 0 failed after " << waited << " s: " << what << std::endl;
    const bool named = what.find("rank 1 (pid ") != std::string::npos && what.find("died") != std::string::npos;
    std::cout << (named && waited < 5 ? "PASS: the dead peer was named" : "FAIL: not named, or too late") << std::endl;
  }
  std::cout.flush();
  std::_Exit(0);  // the gloo group's peer is gone: skip its teardown
}

// Rank 1 sends rank 0 a small message, then a 64 MB one, and dies (SIGKILL) at once, mid-transfer:
// rank 0's recv of the large one must fail within seconds, naming rank 1 and how many bytes had
// come; the small one, whole in the ring, is still received.
int peer_dies_mid_transfer(lf::Collective& shm) {
  const int64_t count = 16 << 20;  // 64 MB of float32
  if (shm.rank() == 1) {
    auto small = shm.send_start(at::full({3}, 42.0), 0, 6);  // whole in the ring before the kill
    at::Tensor big = at::ones({count});
    auto finish = shm.send_start(big, 0, 7);
    ::raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  at::Tensor into = at::zeros({count});
  try {
    shm.recv_start_(into, 1, 7)();
    std::cout << "FAIL: the recv returned although rank 1 died" << std::endl;
  } catch (const std::exception& error) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = error.what();
    std::cout << "rank 0 failed after " << waited << " s: " << what << std::endl;
    const bool named = what.find("rank 1 (pid ") != std::string::npos && what.find("died") != std::string::npos &&
                       what.find(" of 67108864 bytes") != std::string::npos;
    // The message it sent whole before dying is still received.
    at::Tensor small = at::zeros({3});
    bool received = false;
    try {
      shm.recv_start_(small, 1, 6)();
      received = at::equal(small, at::full({3}, 42.0));
    } catch (const std::exception& late) {
      std::cout << "the whole message was refused: " << late.what() << std::endl;
    }
    std::cout << (named && waited < 5 && received ? "PASS: the dead peer was named" : "FAIL: not named, too late, or "
                  "its whole message lost") << std::endl;
  }
  std::cout.flush();
  std::_Exit(0);
}

// Point-to-point on shm: the receiver knows what each sender sent (input_for of the sender's
// rank), so every message is checked bitwise. Sizes from 1 byte to 64 MB (past the 4 MB ring),
// every dtype, tags received out of order, both directions at once, a refused mismatch.
void check_point_to_point(lf::Collective& shm, bool large) {
  const int rank = shm.rank(), world = shm.world_size();
  const int next = (rank + 1) % world, previous = (rank + world - 1) % world;
  int salt = 5000;
  const std::vector<int64_t> sizes = large ? std::vector<int64_t>{16LL << 20}
                                           : std::vector<int64_t>{0, 1, 7, 1000, 65537, (3 << 20) + 3};
  const std::vector<at::ScalarType> dtypes{at::kByte, at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong,
                                           at::kInt, at::kBool};
  for (int64_t count : sizes) {
    for (at::ScalarType dtype : dtypes) {
      // Past the ring (4 MB) with one byte-sized and one 4-byte dtype; every dtype below it.
      if ((large || count > (1 << 20)) && dtype != at::kFloat && dtype != at::kByte) continue;
      if (large && dtype != at::kFloat) continue;
      ++salt;
      auto make = [&](int who) {
        return dtype == at::kBool ? input_for(who, count, at::kLong, salt).gt(0) : input_for(who, count, dtype, salt);
      };
      const at::Tensor mine = make(rank);
      at::Tensor got = at::empty({count}, mine.options());
      // Everyone sends before receiving: sends larger than the ring finish as the peers' threads
      // take their bytes.
      auto sent = shm.send_start(mine, next, 3);
      auto received = shm.recv_start_(got, previous, 3);
      sent();
      received();
      checks::expect(at::equal(got, make(previous)), std::string("send/recv ring of ") + c10::toString(dtype) + "[" +
                                                         std::to_string(count) + "]");
    }
  }
  if (large) return;
  // Tags out of order: three messages to next (tags 0, 1, 2), received 2, 1, 0; then two of one
  // tag, which arrive in the order sent.
  std::vector<at::Tensor> outgoing, incoming;
  std::vector<std::function<void()>> sends, recvs;
  for (int tag = 0; tag < 3; ++tag) {
    outgoing.push_back(input_for(rank, tag == 0 ? (5 << 20) / 4 + 1 : 10 + tag, at::kFloat, ++salt));
    sends.push_back(shm.send_start(outgoing.back(), next, tag));
  }
  for (int tag = 2; tag >= 0; --tag) {
    incoming.push_back(at::empty({tag == 0 ? (5 << 20) / 4 + 1 : 10 + tag}));
    recvs.push_back(shm.recv_start_(incoming.back(), previous, tag));
  }
  for (auto& wait : recvs) wait();
  for (auto& wait : sends) wait();
  for (int tag = 2, i = 0; tag >= 0; --tag, ++i) {
    checks::expect(at::equal(incoming[i], input_for(previous, incoming[i].numel(), at::kFloat, salt - 2 + tag)),
                   "tag " + std::to_string(tag) + " received out of order");
  }
  const at::Tensor first = at::full({3}, 1.0 + rank), second = at::full({3}, 2.0 + rank);
  auto a = shm.send_start(first, next, 9);
  auto b = shm.send_start(second, next, 9);
  at::Tensor one = at::empty({3}), two = at::empty({3});
  shm.recv_start_(one, previous, 9)();
  shm.recv_start_(two, previous, 9)();
  a();
  b();
  checks::expect(one[0].item<double>() == 1.0 + previous && two[0].item<double>() == 2.0 + previous,
                 "two messages of one tag arrive in the order sent");
  // Blocking send/recv of a strided tensor (staged) between ranks 0 and 1.
  if (rank < 2) {
    at::Tensor grid = input_for(0, 48 * 64, at::kFloat, ++salt).view({48, 64});
    if (rank == 0) {
      shm.send(grid.t(), 1);
    } else {
      at::Tensor into = at::empty({48, 64}).t();
      shm.recv_(into, 0);
      checks::expect(at::equal(into, grid.t()), "blocking send/recv of a transposed view");
    }
  }
  // A blocking send larger than the ring while the receiver waits in a barrier first: the
  // receiver's thread takes the bytes (as gloo's would), so neither rank waits on the other.
  if (rank < 2) {
    const at::Tensor large = input_for(0, (8 << 20) / 4 + 1, at::kFloat, ++salt);
    at::Tensor into = at::empty_like(large);
    lf::Collective pair(shm, "shm-checks-pair", {0, 1}, lf::ProcessGroupBackend::Shm);
    if (rank == 0) {
      pair.send(large, 1);
      pair.barrier();
    } else {
      pair.barrier();
      pair.recv_(into, 0);
      checks::expect(at::equal(into, large), "a send past the ring finished while its receiver was in a barrier");
    }
  }
  // A recv of the wrong size fails naming both; the stream goes on.
  auto wrong = shm.send_start(at::ones({10}), next, 4);
  auto right = shm.send_start(at::full({2}, 5.0), next, 4);
  at::Tensor too_long = at::empty({11}), after = at::empty({2});
  try {
    shm.recv_start_(too_long, previous, 4)();
    checks::expect(false, "a recv of the wrong size was accepted");
  } catch (const lf::ValueError& error) {
    const std::string what = error.what();
    checks::expect(what.find("Float[10]") != std::string::npos && what.find("Float[11]") != std::string::npos,
                   "the size mismatch names both sizes: " + what);
  }
  shm.recv_start_(after, previous, 4)();
  checks::expect(at::equal(after, at::full({2}, 5.0)), "the message after a refused one");
  wrong();
  right();
  shm.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  const bool large = argc > 1 && std::strcmp(argv[1], "--large") == 0;
  lf::CollectiveOptions options;
  options.settings = lf::with_environment_overrides({}, lf::env::process_env());  // GLOO_SOCKET_IFNAME, LT_*
  options.rank = env_int("RANK", 0);
  options.world_size = env_int("WORLD_SIZE", 1);
  options.main_address = std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR") : "127.0.0.1";
  options.main_port = env_int("MASTER_PORT", 29400);
  options.use_agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE") &&
                            std::string(std::getenv("TORCHELASTIC_USE_AGENT_STORE")) == "True";
  options.store_attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  lf::Collective gloo(options);
  std::vector<int> everyone;
  for (int r = 0; r < gloo.world_size(); ++r) everyone.push_back(r);
  lf::Collective shm(gloo, "shm-checks", everyone, lf::ProcessGroupBackend::Shm);
  if (argc > 1 && std::strcmp(argv[1], "--peer-dies") == 0) return peer_dies(shm);
  if (argc > 1 && std::strcmp(argv[1], "--peer-dies-mid-transfer") == 0) return peer_dies_mid_transfer(shm);
  const int rank = gloo.rank(), world = gloo.world_size();
  checks::expect(shm.backend() == lf::ProcessGroupBackend::Shm && shm.world_size() == world, "the subgroup is not an shm group of every rank");

  // all_reduce: every op, dtypes, sizes from empty to several chunks.
  const int64_t chunk_floats = 4 << 20 >> 2;
  std::vector<int64_t> sizes{0, 1, 7, 1000, chunk_floats + 3, 3 * chunk_floats + 11};
  if (large) sizes = {64LL << 20};  // 256 MB of float32
  const std::vector<at::ScalarType> dtypes = large ? std::vector<at::ScalarType>{at::kFloat}
                                                   : std::vector<at::ScalarType>{at::kFloat, at::kDouble, at::kBFloat16,
                                                                                 at::kHalf, at::kLong, at::kInt};
  int salt = 0;
  for (int64_t count : sizes) {
    for (at::ScalarType dtype : dtypes) {
      for (lf::ReduceOp op : {lf::ReduceOp::Sum, lf::ReduceOp::Mean, lf::ReduceOp::Max, lf::ReduceOp::Min}) {
        if (op == lf::ReduceOp::Mean && !at::isFloatingType(dtype)) continue;
        if (large && op != lf::ReduceOp::Sum) continue;
        at::Tensor on_shm = input_for(rank, count, dtype, ++salt);
        at::Tensor on_gloo = on_shm.clone();
        shm.all_reduce_(on_shm, op);
        gloo.all_reduce_(on_gloo, op);
        compare(on_shm, on_gloo, order_free(op, world),
                "all_reduce op " + std::to_string(static_cast<int>(op)) + " " + c10::toString(dtype) + "[" +
                    std::to_string(count) + "]");
      }
    }
  }
  if (!large) {
    // Non-contiguous input: both stage it, the result lands in the view.
    at::Tensor base = input_for(rank, 64 * 48, at::kFloat, ++salt).view({64, 48});
    at::Tensor a = base.clone(), b = base.clone();
    at::Tensor view_a = a.t(), view_b = b.t();
    shm.all_reduce_(view_a, lf::ReduceOp::Max);
    gloo.all_reduce_(view_b, lf::ReduceOp::Max);
    compare(a, b, true, "all_reduce of a transposed view");

    // broadcast from every rank, all_gather, reduce_scatter, all_to_all, bytes, barrier.
    // Small ones (up to 64 KB: one barrier, a slot per op parity) back to back, then chunked ones.
    for (int64_t count : {int64_t{0}, int64_t{5}, int64_t{16384}, int64_t{16385}, chunk_floats + 5}) {
      for (int src = 0; src < world; ++src) {
        at::Tensor x = input_for(rank, count, at::kFloat, ++salt), y = x.clone();
        shm.broadcast_(x, src);
        gloo.broadcast_(y, src);
        compare(x, y, true, "broadcast of " + std::to_string(count) + " floats from " + std::to_string(src));
      }
    }
    for (int64_t count : {int64_t{0}, int64_t{5}, chunk_floats + 9}) {
      const at::Tensor x = input_for(rank, count, at::kBFloat16, ++salt);
      compare(shm.all_gather(x), gloo.all_gather(x), true, "all_gather [" + std::to_string(count) + "]");
      const at::Tensor rows = input_for(rank, world * count, at::kFloat, ++salt).view({world, count});
      compare(shm.reduce_scatter(rows, lf::ReduceOp::Sum), gloo.reduce_scatter(rows, lf::ReduceOp::Sum), world == 2,
              "reduce_scatter [" + std::to_string(count) + "]");
      const at::Tensor parts = input_for(rank, world * count, at::kDouble, ++salt);
      const at::Tensor exchanged = shm.all_to_all(parts);
      const at::Tensor gathered = gloo.all_gather(parts).view({world, world, count});
      compare(exchanged.view({world, count}), gathered.select(1, rank), true, "all_to_all [" + std::to_string(count) + "]");
    }
    const std::string text = shm.broadcast_bytes(rank == 1 ? std::string(300000, 'x') + "end" : std::string(), 1);
    checks::expect(text.size() == 300003 && text.substr(300000) == "end", "broadcast_bytes through shm");
    for (int i = 0; i < 100; ++i) shm.barrier();
  }
  check_point_to_point(shm, large);
  if (checks::failures() > 0) return 1;
  std::cout << "PASS: shm matches gloo on rank " << rank << " of " << world << (large ? " (256 MB)" : "") << std::endl;
  return 0;
}
