// What research loops need, against one process's plain LibTorch over the global batch:
//   lf_research_loop_checks single|ddp|fsdp [PRECISION | bf16-mixed-scaled]
// single runs in one process over the whole batch; ddp and fsdp (FULL_SHARD, the critic's two
// larger layers as sharding units) run under lightning-run, rank r holding rows [4r, 4r + 4).
// Checks, each on a fresh critic (MLP 6-32-32-1 with tanh) and one SGD step (lr 0.1), weights
// compared after the step on every rank (error relative to each parameter's largest magnitude,
// at least 0.01):
//   - a WGAN-GP step: the gradient penalty through fabric.grad(create_graph) plus the critic's
//     loss, one fabric.backward (1e-5 relative in 32-true; 3e-2 in the mixed precisions, where
//     the critic computes in 16 bits). bf16-mixed-scaled adds a loss scaler (16-mixed's, which
//     this CPU cannot run: it falls back to bf16-mixed there, as in Python), so fabric.grad must
//     take the scale out of the penalty's gradient; no step may be skipped;
//   - a MAML inner step: fabric.grad with respect to the parameters (higher_order), the outer loss
//     through the fast weights (single and ddp; fsdp's parameters are whole only in its forward);
//   - retain_graph: two fabric.backward on one loss give twice the gradient;
//   - inputs: only the named parameter moves;
//   - a no-grad forward between a forward and its backward changes nothing;
//   - create_graph in fabric.backward: a differentiable gradient on one process, refused with the
//     fix under ddp and fsdp;
//   - a forward method (FabricModule::call, by member pointer and by callable) runs with full
//     parameters and the precision's autocast, and equals the plain module's result;
//   - a contrastive loss over the global batch through all_gather(sync_grads) (ranks' embeddings);
//   - groups (fabric.new_group): all_reduce, broadcast and all_gather among members, refusals for
//     non-members and bad ranks;
//   - hooks: on_after_setup and on_after_optimizer_step reach the callbacks and a set-up module
//     that derives from lf::Callback, with the documented arguments.
// Each rank prints "FAIL: ..." per failed check and exits 1 if any failed.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <iostream>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {
using checks::expect;
const auto refusal = [](auto&& fn) { return checks::refusal<lf::ValueError>(fn); };

constexpr int64_t kLocalRows = 4;

// Counts Fabric's own hooks and keeps their arguments.
struct HookRecorder : lf::Callback {
  int setups = 0, steps = 0;
  std::shared_ptr<torch::nn::Module> module;
  lf::Fabric* fabric = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  lf::Strategy* strategy = nullptr;
  void on_after_setup(const lf::HookArgs& args) override {
    ++setups;
    fabric = args.get<lf::Fabric*>("fabric");
    module = args.get<std::shared_ptr<torch::nn::Module>>("module");
  }
  void on_after_optimizer_step(const lf::HookArgs& args) override {
    ++steps;
    strategy = args.get<lf::Strategy*>("strategy");
    optimizer = args.get<torch::optim::Optimizer*>("optimizer");
  }
};
constexpr double kLearningRate = 0.1;

torch::nn::Sequential make_critic() {
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(6, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Linear(32, 1));
}

struct Run {
  lf::Fabric& fabric;
  std::string strategy;
  std::string precision;
  double tolerance;
  torch::Tensor real, fake, alpha;  // the global batch, alike on every rank
  std::shared_ptr<struct HookRecorder> recorder;

  int64_t offset() const { return strategy == "single" ? 0 : fabric.global_rank() * kLocalRows; }
  int64_t rows() const { return strategy == "single" ? real.size(0) : kLocalRows; }
  torch::Tensor mine(const torch::Tensor& t) const { return t.narrow(0, offset(), rows()); }
};

// The critic's weights after the step, whole on every rank.
std::vector<torch::Tensor> weights(Run& run, torch::nn::Sequential& critic) {
  std::vector<torch::Tensor> out;
  auto read = [&] {
    for (const auto& p : critic->parameters()) out.push_back(p.detach().clone());
  };
  if (run.strategy == "fsdp") {
    auto full = run.fabric.strategy_as<lf::FSDPStrategy>().summon_full_parameters(*critic.ptr());
    read();
  } else {
    read();
  }
  return out;
}

void expect_weights(Run& run, torch::nn::Sequential& critic, const std::vector<torch::Tensor>& expected,
                    const std::string& what) {
  const auto ours = weights(run, critic);
  expect(ours.size() == expected.size(), what + ": parameter count differs");
  for (size_t i = 0; i < std::min(ours.size(), expected.size()); ++i) {
    // Relative to the parameter's largest magnitude, at least 0.01: a bias that a step brought
    // near zero would otherwise turn float rounding into a large relative error.
    const double error = ((ours[i] - expected[i]).abs().max() / expected[i].abs().max().clamp_min(1e-2)).item<double>();
    expect(error <= run.tolerance, what + ": parameter " + std::to_string(i) + " differs from one process's by " +
                                       std::to_string(error) + " (tolerance " + std::to_string(run.tolerance) +
                                       ", largest magnitude " + std::to_string(expected[i].abs().max().item<double>()) + ")");
  }
}

// Plain LibTorch over the global batch: SGD applied by hand to a copy of the critic.
std::vector<torch::Tensor> reference_step(const std::function<torch::Tensor(torch::nn::Sequential&)>& loss_of,
                                          double gradient_factor = 1.0, int only = -1,
                                          const std::function<torch::nn::Sequential()>& make = make_critic) {
  auto critic = make();
  loss_of(critic).backward();
  std::vector<torch::Tensor> out;
  const auto parameters = critic->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    const bool moves = only < 0 || static_cast<int>(i) == only;
    out.push_back(moves ? (p - kLearningRate * gradient_factor * p.grad()).detach() : p.detach().clone());
  }
  return out;
}

template <class Body>
void with_critic(Run& run, Body&& body, const std::function<torch::nn::Sequential()>& make = make_critic) {
  auto critic = make();
  auto optimizer = std::make_shared<torch::optim::SGD>(critic->parameters(), torch::optim::SGDOptions(kLearningRate));
  auto [model, fabric_optimizer] = run.fabric.setup(critic, optimizer);
  body(critic, model, fabric_optimizer);
}

torch::Tensor penalty_loss(const torch::Tensor& d_real, const torch::Tensor& d_fake, const torch::Tensor& gradient) {
  const auto penalty = (gradient.flatten(1).norm(2, 1) - 1).pow(2).mean();
  return d_fake.mean() - d_real.mean() + 10 * penalty;
}

void check_gradient_penalty(Run& run) {
  const auto expected = reference_step([&](torch::nn::Sequential& critic) {
    const auto mixed = (run.alpha * run.real + (1 - run.alpha) * run.fake).requires_grad_();
    const auto d_mixed = critic->forward(mixed);
    const auto gradient = torch::autograd::grad({d_mixed}, {mixed}, {torch::ones_like(d_mixed)}, std::nullopt,
                                                /*create_graph=*/true)[0];
    return penalty_loss(critic->forward(run.real), critic->forward(run.fake), gradient);
  });
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto& optimizer) {
    const auto real = run.mine(run.real), fake = run.mine(run.fake), alpha = run.mine(run.alpha);
    const auto d_real = model(real);  // one forward before the gradient, one after it (below)
    const auto mixed = (alpha * real + (1 - alpha) * fake).requires_grad_();
    const auto d_mixed = model(mixed);
    bool refused = false;
    try {
      torch::autograd::grad({d_mixed}, {mixed}, {torch::ones_like(d_mixed)}, true, false);
    } catch (const std::exception& error) {
      refused = std::string(error.what()).find("fabric.backward") != std::string::npos;
    }
    expect(refused, "a plain torch::autograd::grad on a set-up model's output is refused, naming fabric.backward");
    const auto gradient = run.fabric.grad({d_mixed}, {mixed},
                                          lf::GradOptions().outputs_grad({torch::ones_like(d_mixed)}).higher_order())[0];
    expect(gradient.requires_grad(), "fabric.grad(create_graph) returns a differentiable gradient");
    const auto d_fake = model(fake);  // under fsdp, must not free what the gradient's graph saved
    {
      torch::NoGradGuard no_grad;  // a metric's forward in between: fsdp would free full parameters after it
      model(fake);
    }
    run.fabric.backward(penalty_loss(d_real, d_fake, gradient));
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, critic, expected, "gradient penalty step");
    if (const auto scaler = run.fabric.precision()->loss_scaler()) {
      expect(scaler->get_scale() == 65536.0, "loss scaler: no step was skipped (scale " +
                                                 std::to_string(scaler->get_scale()) + ")");
    }
  });
}

// The critic's forward with other weights (MAML's fast weights), as make_critic's layers.
torch::Tensor critic_with(const torch::Tensor& x, const std::vector<torch::Tensor>& w) {
  namespace F = torch::nn::functional;
  const auto hidden = torch::tanh(F::linear(torch::tanh(F::linear(x, w[0], w[1])), w[2], w[3]));
  return F::linear(hidden, w[4], w[5]);
}

// A MAML inner step: fabric.grad with respect to the parameters (higher_order), fast weights
// p - a * g, and the outer loss through them, differentiated back through the inner gradient.
// Under ddp each rank adapts on its own rows and the outer gradients are averaged, so one process
// averages the ranks' outer losses. Not under fsdp: its full parameters exist only inside the
// module's forward, so weights used outside it are not the model's.
void check_inner_step_on_parameters(Run& run) {
  if (run.strategy == "fsdp") return;
  constexpr double kInner = 0.05;
  const int64_t rows = run.rows(), chunks = run.real.size(0) / rows;
  const auto expected = reference_step([&](torch::nn::Sequential& critic) {
    const auto parameters = critic->parameters();
    torch::Tensor outer = torch::zeros({});
    for (int64_t c = 0; c < chunks; ++c) {
      const auto inner = critic->forward(run.real.narrow(0, c * rows, rows)).pow(2).mean();
      const auto g = torch::autograd::grad({inner}, parameters, {}, std::nullopt, /*create_graph=*/true);
      std::vector<torch::Tensor> fast;
      for (size_t i = 0; i < parameters.size(); ++i) fast.push_back(parameters[i] - kInner * g[i]);
      outer = outer + critic_with(run.fake.narrow(0, c * rows, rows), fast).pow(2).mean();
    }
    return outer / static_cast<double>(chunks);
  });
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto& optimizer) {
    const auto parameters = critic->parameters();
    const auto inner = model(run.mine(run.real)).pow(2).mean();
    const auto g = run.fabric.grad({inner}, parameters, lf::GradOptions().higher_order());
    expect(g.size() == parameters.size() && g[0].requires_grad(),
           "fabric.grad with respect to the parameters returns one differentiable gradient per parameter");
    std::vector<torch::Tensor> fast;
    for (size_t i = 0; i < parameters.size(); ++i) fast.push_back(parameters[i] - kInner * g[i].to(parameters[i].dtype()));
    run.fabric.backward(critic_with(run.mine(run.fake), fast).pow(2).mean());
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, critic, expected, "MAML inner step (fabric.grad with respect to the parameters)");
  });
}

void check_retain_graph(Run& run) {
  const auto expected = reference_step([&](torch::nn::Sequential& critic) { return critic->forward(run.real).pow(2).mean(); },
                                       /*gradient_factor=*/2.0);
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto& optimizer) {
    const auto loss = model(run.mine(run.real)).pow(2).mean();
    run.fabric.backward(loss, lf::BackwardOptions().retain());
    run.fabric.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, critic, expected, "two backward passes over a retained graph");
  });
}

// A no-grad forward (a metric) between a forward and its backward: fsdp must keep what the
// backward needs.
void check_forward_without_gradients_before_backward(Run& run) {
  const auto expected = reference_step([&](torch::nn::Sequential& critic) { return critic->forward(run.real).pow(2).mean(); });
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto& optimizer) {
    const auto loss = model(run.mine(run.real)).pow(2).mean();
    {
      torch::NoGradGuard no_grad;
      model(run.mine(run.fake));
    }
    run.fabric.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, critic, expected, "a no-grad forward between a forward and its backward");
  });
}

void check_inputs(Run& run) {
  const auto expected = reference_step([&](torch::nn::Sequential& critic) { return critic->forward(run.fake).pow(2).mean(); },
                                       1.0, /*only=*/2);
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto& optimizer) {
    const auto chosen = critic->parameters()[2];  // the second layer's weight
    const auto loss = model(run.mine(run.fake)).pow(2).mean();
    run.fabric.backward(loss, lf::BackwardOptions().only({chosen}));
    if (run.strategy != "fsdp") {
      int filled = 0;
      for (const auto& p : critic->parameters()) filled += p.grad().defined() ? 1 : 0;
      expect(filled == 1 && chosen.grad().defined(), "inputs: the named parameter's gradient only is filled (" +
                                                         std::to_string(filled) + " filled)");
    }
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, critic, expected, "backward with inputs");
  });
}

void check_create_graph(Run& run) {
  with_critic(run, [&](torch::nn::Sequential& critic, auto& model, auto&) {
    const auto loss = model(run.mine(run.real)).pow(2).mean();
    const auto options = lf::BackwardOptions().higher_order();
    if (run.strategy == "single") {
      run.fabric.backward(loss, options);
      expect(critic->parameters()[0].grad().requires_grad(), "create_graph: the gradient is differentiable");
      for (auto& p : critic->parameters()) p.mutable_grad().reset();  // breaks the gradient's cycle with its graph
      return;
    }
    std::string message;
    try {
      run.fabric.backward(loss, options);
    } catch (const lf::ValueError& error) {
      message = error.what();
    }
    expect(message.find("fabric.grad(outputs, inputs, GradOptions().higher_order())") != std::string::npos &&
               message.find(run.strategy) != std::string::npos,
           "create_graph under " + run.strategy + " is refused with the fix, got: " + message);
  });
}
torch::nn::Sequential make_encoder() {
  torch::manual_seed(17);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8));
}

// A SimCLR-style loss: rows 2k and 2k + 1 are two views of one sample, each row's positive the
// other, every other row of the batch a negative.
torch::Tensor contrastive_loss(const torch::Tensor& embeddings) {
  namespace F = torch::nn::functional;
  const auto z = F::normalize(embeddings, F::NormalizeFuncOptions().dim(1));
  const int64_t n = z.size(0);
  const auto logits = z.matmul(z.t()) / 0.5 - 1e4 * torch::eye(n);
  return F::cross_entropy(logits, torch::arange(n).bitwise_xor(1));
}

// The loss over the global batch on every rank: the ranks' embeddings gathered with gradients.
void check_contrastive_loss(Run& run) {
  const auto expected = reference_step([&](torch::nn::Sequential& encoder) { return contrastive_loss(encoder->forward(run.real)); },
                                       1.0, -1, make_encoder);
  with_critic(run, [&](torch::nn::Sequential& encoder, auto& model, auto& optimizer) {
    const auto mine = model(run.mine(run.real));
    const auto all = run.fabric.all_gather(mine, lf::AllGatherOptions().with_gradients()).reshape({-1, mine.size(1)});
    run.fabric.backward(contrastive_loss(all));
    optimizer.step();
    optimizer.zero_grad();
    expect_weights(run, encoder, expected, "a contrastive loss over all_gather(sync_grads)");
  }, make_encoder);
}

void check_groups(Run& run) {
  lf::Fabric& fabric = run.fabric;
  const int world = fabric.world_size(), rank = fabric.global_rank();
  const auto value = torch::full({3}, static_cast<double>(rank + 1));
  std::vector<int> descending;
  for (int r = world - 1; r >= 0; --r) descending.push_back(r);
  const auto everyone = fabric.new_group(descending);
  expect(everyone->rank() == rank && everyone->size() == world, "new_group orders members by global rank");
  expect(torch::equal(fabric.all_reduce(value.clone(), "sum", *everyone), fabric.all_reduce(value.clone(), "sum")),
         "all_reduce over a group of every rank equals the world's");
  const auto last = fabric.new_group({world - 1});
  if (rank == world - 1) {
    const auto alone = fabric.all_gather(value, lf::AllGatherOptions().in(last));
    expect(torch::equal(alone, world == 1 ? value : value.unsqueeze(0)), "all_gather in a group of one process");
  } else {
    const auto message = refusal([&] { fabric.all_gather(value, lf::AllGatherOptions().in(last)); });
    expect(message.find("is not in the group of ranks [" + std::to_string(world - 1) + "]") != std::string::npos,
           "a non-member's all_gather is refused naming the group, got: " + message);
  }
  if (world > 1) {
    std::vector<int> odd;
    for (int r = 1; r < world; r += 2) odd.push_back(r);
    const auto odd_ranks = fabric.new_group(odd);
    if (odd_ranks->is_member()) {
      double sum = 0;
      for (int r : odd) sum += r + 1;
      expect(torch::allclose(fabric.all_reduce(value.clone(), "sum", *odd_ranks), torch::full({3}, sum)),
             "all_reduce within the odd ranks");
      const int source = odd.back();
      expect(torch::equal(fabric.broadcast(value, source, *odd_ranks), torch::full({3}, static_cast<double>(source + 1))),
             "broadcast within the odd ranks, from a global rank");
      const auto gathered = fabric.all_gather(value, lf::AllGatherOptions().in(odd_ranks));
      bool rows = gathered.size(0) == static_cast<int64_t>(odd.size());
      for (size_t i = 0; rows && i < odd.size(); ++i) rows = gathered[i].eq(odd[i] + 1).all().item<bool>();
      expect(rows, "all_gather within the odd ranks: one row per member, in rank order");
      const auto message = refusal([&] { fabric.broadcast(value, 0, *odd_ranks); });
      expect(message.find("rank 0 is not in the group") != std::string::npos,
             "broadcast from a non-member is refused, got: " + message);
    } else {
      const auto message = refusal([&] { fabric.all_reduce(value, "sum", *odd_ranks); });
      expect(message.find("fabric.all_reduce") != std::string::npos && message.find("is_member") != std::string::npos,
             "a non-member's all_reduce is refused with the fix, got: " + message);
    }
  }
  expect(refusal([&] { fabric.new_group({world}); }).find("rank " + std::to_string(world) + " is not a rank of this job") !=
             std::string::npos,
         "new_group refuses a rank outside the job");
  expect(refusal([&] { fabric.new_group({0, 0}); }).find("named twice") != std::string::npos,
         "new_group refuses a rank named twice");
  expect(refusal([&] { fabric.all_gather(torch::ones({2}, torch::kLong), lf::AllGatherOptions().with_gradients()); })
                 .find("has no gradients") != std::string::npos,
         "all_gather(sync_grads) refuses an integer tensor");
}

// A module with a second entry point that calls forward several times, as a generate() does,
// noting what it saw; it is a callback too.
struct RefinerImpl : torch::nn::Module, lf::Callback {
  RefinerImpl() : fc(register_module("fc", torch::nn::Linear(6, 6))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::Tensor refine(const torch::Tensor& x, int64_t times) {
    saw_autocast = at::autocast::is_autocast_enabled(at::kCPU);
    saw_weight_elements = fc->weight.numel();
    torch::Tensor y = x;
    for (int64_t i = 0; i < times; ++i) y = torch::tanh(forward(y));
    return y;
  }
  void on_after_optimizer_step(const lf::HookArgs&) override { ++steps_seen; }
  torch::nn::Linear fc;
  bool saw_autocast = false;
  int64_t saw_weight_elements = 0;
  int steps_seen = 0;
};
TORCH_MODULE(Refiner);

Refiner make_refiner() {
  torch::manual_seed(13);
  return Refiner();
}

void check_forward_methods(Run& run) {
  auto reference = make_refiner();
  auto refiner = make_refiner();
  auto model = run.fabric.setup_module(refiner);
  const auto x = run.mine(run.real);
  torch::NoGradGuard no_grad;  // as a generate() runs
  const auto expected = reference->refine(x, 3);
  const bool mixed = run.precision != "32-true";
  const auto by_member = model.call(&RefinerImpl::refine, x, int64_t{3});
  expect(refiner->saw_autocast == mixed, "call(&RefinerImpl::refine): autocast " +
                                             std::string(refiner->saw_autocast ? "on" : "off") + " under " + run.precision);
  expect(refiner->saw_weight_elements == 36, "call(&RefinerImpl::refine): the method saw a weight of " +
                                                 std::to_string(refiner->saw_weight_elements) + " elements, not 36");
  const double error = ((by_member - expected).abs().max() / expected.abs().max()).item<double>();
  expect(by_member.scalar_type() == at::kFloat && error <= run.tolerance,
         "call(&RefinerImpl::refine) differs from the plain module's by " + std::to_string(error));
  refiner->saw_weight_elements = 0;
  const auto by_callable = model.call([](RefinerImpl& net, const torch::Tensor& input) { return net.refine(input, 3); }, x);
  expect(refiner->saw_weight_elements == 36 && torch::equal(by_callable, by_member),
         "call(callable) runs like call(member) with full parameters");
}

void check_hooks(Run& run) {
  HookRecorder& recorder = *run.recorder;
  const int setups = recorder.setups, steps = recorder.steps;
  auto refiner = make_refiner();
  auto optimizer = std::make_shared<torch::optim::SGD>(refiner->parameters(), torch::optim::SGDOptions(kLearningRate));
  auto [model, fabric_optimizer] = run.fabric.setup(refiner, optimizer);
  expect(recorder.setups == setups + 1 && recorder.fabric == &run.fabric && recorder.module.get() == refiner.ptr().get(),
         "on_after_setup: called once with the Fabric and the original module");
  const bool registered = std::any_of(run.fabric.callbacks().begin(), run.fabric.callbacks().end(),
                                      [&](const auto& c) { return c.get() == static_cast<lf::Callback*>(refiner.ptr().get()); });
  expect(registered, "a set-up module deriving from lf::Callback joins fabric.callbacks()");
  for (int step = 0; step < 2; ++step) {
    run.fabric.backward(model(run.mine(run.real)).pow(2).mean());
    fabric_optimizer.step();
    fabric_optimizer.zero_grad();
  }
  expect(recorder.steps == steps + 2 && recorder.optimizer == optimizer.get() && recorder.strategy == run.fabric.strategy().get(),
         "on_after_optimizer_step: after every step, with the strategy and the optimizer");
  expect(refiner->steps_seen == 2, "the module's own on_after_optimizer_step ran " + std::to_string(refiner->steps_seen) +
                                       " times, not 2");
}
}  // namespace

int main(int argc, char** argv) {
  const std::string strategy = argc > 1 ? argv[1] : "single";
  const std::string precision = argc > 2 ? argv[2] : "32-true";
  lf::FabricOptions options = lf::FabricOptions().accelerator("cpu");
  if (precision == "bf16-mixed-scaled") {
    options.plugin(std::make_shared<lf::MixedPrecision>("bf16-mixed", torch::kBFloat16, std::make_shared<lf::LossScaler>()));
  } else {
    options.precision(precision);
  }
  if (strategy == "fsdp") {
    lf::FSDPOptions fsdp;
    fsdp.auto_wrap_min_params = 200;  // the 6-32 and 32-32 layers become units; the head stays
    options.strategy(lf::fsdp_strategy(fsdp));
  } else {
    options.strategy(strategy == "single" ? "single_device" : strategy);
  }
  auto recorder = std::make_shared<HookRecorder>();
  options.callback(recorder);
  lf::Fabric fabric(options);
  torch::manual_seed(3);
  const int64_t rows = kLocalRows * (strategy == "single" ? 2 : fabric.world_size());
  Run run{fabric, strategy, precision, precision == "32-true" ? 1e-5 : 3e-2, torch::randn({rows, 6}),
          torch::randn({rows, 6}) + 1, torch::rand({rows, 1}), recorder};
  check_gradient_penalty(run);
  check_inner_step_on_parameters(run);
  check_retain_graph(run);
  check_forward_without_gradients_before_backward(run);
  check_inputs(run);
  check_create_graph(run);
  check_contrastive_loss(run);
  check_groups(run);
  check_forward_methods(run);
  check_hooks(run);
  if (checks::failures() > 0) return 1;
  std::cout << "rank " << fabric.global_rank() << ": research loop checks pass under " << strategy << " " << precision
            << std::endl;
  return 0;
}
