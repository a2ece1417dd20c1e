// Every collective Fabric issues, and a save/load round trip, under ddp and under fsdp, on the
// accelerator lightning-run names: gloo on CPU (CTest runs 2 ranks), NCCL on CUDA (label "gpu",
// world size 1: ProcessGroupNCCL rejects CPU tensors at any size, so one rank proves a path
// NCCL-correct). Each case runs under lightning-run, which provides the rendezvous:
//   lightning-run model --accelerator cpu --devices 2 --strategy ddp lf_collective_checks "[ddp]"
//   lightning-run model --accelerator cuda --devices 1 --strategy fsdp lf_collective_checks "[fsdp]"
// One test case per strategy: each Fabric makes its own process group, and a job has one.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <torch/torch.h>

#include "lightning/fabric.h"
#include "lightning/fabric/plugins/collectives/collective.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;

namespace {
// A folder every rank shares (the launcher's run id names it), removed by rank 0 at the end.
fs::path scratch(const std::string& name) {
  const char* run = std::getenv("TORCHELASTIC_RUN_ID");
  const fs::path folder = fs::temp_directory_path() / ("lf-collective-checks-" + std::string(run ? run : "local"));
  fs::create_directories(folder);
  return folder / name;
}

// The loss-scaling precision of the accelerator: float16 on CUDA; on CPU bfloat16 carrying the same
// scaler, so the scaler's found-inf flag crosses the group there too.
std::shared_ptr<lf::MixedPrecision> scaled_precision(bool cuda) {
  return std::make_shared<lf::MixedPrecision>(cuda ? "16-mixed" : "bf16-mixed", cuda ? torch::kFloat16 : torch::kBFloat16,
                                              std::make_shared<lf::LossScaler>());
}

// A user object checkpointed through lf::Stateful: a counter and a tensor.
struct Progress : lf::Stateful {
  int64_t batches = 0;
  torch::Tensor best = torch::zeros({2});
  lf::StateDict state_dict() const override {
    lf::StateDict state = lf::make_state_dict();
    state.insert("batches", batches);
    state.insert("best", best);
    return state;
  }
  void load_state_dict(const lf::StateDict& state) override {
    batches = state.at("batches").toInt();
    best = state.at("best").toTensor();
  }
};

torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
}

void train_step(lf::Fabric& fabric, lf::FabricModule<torch::nn::SequentialImpl>& model, lf::FabricOptimizer& optimizer) {
  optimizer.zero_grad();
  fabric.backward(model(torch::randn({4, 8})).pow(2).mean());
  optimizer.step();
}

// Saves model + optimizer, trains on, loads, and checks the weights came back.
void check_save_load_round_trip(lf::Fabric& fabric, const fs::path& path) {
  auto net = small_model();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  auto [model, optimizer] = fabric.setup(net, adam);
  train_step(fabric, model, optimizer);
  Progress progress;  // borrowed
  progress.batches = 41;
  progress.best = torch::tensor({0.5f, 0.25f});
  auto shared = std::make_shared<Progress>();  // shared
  shared->batches = 7;
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", 1}, {"progress", progress}, {"shared", shared}});
  std::vector<torch::Tensor> saved;
  {
    auto summon = fabric.strategy()->name() == "fsdp"
                      ? fabric.strategy_as<lf::FSDPStrategy>().summon_full_parameters(*net)
                      : lf::ScopeGuard();
    for (const auto& parameter : net->parameters()) saved.push_back(parameter.detach().cpu().clone());
  }
  train_step(fabric, model, optimizer);
  progress = Progress();
  shared->batches = 0;
  lf::State state{{"model", model}, {"optimizer", optimizer}, {"progress", progress}, {"shared", shared}};
  auto rest = fabric.load(path, state);
  CHECK(rest.at("step").toInt() == 1);
  CHECK(progress.batches == 41);
  CHECK(torch::equal(progress.best, torch::tensor({0.5f, 0.25f})));
  CHECK(shared->batches == 7);
  auto summon = fabric.strategy()->name() == "fsdp"
                    ? fabric.strategy_as<lf::FSDPStrategy>().summon_full_parameters(*net)
                    : lf::ScopeGuard();
  const auto parameters = net->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) CHECK(torch::equal(parameters[i].detach().cpu(), saved[i]));
}
}  // namespace

// The harness's own check (CTest: collectives.a_check_failing_on_one_rank_only_fails_the_test): a
// check that fails on rank 1 only, while rank 0 passes and prints Catch2's "All tests passed".
TEST_CASE("a check that fails on rank 1 only", "[.][planted]") {
  const char* rank = std::getenv("RANK");
  REQUIRE(rank != nullptr);
  if (std::string(rank) == "1") sleep(2);  // rank 0 ends (and says so) before rank 1's failure stops the job
  CHECK(std::string(rank) != "1");
}

TEST_CASE("every Fabric collective, and save/load, under ddp", "[.][ddp]") {
  lf::Fabric fabric;  // accelerator, devices and strategy from lightning-run
  REQUIRE(fabric.strategy()->name() == "ddp");
  fabric.barrier();
  auto& collective = fabric.strategy_as<lf::DDPStrategy>().collective();
  const bool cuda = fabric.device().is_cuda();
  const int world = fabric.world_size(), rank = fabric.global_rank();
  // Default: nccl on CUDA, shm for CPU ranks on one machine; lightning-run --process-group-backend wins.
  const char* chosen = std::getenv("LT_PROCESS_GROUP_BACKEND");
  CHECK(lf::to_string(collective.backend()) == (chosen != nullptr ? std::string(chosen) : cuda ? "nccl" : "shm"));
  CHECK(collective.device() == (cuda ? fabric.device() : torch::Device(torch::kCPU)));
  // Object and scalar collectives build their tensors on the caller's side (CPU).
  CHECK(fabric.broadcast(rank == 0 ? std::string("from rank 0") : std::string("not this"), 0) == "from rank 0");
  CHECK(fabric.broadcast(std::string(), 0).empty());
  CHECK(fabric.all_reduce(2.5, "sum") == 2.5 * world);
  CHECK(fabric.all_reduce(static_cast<double>(rank), "max") == world - 1);
  CHECK(fabric.all_reduce(3.0, "mean") == 3.0);
  CHECK(fabric.all_reduce(2.5, lf::ReduceOp::Sum) == 2.5 * world);  // the enum as well as the strings
  CHECK(torch::equal(fabric.all_reduce(torch::ones({2}), lf::ReduceOp::Max), torch::ones({2})));
  // Tensors on the CPU or the group's device; results on the caller's device.
  const auto on_cpu = fabric.all_reduce(torch::full({3}, static_cast<double>(rank)), "max");
  CHECK(on_cpu.device().is_cpu());
  CHECK(torch::equal(on_cpu, torch::full({3}, static_cast<double>(world - 1))));
  const auto on_device = fabric.all_reduce(torch::ones({3}, fabric.device()), "sum");
  CHECK(on_device.device() == fabric.device());
  CHECK(torch::equal(on_device.cpu(), torch::full({3}, static_cast<float>(world))));
  // Larger than one shm chunk, and not a multiple of the ranks (shm+gloo pads it): sums stay exact.
  const auto many = [&] { return torch::arange(3'000'001, torch::TensorOptions(torch::kFloat).device(fabric.device())); };
  CHECK(torch::equal(fabric.all_reduce(many(), "sum"), many() * world));
  CHECK(torch::equal(fabric.all_reduce(many(), "mean"), many()));
  const auto gathered = fabric.all_gather(torch::arange(4, fabric.device()) + rank);
  CHECK(gathered.device() == fabric.device());
  CHECK(gathered.sizes() == torch::IntArrayRef({world, 4}));
  CHECK(gathered[world - 1][0].item<int64_t>() == world - 1);
  CHECK(fabric.all_gather(torch::arange(4)).device().is_cpu());
  CHECK(fabric.all_gather(torch::empty({0}, fabric.device())).sizes() == torch::IntArrayRef({world, 0}));
  CHECK(torch::equal(fabric.broadcast(torch::full({2}, 7.0 + rank), 0), torch::full({2}, 7.0)));
  // The flags of the loss scaler and fsdp: a CPU scalar reduced with MAX.
  at::Tensor flag = torch::full({}, rank == world - 1 ? 1.0f : 0.0f);
  collective.all_reduce_(flag, lf::ReduceOp::Max);
  CHECK(flag.item<float>() == 1.0f);
  CHECK(torch::equal(collective.reduce_scatter(torch::ones({world, 5}), lf::ReduceOp::Sum), torch::full({5}, static_cast<float>(world))));
  fabric.barrier();
  check_save_load_round_trip(fabric, scratch("ddp.ckpt"));
  fabric.barrier();
  if (rank == 0) fs::remove_all(scratch("").parent_path());
}

TEST_CASE("fsdp with a loss scaler trains, skips an overflow on every rank, and saves and loads sharded", "[.][fsdp]") {
  const char* accelerator = std::getenv("LT_ACCELERATOR");
  const bool cuda = accelerator != nullptr && std::string(accelerator) == "cuda";
  lf::Fabric fabric(lf::FabricOptions().plugin(scaled_precision(cuda)));
  REQUIRE(fabric.strategy()->name() == "fsdp");
  REQUIRE(fabric.device().is_cuda() == cuda);
  auto net = small_model();
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  train_step(fabric, model, optimizer);
  auto scaler = fabric.precision()->loss_scaler();
  REQUIRE(scaler != nullptr);
  const double scale = scaler->get_scale();
  // An overflow on the last rank only: its found-inf flag crosses the group, every rank skips.
  optimizer.zero_grad();
  const double factor = fabric.global_rank() == fabric.world_size() - 1 ? std::numeric_limits<double>::infinity() : 1.0;
  fabric.backward(model(torch::randn({4, 8})).sum() * factor);
  CHECK_FALSE(optimizer.step());
  CHECK(scaler->get_scale() == scale / 2);
  check_save_load_round_trip(fabric, scratch("fsdp-sharded"));
  fabric.barrier();
  if (fabric.global_rank() == 0) fs::remove_all(scratch("").parent_path());
}
