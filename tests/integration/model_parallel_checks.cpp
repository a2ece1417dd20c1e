// The model_parallel strategy in a real job under lightning-run: the tensor-parallel GPT of
// examples/common/tensor_parallel_gpt.h (q, k, v column-parallel, the attention output and the
// MLP's second layer row-parallel, a vocabulary-parallel embedding, head and loss) trains SGD
// steps with momentum and gradient clipping on one global batch per step, split by the data rank.
// Every rank compares its parameters with the same model trained unsplit in this process on the
// whole batches (float32, within 1e-5), and checks the mesh, the sampler's share and the clipped
// norm. Prints "FAIL: ..." and exits 1 on a mismatch, "model parallel checks passed on rank R
// (data D of S, tensor T of U)" otherwise.
//   lightning-run model --accelerator cpu --devices 4 lf_model_parallel_checks [--tensor N]
// --tensor N configures model_parallel_strategy in code; without it the strategy comes from
// lightning-run --strategy model_parallel (tensor size = the devices per node). Checkpoints:
//   --save PATH [--save-type full|sharded]  fabric.save({model, optimizer, step}) after training
//   --resume PATH                           fabric.load it first and train from its step on (the
//                                           reference trains every step from 0)
//   --fsdp [SHARDING]                       fsdp on the data dimension (default FULL_SHARD; the
//                                           reference is the same), and a check of the memory each
//                                           rank holds for parameters, gradients and momentum
//                                           against the formula (at most 1.10 times it)
//   --sequence-parallel                     activations split by sequence between the pairs
//                                           (ParallelLayerNorm's gradients summed over the group)
//   --dropout P                             residual dropout; every rank seeds each step alike and
//                                           the reference runs each data rank's rows on its own
//                                           with the same seed (ParallelDropout's mask rule)
//   --shard N                               with --fsdp HYBRID_SHARD: shard each replica over N data
//                                           ranks (HSDP x tensor: mesh (replicate, shard, tensor))
//   --context N                             context parallelism over N ranks (mesh (data, context,
//                                           tensor)): each rank trains on its load-balanced part of
//                                           the sequence, attention by ring
//   --checkpoint-blocks                     activation checkpointing of every block (recomputed in
//                                           the backward, after the step's context region ended)
//   --losses FILE                           rank 0 writes "STEP LOSS" per trained step: the step's
//                                           mean loss over the whole batch, before the update
//   --meta                                  build the model under fabric.init_module(true) (on the
//                                           meta device under fsdp: split, then materialised)
//   --plain                                 no model_parallel: Fabric's default strategy, unsplit
//   --steps N                               steps to train (default 20)
//   --vocab N                               another vocabulary size than the default 32
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>

#include "lightning/fabric.h"
#include "tensor_parallel_gpt.h"

namespace lf = lightning::fabric;
namespace tp = lightning::fabric::tensor_parallel;

namespace {
examples::TensorParallelGptSettings kSettings{/*vocab=*/32, /*seq=*/8, /*d_model=*/16, /*heads=*/4, /*layers=*/2};
constexpr int64_t kBatch = 4;

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::cout << "FAIL: " << what << std::endl;
  ++failures;
}

struct Flags {
  std::optional<int> tensor;
  int64_t steps = 20;
  std::string save, save_type = "sharded", resume, fsdp, losses;
  int context = 1;
  bool plain = false, meta = false, checkpoint_blocks = false;
  int shard = 0;  // HYBRID_SHARD's shard size; 0: the default
};

Flags parse(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    const bool has_value = i + 1 < argc;
    if (name == "--plain") flags.plain = true;
    else if (name == "--meta") flags.meta = true;
    else if (name == "--checkpoint-blocks") flags.checkpoint_blocks = true;
    else if (name == "--shard" && has_value) flags.shard = std::atoi(argv[++i]);
    else if (name == "--context" && has_value) flags.context = std::atoi(argv[++i]);
    else if (name == "--losses" && has_value) flags.losses = argv[++i];
    else if (name == "--tensor" && has_value) flags.tensor = std::atoi(argv[++i]);
    else if (name == "--fsdp") flags.fsdp = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "FULL_SHARD";
    else if (name == "--steps" && has_value) flags.steps = std::atoll(argv[++i]);
    else if (name == "--save" && has_value) flags.save = argv[++i];
    else if (name == "--save-type" && has_value) flags.save_type = argv[++i];
    else if (name == "--resume" && has_value) flags.resume = argv[++i];
    else if (name == "--vocab" && has_value) kSettings.vocab = std::atoll(argv[++i]);
    else if (name == "--sequence-parallel") kSettings.sequence_parallel = true;
    else if (name == "--dropout" && has_value) kSettings.dropout = std::atof(argv[++i]);
    else {
      std::cout << "FAIL: unknown argument " << name << std::endl;
      std::exit(2);
    }
  }
  return flags;
}

lf::FabricOptions fabric_options(const Flags& flags) {
  lf::FabricOptions options;
  options.accelerator("cpu");
  if (flags.tensor || flags.save_type != "sharded" || !flags.fsdp.empty() || flags.context > 1) {
    lf::ModelParallelOptions model_parallel;
    model_parallel.tensor_parallel_size = flags.tensor;
    model_parallel.context_parallel_size = flags.context;
    if (flags.checkpoint_blocks) {
      const auto blocks = lf::ModulePolicy::of_type<examples::TensorParallelBlockImpl>();
      model_parallel.data_parallel.activation_checkpointing = blocks;
      model_parallel.fully_sharded.activation_checkpointing = blocks;
    }
    model_parallel.state_dict_type = flags.save_type;
    if (!flags.fsdp.empty()) {
      model_parallel.data_parallel_strategy = "fsdp";
      model_parallel.fully_sharded.sharding_strategy = lf::parse_sharding_strategy(flags.fsdp);
      if (flags.shard > 0) model_parallel.data_parallel_shard_size = flags.shard;
    }
    options.strategy(lf::model_parallel_strategy(model_parallel));
  }
  return options;
}

struct StepResult {
  double norm = 0;
  double loss = 0;  // the whole batch's mean loss
};

// One step on the split (or unsplit) model: this data rank's rows of the global batch, and of
// them this context rank's part of the sequence.
StepResult train_step(lf::Fabric& fabric, lf::FabricModule<examples::TensorParallelGptImpl>& model,
                      lf::FabricOptimizer& optimizer, const lf::DeviceMesh* mesh, int64_t step) {
  auto [ids, targets] = examples::tensor_parallel_gpt_batch(kSettings, kBatch, step);
  const int data = mesh ? mesh->size("data") : 1, data_rank = mesh ? mesh->coordinate("data") : 0;
  const int64_t rows = kBatch / data;
  optimizer.zero_grad();
  if (kSettings.dropout > 0) torch::manual_seed(500 + static_cast<uint64_t>(step));  // the step's masks
  at::Tensor loss;
  {  // the region ends before the backward, as attention.h allows
    lf::context_parallel::Region region(mesh);
    const at::Tensor logits = model(region.shard(ids.narrow(0, data_rank * rows, rows), 1));
    loss = examples::tensor_parallel_gpt_loss(logits, region.shard(targets.narrow(0, data_rank * rows, rows), 1), mesh);
  }
  fabric.backward(loss);
  // Every rank's loss is its part's mean and every part is as large: the world's mean is the batch's.
  const double mean_loss = fabric.all_reduce(loss.detach(), "mean").item<double>();
  const double norm = fabric.clip_gradients(model, optimizer, lf::GradientClipping().norm(1.0))->item<double>();
  optimizer.step();
  return {norm, mean_loss};
}

// With dropout, each data rank's rows on their own under the step's seed (the mean of the shares'
// mean losses is the batch's mean loss); otherwise the whole batch at once.
double reference_step(examples::TensorParallelGpt& reference, torch::optim::SGD& sgd, int64_t step, int data) {
  auto [ids, targets] = examples::tensor_parallel_gpt_batch(kSettings, kBatch, step);
  sgd.zero_grad();
  if (kSettings.dropout > 0) {
    const int64_t rows = kBatch / data;
    at::Tensor loss = torch::zeros({});
    for (int share = 0; share < data; ++share) {
      torch::manual_seed(500 + static_cast<uint64_t>(step));
      loss = loss + examples::tensor_parallel_gpt_loss(reference->forward(ids.narrow(0, share * rows, rows)),
                                                       targets.narrow(0, share * rows, rows), nullptr) / data;
    }
    loss.backward();
  } else {
    examples::tensor_parallel_gpt_loss(reference->forward(ids), targets, nullptr).backward();
  }
  std::vector<at::Tensor> parameters = reference->parameters();
  const double norm = torch::nn::utils::clip_grad_norm_(parameters, 1.0);
  sgd.step();
  return norm;
}

// The largest difference between every parameter of net (gathered where split) and reference's.
double largest_difference(examples::TensorParallelGpt& net, examples::TensorParallelGpt& reference,
                          const lf::DeviceMesh* mesh) {
  std::map<const c10::TensorImpl*, int64_t> split_dims;
  for (const auto& split : tp::sharded_parameters_of(*net)) split_dims[split.tensor.unsafeGetTensorImpl()] = split.dim;
  const auto theirs = reference->named_parameters();
  double worst = 0;
  for (const auto& parameter : net->named_parameters()) {
    auto dim = split_dims.find(parameter.value().unsafeGetTensorImpl());
    at::Tensor ours = parameter.value().detach();
    if (mesh && mesh->size("tensor") > 1 && dim != split_dims.end()) {
      ours = tp::gather_from_tensor_region(ours, *mesh, dim->second);
    }
    const at::Tensor expected = theirs[parameter.key()].detach();
    expect(ours.sizes() == expected.sizes(), parameter.key() + " has the shape " + c10::str(ours.sizes()));
    if (ours.sizes() == expected.sizes()) worst = std::max(worst, (ours - expected).abs().max().item<double>());
  }
  return worst;
}
}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  lf::Fabric fabric(fabric_options(flags));
  if (!flags.resume.empty() && kSettings.vocab != 32) {  // a checkpoint of another model: the error users meet
    try {
      examples::TensorParallelGpt other(kSettings);
      torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
      auto [model, optimizer] = fabric.setup(other, sgd);
      lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", int64_t{0}}};
      fabric.load(flags.resume, state);
      std::cout << "FAIL: a checkpoint of vocabulary 32 loaded into vocabulary " << kSettings.vocab << std::endl;
      return 1;
    } catch (const lf::RuntimeError& error) {
      std::cout << "load refused: " << error.what() << std::endl;
      return 0;
    }
  }
  lf::Strategy* strategy = flags.plain ? nullptr : fabric.strategy().get();
  lf::FSDPStrategy* fsdp = flags.fsdp.empty() ? nullptr : &fabric.strategy_as<lf::FSDPStrategy>();
  // Ranks seeded apart (as a program that seeds dropout per rank does): setup takes every tensor
  // from rank 0, whose seed builds the reference.
  lf::Fabric::seed_everything(3 + fabric.global_rank());
  examples::TensorParallelGpt net = nullptr;
  {
    auto guard = fabric.init_module(/*empty_init=*/flags.meta);
    net = examples::TensorParallelGpt(kSettings);
  }
  lf::Fabric::seed_everything(3);
  examples::TensorParallelGpt reference(kSettings);
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  auto [model, optimizer] = fabric.setup(net, sgd);  // builds the mesh, shards the layers
  const lf::DeviceMesh* mesh = strategy ? fabric.strategy_as<lf::MeshStrategy>().device_mesh().get() : nullptr;
  const int rank = fabric.global_rank(), data = mesh ? mesh->size("data") : 1, tensor = mesh ? mesh->size("tensor") : 1;
  const int context = mesh && mesh->has("context") ? mesh->size("context") : 1;
  if (strategy) {
    expect(strategy->name() == "model_parallel", "the strategy is called " + strategy->name());
    expect(data * context * tensor == fabric.world_size(), "the mesh covers the world");
    expect(context == flags.context, "the mesh's context size is " + std::to_string(context));
    const auto share = strategy->sampler_share();
    expect(share.replicas == data && share.rank == mesh->coordinate("data"), "the sampler splits by the data rank");
    if (flags.shard > 0) {  // HSDP: the data dimension is replicate x shard, fsdp shards over shard
      expect(mesh->has("replicate") && mesh->size("shard") == flags.shard &&
                 mesh->size("replicate") * flags.shard == data && fsdp->shard_group_size() == flags.shard,
             "HYBRID_SHARD's mesh is (replicate " + std::to_string(data / flags.shard) + ", shard " +
                 std::to_string(flags.shard) + ", tensor)");
    }
  }
  {
    lf::ScopeGuard full = fsdp ? fsdp->summon_full_parameters(*net) : lf::ScopeGuard();
    expect(net->blocks[0]->fc1->weight.size(0) == 4 * kSettings.d_model / tensor &&
               net->blocks[0]->projection->weight.size(1) == kSettings.d_model / tensor,
           "the layers hold 1/tensor of their weights");
  }

  int64_t start = 0;
  if (!flags.resume.empty()) {
    lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", int64_t{0}}};
    fabric.load(flags.resume, state);
    start = state.at("step").to<int64_t>();
    expect(start > 0, "the checkpoint's step is " + std::to_string(start));
  }
  double last_norm = 0, last_reference_norm = 0;
  std::ofstream losses;
  if (!flags.losses.empty() && rank == 0) losses.open(flags.losses);
  for (int64_t step = 0; step < start + flags.steps; ++step) {
    if (step >= start) {
      const StepResult result = train_step(fabric, model, optimizer, mesh, step);
      last_norm = result.norm;
      if (losses.is_open()) losses << step << ' ' << std::setprecision(10) << result.loss << '\n';
    }
    last_reference_norm = reference_step(reference, reference_sgd, step, data);
  }
  if (losses.is_open()) {
    losses.close();
    expect(!losses.fail(), "could not write the losses to " + flags.losses);
  }
  expect(std::abs(last_norm - last_reference_norm) <= 1e-5 * std::max(1.0, last_reference_norm),
         "the clipped norm " + std::to_string(last_norm) + " differs from the unsplit model's " +
             std::to_string(last_reference_norm));
  double worst = 0;
  {
    lf::ScopeGuard full = fsdp ? fsdp->summon_full_parameters(*net) : lf::ScopeGuard();
    worst = largest_difference(net, reference, mesh);
  }
  expect(worst <= 1e-5, "the parameters differ from the unsplit model's by " + std::to_string(worst));
  if (fsdp && (flags.fsdp == "FULL_SHARD" || flags.fsdp == "HYBRID_SHARD")) {
    // Parameters, gradients and momentum: each rank holds 1/(shards x tensor) of a split parameter
    // and 1/shards of a whole one, three times over (float32), shards being the data size (the
    // shard size under HYBRID_SHARD); SHARD_GRAD_OP and NO_SHARD keep full parameters by design.
    const int shards = fsdp->shard_group_size();
    double formula = 0;
    for (const auto& shard : fsdp->local_shards(*net)) {
      const double whole = static_cast<double>(c10::multiply_integers(shard.shape)) * 4;  // this rank's slice
      formula += 3 * whole / shards;
    }
    int64_t momentum = 0;
    for (const auto& group : sgd.param_groups()) {
      for (const auto& parameter : group.params()) {
        auto found = sgd.state().find(parameter.unsafeGetTensorImpl());
        if (found == sgd.state().end()) continue;
        const auto& buffer = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
        momentum += buffer.numel() * static_cast<int64_t>(buffer.element_size());
      }
    }
    const double measured = static_cast<double>(fsdp->resident_bytes() + momentum);
    std::cout << "memory on rank " << rank << ": " << measured << " bytes of parameters, gradients and momentum, "
              << formula << " by the formula, ratio " << measured / formula << std::endl;
    expect(measured <= 1.10 * formula, "rank " + std::to_string(rank) + " holds " + std::to_string(measured) +
                                           " bytes, more than 1.10 x the formula's " + std::to_string(formula));
  }
  if (!flags.save.empty()) {
    lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", start + flags.steps}};
    fabric.save(flags.save, state);
  }
  if (failures > 0) return 1;
  std::cout << "model parallel checks passed on rank " << rank << " (data " << (mesh ? mesh->coordinate("data") : 0) << " of "
            << data << ", tensor " << (mesh ? mesh->coordinate("tensor") : 0) << " of " << tensor << "), from step " << start
            << ", largest difference " << worst << std::endl;
  return 0;
}
