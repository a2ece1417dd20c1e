// Pipeline schedules (pipeline_schedule.h): per-rank action orders and their simulated bubble.
#include "lightning/fabric/strategies/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

const std::vector<std::string>& pipeline_schedules() {
  static const std::vector<std::string> names{"GPipe", "1F1B", "Interleaved1F1B"};
  return names;
}

void check_pipeline_schedule(const std::string& call, const std::string& schedule, int pipe_size, int stages_per_rank,
                             int micro_batches) {
  const auto& names = pipeline_schedules();
  LF_CHECK(std::find(names.begin(), names.end(), schedule) != names.end(), ValueError, call, ": schedule=\"", schedule,
           "\" is not valid. Choose \"GPipe\" (every forward, then every backward), \"1F1B\" (one forward, one "
           "backward: at most pipe-size micro-batches in flight) or \"Interleaved1F1B\" (several stages per rank).");
  LF_CHECK(pipe_size > 0 && stages_per_rank > 0 && micro_batches > 0, ValueError, call, ": pipe size ", pipe_size,
           ", stages_per_rank=", stages_per_rank, " and micro_batches=", micro_batches, " must all be positive.");
  LF_CHECK(schedule != "1F1B" || stages_per_rank == 1, ValueError, call, ": schedule=\"1F1B\" runs one stage per "
           "rank, but stages_per_rank=", stages_per_rank, ". Choose schedule=\"Interleaved1F1B\" (or \"GPipe\") for "
           "several stages per rank, or set stages_per_rank=1.");
  LF_CHECK(schedule != "Interleaved1F1B" || stages_per_rank > 1, ValueError, call, ": schedule=\"Interleaved1F1B\" "
           "needs several stages per rank, but stages_per_rank=1. Set stages_per_rank to 2 or more, or choose "
           "schedule=\"1F1B\".");
  LF_CHECK(schedule != "Interleaved1F1B" || micro_batches % pipe_size == 0, ValueError, call,
           ": schedule=\"Interleaved1F1B\" takes micro-batches ", pipe_size, " at a time (the pipe size) through each "
           "stage of a rank, but micro_batches=", micro_batches, " is not a multiple of ", pipe_size,
           ". Choose micro_batches=", (micro_batches / pipe_size + 1) * pipe_size, " (or another multiple).");
}

std::vector<PipelineAction> pipeline_actions(const std::string& schedule, int pipe_size, int rank, int stages_per_rank,
                                             int micro_batches) {
  check_pipeline_schedule("pipeline_actions", schedule, pipe_size, stages_per_rank, micro_batches);
  const int P = pipe_size, v = stages_per_rank, m = micro_batches, total = m * v;
  std::vector<PipelineAction> forwards, backwards;
  if (schedule == "GPipe") {
    for (int chunk = 0; chunk < v; ++chunk) {
      for (int i = 0; i < m; ++i) forwards.push_back({PipelineAction::Kind::Forward, chunk * P + rank, i});
    }
    for (int chunk = v - 1; chunk >= 0; --chunk) {
      for (int i = 0; i < m; ++i) backwards.push_back({PipelineAction::Kind::Backward, chunk * P + rank, i});
    }
  } else {
    // k-th of the rank's forwards: micro-batches in groups of P, each group through every chunk.
    // With one stage per rank this is micro-batch k.
    const int per_group = P * v;
    for (int k = 0; k < total; ++k) {
      const int group = k / per_group, within = k % per_group;
      const int micro_batch = v == 1 ? k : group * P + within % P;
      const int chunk = v == 1 ? 0 : within / P;
      forwards.push_back({PipelineAction::Kind::Forward, chunk * P + rank, micro_batch});
      backwards.push_back({PipelineAction::Kind::Backward, (v - 1 - chunk) * P + rank, micro_batch});
    }
  }
  int warmup = total;
  if (schedule == "1F1B") warmup = std::min(P - rank - 1, total);
  if (schedule == "Interleaved1F1B") warmup = std::min(2 * (P - rank - 1) + (v - 1) * P, total);
  std::vector<PipelineAction> actions(forwards.begin(), forwards.begin() + warmup);
  size_t next_backward = 0;
  for (size_t f = warmup; f < forwards.size(); ++f) {
    actions.push_back(forwards[f]);
    actions.push_back(backwards[next_backward++]);
  }
  actions.insert(actions.end(), backwards.begin() + static_cast<std::ptrdiff_t>(next_backward), backwards.end());
  return actions;
}

double simulated_bubble(const std::string& schedule, int pipe_size, int stages_per_rank, int micro_batches,
                        double forward_time, double backward_time) {
  const int stages = pipe_size * stages_per_rank;
  std::vector<std::vector<PipelineAction>> plans;
  for (int r = 0; r < pipe_size; ++r) plans.push_back(pipeline_actions(schedule, pipe_size, r, stages_per_rank, micro_batches));
  std::map<std::tuple<int, int, int>, double> finished;  // (kind, stage, micro-batch) -> finish time
  std::vector<size_t> next(pipe_size, 0);
  std::vector<double> clock(pipe_size, 0.0), busy(pipe_size, 0.0);
  const auto key = [](PipelineAction::Kind kind, int stage, int i) { return std::make_tuple(static_cast<int>(kind), stage, i); };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pipe_size; ++r) {
      while (next[r] < plans[r].size()) {
        const PipelineAction& a = plans[r][next[r]];
        double ready = clock[r];
        bool waits = false;
        auto need = [&](PipelineAction::Kind kind, int stage) {
          auto found = finished.find(key(kind, stage, a.micro_batch));
          if (found == finished.end()) waits = true;
          else ready = std::max(ready, found->second);
        };
        if (a.kind == PipelineAction::Kind::Forward && a.stage > 0) need(PipelineAction::Kind::Forward, a.stage - 1);
        if (a.kind == PipelineAction::Kind::Backward) {
          need(PipelineAction::Kind::Forward, a.stage);
          if (a.stage < stages - 1) need(PipelineAction::Kind::Backward, a.stage + 1);
        }
        if (waits) break;
        const double length = a.kind == PipelineAction::Kind::Forward ? forward_time : backward_time;
        clock[r] = ready + length;
        busy[r] += length;
        finished[key(a.kind, a.stage, a.micro_batch)] = clock[r];
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < pipe_size; ++r) {
    LF_CHECK(next[r] == plans[r].size(), RuntimeError, "simulated_bubble: schedule \"", schedule, "\" deadlocks: rank ",
             r, " waits at action ", next[r], " of ", plans[r].size(), ".");
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  double idle = 0.0;
  for (int r = 0; r < pipe_size; ++r) idle += 1.0 - busy[r] / makespan;
  return idle / pipe_size;
}

}  // namespace lightning::fabric
