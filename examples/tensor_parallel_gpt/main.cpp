// The tensor-parallel GPT of examples/common/tensor_parallel_gpt.h trained on a synthetic copy
// task with AdamW. Under the model_parallel strategy each tensor group splits the model (q, k, v
// and the MLP's first layer by output features, the projections by input features, embedding and
// head by vocabulary) and the data groups run ddp, or fsdp with --data-parallel fsdp (each slice
// sharded again over the data group); --sequence-parallel splits the activations between the
// tensor-parallel pairs by sequence, --dropout adds residual dropout, --context-parallel-size C
// splits every sequence over C ranks (ring attention). Under any other strategy it
// is the unsplit model. Prints the loss every --log-every steps and, at the end, one JSON line
// from rank 0: the median step time, the mesh, the tensor group's collectives per step, and the
// parameter and AdamW state bytes rank 0 holds (the storages of the tensors its optimizer steps)
// next to the formula's (split parameters / T + replicated ones, both / D under fsdp; AdamW keeps
// two tensors per parameter), as docs/benchmarks.md records them.
//   lightning-run model --accelerator cpu --devices 4 --strategy model_parallel build/bin/tensor_parallel_gpt
//   build/bin/tensor_parallel_gpt --accelerator cpu --devices 2 --tensor-parallel-size 2 --steps 20
//   lightning-run model --accelerator cpu --devices 4 build/bin/tensor_parallel_gpt --tensor-parallel-size 2 \
//       --data-parallel fsdp --sequence-parallel --dropout 0.1
//   lightning-run model --accelerator cpu --devices 4 build/bin/tensor_parallel_gpt --tensor-parallel-size 2 \
//       --context-parallel-size 2
//   ... --checkpoint ck/last.ckpt          save {model, optimizer, step} there at the end
//   ... --resume ck/last.ckpt              continue from it (any mesh shape, any strategy)
#include <CLI/CLI.hpp>
#include <lightning/fabric.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <set>

#include "shared_flags.h"
#include "tensor_parallel_gpt.h"

namespace lf = lightning::fabric;
namespace tp = lightning::fabric::tensor_parallel;

namespace {
struct Flags {
  examples::TensorParallelGptSettings model;
  int64_t batch_size = 8, steps = 50, warmup = 3, log_every = 10;
  double lr = 3e-3;
  std::optional<int> tensor_parallel_size;
  int context_parallel_size = 1;
  std::string state_dict_type = "sharded", checkpoint, resume, data_parallel;
  examples::SharedFlags shared;
};

// Bytes of the distinct storages behind tensors (a view of a larger tensor counts its whole storage).
int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += t.storage().nbytes();
  }
  return bytes;
}

// The optimizer's state tensors (AdamW: exp_avg, exp_avg_sq, step).
std::vector<at::Tensor> optimizer_tensors(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto found = optimizer.state().find(p.unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
      out.push_back(state.exp_avg());
      out.push_back(state.exp_avg_sq());
      if (state.max_exp_avg_sq().defined()) out.push_back(state.max_exp_avg_sq());
    }
  }
  return out;
}

// The float32 bytes of the model's parameters on one rank of a tensor group of `tensor` ranks,
// from the formula: the split parameters' elements / tensor + the replicated ones', all divided by
// `sharded_over` (the data size under fsdp, else 1). Split: the
// token embedding and the head (vocab x d), q, k, v and fc1 (weights and biases), the projection's
// and fc2's weights. Replicated: the position embedding, the LayerNorms, the row layers' biases.
int64_t formula_parameter_bytes(const examples::TensorParallelGptSettings& s, int tensor, int sharded_over) {
  const int64_t d = s.d_model;
  const int64_t split_per_block = 3 * (d * d + d) + d * d + (4 * d * d + 4 * d) + 4 * d * d;
  const int64_t replicated_per_block = 2 * d + d + 2 * d + d;
  const int64_t split = 2 * s.vocab * d + s.layers * split_per_block;
  const int64_t replicated = s.seq * d + 2 * d + s.layers * replicated_per_block;
  return (split / tensor + replicated) * 4 / sharded_over;
}
}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"A tensor-parallel GPT on a synthetic copy task (docs/model-parallel.md)"};
  app.add_option("--vocab", f.model.vocab, "Vocabulary size (divisible by the tensor size)");
  app.add_option("--seq", f.model.seq, "Sequence length");
  app.add_option("--d-model", f.model.d_model, "Model width (divisible by --heads)");
  app.add_option("--heads", f.model.heads, "Attention heads (divisible by the tensor size)");
  app.add_option("--layers", f.model.layers, "Transformer blocks");
  app.add_option("--batch-size", f.batch_size, "Sequences per step over all data-parallel ranks");
  app.add_option("--steps", f.steps, "Training steps");
  app.add_option("--warmup", f.warmup, "Steps left out of the median step time");
  app.add_option("--log-every", f.log_every, "Print the loss every this many steps");
  app.add_option("--lr", f.lr, "AdamW learning rate");
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size,
                 "Configure model_parallel in code with this tensor size (default: --strategy decides)");
  app.add_option("--context-parallel-size", f.context_parallel_size,
                 "Configure model_parallel in code with each sequence split over this many ranks (ring attention)")
      ->check(CLI::PositiveNumber);
  app.add_option("--state-dict-type", f.state_dict_type, "With --tensor-parallel-size: sharded (a folder) or full (one file)")
      ->check(CLI::IsMember({"sharded", "full"}));
  app.add_option("--data-parallel", f.data_parallel,
                 "Configure model_parallel in code with this on the data dimension: ddp, fsdp (FULL_SHARD) or hsdp "
                 "(HYBRID_SHARD: shards within a node's data ranks, replicas across)")
      ->check(CLI::IsMember({"ddp", "fsdp", "hsdp"}));
  app.add_flag("--sequence-parallel", f.model.sequence_parallel,
               "Split the activations between the tensor-parallel pairs (LayerNorm, dropout, residuals) by sequence");
  app.add_option("--dropout", f.model.dropout, "Residual dropout probability")->check(CLI::Range(0.0, 0.99));
  app.add_option("--checkpoint", f.checkpoint, "Save {model, optimizer, step} here at the end");
  app.add_option("--resume", f.resume, "Load this checkpoint first and continue from its step");
  f.shared.add_to(app);
  CLI11_PARSE(app, argc, argv);
  if (f.model.heads < 1 || f.model.d_model % f.model.heads != 0) {
    std::cerr << "tensor_parallel_gpt: --d-model " << f.model.d_model << " must be a multiple of --heads "
              << f.model.heads << "; e.g. --d-model 64 --heads 4." << std::endl;
    return 2;
  }
  try {
    lf::FabricOptions options = f.shared.apply();
    if (f.tensor_parallel_size || !f.data_parallel.empty() || f.context_parallel_size > 1) {
      lf::ModelParallelOptions mp;
      mp.tensor_parallel_size = f.tensor_parallel_size;
      mp.context_parallel_size = f.context_parallel_size;
      mp.state_dict_type = f.state_dict_type;
      if (!f.data_parallel.empty()) mp.data_parallel_strategy = f.data_parallel == "ddp" ? "ddp" : "fsdp";
      if (f.data_parallel == "hsdp") mp.fully_sharded.sharding_strategy = lf::ShardingStrategy::HybridShard;
      options.strategy(lf::model_parallel_strategy(mp));
    }
    lf::Fabric fabric(options);
    fabric.seed_everything(0);
    examples::TensorParallelGpt net(f.model);
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(f.lr));
    auto [model, optimizer] = fabric.setup(net, adamw);  // model_parallel: the mesh, the split layers
    auto* model_parallel = dynamic_cast<lf::MeshStrategy*>(fabric.strategy().get());
    const lf::DeviceMesh* mesh = model_parallel ? model_parallel->device_mesh().get() : nullptr;
    const bool fully_sharded = dynamic_cast<lf::FSDPStrategy*>(fabric.strategy().get()) != nullptr ||
                               dynamic_cast<lf::FSDPStrategy*>(fabric.strategy()->data_parallel_part()) != nullptr;
    const auto share = fabric.strategy()->sampler_share();  // model_parallel: by the data rank
    if (f.batch_size % share.replicas != 0) {
      std::cerr << "tensor_parallel_gpt: --batch-size " << f.batch_size << " does not split over " << share.replicas
                << " data-parallel ranks; give a multiple of " << share.replicas << "." << std::endl;
      return 2;
    }
    const int64_t rows = f.batch_size / share.replicas;
    int64_t start = 0;
    if (!f.resume.empty()) {
      lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", int64_t{0}}};
      fabric.load(f.resume, state);
      start = state.at("step").to<int64_t>();
      fabric.print("resumed from " + f.resume + " at step " + std::to_string(start));
    }
    std::vector<double> step_ms;
    double loss_value = 0;
    const uint64_t tensor_operations_before = mesh ? mesh->operations("tensor") : 0;
    for (int64_t step = start; step < start + f.steps; ++step) {
      const auto begin = std::chrono::steady_clock::now();
      auto [ids, targets] = examples::tensor_parallel_gpt_batch(f.model, f.batch_size, step);
      optimizer.zero_grad();
      at::Tensor loss;
      {  // under context parallelism each rank its part of every sequence (no mesh, or none: all of it)
        lf::context_parallel::Region region(mesh);
        const at::Tensor logits = model(region.shard(ids.narrow(0, share.rank * rows, rows), 1).to(fabric.device()));
        loss = examples::tensor_parallel_gpt_loss(
            logits, region.shard(targets.narrow(0, share.rank * rows, rows), 1).to(fabric.device()), mesh);
      }
      fabric.backward(loss);
      optimizer.step();
      loss_value = loss.item<double>();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
      if (step - start >= f.warmup) step_ms.push_back(ms);
      if ((step + 1) % f.log_every == 0) fabric.print("step " + std::to_string(step + 1) + " loss " + std::to_string(loss_value));
    }
    if (!f.checkpoint.empty()) {
      lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", start + f.steps}};
      fabric.save(f.checkpoint, state);
      fabric.print("saved " + f.checkpoint);
    }
    const double tensor_collectives_per_step =
        mesh && f.steps > 0 ? static_cast<double>(mesh->operations("tensor") - tensor_operations_before) / f.steps : 0.0;
    std::sort(step_ms.begin(), step_ms.end());
    const double median = step_ms.empty() ? 0.0 : step_ms[step_ms.size() / 2];
    std::vector<at::Tensor> stepped;  // the parameters, or under fsdp their shards
    for (const auto& group : adamw.param_groups()) stepped.insert(stepped.end(), group.params().begin(), group.params().end());
    const int64_t parameter_bytes = storage_bytes(stepped);
    const int64_t optimizer_bytes = storage_bytes(optimizer_tensors(adamw));
    // fsdp shards over "shard" (times "context" when there is one); HSDP's replicas hold a shard each.
    const int context = mesh && mesh->has("context") ? mesh->size("context") : 1;
    const int64_t formula = formula_parameter_bytes(
        f.model, mesh ? mesh->size("tensor") : 1,
        fully_sharded ? (mesh ? mesh->size("shard") * context : fabric.world_size()) : 1);
    if (fabric.is_global_zero()) {
      std::cout << "{\"example\":\"tensor_parallel_gpt\",\"strategy\":\"" << fabric.strategy()->name()
                << "\",\"world_size\":" << fabric.world_size() << ",\"data\":" << (mesh ? mesh->size("data") : share.replicas)
                << ",\"tensor\":" << (mesh ? mesh->size("tensor") : 1)
                << ",\"context\":" << context << ",\"median_step_ms\":" << examples::rounded(median, 3)
                << ",\"loss\":" << examples::rounded(loss_value, 5)
                << ",\"tensor_collectives_per_step\":" << tensor_collectives_per_step << ",\"parameter_bytes\":" << parameter_bytes
                << ",\"optimizer_bytes\":" << optimizer_bytes << ",\"formula_parameter_bytes\":" << formula
                << ",\"formula_optimizer_bytes\":" << 2 * formula << "}"
                << std::endl;
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "tensor_parallel_gpt: " << error.what() << std::endl;
    return 1;
  }
}
