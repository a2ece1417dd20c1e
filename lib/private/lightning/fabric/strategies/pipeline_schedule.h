// The order in which one rank of a pipeline runs the forwards and backwards of its stages'
// micro-batches (docs/pipeline-parallel.md, "Schedules"). Pure arithmetic: nothing here
// communicates, so the schedules are tested (and their bubble computed) without processes.
//
// Stages are numbered 0..S-1 along the model, S = pipe_size x stages_per_rank; stage s runs on pipe
// rank s % pipe_size (so with several stages per rank, rank r holds r, r + P, r + 2P, ...).
// Every schedule is the same three phases on each rank: `warmup` forwards, then one forward and
// one backward in turn while forwards remain, then the remaining backwards; the schedules differ
// only in the forward and backward orders and the warmup:
//   - GPipe: every forward first (warmup = all), then every backward;
//   - 1F1B: warmup = P - r - 1, so a stage holds at most P - r micro-batches' activations;
//   - Interleaved1F1B: several stages per rank, micro-batches taken P at a time through each of
//     the rank's stages in turn (Megatron-LM's order), warmup = 2 (P - r - 1) + (v - 1) P.
#pragma once

#include <string>
#include <vector>

namespace lightning::fabric {

struct PipelineAction {
  enum class Kind { Forward, Backward };
  Kind kind;
  int stage;        // 0..stages-1, along the model
  int micro_batch;  // 0..micro_batches-1
  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && stage == other.stage && micro_batch == other.micro_batch;
  }
};

/// The schedule names: "GPipe", "1F1B", "Interleaved1F1B".
const std::vector<std::string>& pipeline_schedules();

/// ValueError naming the call, the bad value and the fix: an unknown schedule, non-positive sizes,
/// stages_per_rank > 1 under 1F1B, or 1 under Interleaved1F1B, or micro_batches not a multiple of
/// pipe_size under Interleaved1F1B.
void check_pipeline_schedule(const std::string& call, const std::string& schedule, int pipe_size, int stages_per_rank,
                             int micro_batches);

/// What pipe rank `rank` runs in one training step, in order (after check_pipeline_schedule).
std::vector<PipelineAction> pipeline_actions(const std::string& schedule, int pipe_size, int rank, int stages_per_rank,
                                             int micro_batches);

/// The fraction of a step every rank idles in the schedule when each forward takes
/// forward_time, each backward backward_time and communication is free: the schedules run
/// together as processes would (a forward waits for the previous stage's, a backward for the next
/// stage's), and the result is 1 - busy / makespan, averaged over ranks. GPipe and 1F1B give the
/// textbook (P - 1) / (m + P - 1). Throws RuntimeError if the schedules deadlock.
double simulated_bubble(const std::string& schedule, int pipe_size, int stages_per_rank, int micro_batches,
                        double forward_time = 1.0, double backward_time = 2.0);

}  // namespace lightning::fabric
