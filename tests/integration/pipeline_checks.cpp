// The pipeline strategy in a real job under lightning-run: the GPT of examples/common/pipeline_gpt.h
// in stages across the pipe ranks (ddp over the data ranks) trains SGD steps with momentum and
// gradient clipping on one global batch per step, split by the data rank. Every rank compares the
// returned loss (averaged over the data ranks) and the clipped norm each step, and its stages'
// parameters after training, with the same model trained in this process on the whole batches
// (float32, within 1e-5); and checks the mesh, the sampler's share and how many micro-batches the
// schedule held at once. Prints "FAIL: ..." and exits 1 on a mismatch, "pipeline checks passed on
// rank R (stages S, data D of N)" otherwise.
//   lightning-run model --accelerator cpu --devices 4 lf_pipeline_checks [flags]
//   --pipe P                 pipeline_size (default: every rank)
//   --tensor T               tensor_parallel_size: the GPT's tensor-parallel variant, split in each stage
//   --fsdp SHARDING          fsdp on the data dimension (FULL_SHARD, SHARD_GRAD_OP or NO_SHARD)
//   --schedule NAME          GPipe, 1F1B (default) or Interleaved1F1B
//   --micro-batches M        default 4
//   --stages-per-rank V      default 1
//   --steps N                default 20
//   --batch B                the global batch (default 16)
//   --blocks K               transformer blocks (default 6: 8 layers with embedding and head)
//   --stage-starts a,b,...   the split, explicitly
//   --fail-stage S           the first block of stage S throws in its third forward
//   --halve-batch-after N    steps after step N get half the batch (stage outputs change shape)
//   --save PATH / --resume PATH   fabric.save({model, optimizer, step}) after training / load it
//                            first and train from its step on (the reference trains from 0)
//   --from-launcher          no strategy in code: lightning-run --strategy pipeline's defaults
//   --single-device          no pipeline strategy: strategy "single_device" in one process, where the
//                            lf::Pipeline runs loss(layers(x), y) and the optimizer holds every
//                            parameter (as a program without pipelining would); not with --tensor,
//                            --fsdp or --meta
//   --meta                   build the model under fabric.init_module(true): on the meta device, only
//                            this rank's stages materialised (with the values a normal build has)
//   --no-momentum            SGD without momentum (no per-parameter optimizer state)
//   --adam                   AdamW (step counts in the optimizer state; eps 1e-3, so that gradients
//                            that are rounding noise, such as the key bias's, stay noise) instead of
//                            SGD with momentum
//   --refusals               before setup, every rank tries setups the strategy refuses (not an
//                            lf::Pipeline, a weight tied across stages, a stage with nothing to train,
//                            activation checkpointing, an lf::FSDPUnit under fsdp); at the first step a
//                            target of the wrong length, backward with higher_order() and with only(...),
//                            and a second backward: each must be refused on every rank, naming the cause,
//                            and the job then trains on like one process
//   --catch-refusals         an lf::Error is printed as "rank R refused: ..." and the rank exits 4, even
//                            after lightning-run began stopping the job (SIGTERM ignored); with
//                            LF_TEST_REFUSAL_DIR, only once every rank has (each leaves a file there)
//   --loss-scaler            precision with a loss scaler (bf16-mixed plus 16-mixed's scaler): setup must
//                            be refused on every rank, which then meet at a barrier and exit 0
//   --retry-after-failure    with --fail-stage: the failing rank catches the failure and runs the next
//                            step, which must be refused; it prints both and exits 3
//   --loss-per-sample        the loss returns one value per sample: the last stage fails naming it
//   --seed-by-data-rank      each data replica builds the model from another seed (the data rank's):
//                            the broadcast within each stage at setup must make them one model
//   --eval-no-grad           after training, evaluate a batch under NoGradGuard (forwards only): its
//                            loss equals one process's and nothing trains
//   --shape-fault F          a layer after the embedding (in the first stage, with --stage-starts 0,2,...):
//                            nine-dims makes the stage's output 9-dimensional; shrink drops a sequence
//                            position after the first step (the stage's output leaves the agreed shape)
//   --precision P            bf16-mixed: compare with one process's float32 run within 3e-2 (relative)
//   --accumulate K           K micro-steps per optimizer step (the global batch split in K), the first
//                            K-1 under fabric.no_backward_sync, each backward of loss / K
//   --bench                  no reference; prints each rank's step time (the slowest rank's), idle
//                            fraction against it, the schedule's formula and the simulator's value for
//                            these stage times (scripts/bench-pipeline.sh sets the busiest rank's idle
//                            fraction, the bubble, beside them), the
//                            boundary transfers' time per step (measured by a ping-pong after
//                            training), forward and backward time, peak micro-batches in flight, as
//                            medians over the steps after the first, and how far training raised the
//                            peak resident memory above what setup left (activations)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "expect.h"
#include "lightning/fabric.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/strategies/pipeline_schedule.h"
#include "pipeline_gpt.h"

namespace lf = lightning::fabric;

namespace {
examples::PipelineGptSettings kSettings{/*vocab=*/32, /*seq=*/8, /*d_model=*/16, /*heads=*/4, /*blocks=*/6};
bool shape_fault_layer = false;  // --shape-fault: a ShapeFault layer after the embedding, in the reference too

using checks::expect;

struct Flags {
  std::optional<int> pipe;
  lf::PipelineOptions options;
  int64_t steps = 20, batch = 16;
  int fail_stage = -1, halve_batch_after = -1;
  std::vector<int64_t> stage_starts;
  std::string save, resume;
  bool bench = false, adam = false, momentum = true, meta = false, from_launcher = false, single_device = false;
  bool refusals = false, loss_scaler = false, retry_after_failure = false, loss_per_sample = false;
  bool seed_by_data_rank = false, eval_no_grad = false, catch_refusals = false;
  std::string precision, shape_fault;
  int64_t accumulate = 1;
};

Flags parse(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    const bool has_value = i + 1 < argc;
    if (name == "--pipe" && has_value) flags.options.pipeline_size = std::atoi(argv[++i]);
    else if (name == "--fsdp" && has_value) {
      flags.options.data_parallel_strategy = "fsdp";
      flags.options.fully_sharded.sharding_strategy = lf::parse_sharding_strategy(argv[++i]);
    } else if (name == "--tensor" && has_value) {
      flags.options.tensor_parallel_size = std::atoi(argv[++i]);
      kSettings.tensor_parallel = true;
    }
    else if (name == "--schedule" && has_value) flags.options.schedule = argv[++i];
    else if (name == "--micro-batches" && has_value) flags.options.micro_batches = std::atoi(argv[++i]);
    else if (name == "--stages-per-rank" && has_value) flags.options.stages_per_rank = std::atoi(argv[++i]);
    else if (name == "--steps" && has_value) flags.steps = std::atoll(argv[++i]);
    else if (name == "--batch" && has_value) flags.batch = std::atoll(argv[++i]);
    else if (name == "--blocks" && has_value) kSettings.blocks = std::atoll(argv[++i]);
    else if (name == "--d-model" && has_value) kSettings.d_model = std::atoll(argv[++i]);
    else if (name == "--seq" && has_value) kSettings.seq = std::atoll(argv[++i]);
    else if (name == "--fail-stage" && has_value) flags.fail_stage = std::atoi(argv[++i]);
    else if (name == "--halve-batch-after" && has_value) flags.halve_batch_after = std::atoi(argv[++i]);
    else if (name == "--save" && has_value) flags.save = argv[++i];
    else if (name == "--resume" && has_value) flags.resume = argv[++i];
    else if (name == "--bench") flags.bench = true;
    else if (name == "--adam") flags.adam = true;
    else if (name == "--no-momentum") flags.momentum = false;
    else if (name == "--meta") flags.meta = true;
    else if (name == "--from-launcher") flags.from_launcher = true;
    else if (name == "--refusals") flags.refusals = true;
    else if (name == "--catch-refusals") flags.catch_refusals = true;
    else if (name == "--loss-scaler") flags.loss_scaler = true;
    else if (name == "--retry-after-failure") flags.retry_after_failure = true;
    else if (name == "--loss-per-sample") flags.loss_per_sample = true;
    else if (name == "--seed-by-data-rank") flags.seed_by_data_rank = true;
    else if (name == "--eval-no-grad") flags.eval_no_grad = true;
    else if (name == "--precision" && has_value) flags.precision = argv[++i];
    else if (name == "--shape-fault" && has_value) {
      flags.shape_fault = argv[++i];
      shape_fault_layer = true;
    }
    else if (name == "--accumulate" && has_value) flags.accumulate = std::atoll(argv[++i]);
    else if (name == "--single-device") flags.single_device = true;
    else if (name == "--stage-starts" && has_value) {
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) flags.stage_starts.push_back(std::atoll(item.c_str()));
    } else {
      std::cout << "FAIL: unknown argument " << name << std::endl;
      std::exit(2);
    }
  }
  if (flags.single_device && (kSettings.tensor_parallel || flags.options.data_parallel_strategy == "fsdp" || flags.meta)) {
    std::cout << "FAIL: --single-device runs without the pipeline strategy, so --tensor, --fsdp and --meta do not apply"
              << std::endl;
    std::exit(2);
  }
  return flags;
}

// A block that throws in its forward once armed, for --fail-stage.
struct TrippingBlockImpl : examples::GptBlockImpl {
  using GptBlockImpl::GptBlockImpl;
  torch::Tensor forward(const torch::Tensor& x) {
    if (fail_after >= 0 && calls++ >= fail_after) throw std::runtime_error("injected fault in a block's forward");
    return GptBlockImpl::forward(x);
  }
  int64_t calls = 0, fail_after = -1;
};
TORCH_MODULE(TrippingBlock);

// After the embedding when --shape-fault is given (pass-through in the reference): "nine-dims"
// makes the first stage's output a 9-dimension tensor; "shrink" drops a position from the
// sequence after the first step's micro-batches, so the output no longer has the agreed shape.
struct ShapeFaultImpl : torch::nn::Module {
  explicit ShapeFaultImpl(std::string fault, int64_t first_step_calls) : fault(std::move(fault)), quiet_calls(first_step_calls) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    if (fault == "nine-dims") return x.reshape({x.size(0), x.size(1), 2, 2, 2, 2, 1, 1, x.size(2) / 16});
    if (fault == "shrink" && calls > quiet_calls) return x.narrow(1, 0, x.size(1) - 1);
    return x;
  }
  std::string fault;
  int64_t quiet_calls, calls = 0;
};
TORCH_MODULE(ShapeFault);

torch::nn::Sequential layers(int trip_layer, const std::string& shape_fault = "", int64_t micro_batches = 0) {
  if (kSettings.tensor_parallel) return examples::pipeline_gpt_layers(kSettings);
  torch::nn::Sequential built{examples::GptEmbedding(kSettings)};
  if (shape_fault_layer) built->push_back(ShapeFault(shape_fault, micro_batches));
  for (int64_t b = 0; b < kSettings.blocks; ++b) {
    TrippingBlock block(kSettings);
    if (b + 1 == trip_layer) block->fail_after = 2;
    built->push_back(block);
  }
  built->push_back(examples::GptHead(kSettings));
  return built;
}

// This process's resident memory now (VmRSS) or at its peak (VmHWM), in MiB.
double rss_mb(const std::string& field = "VmHWM:") {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + field.size()) / 1024.0;
  }
  return 0.0;
}

// A layer holding a weight it was given, so that two layers can hold the same tensor (tied).
struct HeldWeightImpl : torch::nn::Module {
  explicit HeldWeightImpl(const at::Tensor& shared) { weight = register_parameter("weight", shared); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight); }
  at::Tensor weight;
};
TORCH_MODULE(HeldWeight);

// Every refusal is expected on every rank, before anything is sent (nothing blocks), and leaves
// the strategy usable: "refused on rank R: WHAT: message" is printed for the script to count.
void expect_refused(int rank, const std::string& what, const std::string& text, const std::function<void()>& attempt) {
  const std::string message = checks::refusal(attempt);
  checks::expect(message.find(text) != std::string::npos, what + ": expected a refusal mentioning '" + text + "', got: " +
                                                              message);
  std::cout << "refused on rank " << rank << ": " << what << ": " << message << std::endl;
}

// The setups the pipeline strategy refuses, tried in turn on every rank (--refusals).
void check_setup_refusals(lf::Fabric& fabric, bool fsdp) {
  const int rank = fabric.global_rank();
  const auto square = [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); };
  const auto linears = [] {
    torch::nn::Sequential built;
    for (int l = 0; l < 4; ++l) built->push_back(torch::nn::Linear(8, 8));
    return built;
  };
  expect_refused(rank, "a plain module", "sets up an lf::Pipeline", [&] { fabric.setup_module(linears()); });
  const at::Tensor shared = torch::randn({8, 8}).requires_grad_(true);
  torch::nn::Sequential tied{HeldWeight(shared), torch::nn::Linear(8, 8), torch::nn::Linear(8, 8), HeldWeight(shared)};
  expect_refused(rank, "a weight tied across stages", "a tied weight, which the split puts in two stages",
                 [&] { fabric.setup_module(lf::Pipeline(tied, square)); });
  torch::nn::Sequential frozen = linears();
  for (int l = 2; l < 4; ++l) {
    for (auto& p : frozen[l]->parameters()) p.requires_grad_(false);
  }
  expect_refused(rank, "a stage with nothing to train", "has no parameter to train",
                 [&] { fabric.setup_module(lf::Pipeline(frozen, square)); });
  // A policy matching a layer of the first stage only: the other stages' ranks hold nothing it
  // marked, and must refuse all the same.
  lf::SetupOptions checkpointed;
  checkpointed.activation_checkpointing =
      lf::ModulePolicy([](const torch::nn::Module&, const std::string& name) { return name == "0"; });
  expect_refused(rank, "activation checkpointing of the first stage's layer", "activation checkpointing",
                 [&] { fabric.setup_module(checkpointed, lf::Pipeline(linears(), square)); });
  if (fsdp) {
    torch::nn::Sequential wrapped{lf::FSDPUnit(torch::nn::Linear(8, 8)), torch::nn::Linear(8, 8),
                                  torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)};
    expect_refused(rank, "an lf::FSDPUnit in a stage under fsdp", "holds an lf::FSDPUnit",
                   [&] { fabric.setup_module(lf::Pipeline(wrapped, square)); });
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}
}  // namespace

int run(const Flags& flags_given);

int main(int argc, char** argv) {
  Flags flags = parse(argc, argv);
  if (!flags.catch_refusals) return run(flags);
  // Every rank prints its refusal and exits 4, also after the first to exit has made lightning-run
  // stop the others (SIGTERM, then SIGKILL 10 s later): a rank that was not refused, and waits in
  // a collective instead, never prints.
  std::signal(SIGTERM, SIG_IGN);
  try {
    return run(flags);
  } catch (const lf::Error& error) {
    const std::string rank = std::getenv("RANK") != nullptr ? std::getenv("RANK") : "0";
    std::cout << "rank " << rank << " refused: " << error.what() << std::endl;
    // The first rank to exit makes lightning-run stop the others, maybe before they have even
    // started: with LF_TEST_REFUSAL_DIR, each refused rank leaves a file there and exits only when
    // every rank of the job has (at most 30 s), so each prints its own refusal first.
    if (const char* dir = std::getenv("LF_TEST_REFUSAL_DIR")) {
      std::ofstream(std::filesystem::path(dir) / ("rank-" + rank)) << rank << std::endl;
      const long world = std::getenv("WORLD_SIZE") != nullptr ? std::atol(std::getenv("WORLD_SIZE")) : 1;
      for (int waited = 0; waited < 300; ++waited) {
        const auto files = std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator());
        if (files >= world) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    return 4;
  }
}

int run(const Flags& flags_given) {
  Flags flags = flags_given;
  lf::FabricOptions options = lf::FabricOptions().accelerator("cpu");
  if (flags.single_device) options.strategy("single_device");
  else if (!flags.from_launcher) options.strategy(lf::pipeline_strategy(flags.options));
  if (flags.loss_scaler) {
    options.plugin(std::make_shared<lf::MixedPrecision>("bf16-mixed", torch::kBFloat16, std::make_shared<lf::LossScaler>()));
  } else if (!flags.precision.empty()) {
    options.precision(flags.precision);
  }
  // bf16-mixed against one process's float32 run: relative, as the research loops' checks.
  const double tolerance = flags.precision == "bf16-mixed" ? 3e-2 : 1e-5;
  lf::Fabric fabric(options);
  // nullptr under --single-device: one process, no mesh, one stage.
  lf::PipelineParallel* strategy = flags.single_device ? nullptr : &fabric.strategy_as<lf::PipelineParallel>();
  fabric.strategy()->setup_environment();
  std::shared_ptr<lf::DeviceMesh> mesh;
  if (strategy != nullptr) mesh = strategy->device_mesh();
  const int pipe = strategy != nullptr ? strategy->pipe_size() : 1;
  const int data = mesh ? mesh->size("data") : 1, data_rank = mesh ? mesh->coordinate("data") : 0;
  const int stages = pipe * flags.options.stages_per_rank;
  const lf::DeviceMesh* split_by = kSettings.tensor_parallel ? mesh.get() : nullptr;
  const bool per_sample = flags.loss_per_sample;
  const auto loss = [split_by, per_sample](const at::Tensor& logits, const at::Tensor& targets) {
    const at::Tensor mean = examples::pipeline_gpt_loss(logits, targets, split_by);
    return per_sample ? mean.expand({logits.size(0)}) : mean;
  };
  const auto reference_loss_of = [](const at::Tensor& logits, const at::Tensor& targets) {
    return examples::pipeline_gpt_loss(logits, targets);
  };
  // The layer that trips: the first block of the failing stage (the split of the unarmed model).
  int trip_layer = -1;
  if (flags.fail_stage >= 0) {
    lf::Pipeline probe(layers(-1), loss, flags.stage_starts);
    trip_layer = static_cast<int>(std::max<int64_t>(1, probe->stage_starts(stages)[static_cast<size_t>(flags.fail_stage)]));
  }

  if (flags.refusals) check_setup_refusals(fabric, flags.options.data_parallel_strategy == "fsdp");
  // Data replicas built from other seeds than the first replica's (42) must be made its copy by
  // the broadcast within each stage at setup.
  torch::manual_seed(flags.seed_by_data_rank ? 42 + 1000 * data_rank : 42);
  std::optional<lf::ScopeGuard> on_meta;
  if (flags.meta) on_meta.emplace(fabric.init_module(/*empty_init=*/true));
  lf::Pipeline model(layers(trip_layer, flags.shape_fault, flags.options.micro_batches), loss, flags.stage_starts);
  on_meta.reset();
  if (flags.meta) {
    int64_t meta = 0;
    for (const auto& p : model->parameters()) meta += p.is_meta();
    expect(meta == static_cast<int64_t>(model->parameters().size()), "init_module(true) built " +
           std::to_string(meta) + " of " + std::to_string(model->parameters().size()) + " parameters on the meta device");
  }
  torch::manual_seed(42);
  lf::Pipeline reference(layers(-1), reference_loss_of, flags.stage_starts);
  const auto make_optimizer = [&](const std::vector<at::Tensor>& parameters) -> std::shared_ptr<torch::optim::Optimizer> {
    if (flags.adam) return std::make_shared<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(0.01).eps(1e-3));
    return std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.1).momentum(flags.momentum ? 0.9 : 0.0));
  };
  std::shared_ptr<torch::optim::Optimizer> sgd = make_optimizer(model->parameters());
  std::shared_ptr<torch::optim::Optimizer> reference_optimizer = make_optimizer(reference->parameters());
  torch::optim::Optimizer& reference_sgd = *reference_optimizer;
  if (flags.loss_scaler) {  // refused at setup on every rank; the barrier shows that none was left waiting
    expect_refused(fabric.global_rank(), "a precision with a loss scaler", "cannot use a precision with a loss scaler",
                   [&] { fabric.setup(model, sgd); });
    fabric.barrier();
    if (checks::failures() > 0) return 1;
    std::cout << "pipeline checks passed on rank " << fabric.global_rank() << " (a loss scaler refused)" << std::endl;
    return 0;
  }
  auto setup = fabric.setup(model, sgd);  // (C++17 lambdas cannot capture structured bindings)
  auto& net = std::get<0>(setup);
  auto& optimizer = std::get<1>(setup);

  const auto share = fabric.strategy()->sampler_share();
  expect(share.replicas == data && share.rank == data_rank, "sampler share (" + std::to_string(share.replicas) + ", " +
         std::to_string(share.rank) + "), expected the data dimension's (" + std::to_string(data) + ", " +
         std::to_string(data_rank) + ")");
  for (const auto& group : optimizer.optimizer().param_groups()) {
    expect(group.params().size() == net.module()->parameters().size(),
           "the optimizer keeps " + std::to_string(group.params().size()) + " parameters, this rank's stages hold " +
           std::to_string(net.module()->parameters().size()));
  }

  int64_t first_step = 0;
  if (!flags.resume.empty()) {
    lf::State state{{"model", net}, {"optimizer", optimizer}, {"step", int64_t{0}}};
    fabric.load(flags.resume, state);
    first_step = state.at("step").value().toInt();
  }
  std::vector<double> step_times, idle, peaks, forwards, backwards;
  const double rss_before_training = rss_mb("VmRSS:");
  for (int64_t step = 0; step < first_step + flags.steps; ++step) {
    const int64_t batch = flags.halve_batch_after >= 0 && step > flags.halve_batch_after ? flags.batch / 2 : flags.batch;
    const int64_t rows = batch / data;
    auto [ids, targets] = examples::pipeline_gpt_batch(kSettings, batch, step);
    // The reference: the whole global batch in one process (not under --bench).
    at::Tensor reference_loss;
    double reference_norm = 0.0;
    if (!flags.bench) {
      reference_sgd.zero_grad();
      reference_loss = reference(ids, targets);
      reference_loss.backward();
      reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1.0);
      reference_sgd.step();
    }
    if (step < first_step) continue;

    optimizer.zero_grad();
    const at::Tensor my_ids = ids.narrow(0, data_rank * rows, rows), my_targets = targets.narrow(0, data_rank * rows, rows);
    if (flags.refusals && step == first_step) {
      expect_refused(fabric.global_rank(), "a target of another length", "Give one target per input sample",
                     [&] { net(my_ids, my_targets.narrow(0, 0, rows - 1)); });
    }
    at::Tensor loss_value;
    if (flags.accumulate > 1) {  // K micro-steps, the first K-1 without the gradient reduction
      const int64_t part = rows / flags.accumulate;
      std::vector<at::Tensor> parts;
      for (int64_t k = 0; k < flags.accumulate; ++k) {
        auto skip = fabric.no_backward_sync(net, /*enabled=*/k + 1 < flags.accumulate);
        const at::Tensor piece = net(my_ids.narrow(0, k * part, part), my_targets.narrow(0, k * part, part));
        fabric.backward(piece / static_cast<double>(flags.accumulate));
        parts.push_back(piece.detach());
      }
      loss_value = at::stack(parts).mean();
    } else {
      try {
        loss_value = net(my_ids, my_targets);
      } catch (const std::exception& error) {
        if (!flags.retry_after_failure) throw;
        std::cout << "rank " << fabric.global_rank() << " step " << step << " failed: " << error.what() << std::endl;
        const std::string retry = checks::refusal([&] { net(my_ids, my_targets); });
        std::cout << "rank " << fabric.global_rank() << " the next step: " << retry << std::endl;
        std::exit(3);
      }
      if (flags.refusals && step == first_step) {
        expect_refused(fabric.global_rank(), "backward with higher_order()", "higher_order()",
                       [&] { fabric.backward(loss_value, lf::BackwardOptions().higher_order()); });
        expect_refused(fabric.global_rank(), "backward with only(...)", "only(...)",
                       [&] { fabric.backward(loss_value, lf::BackwardOptions().only({net.module()->parameters()[0]})); });
      }
      fabric.backward(loss_value);
      if (flags.refusals && step == first_step) {
        expect_refused(fabric.global_rank(), "a second backward of one step", "gradients were applied already",
                       [&] { fabric.backward(loss_value); });
      }
    }
    const double norm = fabric.clip_gradients(net, optimizer, lf::GradientClipping().norm(1.0))->item<double>();
    optimizer.step();
    const double mean_loss = fabric.all_reduce(loss_value.detach(), "mean").item<double>();
    if (strategy != nullptr && step > first_step) {
      const auto stats = strategy->last_step();
      // The pipeline's makespan is its slowest rank's step: each rank idles 1 - compute / makespan.
      const double makespan = fabric.all_reduce(stats.step_seconds, lf::ReduceOp::Max);
      step_times.push_back(makespan);
      idle.push_back(1.0 - stats.compute_seconds / makespan);
      peaks.push_back(stats.peak_micro_batches);
      forwards.push_back(stats.forward_seconds);
      backwards.push_back(stats.backward_seconds);
    }
    if (flags.bench) continue;
    expect(std::abs(mean_loss - reference_loss.item<double>()) <= tolerance * std::max(1.0, std::abs(reference_loss.item<double>())),
           "step " + std::to_string(step) + ": loss " + std::to_string(mean_loss) + ", one process " +
           std::to_string(reference_loss.item<double>()));
    expect(std::abs(norm - reference_norm) <= tolerance * std::max(1.0, reference_norm),
           "step " + std::to_string(step) + ": clipped norm " + std::to_string(norm) + ", one process " +
           std::to_string(reference_norm));
  }

  const int pipe_rank = strategy != nullptr ? strategy->pipe_rank() : 0;
  const int64_t m = flags.options.micro_batches;
  const int v = flags.options.stages_per_rank;
  if (strategy != nullptr && !flags.bench && flags.options.schedule == "GPipe") {
    expect(median(peaks) == m * v, "GPipe held " + std::to_string(median(peaks)) + " micro-batches at once, expected all " +
           std::to_string(m * v));
  }
  if (strategy != nullptr && !flags.bench && flags.options.schedule == "1F1B") {
    const double bound = std::min<int64_t>(m, pipe - pipe_rank);
    expect(median(peaks) <= bound, "1F1B held " + std::to_string(median(peaks)) + " micro-batches at once, expected at "
           "most " + std::to_string(bound) + " (pipe size - pipe rank)");
  }

  // Under fsdp the stage's full parameters exist only while gathered.
  auto* fsdp = dynamic_cast<lf::FSDPStrategy*>(fabric.strategy().get());
  if (fsdp == nullptr) fsdp = dynamic_cast<lf::FSDPStrategy*>(fabric.strategy()->data_parallel_part());
  lf::ScopeGuard full = fsdp ? fsdp->summon_full_parameters(*net.module()) : lf::ScopeGuard();
  if (fsdp != nullptr && data > 1 && flags.options.fully_sharded.sharding_strategy != lf::ShardingStrategy::NoShard) {
    int64_t stepped = 0, held = 0;  // the optimizer steps shards: about 1 / data of the stage
    for (const auto& group : optimizer.optimizer().param_groups()) {
      for (const auto& p : group.params()) stepped += p.numel();
    }
    for (const auto& p : net.module()->parameters()) held += p.numel();
    expect(stepped * data <= held + data * 64, "fsdp: the optimizer steps " + std::to_string(stepped) + " elements of "
           "this stage's " + std::to_string(held) + ", not a 1/" + std::to_string(data) + " share");
  }
  std::map<std::string, at::Tensor> expected;
  for (const auto& item : reference->named_parameters()) expected[item.key()] = item.value();
  if (!flags.bench) {
    int64_t split = 0;
    for (const auto& item : net.module()->named_parameters()) split += item.value().sizes() != expected.at(item.key()).sizes();
    const int tensor_size = mesh ? mesh->size("tensor") : 1;
    expect(tensor_size == 1 || split > 0, "tensor_parallel_size " + std::to_string(tensor_size) +
           " split none of this rank's parameters");
    for (const auto& item : net.module()->named_parameters()) {
      at::Tensor want = expected.at(item.key());
      for (int64_t d = 0; d < want.dim(); ++d) {  // a tensor-parallel slice: this tensor rank's part
        const int64_t size = item.value().size(d);
        if (size != want.size(d)) want = want.narrow(d, mesh->coordinate("tensor") * size, size);
      }
      const double difference = (item.value().detach().to(at::kFloat) - want).abs().max().item<double>() /
                                (tolerance > 1e-5 ? std::max(1e-2, want.abs().max().item<double>()) : 1.0);
      expect(difference <= tolerance, "parameter " + item.key() + " differs from the one-process run by " +
             std::to_string(difference));
    }
  }
  if (flags.eval_no_grad && !flags.bench) {
    // Evaluation: forwards only, every micro-batch, the mean loss on every rank; nothing trains.
    auto [ids, targets] = examples::pipeline_gpt_batch(kSettings, flags.batch, first_step + flags.steps);
    const int64_t rows = flags.batch / data;
    std::vector<at::Tensor> before;
    for (const auto& p : net.module()->parameters()) before.push_back(p.detach().clone());
    torch::NoGradGuard no_grad;
    const at::Tensor evaluated = net(ids.narrow(0, data_rank * rows, rows), targets.narrow(0, data_rank * rows, rows));
    const double mean = fabric.all_reduce(evaluated, "mean").item<double>();
    const double want = reference(ids, targets).item<double>();
    expect(!evaluated.requires_grad(), "the loss evaluated under NoGradGuard requires a gradient");
    expect(std::abs(mean - want) <= tolerance * std::max(1.0, std::abs(want)),
           "evaluation under NoGradGuard: loss " + std::to_string(mean) + ", one process " + std::to_string(want));
    size_t k = 0;
    for (const auto& p : net.module()->parameters()) {
      expect(torch::equal(p.detach(), before[k++]), "evaluation under NoGradGuard changed a parameter");
    }
    std::cout << "rank " << fabric.global_rank() << " evaluated under NoGradGuard: loss " << mean << std::endl;
  }
  if (!flags.save.empty()) {
    lf::State state{{"model", net}, {"optimizer", optimizer}, {"step", first_step + flags.steps}};
    fabric.save(flags.save, state);
  }
  std::ostringstream local;
  if (strategy == nullptr) local << "all";
  for (int s : strategy != nullptr ? strategy->local_stages() : std::vector<int>{}) local << (local.tellp() > 0 ? "," : "") << s;
  if (flags.bench) {
    // The transfer time per step: a boundary tensor (one micro-batch's activations) sent back and
    // forth between pipe ranks 2k and 2k+1 on the pipe group, times the boundary messages each
    // rank takes part in per step (an activation and a gradient per micro-batch per boundary).
    double one_way_ms = 0.0;
    const int transfers = pipe > 1 ? static_cast<int>(4 * m * (stages - 1) / pipe) : 0;
    if (pipe > 1 && (pipe_rank ^ 1) < pipe) {
      lf::Collective& group = mesh->group("pipe");
      at::Tensor boundary = at::zeros({flags.batch / data / m, kSettings.seq, kSettings.d_model});
      const int partner = pipe_rank ^ 1, rounds = 20;
      auto exchange = [&] {
        if (pipe_rank % 2 == 0) {
          group.send_start(boundary, partner, 1000)();
          group.recv_start_(boundary, partner, 1001)();
        } else {
          group.recv_start_(boundary, partner, 1000)();
          group.send_start(boundary, partner, 1001)();
        }
      };
      for (int r = 0; r < 3; ++r) exchange();
      const auto start = std::chrono::steady_clock::now();
      for (int r = 0; r < rounds; ++r) exchange();
      one_way_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / (2 * rounds);
    }
    const double formula = flags.options.schedule == "Interleaved1F1B" ? (pipe - 1.0) / (v * m + pipe - 1.0)
                                                                       : (pipe - 1.0) / (m + pipe - 1.0);
    const double simulated = pipe > 1 ? lf::simulated_bubble(flags.options.schedule, pipe, v, static_cast<int>(m),
                                                             median(forwards), median(backwards)) : 0.0;
    std::cout << "pipeline bench rank " << fabric.global_rank() << " stages " << local.str() << " schedule "
              << flags.options.schedule << " micro-batches " << m << " step_ms " << median(step_times) * 1e3
              << " idle " << median(idle) << " formula " << formula
              << " simulated " << simulated << " transfer_ms " << transfers * one_way_ms << " one_way_ms " << one_way_ms
              << " forward_ms " << median(forwards) * 1e3 << " backward_ms " << median(backwards) * 1e3
              << " peak_micro_batches " << median(peaks) << " training_rss_growth_mb " << rss_mb() - rss_before_training
              << std::endl;
  }
  if (checks::failures() > 0) return 1;
  std::cout << "pipeline checks passed on rank " << fabric.global_rank() << " (stages " << local.str() << ", data "
            << data_rank << " of " << data << ")" << std::endl;
  return 0;
}
