// The training job of the hosts tests (tests/hosts): a small classifier trained with DDP on
// synthetic data, every rank on its slice of one global batch, then checked from inside the job.
//   hosts_job STEPS [--sleep-ms MS] [--checkpoint-dir DIR] [--tolerance T] [--strategy ddp|fsdp] [--snapshot]
//             [--hidden H] [--log-every N]
// Each rank prints "rank R of W on HOST: backend B, restart count C, starting at step S" first,
// "rank R of W on HOST: backend B, step S" every 10 steps and at the end
//   "rank R of W on HOST: backend B, STEPS steps, bitwise equal to rank 0: yes|no, reference error E,
//    shm segment: yes|no"
// where E is the largest relative difference from one process trained on the whole global batch,
// and the last answer says whether the process maps the shm backend's memory segment.
// It prints "FAIL: ..." and exits 1 when the ranks differ or E > T (default 1e-6; a job whose world
// size changes midway reduces in another order from then on, and drifts further). --sleep-ms makes each step
// take at least that long (the fault tests need a job that is still training when they strike).
// --checkpoint-dir: every 10 steps the job saves DIR/step-S.ckpt, and it starts from the newest
// one there (the elastic tests restart it with another world size; the result must not change).
// --snapshot: fabric.snapshot(state) after every step and fabric.restore_snapshot(state, the newest
// checkpoint of --checkpoint-dir) at the start (lightning-run --in-memory-replicas K); a restored
// rank prints "..., restored snapshot N" (or "..., no whole snapshot: fell back to PATH"). --strategy fsdp shards the model (default ddp).
// --hidden H: the hidden layer's width (default 64; scripts/bench-hosts-memory.sh makes the state
// hundreds of MB with it). --log-every N: the step lines' period (default 10). A negative
// --tolerance skips the one-process reference (a benchmark's large model; the ranks must still agree).
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "lightning/fabric.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/fsdp.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lf = lightning::fabric;

namespace {
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3, 4, 6, 8 and 12 ranks
constexpr int64_t kFeatures = 20, kClasses = 5;

torch::nn::Sequential classifier(int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, kClasses));
}

torch::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

// Step s's global batch: rows generated from seed 1000 + s, labels from a fixed linear rule.
std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  torch::manual_seed(1000 + step);
  torch::Tensor inputs = torch::randn({kGlobalBatch, kFeatures});
  torch::manual_seed(7);
  torch::Tensor rule = torch::randn({kFeatures, kClasses});
  return {inputs, inputs.matmul(rule).argmax(1)};
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Whether this process maps the shm backend's segment (a memfd of that name): evidence, from the
// kernel's side, of which backend carries the job's data.
bool maps_shm_segment() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:lightning-fabric-shm") != std::string::npos) return true;
  }
  return false;
}

// The newest DIR/step-S.ckpt and its S; {"", 0} when there is none.
std::pair<std::string, int64_t> newest_checkpoint(const std::string& dir) {
  std::pair<std::string, int64_t> newest{"", 0};
  if (dir.empty() || !std::filesystem::is_directory(dir)) return newest;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || entry.path().extension() != ".ckpt") continue;
    // A sharded one (fsdp) is whole once its .metadata is in: a killed save leaves it without.
    if (entry.is_directory() && !std::filesystem::exists(entry.path() / ".metadata")) continue;
    const int64_t step = std::atoll(name.c_str() + 5);
    if (step > newest.second) newest = {entry.path().string(), step};
  }
  return newest;
}

torch::optim::SGD sgd_for(torch::nn::Module& module) {
  return torch::optim::SGD(module.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: hosts_job STEPS [--sleep-ms MS]" << std::endl;
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  int64_t sleep_ms = 0;
  std::string checkpoint_dir;
  double tolerance = 1e-6;
  int64_t hidden = 64, log_every = 10;
  std::string strategy = "ddp";
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--sleep-ms") sleep_ms = std::atoll(argv[i + 1]);
    if (std::string(argv[i]) == "--checkpoint-dir") checkpoint_dir = argv[i + 1];
    if (std::string(argv[i]) == "--tolerance") tolerance = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--hidden") hidden = std::atoll(argv[i + 1]);
    if (std::string(argv[i]) == "--log-every") log_every = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    if (std::string(argv[i]) == "--strategy") strategy = argv[i + 1];
  }
  bool snapshots = false;
  for (int i = 2; i < argc; ++i) snapshots = snapshots || std::string(argv[i]) == "--snapshot";
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(strategy));
  lf::Fabric::seed_everything(3);
  auto net = classifier(hidden);
  auto reference = classifier(hidden);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net->parameters().size(); ++i) reference->parameters()[i].copy_(net->parameters()[i]);
  }
  auto optimizer = sgd_for(*net);
  auto [model, fabric_optimizer] = fabric.setup(net, optimizer);
  const int rank = fabric.global_rank(), world = fabric.world_size();
  const std::string backend =
      world > 1 ? lf::to_string(dynamic_cast<lf::ParallelStrategy&>(*fabric.strategy()).collective().backend()) : "none";
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(world) + " on " + host_name() +
                          ": backend " + backend;
  const int64_t slice = kGlobalBatch / world;
  int64_t first_step = 0;
  lf::State state{{"model", model}, {"optimizer", fabric_optimizer}, {"step", first_step}};
  const auto [resume, resume_step] = newest_checkpoint(checkpoint_dir);
  const auto load_started = std::chrono::steady_clock::now();
  if (snapshots && fabric.restore_snapshot(state, resume)) {
    first_step = state.at("step").to<int64_t>();
    // snapshot_number() 0: none was whole, and the disk checkpoint was loaded instead.
    if (fabric.snapshot_number() > 0) std::cout << who << ", restored snapshot " << fabric.snapshot_number() << std::endl;
    else std::cout << who << ", no whole snapshot: fell back to " << resume << std::endl;
  } else if (!resume.empty()) {
    fabric.load(resume, state);
    first_step = state.at("step").to<int64_t>();
  }
  if (first_step > 0) {
    std::cout << who << ", state loaded in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - load_started).count() << " s" << std::endl;
  }
  std::cout << who << ", restart count " << fabric.restart_count() << ", starting at step " << first_step << std::endl;
  for (int64_t step = first_step; step < steps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    auto [inputs, targets] = global_batch(step);
    fabric_optimizer.zero_grad();
    auto logits = model(inputs.narrow(0, rank * slice, slice));
    fabric.backward(torch::nn::functional::cross_entropy(logits, targets.narrow(0, rank * slice, slice)));
    fabric_optimizer.step();
    if (step % log_every == 0) std::cout << who << ", step " << step << std::endl;
    if (!checkpoint_dir.empty() && (step + 1) % 10 == 0) {
      state.at("step").set_value(step + 1);
      fabric.save(checkpoint_dir + "/step-" + std::to_string(step + 1) + ".ckpt", state);
    }
    if (snapshots) {
      state.at("step").set_value(step + 1);
      fabric.snapshot(state);
    }
    std::this_thread::sleep_until(started + std::chrono::milliseconds(sleep_ms));
  }
  auto reference_optimizer = sgd_for(*reference);
  for (int64_t step = 0; step < (tolerance < 0 ? 0 : steps); ++step) {
    auto [inputs, targets] = global_batch(step);
    reference_optimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(inputs), targets).backward();
    reference_optimizer.step();
  }
  torch::Tensor mine;
  if (strategy == "fsdp") {
    auto full = fabric.strategy_as<lf::FSDPStrategy>().summon_full_parameters(*net);
    mine = flat_parameters(*net).clone();
  } else {
    mine = flat_parameters(*net);
  }
  const torch::Tensor expected = flat_parameters(*reference);
  // A large model's ranks compare sums (in double) rather than every weight.
  const torch::Tensor compared =
      tolerance < 0 ? torch::stack({mine.to(torch::kDouble).sum(), mine.to(torch::kDouble).abs().sum(), mine.to(torch::kDouble).square().sum()})
                    : mine;
  const torch::Tensor everyone = fabric.all_gather(compared);
  bool equal = true;
  for (int r = 0; r < world; ++r) equal = equal && torch::equal(everyone[r], everyone[0]);
  const double error = tolerance < 0 ? 0.0 : ((mine - expected).abs().max() / expected.abs().max()).item<double>();
  std::cout << who << ", " << steps << " steps, bitwise equal to rank 0: " << (equal ? "yes" : "no")
            << ", reference error " << error << ", shm segment: " << (maps_shm_segment() ? "yes" : "no") << std::endl;
  int failures = 0;
  if (!equal) ++failures, std::cout << "FAIL: rank " << rank << "'s weights differ from another rank's" << std::endl;
  if (tolerance >= 0 && !(error <= tolerance)) ++failures, std::cout << "FAIL: rank " << rank << " is " << error << " from the reference" << std::endl;
  fabric.barrier();
  return failures == 0 ? 0 : 1;
}
