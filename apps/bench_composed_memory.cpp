// Step time and memory per rank of a composed configuration (docs/benchmarks.md, "Every 2-D and
// 3-D configuration"): the examples' tensor-parallel GPT trained with AdamW under model_parallel
// with the data dimension (--data ddp|fsdp|hsdp, --shard S for hsdp), --tensor T and --context C,
// one sequence per data rank. Each rank measures from the kernel the peak resident set during the
// measured steps (VmHWM, reset after two warm-up steps) above its resident set before the model
// was built, so the peak holds everything the step needs: parameters, gradients, AdamW's two
// states, gathered units, buckets, activations. The formula is what ZeRO's accounting says this
// rank must hold: the elements it trains (its tensor-parallel slices, under fsdp its shards of
// them: Strategy::trained_parts) x 4 bytes x 4 (parameter, gradient, two states). Prints one JSON
// line from rank 0 with the largest ratio over the ranks, the median step time and the most any
// rank holds between steps (rest_mb, above the same base), of it the shared memory it has touched
// (rest_shm_mb: the shm backend's segments; shm_after_steps_mb after the measured steps), and what
// its trained tensors, their gradients and AdamW's state occupy as allocated (held_mb).
//   lightning-run model --accelerator cpu --devices 4 build/bin/bench_composed_memory --data fsdp --tensor 2
#include <lightning/fabric.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "fsdp_bench_common.h"
#include "tensor_parallel_gpt.h"

namespace lf = lightning::fabric;
using fsdp_bench::status_bytes;

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed: glibc's adaptive threshold would keep freed blocks
  examples::TensorParallelGptSettings settings{/*vocab=*/4096, /*seq=*/32, /*d_model=*/512, /*heads=*/8, /*layers=*/8};
  std::string data = "ddp";
  int tensor = 1, context = 1, shard = 0;
  int64_t steps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool value = i + 1 < argc;
    if (arg == "--data" && value) data = argv[++i];
    else if (arg == "--tensor" && value) tensor = std::stoi(argv[++i]);
    else if (arg == "--context" && value) context = std::stoi(argv[++i]);
    else if (arg == "--shard" && value) shard = std::stoi(argv[++i]);
    else if (arg == "--steps" && value) steps = std::stoll(argv[++i]);
    else if (arg == "--layers" && value) settings.layers = std::stoll(argv[++i]);
    else if (arg == "--d-model" && value) settings.d_model = std::stoll(argv[++i]);
    else if (arg == "--seq" && value) settings.seq = std::stoll(argv[++i]);
    else {
      std::cerr << "bench_composed_memory: unknown argument " << arg
                << " (--data ddp|fsdp|hsdp, --tensor T, --context C, --shard S, --steps N, --layers L, --d-model D, --seq L)"
                << std::endl;
      return 2;
    }
  }
  lf::ModelParallelOptions options;
  options.tensor_parallel_size = tensor;
  options.context_parallel_size = context;
  if (data != "ddp") {
    options.data_parallel_strategy = "fsdp";
    options.fully_sharded.auto_wrap = lf::ModulePolicy::of_type<examples::TensorParallelBlockImpl>();  // a unit per block
    if (data == "hsdp") {
      options.fully_sharded.sharding_strategy = lf::ShardingStrategy::HybridShard;
      if (shard > 0) options.data_parallel_shard_size = shard;
    }
  }
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::model_parallel_strategy(options)));
  fabric.seed_everything(0);
  fsdp_bench::warm_up(fabric);  // the groups, code and buffers every step touches are part of base
  const int64_t base = status_bytes("VmRSS"), base_shared = status_bytes("RssShmem");
  examples::TensorParallelGpt net(settings);
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-4));
  auto setup = fabric.setup(net, adamw);
  auto& model = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);
  const lf::DeviceMesh* mesh = fabric.strategy_as<lf::MeshStrategy>().device_mesh().get();
  const int data_size = mesh->size("data"), data_rank = mesh->coordinate("data");
  int64_t trained = 0;  // elements this rank trains
  for (const auto& part : fabric.strategy()->trained_parts(*net)) trained += part.tensor.numel();
  const auto step = [&](int64_t index) {
    auto [ids, targets] = examples::tensor_parallel_gpt_batch(settings, data_size, index);
    optimizer.zero_grad();
    lf::context_parallel::Region region(mesh);
    const at::Tensor logits = model(region.shard(ids.narrow(0, data_rank, 1), 1));
    fabric.backward(examples::tensor_parallel_gpt_loss(logits, region.shard(targets.narrow(0, data_rank, 1), 1), mesh));
    optimizer.step();
  };
  step(0);
  step(1);
  const double rest = static_cast<double>(status_bytes("VmRSS") - base);  // held between steps
  // Of it, pages of shared memory this process has touched: the shm backend's segments (its own
  // and its peers' that it reads), which the collectives keep mapped for the job's life.
  const double rest_shared = static_cast<double>(status_bytes("RssShmem") - base_shared);
  // What the trained tensors, their gradients and AdamW's state occupy (distinct storages): the
  // part of the rest the formula accounts for, as allocated.
  std::set<const void*> storages;
  double held = 0;
  const auto count = [&](const at::Tensor& tensor) {
    if (tensor.defined() && storages.insert(tensor.storage().unsafeGetStorageImpl()).second) {
      held += static_cast<double>(tensor.storage().nbytes());
    }
  };
  for (const auto& part : fabric.strategy()->trained_parts(*net)) {
    count(part.tensor);
    count(part.tensor.grad());
  }
  for (const auto& group : adamw.param_groups()) {
    for (const auto& parameter : group.params()) {
      auto found = adamw.state().find(parameter.unsafeGetTensorImpl());
      if (found == adamw.state().end()) continue;
      const auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      count(state.exp_avg());
      count(state.exp_avg_sq());
    }
  }
  fsdp_bench::reset_peak_rss();
  std::vector<double> times;
  for (int64_t i = 0; i < steps; ++i) {
    fabric.barrier();
    const auto start = std::chrono::steady_clock::now();
    step(2 + i);
    fabric.barrier();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const double peak = static_cast<double>(status_bytes("VmHWM") - base);
  const double formula = 16.0 * static_cast<double>(trained);
  const auto most = [&](double value) {
    return fabric.all_reduce(torch::tensor(value, torch::kFloat64), "max").item<double>();
  };
  const double worst_ratio = most(peak / formula), peak_most = most(peak), formula_most = most(formula);
  const double rest_most = most(rest), held_most = most(held), shared_most = most(rest_shared);
  const double shared_after = most(static_cast<double>(status_bytes("RssShmem") - base_shared));
  if (fabric.is_global_zero()) {
    std::cout << "{\"benchmark\":\"composed memory\",\"data\":\"" << data << "\",\"mesh\":\"";
    const std::vector<std::string> names = mesh->names();
    const std::vector<int> shape = mesh->shape();
    for (size_t d = 0; d < names.size(); ++d) std::cout << (d ? " x " : "") << names[d] << " " << shape[d];
    std::cout << "\",\"ranks\":" << fabric.world_size() << ",\"layers\":" << settings.layers
              << ",\"d_model\":" << settings.d_model << ",\"seq\":" << settings.seq
              << ",\"step_ms_median\":" << times[times.size() / 2] << ",\"rest_mb\":" << rest_most / 1e6
              << ",\"held_mb\":" << held_most / 1e6 << ",\"rest_shm_mb\":" << shared_most / 1e6
              << ",\"shm_after_steps_mb\":" << shared_after / 1e6
              << ",\"peak_mb\":" << peak_most / 1e6
              << ",\"formula_mb\":" << formula_most / 1e6 << ",\"peak_over_formula\":" << worst_ratio << "}" << std::endl;
  }
  return 0;
}
