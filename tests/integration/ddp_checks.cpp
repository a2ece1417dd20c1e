// DDP and collectives checked from inside a real multi-process job. Run under lightning-run with
// 2 or 4 workers; every rank checks, prints "FAIL: ..." for each failed check and exits 1 if
// any failed, else prints "rank R: all DDP checks passed".
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>
#include <map>
#include <string>

#include "expect.h"
#include "lightning/fabric.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/utilities/process.h"
#include "lightning/fabric/strategies/ddp.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// A second network with the same weights (the single-process reference keeps the original).
Net copy_of(const Net& reference) {
  Net copy;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < copy->parameters().size(); ++i) copy->parameters()[i].copy_(reference->parameters()[i]);
  return copy;
}

double max_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

// Gradients after one backward: identical on every rank and equal to the single-process gradient
// of the concatenated batch.
void check_gradients(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  torch::manual_seed(5);
  Net reference;
  Net net = copy_of(reference);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(9);
  const auto inputs = torch::randn({8 * world, 16});
  const auto targets = torch::randint(4, {8 * world});
  auto local = torch::nn::functional::cross_entropy(model(inputs.narrow(0, 8 * rank, 8)), targets.narrow(0, 8 * rank, 8));
  fabric.backward(local);
  torch::nn::functional::cross_entropy(reference(inputs), targets).backward();
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    const auto grad = net->parameters()[i].grad();
    const auto gathered = fabric.all_gather(grad);
    for (int r = 0; r < world; ++r) expect(torch::equal(gathered[r], gathered[0]), "gradients identical on every rank");
    const double error = max_relative_error(grad, reference->parameters()[i].grad());
    expect(error <= 1e-6, "gradient equals the full-batch gradient (relative error " + std::to_string(error) + ")");
  }
}

// 100 steps on different data per rank: the replicas stay identical.
void check_replicas(lf::Fabric& fabric) {
  Net net;
  torch::optim::Adam adam(net->parameters(), 1e-2);
  auto [model, optimizer] = fabric.setup(net, adam);
  torch::manual_seed(1000 + fabric.global_rank());
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({4, 16})).pow(2).mean());
    optimizer.step();
  }
  for (const auto& parameter : net->parameters()) {
    const auto gathered = fabric.all_gather(parameter.detach());
    for (int r = 0; r < fabric.world_size(); ++r) expect(torch::equal(gathered[r], gathered[0]), "weights identical after 100 steps");
  }
}

struct NormNetImpl : torch::nn::Module {
  NormNetImpl()
      : fc(register_module("fc", torch::nn::Linear(16, 8))), norm(register_module("norm", torch::nn::BatchNorm1d(8))),
        head(register_module("head", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::relu(norm(fc(x)))); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear head;
};
TORCH_MODULE(NormNet);

// broadcast_buffers (on by default, as PyTorch's DDP): rank 0's BatchNorm statistics reach every
// rank before each forward. After training on different data per rank, each rank's statistics
// hold its own last batch; the evaluation forward that follows sees rank 0's on every rank. A
// forward after one under no_grad sends nothing (PyTorch's require_forward_param_sync).
void check_buffers(lf::Fabric& fabric) {
  auto& ddp = fabric.strategy_as<lf::DDPStrategy>();
  NormNet net;
  torch::optim::SGD sgd(net->parameters(), 0.05);
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(2000 + fabric.global_rank());
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({6, 16}) * (1.0 + fabric.global_rank())).pow(2).mean());
    optimizer.step();
  }
  // Two forwards before one backward, as a GAN's discriminator runs on real, then generated,
  // samples: the broadcast before the second must leave the first forward's backward valid.
  optimizer.zero_grad();
  const auto real = model(torch::randn({6, 16}));
  const auto generated = model(torch::randn({6, 16}) * (1.0 + fabric.global_rank()));
  fabric.backward(real.pow(2).mean() + generated.pow(2).mean());
  optimizer.step();
  const auto means = fabric.all_gather(net->norm->running_mean.clone());
  expect(!torch::equal(means[0], means[1]), "each rank's last training batch updated its own statistics");
  net->eval();
  {
    torch::NoGradGuard no_grad;
    model(torch::randn({6, 16}));
  }
  for (const auto& buffer : net->buffers()) {
    const auto gathered = fabric.all_gather(buffer);
    for (int r = 0; r < fabric.world_size(); ++r) {
      expect(torch::equal(gathered[r], gathered[0]), "buffers equal on every rank at the evaluation forward");
    }
  }
  expect(torch::equal(net->norm->running_mean, means[0]), "every rank has rank 0's statistics");
  const uint64_t before = ddp.collective().operation_count();
  {
    torch::NoGradGuard no_grad;
    model(torch::randn({6, 16}));
  }
  expect(ddp.collective().operation_count() == before, "no buffer broadcast after a forward under no_grad");
  net->train();
}

// Accumulation under no_backward_sync: no collective, local gradients; the final synced backward
// gives the full-batch result.
void check_no_backward_sync(lf::Fabric& fabric) {
  auto& ddp = fabric.strategy_as<lf::DDPStrategy>();
  const int world = fabric.world_size(), rank = fabric.global_rank();
  torch::manual_seed(11);
  Net reference;
  Net net = copy_of(reference);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(12);
  const auto inputs = torch::randn({2, 4 * world, 16});  // two micro-batches
  const uint64_t before = ddp.collective().operation_count();
  {
    auto skip = fabric.no_backward_sync(model);
    fabric.backward(model(inputs[0].narrow(0, 4 * rank, 4)).pow(2).mean());
  }
  expect(ddp.collective().operation_count() == before, "no collective during accumulation");
  fabric.backward(model(inputs[1].narrow(0, 4 * rank, 4)).pow(2).mean());
  // main() set buckets so small that every parameter is a bucket of its own: one all-reduce each.
  expect(ddp.collective().operation_count() - before == net->parameters().size(),
         "one all-reduce per bucket (" + std::to_string(ddp.collective().operation_count() - before) + ")");
  (reference(inputs[0]).pow(2).mean() + reference(inputs[1]).pow(2).mean()).backward();
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    const double error = max_relative_error(net->parameters()[i].grad(), reference->parameters()[i].grad());
    expect(error <= 1e-6, "accumulated gradient equals the full-batch one (relative error " + std::to_string(error) + ")");
  }
}

void check_collectives(lf::Fabric& fabric) {
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const auto mine = torch::full({3}, static_cast<double>(rank + 1), torch::kDouble);
  const double sum = world * (world + 1) / 2.0;
  expect(fabric.all_reduce(mine.clone(), "sum").equal(torch::full({3}, sum, torch::kDouble)), "all_reduce sum");
  expect(fabric.all_reduce(mine.clone(), "mean").allclose(torch::full({3}, sum / world, torch::kDouble)), "all_reduce mean");
  expect(fabric.all_reduce(mine.clone(), "max").equal(torch::full({3}, world, torch::kDouble)), "all_reduce max");
  expect(fabric.all_reduce(mine.clone(), "min").equal(torch::full({3}, 1.0, torch::kDouble)), "all_reduce min");
  auto in_place = mine.clone();
  fabric.all_reduce(in_place, "sum");
  expect(in_place.equal(torch::full({3}, sum, torch::kDouble)), "all_reduce reduces a contiguous input in place, as Python");
  expect(fabric.all_reduce(static_cast<double>(rank), "sum") == world * (world - 1) / 2.0, "all_reduce of a number");
  std::map<std::string, torch::Tensor> nested{{"a", torch::ones({2})}, {"b", torch::full({1}, static_cast<double>(rank))}};
  auto reduced = fabric.all_reduce(nested, "sum");
  expect(reduced["a"].equal(torch::full({2}, static_cast<float>(world))), "all_reduce of a map of tensors");
  const auto gathered = fabric.all_gather(torch::full({2, 2}, static_cast<double>(rank)));
  expect(gathered.sizes() == torch::IntArrayRef({world, 2, 2}), "all_gather adds a leading world-size dimension");
  for (int r = 0; r < world; ++r) expect(gathered[r].equal(torch::full({2, 2}, static_cast<double>(r))), "all_gather order");
  const auto broadcast = fabric.broadcast(torch::full({2}, static_cast<double>(rank)), world - 1);
  expect(broadcast.equal(torch::full({2}, static_cast<double>(world - 1))), "broadcast from the last rank");
  const std::string text = fabric.broadcast(rank == 0 ? std::string("{\"lr\": 0.1}") : std::string(), 0);
  expect(text == "{\"lr\": 0.1}", "broadcast of a string");
  fabric.barrier();
  std::vector<int> order;
  {
    auto first = fabric.rank_zero_first();
    order.push_back(rank);
  }
  expect(order.size() == 1, "rank_zero_first runs the block once per rank");
}

// The distributed sampler covers the data set exactly once per epoch across ranks.
class Range : public torch::data::datasets::Dataset<Range> {
 public:
  torch::data::Example<> get(size_t i) override { return {torch::full({1}, static_cast<double>(i)), torch::zeros({1})}; }
  torch::optional<size_t> size() const override { return 103; }
};

void check_sampler(lf::Fabric& fabric) {
  auto loader = fabric.setup_dataloaders(Range().map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(10),
                                         lf::DataLoaderSettings{true});
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto seen = torch::zeros({103}, torch::kDouble);
    for (auto& batch : loader) {
      for (int64_t i = 0; i < batch.data.size(0); ++i) seen[batch.data[i].item<int64_t>()] += 1;
    }
    seen = fabric.all_reduce(seen, "sum");
    const int world = fabric.world_size();
    const int64_t padded = ((103 + world - 1) / world) * world - 103;
    expect(seen.min().item<double>() >= 1, "every sample seen in epoch " + std::to_string(epoch));
    expect(seen.sum().item<double>() == 103 + padded, "no sample seen twice but the padding");
  }
}
// fabric.save on every rank writes one file (rank 0's), after which every rank can load it.
void check_checkpoint(lf::Fabric& fabric) {
  const std::string folder = fabric.broadcast(fabric.is_global_zero() ? lf::make_temporary_directory("lf-ddp-ckpt") : "");
  torch::manual_seed(21 + fabric.global_rank());  // different on every rank on purpose
  Net net;
  const auto rank_zero_weight = fabric.broadcast(net->fc1->weight.detach().clone(), 0);
  fabric.save(folder + "/shared.ckpt", {{"model", net}, {"rank", fabric.global_rank()}});
  Net restored;
  lf::State state{{"model", restored}, {"rank", -1}};
  fabric.load(folder + "/shared.ckpt", state);
  expect(state.at("rank").to<int64_t>() == 0, "the file holds rank 0's state");
  expect(torch::equal(restored->fc1->weight, rank_zero_weight), "every rank loads rank 0's weights");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) files += entry.is_regular_file();
  expect(files == 1, "one file written, no temporary left (" + std::to_string(files) + ")");
  fabric.barrier();
  if (fabric.is_global_zero()) std::filesystem::remove_all(folder);
}
}  // namespace

// A process-group timeout set through FabricOptions().strategy(ddp_strategy(...)) ends a barrier
// that another rank never joins (that rank stays alive, so the error is the timeout's).
int check_timeout() {
  lf::DDPOptions settings;
  settings.process_group.timeout = std::chrono::seconds(4);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::ddp_strategy(settings)));
  fabric.barrier();  // everybody is here
  if (fabric.global_rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(12));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    fabric.barrier();
    std::cout << "FAIL: the barrier returned although rank 1 never joined" << std::endl;
    return 1;
  } catch (const std::exception& error) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "rank 0: barrier ended after " << waited << " s: " << error.what() << std::endl;
    const bool ok = waited >= 3.5 && waited < 11.0;
    std::cout << (ok ? "rank 0: timeout check passed" : "FAIL: the barrier did not end at the 4 s timeout") << std::endl;
    return ok ? 0 : 1;
  }
}

// Blocks with dropout held as named members and called through lf::call, so that a policy can
// checkpoint them wherever they sit.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl()
      : fc(register_module("fc", torch::nn::Linear(16, 64))), out(register_module("out", torch::nn::Linear(64, 16))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++forwards;
    return x + out(drop(torch::gelu(fc(x))));
  }
  torch::nn::Linear fc, out;
  torch::nn::Dropout drop;
  int forwards = 0;
};
TORCH_MODULE(DropBlock);

struct BlocksImpl : torch::nn::Module {
  BlocksImpl() : first(register_module("first", DropBlock())), second(register_module("second", DropBlock())),
                 head(register_module("head", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return head(lf::call(second, lf::call(first, x))); }
  DropBlock first, second;
  torch::nn::Linear head;
};
TORCH_MODULE(Blocks);

// The same blocks called directly: a checkpointing policy that matches them recomputes nothing.
struct DirectBlocksImpl : torch::nn::Module {
  DirectBlocksImpl() : first(register_module("first", DropBlock())), second(register_module("second", DropBlock())) {}
  torch::Tensor forward(torch::Tensor x) { return second(first(x)); }
  DropBlock first, second;
};
TORCH_MODULE(DirectBlocks);

// Two replicas of one model trained side by side, one with its blocks checkpointed
// (SetupOptions::activation_checkpointing): the same dropout masks, the same averaged gradients,
// bitwise-equal weights after 20 steps; the checkpointed blocks run forward twice per step. A
// policy matching blocks the parent calls directly is refused at the first backward, on every rank.
void check_activation_checkpointing(lf::Fabric& fabric) {
  torch::manual_seed(21);
  Blocks plain;
  Blocks checkpointed;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) checkpointed->parameters()[i].copy_(plain->parameters()[i]);
  }
  torch::optim::Adam adam_plain(plain->parameters(), 1e-2), adam_checkpointed(checkpointed->parameters(), 1e-2);
  auto [model_plain, optimizer_plain] = fabric.setup(plain, adam_plain);
  lf::SetupOptions options;
  options.activation_checkpointing = lf::ModulePolicy::of_type<DropBlockImpl>();
  auto [model_checkpointed, optimizer_checkpointed] = fabric.setup(options, checkpointed, adam_checkpointed);
  expect(lf::is_checkpointed(*checkpointed->first) && !lf::is_checkpointed(*plain->first),
         "the policy marks the set-up model's blocks only");
  const int steps = 20;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(500 + step * 10 + fabric.global_rank());
    const auto input = torch::randn({6, 16});
    for (auto* pair : {&model_plain, &model_checkpointed}) {
      auto& optimizer = pair == &model_plain ? optimizer_plain : optimizer_checkpointed;
      torch::manual_seed(900 + step * 10 + fabric.global_rank());  // the same dropout masks for both
      optimizer.zero_grad();
      fabric.backward((*pair)(input).pow(2).mean());
      optimizer.step();
    }
  }
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    expect(torch::equal(plain->parameters()[i], checkpointed->parameters()[i]),
           "checkpointed blocks train to bitwise-equal weights (parameter " + std::to_string(i) + ")");
    const auto gathered = fabric.all_gather(checkpointed->parameters()[i].detach());
    for (int r = 0; r < fabric.world_size(); ++r) expect(torch::equal(gathered[r], gathered[0]), "replicas agree");
  }
  expect(plain->first->forwards == steps && checkpointed->first->forwards == 2 * steps,
         "checkpointed blocks run forward again in backward (" + std::to_string(checkpointed->first->forwards) +
             " forwards in " + std::to_string(steps) + " steps)");
  DirectBlocks direct;
  auto model_direct = fabric.setup_module(options, direct);
  std::string message;
  try {
    fabric.backward(model_direct(torch::randn({6, 16})).pow(2).mean());
  } catch (const lf::ValueError& error) {
    message = error.what();
  }
  expect(message.find("'first', 'second'") != std::string::npos && message.find("lf::call(block, x)") != std::string::npos,
         "ddp: a policy matching blocks called directly is refused at the first backward, got: " + message);
}

// DDPOptions::broadcast_buffers off: each rank keeps its own statistics, and a forward sends nothing.
int check_buffers_off() {
  lf::DDPOptions settings;
  settings.broadcast_buffers = false;
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::ddp_strategy(settings)));
  auto& ddp = fabric.strategy_as<lf::DDPStrategy>();
  NormNet net;
  torch::optim::SGD sgd(net->parameters(), 0.05);
  auto [model, optimizer] = fabric.setup(net, sgd);
  torch::manual_seed(3000 + fabric.global_rank());
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    fabric.backward(model(torch::randn({6, 16}) * (1.0 + fabric.global_rank())).pow(2).mean());
    optimizer.step();
  }
  net->eval();
  const uint64_t before = ddp.collective().operation_count();
  model(torch::randn({6, 16}));  // with gradients: broadcast_buffers on would send rank 0's buffers first
  expect(ddp.collective().operation_count() == before, "broadcast_buffers off: a forward issues no collective");
  const auto means = fabric.all_gather(net->norm->running_mean.clone());
  expect(!torch::equal(means[0], means[1]), "broadcast_buffers off: each rank keeps its own running statistics");
  if (checks::failures() == 0) std::cout << "rank " << fabric.global_rank() << ": all DDP checks passed" << std::endl;
  return checks::failures() == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "timeout") return check_timeout();
  if (argc > 1 && std::string(argv[1]) == "buffers_off") return check_buffers_off();
  if (argc > 1 && std::string(argv[1]) == "checkpointing") {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
    check_activation_checkpointing(fabric);
    if (checks::failures() == 0) std::cout << "rank " << fabric.global_rank() << ": all DDP checks passed" << std::endl;
    return checks::failures() == 0 ? 0 : 1;
  }
  lf::DDPOptions settings;
  settings.first_bucket_mb = settings.bucket_cap_mb = 1e-6;  // a bucket per parameter
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::ddp_strategy(settings)));
  lf::Fabric::seed_everything(3);
  check_gradients(fabric);
  check_replicas(fabric);
  check_no_backward_sync(fabric);
  check_buffers(fabric);
  check_collectives(fabric);
  check_sampler(fabric);
  check_checkpoint(fabric);
  if (checks::failures() == 0) std::cout << "rank " << fabric.global_rank() << ": all DDP checks passed" << std::endl;
  return checks::failures() == 0 ? 0 : 1;
}
