// A small GPT-style language model (token and position embeddings, pre-norm transformer blocks
// with causal self-attention, a linear head) trained on synthetic tokens: the workload of
// benchmark P8, where the same model and batch run under Python Lightning Fabric
// (scripts/p8_python_fabric.py) on the same GPU. Prints one JSON line: median step time,
// tokens/s, and the fraction of the card's bf16 peak the model's FLOPs reach.
//   build/bin/gpt --accelerator cuda --precision bf16-mixed --steps 100
//   build/bin/gpt --accelerator cpu --layers 2 --d-model 128 --heads 4 --seq 64 --batch-size 4 --steps 5   (smoke)
//   build/bin/gpt --list-forward-ops   (the ATen operators of one forward, for the twin check)
//   build/bin/gpt --accelerator cuda --precision bf16-mixed --optimizer-step libtorch --profile-step
// --optimizer-step libtorch steps through LibTorch's AdamW (default: fused, Fabric's default);
// --profile-step profiles one more step after the timed ones and prints a second JSON line with
// its kernel count (the Kineto profiler, as torch.profiler in the Python twin); --cuda-graph runs
// every step through lf::CapturedStep (experimental: captured once, then replayed). The JSON line
// ends with weights_l2, the norm of all weights after training, for comparing two runs.
// The model is its Python twin op for op (tests/integration/gpt_twin_ops.sh checks the operator
// counts): q, k and v come from unbind, and every Linear runs as at::linear, which folds the bias
// into the matrix product (torch::nn::Linear's forward on 3-D input multiplies, then adds).
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "shared_flags.h"
#include <chrono>
#include <iostream>

namespace lf = lightning::fabric;

struct GptSettings {
  int64_t vocab = 8192, seq = 512, d_model = 768, heads = 12, layers = 12, batch_size = 16;
  int steps = 60, warmup = 10;
  double peak_tflops = 989.0;  // H100/H200 SXM dense bf16
  std::string optimizer_step = "fused";  // or "libtorch"
  bool profile_step = false;
  bool cuda_graph = false;
  bool activation_checkpointing = false;  // recompute each block's activations in backward
  bool fsdp_block_units = false;          // fsdp with one sharding unit per block
  bool meta_init = false;                 // fsdp: build on the meta device, setup materialises shards
  std::string fsdp_prefetch = "backward";  // with fsdp_block_units: off, forward, backward or both
  examples::SharedFlags shared;  // --accelerator, --devices, --strategy, --precision (unset unless given), --no-progress
};

// A Linear's forward as Python's nn.Linear runs it: one at::linear (bias in the GEMM's epilogue on
// CUDA), where LibTorch's Linear on a 3-D input issues a matmul and a separate add.
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        projection(register_module("projection", torch::nn::Linear(d, d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))),
        heads(heads) {}
  // x: [B, T, D]; causal self-attention through scaled_dot_product_attention (flash/efficient
  // kernels on CUDA), the same call as the Python twin's.
  torch::Tensor forward(torch::Tensor x) {
    const int64_t batch = x.size(0), length = x.size(1), d = x.size(2);
    // [3, B, H, T, hd] unbound into q, k, v: views whose backward is one stack, where indexing
    // builds three zero tensors and adds them.
    const auto qkv_heads = linear(qkv, ln1(x)).view({batch, length, 3, heads, d / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto attended = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], /*attn_mask=*/{},
                                                     /*dropout_p=*/0.0, /*is_causal=*/true);
    x = x + linear(projection, attended.transpose(1, 2).reshape({batch, length, d}));
    return x + linear(fc2, torch::gelu(linear(fc1, ln2(x))));
  }
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, projection;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
  int64_t heads;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptSettings& s)
      : tokens(register_module("tokens", torch::nn::Embedding(s.vocab, s.d_model))),
        positions(register_module("positions", torch::nn::Embedding(s.seq, s.d_model))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(s.d_model, s.vocab).bias(false)))) {
    for (int64_t i = 0; i < s.layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(s.d_model, s.heads)));
  }
  // tokens: [B, T] -> logits [B, T, vocab]
  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = tokens(ids) + positions(torch::arange(ids.size(1), ids.options()));  // [B, T, D]
    // Through lf::call, so that an activation-checkpointing policy reaches the blocks.
    for (auto& block : blocks) x = lf::call(block, x);
    return linear(head, ln_f(x));
  }
  torch::nn::Embedding tokens, positions;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(Gpt);

// One forward of the model on CPU with every ATen operator counted (nested ones included, as the
// profiler sees them), printed as "count name" lines sorted by name: the twin check's C++ side.
int print_forward_ops(const GptSettings& s) {
  torch::manual_seed(0);
  Gpt net(s);
  const auto ids = torch::randint(s.vocab, {s.batch_size, s.seq}, torch::kLong);
  torch::NoGradGuard no_grad;  // the twin check compares forwards
  static std::map<std::string, int> counts;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& call) -> std::unique_ptr<at::ObserverContext> {
        ++counts[call.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  net(ids);
  at::removeCallback(handle);
  for (const auto& [name, count] : counts) std::cout << count << " " << name << "\n";
  return 0;
}

// Model FLOPs utilisation of a step: measured FLOPs per second over the device's dense peak in the
// precision's compute dtype (lf::available_flops); "null" where no peak is known (CPUs).
std::string mfu_text(const lf::Fabric& fabric, int64_t step_flops, double median_ms) {
  const auto* mixed = dynamic_cast<const lf::MixedPrecision*>(fabric.precision().get());
  const auto dtype = mixed ? mixed->autocast_dtype() : fabric.precision()->module_dtype().value_or(torch::kFloat32);
  const auto peak = lf::available_flops(fabric.device(), dtype);
  if (!peak || step_flops == 0) return "null";
  return std::to_string(static_cast<double>(step_flops) / (median_ms / 1e3) / *peak);
}

// The norm of every weight together: equal for two runs that trained alike.
double weights_l2(torch::nn::Module& net) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& p : net.parameters()) sum += p.to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

// One call of step under the Kineto profiler: GPU kernels (device events), kernel launches
// (runtime calls whose name has "LaunchKernel") and ATen operators, as the Python twin counts them.
template <class Step>
void print_step_profile(const Step& step, bool cuda, const std::string& optimizer_step) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities, {at::RecordScope::FUNCTION});
  step();
  if (cuda) torch::cuda::synchronize();
  const auto result = profiler::disableProfiler();
  int64_t kernels = 0, launches = 0, operators = 0;
  for (const auto& event : result->events()) {
    const std::string name = event.name();
    if (event.deviceType() == c10::DeviceType::CUDA) {
      if (name.rfind("Memcpy", 0) != 0 && name.rfind("Memset", 0) != 0) ++kernels;
    } else if (name.find("LaunchKernel") != std::string::npos) {
      ++launches;
    } else if (name.rfind("aten::", 0) == 0) {
      ++operators;
    }
  }
  std::cout << "{\"benchmark\":\"P8 kernels\",\"implementation\":\"lightning-fabric-cpp\",\"optimizer_step\":\""
            << optimizer_step << "\",\"gpu_kernels\":" << kernels << ",\"kernel_launches\":" << launches
            << ",\"aten_operators\":" << operators << "}" << std::endl;
}

// Heap bytes in use (small blocks plus mmap'ed large ones): on the CPU, what a forward's
// activations add until its backward frees them.
size_t heap_in_use() {
  const auto info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

// The process's peak resident memory so far, in MB.
double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

int main(int argc, char** argv) {
  GptSettings s;
  CLI::App app{"A small GPT-style model on synthetic tokens (benchmark P8)"};
  app.add_option("--vocab", s.vocab, "Vocabulary size");
  app.add_option("--seq", s.seq, "Sequence length");
  app.add_option("--d-model", s.d_model, "Model width");
  app.add_option("--heads", s.heads, "Attention heads");
  app.add_option("--layers", s.layers, "Transformer blocks");
  app.add_option("--batch-size", s.batch_size, "Sequences per step");
  app.add_option("--steps", s.steps, "Timed steps");
  app.add_option("--warmup", s.warmup, "Untimed steps first");
  app.add_option("--peak-tflops", s.peak_tflops, "The card's bf16 peak, for the utilisation figure");
  app.add_option("--optimizer-step", s.optimizer_step, "fused (Fabric's default) or libtorch (LibTorch's AdamW::step)")
      ->check(CLI::IsMember({"fused", "libtorch"}));
  app.add_flag("--profile-step", s.profile_step, "Profile one more step and print its kernel count");
  app.add_flag("--cuda-graph", s.cuda_graph, "Capture the step as a CUDA graph and replay it (experimental)");
  app.add_flag("--activation-checkpointing", s.activation_checkpointing,
               "Keep no activations inside the blocks: recompute each block in backward");
  app.add_flag("--fsdp-block-units", s.fsdp_block_units,
               "Run fsdp (FULL_SHARD) with one sharding unit per block (FSDPOptions::auto_wrap by type)");
  app.add_option("--fsdp-prefetch", s.fsdp_prefetch,
                 "With --fsdp-block-units: which all-gathers run ahead of their block (off, forward, backward, both)")
      ->check(CLI::IsMember({"off", "forward", "backward", "both"}));
  app.add_flag("--meta-init", s.meta_init,
               "Under fsdp, build the model on the meta device (fabric.init_module(true)): setup gives each rank "
               "its shards only");
  bool list_forward_ops = false;
  app.add_flag("--list-forward-ops", list_forward_ops,
               "Print the ATen operators one CPU forward issues, with their counts (no training)");
  s.shared.add_to(app);
  CLI11_PARSE(app, argc, argv);
  if (s.heads < 1 || s.d_model % s.heads != 0) {
    std::cerr << "gpt: --d-model " << s.d_model << " must be a multiple of --heads " << s.heads
              << " (each head takes d_model / heads features); e.g. --d-model 128 --heads 4." << std::endl;
    return 2;
  }
  if (list_forward_ops) return print_forward_ops(s);
  try {
    lf::FabricOptions options = s.shared.apply().fused_optimizer_steps(s.optimizer_step == "fused");
    if (s.fsdp_block_units) {
      lf::FSDPOptions fsdp;
      fsdp.auto_wrap = lf::ModulePolicy::of_type<BlockImpl>();
      fsdp.forward_prefetch = s.fsdp_prefetch == "forward" || s.fsdp_prefetch == "both";
      fsdp.backward_prefetch = s.fsdp_prefetch == "backward" || s.fsdp_prefetch == "both";
      options.strategy(lf::fsdp_strategy(fsdp));
    }
    lf::Fabric fabric(options);
    fabric.seed_everything(0);
    if (s.meta_init && !fabric.strategy()->builds_on_meta_device()) {
      std::cerr << "gpt: --meta-init needs --strategy fsdp (or --fsdp-block-units); strategy \""
                << fabric.strategy()->name() << "\" would build an uninitialised model." << std::endl;
      return 2;
    }
    Gpt net = nullptr;
    {
      std::optional<lf::ScopeGuard> meta;  // the same values as a normal build, materialised at setup
      if (s.meta_init) meta.emplace(fabric.init_module(/*empty_init=*/true));
      net = Gpt(s);
    }
    int64_t parameters = 0;
    for (const auto& p : net->parameters()) parameters += p.numel();
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(3e-4));
    // The FLOPs of one training step, counted from the products that run (lf::measure_flops), on
    // one sequence and scaled by the batch (every counted product is linear in it), before setup:
    // the raw module still holds every parameter (under fsdp a set-up one holds shards) and its
    // backward is measure_flops's own. The token values do not change the count. A model built on
    // the meta device is not counted (0, printed as null): it has no values before setup, and
    // LibTorch's C++ build lacks meta kernels for some of its operators (index_select).
    const auto one_sequence = torch::zeros({1, s.seq + 1}, torch::kLong);
    const int64_t step_flops = s.meta_init ? 0 : s.batch_size * lf::measure_flops(
        *net, [&] { return net->forward(one_sequence.narrow(1, 0, s.seq)); },
        [&](const torch::Tensor& logits) {
          return torch::nn::functional::cross_entropy(logits.reshape({-1, s.vocab}), one_sequence.narrow(1, 1, s.seq).reshape(-1));
        });
    lf::SetupOptions setup;
    if (s.activation_checkpointing) setup.activation_checkpointing = lf::ModulePolicy::of_type<BlockImpl>();
    auto [model, optimizer] = fabric.setup(setup, net, adamw);
    const auto device = fabric.device();
    const bool cuda = device.is_cuda();
    std::vector<double> step_ms;
    // The loss is read (one device sync) after the step's timing, so the bar costs the timings nothing.
    lf::ProgressBar bar("steps", s.warmup + s.steps, s.shared.show_progress(fabric));
    auto forward_backward = [&, &model = model](const torch::Tensor& batch) {
      auto logits = model(batch.narrow(1, 0, s.seq));
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, s.vocab}), batch.narrow(1, 1, s.seq).reshape(-1));
      fabric.backward(loss);
      return loss;
    };
    std::optional<lf::CapturedStep> captured;
    if (s.cuda_graph) {
      captured.emplace(fabric, optimizer, [&](const std::vector<torch::Tensor>& in) { return forward_backward(in[0]); });
    }
    auto train_step = [&, &optimizer = optimizer](const torch::Tensor& batch) {
      if (captured) return (*captured)({batch});
      optimizer.zero_grad();
      auto loss = forward_backward(batch);
      optimizer.step();
      return loss;
    };
    auto random_batch = [&] {
      return torch::randint(s.vocab, {s.batch_size, s.seq + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
    };
    for (int step = 0; step < s.warmup + s.steps; ++step) {
      auto batch = random_batch();
      if (cuda) torch::cuda::synchronize();
      const auto start = std::chrono::steady_clock::now();
      auto loss = train_step(batch);
      if (cuda) torch::cuda::synchronize();
      if (step >= s.warmup) step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      bar.update(1, loss.item<double>());
    }
    bar.close();
    // What one forward keeps for its backward, in MB (CPU only: "null" on CUDA).
    std::string activations = "null";
    if (!cuda) {
      const auto sample = random_batch();
      optimizer.zero_grad();
      const size_t before = heap_in_use();
      auto logits = model(sample.narrow(1, 0, s.seq));
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, s.vocab}), sample.narrow(1, 1, s.seq).reshape(-1));
      activations = std::to_string(static_cast<double>(heap_in_use() - before) / 1e6);
      fabric.backward(loss);
      optimizer.zero_grad();
    }
    std::sort(step_ms.begin(), step_ms.end());
    const double median = step_ms[step_ms.size() / 2];
    const double tokens = static_cast<double>(s.batch_size * s.seq);
    // Training FLOPs per token: 6 per parameter plus attention's 12 * layers * seq * d_model.
    const double flops = tokens * (6.0 * static_cast<double>(parameters) + 12.0 * s.layers * s.seq * s.d_model);
    // Under fsdp the set-up module holds shards: every rank gathers the full weights to measure them.
    double final_l2 = 0;
    if (auto* fsdp = dynamic_cast<lf::FSDPStrategy*>(fabric.strategy().get())) {
      auto full = fsdp->summon_full_parameters(*net);
      final_l2 = weights_l2(*net);
    } else {
      final_l2 = weights_l2(*net);
    }
    if (!fabric.is_global_zero()) return 0;  // one line per job, from rank 0 (its own steps' times)
    std::cout << "{\"benchmark\":\"P8 gpt\",\"implementation\":\"lightning-fabric-cpp\",\"device\":\"" << device.str()
              << "\",\"precision\":\"" << fabric.precision()->name() << "\",\"parameters\":" << parameters << ",\"batch_size\":" << s.batch_size
              << ",\"seq\":" << s.seq << ",\"median_step_ms\":" << median << ",\"tokens_per_s\":" << tokens / (median / 1e3)
              << ",\"model_tflops\":" << flops / (median / 1e3) / 1e12
              << ",\"fraction_of_peak\":" << flops / (median / 1e3) / (s.peak_tflops * 1e12)
              << ",\"measured_flops_per_step\":" << (step_flops > 0 ? std::to_string(step_flops) : "null") << ",\"mfu\":" << mfu_text(fabric, step_flops, median)
              << ",\"optimizer_step\":\"" << (optimizer.fused() ? "fused" : "libtorch") << "\""
              << ",\"cuda_graph\":" << (captured && captured->captured() ? "true" : "false")
              << ",\"activation_checkpointing\":" << (s.activation_checkpointing ? "true" : "false")
              << ",\"meta_init\":" << (s.meta_init ? "true" : "false")
              << ",\"fsdp_prefetch\":\"" << (s.fsdp_block_units ? s.fsdp_prefetch : "none") << "\""
              << ",\"activation_mb\":" << activations << ",\"peak_rss_mb\":" << peak_rss_mb()
              << ",\"weights_l2\":" << final_l2 << "}" << std::endl;
    if (s.profile_step) {
      const auto batch = random_batch();
      print_step_profile([&] { train_step(batch); }, cuda, optimizer.fused() ? "fused" : "libtorch");
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "gpt: " << error.what() << std::endl;
    return 1;
  }
}
