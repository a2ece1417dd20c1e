// The sharded-checkpoint engine of every sharded strategy: fsdp, and model_parallel with ddp or
// fsdp on its data dimension (docs/checkpoints.md, "One engine, driven by placements"). A strategy
// answers, through a CheckpointLayout, where this rank's value of each parameter lies in the whole
// tensor (placement.h); the engine does everything else, for synchronous and background saves:
//   - collecting: to_checkpoint(state), each placed parameter's value, and the optimizer state of
//     its shape, which shares its placement;
//   - "sharded" saves: a torch.distributed.checkpoint folder (dcp_format.h) staged, written by every
//     rank that holds a part (one replica of each), committed by rank 0 with the merged metadata,
//     meta.pt and an atomic rename; optimizer state keyed by parameter name, as Python keys it;
//     where ranks hold only some parameters (the pipeline), each optimizer group lists every
//     rank's parameters of it (gathered before writing);
//   - "full" saves: every placed tensor assembled whole, rank 0 writes one file;
//   - loading a folder written under any layout (resharding: each rank reads its part's boxes), a
//     file of whole tensors (each rank cuts its part), or the project's earlier sharded layout.
// Every step runs under the strategies' checkpoint protocol, so a failure on any rank is the same
// RuntimeError on every rank.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/placement.h"
#include "lightning/fabric/checkpoint/state.h"
#include "lightning/fabric/checkpoint/state_dict.h"
#include "lightning/fabric/checkpoint/checkpoint_write.h"

namespace torch::optim {
class Optimizer;
}

namespace lightning::fabric {

class Collective;

/// What a sharded strategy tells the engine. Answers must agree across ranks on which tensors are
/// placed (each rank's own box and range may differ).
class CheckpointLayout {
 public:
  virtual ~CheckpointLayout() = default;
  /// Where this rank's value of `parameter` lies, for a parameter as a set-up module holds it or
  /// as an optimizer holds it, or for a module's buffer; nullopt: whole and equal on every rank
  /// (rank 0 saves it).
  virtual std::optional<Placement> placement(const at::Tensor& parameter) const = 0;
  /// Whether every rank holds every tensor of the state (fsdp, model_parallel): then rank 0 saves
  /// what has no placement (plain values, optimizer step counts and groups), and each rank reads
  /// every entry. The pipeline holds each stage's tensors on its ranks only: false; then every rank
  /// for which writes_unplaced() is true saves its unplaced leaves (a key written by several ranks
  /// keeps the lowest rank's value: plain values are the same everywhere), and each rank restores
  /// only what its state holds.
  virtual bool every_rank_holds_every_tensor() const { return true; }
  virtual bool writes_unplaced() const { return false; }
  /// The value saved for a placed module parameter. Default: the parameter (fsdp: its shard).
  virtual at::Tensor saved_value(const at::Tensor& parameter) const { return parameter; }
  /// The names of the optimizer's parameters in index order (optimizer state is keyed by them in
  /// folders). Default: their names in the module entries of state.
  virtual std::vector<std::string> optimizer_parameter_names(const State& state, torch::optim::Optimizer& optimizer) const;
  /// Where optimizer parameter `name` (as optimizer_parameter_names gives it) stands in the whole
  /// model's order, for a layout whose ranks hold only some parameters: a folder's optimizer
  /// groups list every rank's parameters of the group, each once, sorted by it (equal positions
  /// in rank order, then in the group's). Default: 0.
  virtual int64_t parameter_position(const State& state, const std::string& name) const;
  /// Restores state from a checkpoint whose placed tensors are this rank's values; returns the
  /// entries state did not ask for. Default: restore_from_checkpoint.
  virtual StateDict restore(State& state, const StateDict& local, bool strict);
};

/// The steps of fabric.save under a sharded strategy (collective over group, the strategy's world,
/// which must outlive the steps). one_file: state_dict_type "full" (rank 0 writes one file of
/// whole tensors); otherwise a folder.
CheckpointWrite prepare_sharded_save(Collective& group, const std::string& call, const std::filesystem::path& path,
                                     const State& state, const StateFilter& filter, bool host_copy,
                                     const CheckpointLayout& layout, bool one_file);
/// fabric.load under a sharded strategy (collective over group): a folder or a file, from any
/// layout. With state: restores it and returns the unrequested entries; without: the whole
/// checkpoint.
StateDict load_sharded(Collective& group, const std::filesystem::path& path, State* state, bool strict,
                       CheckpointLayout& layout);

}  // namespace lightning::fabric
