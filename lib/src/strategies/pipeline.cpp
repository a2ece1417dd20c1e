// Pipeline parallelism (pipeline.h): lf::Pipeline, the schedule's executor (PipelineRuntime) and
// the pipeline strategy over a (pipe, data) mesh.
#include "lightning/fabric/strategies/pipeline.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <numeric>
#include <unordered_set>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/collective_impl.h"
#include "lightning/fabric/strategies/composed.h"
#include "lightning/fabric/strategies/pipeline_plan.h"
#include "lightning/fabric/strategies/pipeline_schedule.h"
#include "lightning/fabric/tensor_parallel/layers.h"
#include "lightning/fabric/utilities/activation_checkpoint.h"
#include "lightning/fabric/utilities/profiled_range.h"
#include "lightning/fabric/utilities/meta_init.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

// ---- lf::Pipeline ----

namespace {
std::string bracketed(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}
}  // namespace

PipelineImpl::PipelineImpl(const torch::nn::Sequential& layers, LossFunction loss, std::vector<int64_t> starts)
    : loss_(std::move(loss)), stage_starts_(std::move(starts)) {
  LF_CHECK(!layers.is_empty() && layers->size() > 0, ValueError, "lf::Pipeline: the Sequential has no layers. Give "
           "the model's layers in order, each taking the previous one's output tensor.");
  LF_CHECK(loss_ != nullptr, ValueError, "lf::Pipeline: the loss function is empty. Give the loss of the last "
           "layer's output against the target, e.g. [](auto& out, auto& y) { return cross_entropy(out, y); }.");
  const auto names = layers->named_children();
  for (size_t i = 0; i < layers->size(); ++i) {
    layers_.emplace_back(names[i].key(), layers->begin()[static_cast<std::ptrdiff_t>(i)]);
    register_module(names[i].key(), names[i].value());
  }
  if (!stage_starts_.empty()) stage_starts(static_cast<int>(stage_starts_.size()));  // checks them
}

std::vector<int64_t> PipelineImpl::stage_starts(int stages) const {
  const int64_t n = size();
  if (!stage_starts_.empty()) {
    LF_CHECK(static_cast<int>(stage_starts_.size()) == stages, ValueError, "lf::Pipeline: stage_starts has ",
             stage_starts_.size(), " entries ", bracketed(stage_starts_), ", but the pipeline runs ", stages, " stages (pipe size x "
             "stages_per_rank). Give one start per stage, or none to split the ", n, " layers evenly.");
    bool valid = stage_starts_.front() == 0;
    for (size_t i = 1; i < stage_starts_.size(); ++i) valid = valid && stage_starts_[i] > stage_starts_[i - 1];
    valid = valid && stage_starts_.back() < n;
    LF_CHECK(valid, ValueError, "lf::Pipeline: stage_starts ", bracketed(stage_starts_), " cannot split ", n, " layers: the "
             "first start must be 0, each start greater than the one before and below ", n, " (every stage holds at "
             "least one layer).");
    return stage_starts_;
  }
  LF_CHECK(stages > 0 && n >= stages, ValueError, "lf::Pipeline: ", n, " layers cannot make ", stages, " stages (each "
           "stage needs at least one layer). Split the model into more layers, or run fewer stages (pipeline_size x "
           "stages_per_rank).");
  std::vector<int64_t> starts;
  int64_t begin = 0;
  for (int s = 0; s < stages; ++s) {
    starts.push_back(begin);
    begin += n / stages + (s < n % stages ? 1 : 0);
  }
  return starts;
}

at::Tensor PipelineImpl::run_layers(int64_t begin, int64_t end, const at::Tensor& input) {
  at::Tensor x = input;
  for (int64_t i = begin; i < end; ++i) x = layers_[static_cast<size_t>(i)].second.forward(x);
  return x;
}

// ---- the executor ----

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string describe(c10::IntArrayRef shape, at::ScalarType dtype) {
  std::ostringstream out;
  out << collective_detail::dtype_name(dtype) << shape;  // Python's names, as the flight recorder prints them
  return out.str();
}

std::string reason_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

// The loss returned by a training step: its backward hands each parameter the step's gradient
// times the loss's own gradient, so fabric.backward(loss) (or 2 * loss) means what it means for a
// loss computed in one process, and ddp's hooks average the gradients as they arrive.
struct ScheduleGradients : torch::autograd::Node {
  std::vector<at::Tensor> gradients;  // by the node's inputs (the parameters), undefined: unused
  std::string name() const override { return "lf::PipelineStepBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grad_outputs) override {
    LF_CHECK(!gradients.empty() || next_edges().empty(), RuntimeError, "fabric.backward: this pipeline step's "
             "gradients were applied already. Call backward once per forward of the lf::Pipeline.");
    torch::autograd::variable_list out(num_outputs());
    const at::Tensor& scale = grad_outputs.at(0);
    for (size_t i = 0; i < gradients.size(); ++i) {
      if (!gradients[i].defined()) continue;
      out[i] = scale.defined() ? gradients[i].mul_(scale.to(gradients[i].scalar_type())) : gradients[i];
    }
    gradients.clear();
    return out;
  }
};
}  // namespace

class PipelineRuntime {
 public:
  PipelineRuntime(const PipelineOptions& options, std::shared_ptr<DeviceMesh> mesh, std::shared_ptr<Collective> backward,
                  int global_rank, at::Device device, std::shared_ptr<PipelineStepStats> stats)
      : options_(options), mesh_(std::move(mesh)), backward_(std::move(backward)), global_rank_(global_rank),
        device_(device), stats_(std::move(stats)) {}

  int pipe_size() const { return mesh_->size("pipe"); }
  int pipe_rank() const { return mesh_->coordinate("pipe"); }
  int stages() const { return pipe_size() * options_.stages_per_rank; }
  int rank_of(int stage) const { return stage % pipe_size(); }
  bool is_local(int stage) const { return rank_of(stage) == pipe_rank(); }
  Collective& pipe() const { return mesh_->group("pipe"); }

  /// One step (PipelineImpl::forward). After a failure every later call is refused: the stages
  /// are out of step.
  at::Tensor run(PipelineImpl& pipeline, const at::Tensor& input, const at::Tensor& target);

 private:
  at::Tensor run_step(PipelineImpl& pipeline, const at::Tensor& input, const at::Tensor& target);
  // The shape and dtype crossing from stage `stage` to the next, agreed on at the first step.
  struct Boundary {
    bool agreed = false;
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
  };
  // One micro-batch at one stage, from its forward to its backward.
  struct InFlight {
    at::Tensor input, output, loss;
  };
  static int activation_tag(int stage) { return 3 * stage + 1; }
  static int gradient_tag(int stage) { return 3 * stage + 2; }
  static int shape_tag(int stage) { return 3 * stage + 3; }

  void send(Collective& group, const at::Tensor& tensor, int to_stage, int tag, std::tuple<int, int, int> key);
  void finish_send(std::tuple<int, int, int> key);
  at::Tensor receive(Collective& group, const Boundary& boundary, int from_stage, int tag);
  void send_activation(int stage, int micro_batch, const at::Tensor& output);
  at::Tensor receive_activation(int stage);
  std::string where(int stage, const char* what, int micro_batch) const;

  PipelineOptions options_;
  std::shared_ptr<DeviceMesh> mesh_;
  // The pipe group's twin that carries gradients: activations and gradients flow in opposite
  // directions at once under 1F1B, and on one gloo connection per pair two large messages crossing
  // stall each other (measured: a 1 MB gradient waited a second behind an activation).
  std::shared_ptr<Collective> backward_;
  int global_rank_;
  at::Device device_;
  std::shared_ptr<PipelineStepStats> stats_;
  std::map<int, Boundary> sent_, received_;  // by the stage the activation leaves
  std::vector<int64_t> micro_batch_shape_;    // the input's, per micro-batch, at the first step
  // Sends in flight, by (stage sent from, micro-batch, kind): an activation's is finished as soon
  // as its gradient comes back (the next stage has it then), the rest at the step's end.
  std::map<std::tuple<int, int, int>, std::function<void()>> pending_sends_;
  std::string failure_;  // why a step failed after communicating; empty while none has
  bool communicating_ = false;  // this step has passed its checks and may have sent or received
};

std::string PipelineRuntime::where(int stage, const char* what, int micro_batch) const {
  std::ostringstream out;
  out << "pipeline stage " << stage << " (global rank " << global_rank_ << ", pipe rank " << pipe_rank() << ") " << what
      << " micro-batch " << micro_batch;
  return out.str();
}

void PipelineRuntime::send(Collective& group, const at::Tensor& tensor, int to_stage, int tag,
                           std::tuple<int, int, int> key) {
  at::Tensor wire = tensor.detach().to(group.device()).contiguous();
  pending_sends_[key] = group.send_start(wire, rank_of(to_stage), tag);
}

void PipelineRuntime::finish_send(std::tuple<int, int, int> key) {
  auto found = pending_sends_.find(key);
  if (found == pending_sends_.end()) return;
  auto wait = std::move(found->second);
  pending_sends_.erase(found);
  wait();
}

at::Tensor PipelineRuntime::receive(Collective& group, const Boundary& boundary, int from_stage, int tag) {
  at::Tensor wire = at::empty(boundary.shape, at::TensorOptions().dtype(boundary.dtype).device(group.device()));
  group.recv_start_(wire, rank_of(from_stage), tag)();
  return wire.to(device_);
}

void PipelineRuntime::send_activation(int stage, int micro_batch, const at::Tensor& output) {
  Boundary& boundary = sent_[stage];
  if (!boundary.agreed) {
    LF_CHECK(output.dim() <= 8, ValueError, "Pipeline stage ", stage, "'s output has ", output.dim(), " dimensions; "
             "the pipeline carries tensors of at most 8 between stages. Reshape the output before the stage ends.");
    boundary = {true, output.sizes().vec(), output.scalar_type()};
    at::Tensor shape = at::full({10}, -1, at::kLong);
    shape[0] = output.dim();
    shape[1] = static_cast<int64_t>(output.scalar_type());
    for (int64_t d = 0; d < output.dim(); ++d) shape[2 + d] = output.size(d);
    send(pipe(), shape, stage + 1, shape_tag(stage), {stage, micro_batch, 2});
  }
  LF_CHECK(output.sizes().vec() == boundary.shape && output.scalar_type() == boundary.dtype, ValueError,
           "Pipeline stage ", stage, " (global rank ", global_rank_, ") outputs ",
           describe(output.sizes(), output.scalar_type()), " for micro-batch ", micro_batch, ", but the stages agreed on ",
           describe(boundary.shape, boundary.dtype), " at the first step. Every step must pass the same shape between "
           "stages: give every batch the same size (drop_last=true) and every sequence the same length.");
  send(pipe(), output, stage + 1, activation_tag(stage), {stage, micro_batch, 0});
}

at::Tensor PipelineRuntime::receive_activation(int stage) {
  Boundary& boundary = received_[stage - 1];
  if (!boundary.agreed) {
    Boundary shape_of_shape{true, {10}, at::kLong};
    at::Tensor shape = receive(pipe(), shape_of_shape, stage - 1, shape_tag(stage - 1)).cpu();
    const int64_t dims = shape[0].item<int64_t>();
    boundary.shape.clear();
    for (int64_t d = 0; d < dims; ++d) boundary.shape.push_back(shape[2 + d].item<int64_t>());
    boundary.dtype = static_cast<at::ScalarType>(shape[1].item<int64_t>());
    boundary.agreed = true;
  }
  return receive(pipe(), boundary, stage - 1, activation_tag(stage - 1));
}

at::Tensor PipelineRuntime::run(PipelineImpl& pipeline, const at::Tensor& input, const at::Tensor& target) {
  LF_CHECK(failure_.empty(), RuntimeError, "lf::Pipeline forward: an earlier step of this pipeline failed (", failure_,
           "), which left its stages out of step with each other. Start the job again, from a checkpoint.");
  communicating_ = false;
  try {
    return run_step(pipeline, input, target);
  } catch (const std::exception& error) {
    if (communicating_) failure_ = reason_of(error);  // a refusal before any send leaves the stages in step
    throw;
  }
}

at::Tensor PipelineRuntime::run_step(PipelineImpl& pipeline, const at::Tensor& input, const at::Tensor& target) {
  const int m = options_.micro_batches;
  LF_CHECK(input.dim() >= 1 && input.size(0) % m == 0, ValueError, "lf::Pipeline forward: a batch of ",
           input.dim() >= 1 ? input.size(0) : 0, " samples cannot be split into micro_batches=", m, " equal "
           "micro-batches. Choose a batch size that is a multiple of ", m, " (drop_last=true keeps every batch whole), "
           "or set PipelineOptions::micro_batches to a divisor of the batch size.");
  LF_CHECK(target.dim() >= 1 && target.size(0) == input.size(0), ValueError, "lf::Pipeline forward: the target has ",
           target.dim() >= 1 ? target.size(0) : 0, " samples along dimension 0 but the input has ", input.size(0),
           ". Give one target per input sample.");
  // Every rank checks the micro-batch's shape against the first step's before anything is sent,
  // so a changed batch size or sequence length fails on all ranks alike, none left waiting.
  std::vector<int64_t> micro_shape = input.sizes().vec();
  micro_shape[0] /= m;
  if (micro_batch_shape_.empty()) micro_batch_shape_ = micro_shape;
  LF_CHECK(micro_shape == micro_batch_shape_, ValueError, "lf::Pipeline forward: this batch ", input.sizes(),
           " makes micro-batches of shape ", bracketed(micro_shape), ", but the first step's were ",
           bracketed(micro_batch_shape_), ", and the shapes crossing between stages were agreed on then. Give every "
           "batch the same size (drop_last=true) and every sequence the same length.");
  const bool training = torch::GradMode::is_enabled();
  const int S = stages();
  const std::vector<int64_t> starts = pipeline.stage_starts(S);
  const auto stage_end = [&](int s) { return s + 1 < S ? starts[static_cast<size_t>(s) + 1] : pipeline.size(); };
  std::vector<PipelineAction> actions;
  if (training) {
    actions = pipeline_actions(options_.schedule, pipe_size(), pipe_rank(), options_.stages_per_rank, m);
  } else {
    for (int chunk = 0; chunk < options_.stages_per_rank; ++chunk) {
      for (int i = 0; i < m; ++i) actions.push_back({PipelineAction::Kind::Forward, chunk * pipe_size() + pipe_rank(), i});
    }
  }
  // The parameters each local stage trains, and the step's gradient of each.
  std::map<int, std::vector<at::Tensor>> parameters;
  std::vector<at::Tensor> trained;
  std::map<const c10::TensorImpl*, size_t> index;
  for (int s = pipe_rank(); s < S; s += pipe_size()) {
    for (int64_t l = starts[static_cast<size_t>(s)]; l < stage_end(s); ++l) {
      for (const auto& p : pipeline.layers_[static_cast<size_t>(l)].second.ptr()->parameters()) {
        if (!p.requires_grad() || index.count(p.unsafeGetTensorImpl())) continue;
        index[p.unsafeGetTensorImpl()] = trained.size();
        trained.push_back(p);
        parameters[s].push_back(p);
      }
    }
  }
  std::vector<at::Tensor> step_gradients(trained.size());

  const std::vector<at::Tensor> inputs = input.chunk(m), targets = target.chunk(m);
  std::map<std::pair<int, int>, InFlight> in_flight;                 // (stage, micro-batch)
  std::map<std::pair<int, int>, at::Tensor> handed_on, handed_back;  // between two stages of this rank
  std::vector<at::Tensor> losses(static_cast<size_t>(m));
  double forward_seconds = 0.0, backward_seconds = 0.0;
  int peak = 0;
  pending_sends_.clear();
  communicating_ = true;
  const auto start = std::chrono::steady_clock::now();
  for (const PipelineAction& action : actions) {
    const int s = action.stage, i = action.micro_batch;
    const bool forward = action.kind == PipelineAction::Kind::Forward;
    ProfiledRange range([&] {
      return std::string(forward ? "lf::pipeline forward" : "lf::pipeline backward") + " stage " + std::to_string(s) +
             " micro-batch " + std::to_string(i);
    });
    try {
      if (forward) {
        at::Tensor x;
        if (s == 0) {
          x = inputs[static_cast<size_t>(i)];
        } else if (is_local(s - 1)) {
          x = handed_on.at({s, i});
          handed_on.erase({s, i});
        } else {
          x = receive_activation(s);
        }
        if (training && s > 0 && x.is_floating_point()) x = x.detach().requires_grad_(true);
        InFlight& slot = in_flight[{s, i}];
        peak = std::max(peak, static_cast<int>(in_flight.size()));
        const auto computing = std::chrono::steady_clock::now();
        at::Tensor y = pipeline.run_layers(starts[static_cast<size_t>(s)], stage_end(s), x);
        at::Tensor loss = s == S - 1 ? pipeline.loss_(y, targets[static_cast<size_t>(i)]) : at::Tensor();
        forward_seconds += seconds_since(computing);
        if (s == S - 1) {
          LF_CHECK(loss.numel() == 1, ValueError, where(s, "failed in the forward of", i),
                   ": lf::Pipeline: the loss function returned shape ", loss.sizes(),
                   "; it must return one value (a mean over the micro-batch).");
          losses[static_cast<size_t>(i)] = loss.detach().reshape({});
          if (training) slot.loss = loss.reshape({});
        } else if (is_local(s + 1)) {
          handed_on[{s + 1, i}] = y.detach();
        } else {
          send_activation(s, i, y);
        }
        if (training) {
          slot.input = x;
          slot.output = y;
        } else {
          in_flight.erase({s, i});
        }
      } else {
        InFlight slot = std::move(in_flight.at({s, i}));
        in_flight.erase({s, i});
        at::Tensor root, seed;
        if (s == S - 1) {
          root = slot.loss;
          seed = at::full({}, 1.0 / m, root.options());  // the step's loss is the micro-batches' mean
        } else {
          root = slot.output;
          if (is_local(s + 1)) {
            seed = handed_back.at({s, i});
            handed_back.erase({s, i});
          } else {
            seed = receive(*backward_, {true, root.sizes().vec(), root.scalar_type()}, s + 1, gradient_tag(s));
            finish_send({s, i, 0});  // the next stage had the activation: its gradient depends on it
          }
        }
        std::vector<at::Tensor> wrt;
        const bool input_grad = slot.input.requires_grad();
        if (input_grad) wrt.push_back(slot.input);
        const auto& own = parameters[s];
        wrt.insert(wrt.end(), own.begin(), own.end());
        std::vector<at::Tensor> grads;
        const auto computing = std::chrono::steady_clock::now();
        {
          // Backward formulas run as written, never autocast (as PyTorch advises).
          c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
          grads = torch::autograd::grad({root}, wrt, {seed}, /*retain_graph=*/false, /*create_graph=*/false,
                                        /*allow_unused=*/true);
        }
        for (size_t k = input_grad ? 1 : 0; k < grads.size(); ++k) {
          if (!grads[k].defined()) continue;
          at::Tensor& sum = step_gradients[index.at(wrt[k].unsafeGetTensorImpl())];
          if (sum.defined()) sum.add_(grads[k]);
          else sum = grads[k].clone();  // autograd's result may alias another (the input's gradient)
        }
        backward_seconds += seconds_since(computing);
        if (s > 0) {
          at::Tensor back = input_grad && grads[0].defined() ? grads[0] : at::zeros_like(slot.input);
          if (is_local(s - 1)) handed_back[{s - 1, i}] = back;
          else send(*backward_, back, s - 1, gradient_tag(s - 1), {s, i, 1});
        }
      }
    } catch (const Error&) {
      throw;  // the library's own errors name the stage already
    } catch (const std::exception& error) {
      throw RuntimeError(where(s, forward ? "failed in the forward of" : "failed in the backward of", i) + ": " +
                         reason_of(error));
    }
  }
  std::string send_failure;  // every send is waited for (its flight record ended), the first failure kept
  for (auto& [key, wait] : pending_sends_) {
    try {
      wait();
    } catch (const std::exception& error) {
      if (send_failure.empty()) send_failure = reason_of(error);
    }
  }
  pending_sends_.clear();
  LF_CHECK(send_failure.empty(), RuntimeError, "pipeline (global rank ", global_rank_, ", pipe rank ", pipe_rank(),
           ") could not send to a neighbouring stage: ", send_failure);
  const double step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The mean loss, from the last stage's rank to every rank of the pipe group.
  at::Tensor loss = is_local(S - 1) ? at::stack(losses).mean().to(at::kFloat).to(pipe().device())
                                    : at::empty({}, at::TensorOptions().dtype(at::kFloat).device(pipe().device()));
  if (pipe_size() > 1) pipe().broadcast_(loss, rank_of(S - 1));
  loss = loss.to(device_);
  if (training) {
    *stats_ = {step, forward_seconds + backward_seconds, forward_seconds, backward_seconds, peak};
    if (!trained.empty()) {
      auto node = std::shared_ptr<ScheduleGradients>(new ScheduleGradients(), torch::autograd::deleteNode);
      torch::autograd::edge_list edges;
      for (const auto& p : trained) edges.push_back(torch::autograd::impl::gradient_edge(p));
      node->set_next_edges(std::move(edges));
      node->gradients = std::move(step_gradients);
      torch::autograd::set_history(loss, node);
    }
  }
  return loss;
}

at::Tensor PipelineImpl::forward(const at::Tensor& input, const at::Tensor& target) {
  if (runtime_ != nullptr) return runtime_->run(*this, input, target);
  return loss_(run_layers(0, size(), input), target);
}

// ---- what both strategies share ----

namespace {
// (pipe, data) sizes for this world size: pipe x data x tensor must make it.
std::pair<int, int> pipeline_shape(const PipelineOptions& options, int world_size) {
  const int tensor = options.tensor_parallel_size;
  int pipe = options.pipeline_size.value_or(0), data = options.data_parallel_size.value_or(0);
  const int stage_ranks = world_size % tensor == 0 ? world_size / tensor : -1;
  if (pipe == 0 && data == 0) pipe = stage_ranks, data = 1;
  if (pipe == 0) pipe = data > 0 && stage_ranks % data == 0 ? stage_ranks / data : -1;
  if (data == 0) data = pipe > 0 && stage_ranks % pipe == 0 ? stage_ranks / pipe : -1;
  LF_CHECK(pipe > 0 && data > 0 && static_cast<int64_t>(pipe) * data * tensor == world_size, ValueError,
           "PipelineOptions: pipeline_size=", options.pipeline_size ? std::to_string(*options.pipeline_size) : std::string("unset"),
           ", data_parallel_size=", options.data_parallel_size ? std::to_string(*options.data_parallel_size) : std::string("unset"),
           " and tensor_parallel_size=", tensor, " do not make the world size ", world_size, " (pipe x data x tensor "
           "must equal it). Set sizes whose product is ", world_size, ", or launch pipe x data x tensor processes.");
  return {pipe, data};
}

// The checks of what fsdp cannot do inside a pipeline.
const PipelineOptions& fully_sharded_checked(const PipelineOptions& options) {
  LF_CHECK(options.fully_sharded.sharding_strategy != ShardingStrategy::HybridShard, ValueError,
           "PipelineOptions: fully_sharded.sharding_strategy=HYBRID_SHARD needs a replica dimension the pipeline's "
           "mesh does not have. Choose FULL_SHARD, SHARD_GRAD_OP or NO_SHARD (sharded over the stage's data group).");
  LF_CHECK(options.fully_sharded.auto_wrap_min_params == 0 && options.fully_sharded.auto_wrap.empty(), ValueError,
           "PipelineOptions: fully_sharded.auto_wrap (or auto_wrap_min_params) makes sharding units inside a stage, "
           "which every micro-batch's forward and backward would gather again. Each stage is one unit under the "
           "pipeline: leave auto_wrap unset.");
  LF_CHECK(options.fully_sharded.state_dict_type == "sharded", ValueError, "PipelineOptions: "
           "fully_sharded.state_dict_type=\"", options.fully_sharded.state_dict_type, "\": the pipeline saves a "
           "folder, each stage's ranks their parts. Leave it \"sharded\" and run `lightning-run model consolidate "
           "DIR` for one file.");
  return options;
}
}  // namespace

PipelineOptions::PipelineOptions() {
  data_parallel.name = "pipeline";
  parallelize = [](const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<DeviceMesh>& mesh) {
    tensor_parallel::shard_tensor_parallel_layers(*module, mesh);
  };
}

StrategySpec pipeline_strategy(PipelineOptions options) {
  for (const auto& [name, size] : {std::pair{"pipeline_size", options.pipeline_size},
                                   std::pair{"data_parallel_size", options.data_parallel_size}}) {
    LF_CHECK(!size || *size > 0, ValueError, "PipelineOptions: ", name, "=", size.value_or(0),
             " must be positive, or unset.");
  }
  LF_CHECK(options.tensor_parallel_size > 0, ValueError, "PipelineOptions: tensor_parallel_size=",
           options.tensor_parallel_size, " must be positive (1: no tensor parallelism).");
  LF_CHECK(options.parallelize != nullptr, ValueError, "PipelineOptions: parallelize is empty. Give the function that "
           "applies tensor parallelism to the stages, or keep the default (shard every tensor-parallel layer).");
  LF_CHECK(options.micro_batches > 0, ValueError, "PipelineOptions: micro_batches=", options.micro_batches,
           " must be positive (torch's n_microbatches; 4 to 8 per stage keeps the bubble small).");
  check_pipeline_schedule("PipelineOptions", options.schedule, options.pipeline_size.value_or(1), options.stages_per_rank,
                          options.micro_batches);
  LF_CHECK(options.data_parallel_strategy == "ddp" || options.data_parallel_strategy == "fsdp", ValueError,
           "PipelineOptions: data_parallel_strategy=\"", options.data_parallel_strategy, "\" is not valid. Choose "
           "\"ddp\" (each stage's data replicas hold it whole) or \"fsdp\" (each stage sharded over its data group).");
  if (options.data_parallel_strategy == "ddp") {
    ddp_strategy(options.data_parallel);  // checks the ddp settings
  } else {
    fully_sharded_checked(options);
    fsdp_strategy(options.fully_sharded);  // checks the fsdp settings
  }
  return StrategySpec{options.data_parallel.name, [options](StrategyContext context) -> std::shared_ptr<Strategy> {
                        return std::make_shared<ComposedStrategy>(std::move(context), options);
                      }};
}

PipelinePlan::PipelinePlan(PipelineOptions options)
    : options_(std::move(options)), last_step_(std::make_shared<PipelineStepStats>()) {}

std::pair<int, int> PipelinePlan::shape(int world_size) const { return pipeline_shape(options_, world_size); }

void PipelinePlan::form(std::shared_ptr<DeviceMesh> mesh) {
  if (formed()) return;
  const int pipe = mesh->size("pipe");
  check_pipeline_schedule("PipelineOptions", options_.schedule, pipe, options_.stages_per_rank, options_.micro_batches);
  mesh_ = std::move(mesh);
  // Gradients travel on a twin of the pipe group: under 1F1B activations and gradients cross
  // between two ranks at once, and each direction then has a connection of its own.
  Collective& pipe_group = mesh_->group("pipe");
  std::vector<int> pipe_ranks(static_cast<size_t>(pipe));
  std::iota(pipe_ranks.begin(), pipe_ranks.end(), 0);
  gradient_group_ = std::make_shared<Collective>(pipe_group, pipe_group.next_group_name("gradients"), pipe_ranks);
  // Point-to-point connections to the neighbouring stages' ranks, made now in one global order.
  std::set<int> peers;
  if (pipe > 1) {
    const int r = pipe_rank();
    if (r > 0 || options_.stages_per_rank > 1) peers.insert((r + pipe - 1) % pipe);
    if (r < pipe - 1 || options_.stages_per_rank > 1) peers.insert((r + 1) % pipe);
  }
  pipe_group.connect_point_to_point(std::vector<int>(peers.begin(), peers.end()));
  gradient_group_->connect_point_to_point(std::vector<int>(peers.begin(), peers.end()));
}

const std::shared_ptr<DeviceMesh>& PipelinePlan::mesh() const {
  LF_CHECK(formed(), RuntimeError, "The pipeline strategy's mesh forms in setup_environment (fabric.launch() or the "
           "first fabric.setup); call it after.");
  return mesh_;
}

Collective& PipelinePlan::pipe_group() const {
  return mesh()->group("pipe");
}

Collective& PipelinePlan::stage_group() const {
  return mesh()->group("stage");
}

int PipelinePlan::pipe_size() const {
  return mesh()->size("pipe");
}

int PipelinePlan::pipe_rank() const {
  return mesh()->coordinate("pipe");
}

std::vector<int> PipelinePlan::local_stages() const {
  std::vector<int> stages;
  for (int chunk = 0; chunk < options_.stages_per_rank; ++chunk) stages.push_back(chunk * pipe_size() + pipe_rank());
  return stages;
}

PipelineImpl& PipelinePlan::as_pipeline(torch::nn::Module& module) {
  auto* pipeline = dynamic_cast<PipelineImpl*>(&module);
  LF_CHECK(pipeline != nullptr, ValueError, "The pipeline strategy sets up an lf::Pipeline (the model's layers in a "
           "Sequential and its loss), but got a ", module.name(), ". Wrap the model: "
           "fabric.setup(lf::Pipeline(layers, loss), optimizer) (docs/pipeline-parallel.md).");
  return *pipeline;
}

void PipelinePlan::keep_local_stages(PipelineImpl& pipeline) const {
  const int stages = pipe_size() * options_.stages_per_rank;
  const std::vector<int64_t> starts = pipeline.stage_starts(stages);  // ValueError when it cannot split
  const auto end_of = [&](int s) { return s + 1 < stages ? starts[static_cast<size_t>(s) + 1] : pipeline.size(); };
  const bool whole = std::none_of(pipeline.layers_.begin(), pipeline.layers_.end(),
                                  [](const auto& layer) { return layer.second.is_empty(); });
  if (whole) {  // before any layer was dropped: check the split once
    // parameter -> the stage and name of the first layer holding it
    std::map<const c10::TensorImpl*, std::pair<int, std::string>> owner;
    for (int s = 0; s < stages; ++s) {
      bool trains = false;
      for (int64_t l = starts[static_cast<size_t>(s)]; l < end_of(s); ++l) {
        const auto& [name, layer] = pipeline.layers_[static_cast<size_t>(l)];
        for (const auto& item : layer.ptr()->named_parameters()) {
          trains = trains || item.value().requires_grad();
          const std::string here = name + "." + item.key();
          auto [found, first] = owner.emplace(item.value().unsafeGetTensorImpl(), std::pair{s, here});
          LF_CHECK(first || found->second.first == s, ValueError, "lf::Pipeline: parameter ", here, " (stage ", s,
                   ") is also ", found->second.second, " (stage ", found->second.first, "): a tied weight, which "
                   "the split puts in two stages, so they would train separate copies. Keep tied layers in one stage "
                   "(stage_starts), or untie them.");
        }
      }
      LF_CHECK(trains, ValueError, "lf::Pipeline: stage ", s, " (layers ", starts[static_cast<size_t>(s)], " to ",
               end_of(s) - 1, ") has no parameter to train, so its ranks would have no gradients to take part in "
               "backward with. Move a trained layer into it (stage_starts), or run fewer stages.");
    }
  }
  std::vector<bool> keep(static_cast<size_t>(pipeline.size()), false);
  for (int s : local_stages()) {
    for (int64_t l = starts[static_cast<size_t>(s)]; l < end_of(s); ++l) keep[static_cast<size_t>(l)] = true;
  }
  for (size_t l = 0; l < keep.size(); ++l) {
    auto& [name, layer] = pipeline.layers_[l];
    if (keep[l] || layer.is_empty()) continue;
    pipeline.unregister_module(name);
    layer = torch::nn::AnyModule();  // other ranks' layers: their memory is freed here
  }
}

void PipelinePlan::attach(PipelineImpl& pipeline, int global_rank, at::Device device) {
  for (const auto& parameter : pipeline.parameters()) local_parameters_.insert(parameter.unsafeGetTensorImpl());
  pipeline.runtime_ =
      std::make_shared<PipelineRuntime>(options_, mesh_, gradient_group_, global_rank, device, last_step_);
}

int64_t PipelinePlan::layer_position(const State& state, const std::string& name) {
  const std::string layer = name.substr(0, name.find('.'));
  for (const auto& named : state) {
    const auto* pipeline = dynamic_cast<const PipelineImpl*>(named.second.module());
    if (pipeline == nullptr) continue;
    for (size_t l = 0; l < pipeline->layers_.size(); ++l) {
      if (pipeline->layers_[l].first == layer) return static_cast<int64_t>(l);
    }
  }
  return std::numeric_limits<int64_t>::max();
}

void PipelinePlan::keep_local_parameters(torch::optim::Optimizer& optimizer) const {
  for (auto& group : optimizer.param_groups()) {
    auto& params = group.params();
    params.erase(std::remove_if(params.begin(), params.end(),
                                [&](const at::Tensor& p) { return local_parameters_.count(p.unsafeGetTensorImpl()) == 0; }),
                 params.end());
  }
}

void PipelinePlan::check_precision(const Precision& precision) {
  LF_CHECK(precision.loss_scaler() == nullptr, ValueError, "The pipeline strategy cannot use a precision with a "
           "loss scaler (16-mixed): an overflow found on one stage would have to skip the step on every stage. "
           "Choose precision \"bf16-mixed\", \"bf16-true\" or \"32-true\".");
}

void PipelinePlan::check_layers(const PipelineImpl& pipeline, Collective& world, bool refuse_fsdp_units) {
  // This rank holds only its stages' layers by now, so what it finds is shared with every rank (one
  // small all-reduce): all refuse alike, and none goes on into a collective the others never join.
  std::string checkpointed, unit;
  for (const auto& [name, layer] : pipeline.layers_) {
    if (layer.is_empty()) continue;
    for (const auto& module : layer.ptr()->modules(/*include_self=*/true)) {
      if (checkpointed.empty() && is_checkpointed(*module)) checkpointed = name;
      if (unit.empty() && refuse_fsdp_units && dynamic_cast<const FSDPUnitImpl*>(module.get()) != nullptr) unit = name;
    }
  }
  at::Tensor found = at::tensor({static_cast<int64_t>(!checkpointed.empty()), static_cast<int64_t>(!unit.empty())},
                                at::kLong).to(world.device());
  world.all_reduce_(found, ReduceOp::Max);
  found = found.cpu();
  const auto which = [](const std::string& local) {
    return local.empty() ? std::string("a layer of another stage") : "layer " + local;
  };
  LF_CHECK(found[0].item<int64_t>() == 0, ValueError, "The pipeline strategy runs an lf::Pipeline's layers itself, so "
           "activation checkpointing (SetupOptions::activation_checkpointing or the strategy's policy) does not "
           "reach them; ", which(checkpointed), " holds a checkpointed module. Set the model up without an "
           "activation-checkpointing policy.");
  LF_CHECK(found[1].item<int64_t>() == 0, ValueError, "The pipeline strategy with fsdp on the data dimension makes each "
           "stage one sharding unit, but the lf::Pipeline holds an lf::FSDPUnit (", which(unit), "), which every "
           "micro-batch's forward and backward would gather again. Use its plain layers.");
}

void PipelinePlan::check_backward(const BackwardOptions& options) {
  LF_CHECK(!options.create_graph, ValueError, "fabric.backward(loss, BackwardOptions().higher_order()): the pipeline "
           "strategy computes each micro-batch's gradients inside the schedule, so there is no graph of them to "
           "differentiate again. Run gradient penalties under ddp or fsdp.");
  LF_CHECK(options.inputs.empty(), ValueError, "fabric.backward(loss, BackwardOptions().only(...)): the pipeline "
           "strategy hands a step's gradients to all of this rank's parameters at once. Freeze the parameters you do "
           "not want trained (requires_grad false) instead.");
}

}  // namespace lightning::fabric
