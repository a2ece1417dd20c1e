// lf::checkpoint and the policies that apply it (utilities/activation_checkpoint.h): gradients
// equal to the plain forward's, the same dropout mask, activations not kept, autocast, nesting,
// the error for an unlisted tensor, and setup's marking of modules anywhere in the tree.
#include <ATen/autocast_mode.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <torch/torch.h>

#include "lightning/fabric.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include "counting_allocator.h"

#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;

namespace {
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width, double dropout = 0.0)
      : up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(dropout))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    return x + drop(down(torch::gelu(up(x))));
  }
  torch::nn::Linear up, down;
  torch::nn::Dropout drop;
  int calls = 0;
};
TORCH_MODULE(Block);

// Blocks as named members, called by the parent directly or through lf::call.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t width, int64_t depth, double dropout, bool through_call) : through_call(through_call) {
    for (int64_t i = 0; i < depth; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(width, dropout)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = through_call ? lf::call(block, x) : block(x);
    return x;
  }
  std::vector<Block> blocks;
  bool through_call;
};
TORCH_MODULE(Net);

// Gradients of the blocks' parameters and of the input after one backward of sum(out^2).
std::vector<torch::Tensor> gradients(Net& net, const torch::Tensor& input, bool checkpointed, uint64_t seed) {
  net->zero_grad();
  torch::manual_seed(seed);
  auto x = input.clone().requires_grad_();
  auto y = x;
  for (auto& block : net->blocks) y = checkpointed ? lf::checkpoint(block, y) : block(y);
  y.pow(2).sum().backward();
  std::vector<torch::Tensor> grads{x.grad().clone()};
  for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
  grads.push_back(torch::rand({4}));  // the random stream after the step
  return grads;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("checkpoint: gradients equal the plain forward's, bitwise, with and without dropout", "[checkpoint]") {
  torch::manual_seed(0);
  for (double dropout : {0.0, 0.3}) {
    Net net(16, 3, dropout, false);
    const auto input = torch::randn({8, 16});
    const auto plain = gradients(net, input, false, 42);
    const auto recomputed = gradients(net, input, true, 42);
    CHECK(all_equal(plain, recomputed));  // the same masks, and the random stream goes on alike
    for (auto& block : net->blocks) CHECK(block->calls == 3);  // plain, checkpointed, recomputed
    if (dropout > 0) CHECK_FALSE(all_equal(plain, gradients(net, input, false, 43)));  // masks matter
  }
}

TEST_CASE("checkpoint: activations inside the function are not kept until backward", "[checkpoint]") {
  torch::manual_seed(0);
  Net net(256, 8, 0.0, false);
  const auto input = torch::randn({512, 256});
  CountingAllocator counting;  // in front of LibTorch's for this test
  auto kept = [&](bool checkpointed) {
    const int64_t before = CountingAllocator::live();
    auto y = input.clone().requires_grad_();
    for (auto& block : net->blocks) y = checkpointed ? lf::checkpoint(block, y) : block(y);
    const int64_t after = CountingAllocator::live();
    y.sum().backward();
    return static_cast<double>(after - before);
  };
  kept(false);  // warm the allocator up
  const double plain = kept(false), checkpointed = kept(true);
  INFO("plain keeps " << plain / 1e6 << " MB, checkpointed " << checkpointed / 1e6 << " MB");
  CHECK(plain > 8 * 512 * 1024 * 4 * 2.0);  // each block keeps at least its 4x-wide activations
  CHECK(checkpointed < 0.25 * plain);       // only the blocks' inputs and outputs
}

TEST_CASE("checkpoint: autocast during the forward holds during the recompute", "[checkpoint]") {
  torch::manual_seed(0);
  Net net(16, 2, 0.0, false);
  const auto input = torch::randn({4, 16});
  auto run = [&](bool checkpointed) {
    net->zero_grad();
    auto x = input.clone().requires_grad_();
    torch::Tensor y;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      CHECK(net->blocks[0]->up(x).scalar_type() == at::kBFloat16);  // autocast is on
      y = x;
      for (auto& block : net->blocks) y = checkpointed ? lf::checkpoint(block, y) : block(y);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    y.to(torch::kFloat).pow(2).sum().backward();  // backward outside autocast, as training loops do
    return std::vector<torch::Tensor>{x.grad().clone(), net->blocks[0]->up->weight.grad().clone()};
  };
  CHECK(all_equal(run(false), run(true)));
}

TEST_CASE("checkpoint: nested checkpoints and functions of several tensors", "[checkpoint]") {
  torch::manual_seed(0);
  Block inner(8), outer(8);
  const auto a = torch::randn({3, 8}).requires_grad_(), b = torch::randn({3, 8}).requires_grad_();
  auto fn = [&](const std::vector<torch::Tensor>& t) {
    auto mid = lf::checkpoint(inner, t[0] * t[1]);
    return std::vector<torch::Tensor>{outer(mid), mid.sum()};
  };
  std::vector<torch::Tensor> params = inner->parameters();
  for (const auto& p : outer->parameters()) params.push_back(p);
  auto loss_of = [](const std::vector<torch::Tensor>& out) { return out[0].pow(2).sum() + 3 * out[1]; };
  loss_of(fn({a, b})).backward();
  const auto plain_a = a.grad().clone(), plain_w = inner->up->weight.grad().clone();
  a.mutable_grad().reset();
  inner->zero_grad();
  loss_of(lf::checkpoint(fn, {a, b}, params)).backward();
  CHECK(torch::equal(a.grad(), plain_a));
  CHECK(torch::equal(inner->up->weight.grad(), plain_w));
}

TEST_CASE("checkpoint: a tensor that needs a gradient and is not listed is an error, not a silent zero",
          "[checkpoint]") {
  const auto hidden = torch::randn({4}).requires_grad_();
  const auto x = torch::randn({4}).requires_grad_();
  auto y = lf::checkpoint([&](const torch::Tensor& t) { return t * hidden; }, x);
  CHECK_THROWS_WITH(y.sum().backward(), Contains("lf::checkpoint: the checkpointed function reads a tensor that "
                                                 "requires grad (Float[4])") && Contains("Pass it in `parameters`"));
  auto listed = lf::checkpoint([&](const torch::Tensor& t) { return t * hidden; }, x, {hidden});
  listed.sum().backward();
  CHECK(torch::equal(hidden.grad(), x.detach()));
  // Without grad mode the function just runs.
  torch::NoGradGuard no_grad;
  CHECK_FALSE(lf::checkpoint([&](const torch::Tensor& t) { return t * hidden; }, x).requires_grad());
}

TEST_CASE("apply_activation_checkpointing marks matches anywhere, and lf::call and Sequential children honour it",
          "[checkpoint]") {
  torch::manual_seed(0);
  Net net(8, 2, 0.0, true);
  torch::nn::Sequential seq(Block(8), torch::nn::ReLU(), Block(8));
  const auto names_before = seq->named_parameters().keys();
  CHECK(lf::apply_activation_checkpointing(*net, lf::ModulePolicy()) == 0);  // empty policy: nothing
  CHECK(lf::apply_activation_checkpointing(*net, lf::ModulePolicy::of_type<BlockImpl>()) == 2);
  CHECK(lf::is_checkpointed(*net->blocks[0]));
  CHECK(lf::apply_activation_checkpointing(*net, lf::ModulePolicy::of_type<BlockImpl>()) == 0);  // once
  const auto x = torch::randn({2, 8}).requires_grad_();
  net(x).sum().backward();
  CHECK(net->blocks[1]->calls == 2);  // forward, and again in backward
  CHECK(lf::apply_activation_checkpointing(
            *seq, lf::ModulePolicy([](const torch::nn::Module&, const std::string& name) { return name == "2"; })) == 1);
  CHECK(seq->named_parameters().keys() == names_before);  // the wrapper is transparent to names
  CHECK(seq[2]->as<lf::CheckpointedImpl>() != nullptr);
  CHECK(seq[0]->as<BlockImpl>() != nullptr);
  seq->forward(x).sum().backward();
  auto* wrapped = dynamic_cast<BlockImpl*>(seq[2]->as<lf::CheckpointedImpl>()->wrapped().get());
  CHECK(wrapped->calls == 2);
  CHECK(seq[0]->as<BlockImpl>()->calls == 1);
  // An FSDPUnit stands for its module: the policy sees the Block, and the unit checkpoints inside.
  lf::FSDPUnit unit(Block(8));
  torch::nn::Sequential holder(unit);
  CHECK(lf::apply_activation_checkpointing(*holder, lf::ModulePolicy::of_type<BlockImpl>()) == 1);
  unit(x).sum().backward();
  CHECK(dynamic_cast<BlockImpl*>(unit->wrapped().get())->calls == 2);
  // A Sequential inside a unit: its children are reached through the wrapper too.
  torch::nn::Sequential inner(Block(8), torch::nn::ReLU());
  lf::FSDPUnit outer(inner);
  torch::nn::Sequential top(outer);
  top->eval();
  CHECK(lf::apply_activation_checkpointing(*top, lf::ModulePolicy::of_type<BlockImpl>()) == 1);
  CHECK(inner[0]->as<lf::CheckpointedImpl>() != nullptr);
  CHECK_FALSE(inner->is_training());  // rebuilding the Sequential keeps its mode
  top->train();
  top->forward(x).sum().backward();
  CHECK(dynamic_cast<BlockImpl*>(inner[0]->as<lf::CheckpointedImpl>()->wrapped().get())->calls == 2);
}

TEST_CASE("lf::call runs the hooks set for a module around its forward, while their owner lives", "[checkpoint]") {
  struct Recorder : lf::ForwardHooks {
    std::vector<std::string> log;
    torch::Tensor before_forward(torch::Tensor input) override {
      log.push_back("before");
      return input;
    }
    torch::Tensor after_forward(torch::Tensor output) override {
      log.push_back("after");
      return output * 2;
    }
  };
  Block block(4), other(4);
  const auto x = torch::randn({2, 4});
  auto hooks = std::make_shared<Recorder>();
  lf::set_forward_hooks(*block, hooks);
  CHECK(torch::equal(lf::call(block, x), block(x) * 2));
  CHECK(hooks->log == std::vector<std::string>{"before", "after"});
  CHECK(lf::forward_hooks(*other) == nullptr);
  CHECK(torch::equal(lf::call(other, x), other(x)));  // nothing set: the plain forward
  hooks.reset();                                      // the owner is gone: so are the hooks
  CHECK(lf::forward_hooks(*block) == nullptr);
  CHECK(torch::equal(lf::call(block, x), block(x)));
}

TEST_CASE("a policy matching blocks that the parent calls directly is refused at the first backward",
          "[checkpoint][errors]") {
  for (bool through_call : {true, false}) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
    Net net(8, 2, 0.0, through_call);
    lf::SetupOptions options;
    options.activation_checkpointing = lf::ModulePolicy::of_type<BlockImpl>();
    auto model = fabric.setup_module(options, net);
    auto loss = model(torch::randn({3, 8})).pow(2).sum();
    if (through_call) {
      fabric.backward(loss);
      CHECK(net->blocks[0]->calls == 2);  // the forward, then the recompute in backward
    } else {
      CHECK_THROWS_WITH(fabric.backward(loss), Contains("'block0', 'block1'") && Contains("lf::call(block, x)"));
    }
  }
}

TEST_CASE("frozen blocks under a policy: recomputed through lf::call as PyTorch's checkpoint, called directly "
          "unchecked (documented)", "[checkpoint]") {
  for (bool through_call : {true, false}) {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
    torch::manual_seed(4);
    Net net(8, 2, 0.0, through_call);
    torch::manual_seed(4);
    Net plain(8, 2, 0.0, /*through_call=*/false);
    for (auto& p : net->parameters()) p.requires_grad_(false);
    for (auto& p : plain->parameters()) p.requires_grad_(false);
    lf::SetupOptions options;
    options.activation_checkpointing = lf::ModulePolicy::of_type<BlockImpl>();
    auto model = fabric.setup_module(options, net);
    const auto input = torch::randn({3, 8});
    auto x = input.clone().requires_grad_();  // the gradient must reach what comes before the blocks
    fabric.backward(model(x).pow(2).sum());
    auto reference = input.clone().requires_grad_();
    plain(reference).pow(2).sum().backward();
    CHECK(torch::allclose(x.grad(), reference.grad(), 1e-6, 1e-6));
    // Through lf::call: the forward, then the recompute in backward; called directly: no recompute
    // and no error, since a frozen block leaves no gradient to tell that it ran.
    CHECK(net->blocks[0]->calls == (through_call ? 2 : 1));
  }
}
