// Background saves (fabric.save_in_background) checked from inside a 2-rank job; background_save.sh
// runs the modes. STRATEGY: ddp (rank 0 writes one file), fsdp (a sharded torch.distributed.checkpoint
// folder) or fsdp-full (gathered, one file). The model is a stack of square Linear layers + Adam.
//   background_save_checks same STRATEGY DIR        the same state saved by fabric.save to DIR/sync
//                                                  and in the background to DIR/background (the
//                                                  script compares the files byte for byte)
//   background_save_checks continues STRATEGY DIR   training steps run while the save is written;
//                                                  the checkpoint holds the state of the save call;
//                                                  the next save and fabric.load wait for it; one
//                                                  left in flight (DIR/at-exit) completes at exit
//   background_save_checks hang STRATEGY DIR        saves DIR/ck (step 1), then again in the
//                                                  background (step 2), prints "background save
//                                                  started" and trains until killed
//   background_save_checks check STRATEGY DIR       loads DIR/ck: it is step 1 or step 2, whole
//   background_save_checks refused STRATEGY DIR CAUSE WHEN   a background save to DIR/ck that cannot
//                                                  be written: every rank raises the same error at
//                                                  the same call, naming the path and CAUSE; nothing
//                                                  is left in DIR. WHEN "later": not raised by the
//                                                  save_in_background call itself (a write failure)
//   background_save_checks bench STRATEGY DIR MB REPEATS   the time the training loop is blocked per
//                                                  save, fabric.save against save_in_background, on
//                                                  a model of MB megabytes (benchmark P9)
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "expect.h"
#include "lightning/fabric.h"

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using checks::expect;

namespace {

lf::Fabric make_fabric(const std::string& strategy) {
  if (strategy == "ddp") return lf::Fabric(lf::FabricOptions().accelerator("cpu").strategy("ddp"));
  lf::FSDPOptions options;
  options.state_dict_type = strategy == "fsdp-full" ? "full" : "sharded";
  return lf::Fabric(lf::FabricOptions().accelerator("cpu").strategy(lf::fsdp_strategy(options)));
}

// A buffer of `bytes` that the forward passes by: a large checkpoint with a cheap step.
struct BallastImpl : torch::nn::Module {
  explicit BallastImpl(int64_t bytes) { register_buffer("ballast", torch::rand({bytes / 4})); }
  at::Tensor forward(const at::Tensor& x) { return x; }
};
TORCH_MODULE(Ballast);

torch::nn::Sequential stack(int64_t width, int layers, uint64_t seed, int64_t ballast_bytes) {
  torch::manual_seed(seed);
  torch::nn::Sequential net;
  for (int i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::Tanh());
  }
  if (ballast_bytes > 0) net->push_back(Ballast(ballast_bytes));
  return net;
}

// A set-up model and optimizer, stepped on one fixed batch.
class Job {
 public:
  Job(lf::Fabric& fabric, int64_t width, int layers, uint64_t seed, int64_t ballast_bytes = 0)
      : fabric_(fabric), width_(width), net_(stack(width, layers, seed, ballast_bytes)), adam_(net_->parameters(), 1e-3) {
    auto [model, optimizer] = fabric.setup(net_, adam_);
    model_.emplace(std::move(model));
    optimizer_.emplace(std::move(optimizer));
  }
  void step() {
    optimizer_->zero_grad();
    fabric_.backward(torch::mse_loss((*model_)(batch()), torch::zeros({4, width_})));
    optimizer_->step();
  }
  // The loss on the batch, without a step: equal bitwise for equal weights.
  double loss() {
    torch::NoGradGuard no_grad;
    return torch::mse_loss((*model_)(batch()), torch::zeros({4, width_})).item<double>();
  }
  lf::State state(int64_t step) { return {{"model", net_}, {"optimizer", adam_}, {"step", step}}; }
  // Adam's state on this rank (its shards under fsdp), summed: equal for equal state.
  double optimizer_fingerprint() const {
    double sum = 0;
    int64_t found_states = 0;
    for (const auto& group : adam_.param_groups()) {  // the optimizer's own parameters (shards under fsdp)
      for (const auto& parameter : group.params()) {
        auto found = adam_.state().find(parameter.unsafeGetTensorImpl());
        if (found == adam_.state().end()) continue;
        const auto& adam_state = static_cast<const torch::optim::AdamParamState&>(*found->second);
        sum += adam_state.exp_avg().sum().item<double>() + adam_state.exp_avg_sq().sum().item<double>() +
               static_cast<double>(adam_state.step());
        ++found_states;
      }
    }
    expect(found_states > 0, "Adam has state to compare");
    return sum;
  }

 private:
  at::Tensor batch() const { return torch::linspace(-1, 1, 4 * width_).reshape({4, width_}); }
  lf::Fabric& fabric_;
  int64_t width_;
  torch::nn::Sequential net_;
  torch::optim::Adam adam_;
  std::optional<lf::FabricModule<torch::nn::SequentialImpl>> model_;
  std::optional<lf::FabricOptimizer> optimizer_;
};

// Where the checkpoints of `same`, `hang` and `check` go: LF_CHECKPOINT_ROOT (e.g. an s3:// prefix)
// when set, else DIR (the loss files stay in DIR).
fs::path checkpoints(const fs::path& dir) {
  const char* root = std::getenv("LF_CHECKPOINT_ROOT");
  return root && *root ? fs::path(root) : dir;
}
// The width of the model `hang` and `check` train (HANG_WIDTH, default 2048: 8 layers, 128 MB).
int64_t hang_width() {
  const char* width = std::getenv("HANG_WIDTH");
  return width && *width ? std::stoll(width) : 2048;
}

std::string exact(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

int same(const std::string& strategy, const fs::path& dir) {
  auto fabric = make_fabric(strategy);
  Job job(fabric, 256, 3, 1);
  job.step();
  job.step();
  const fs::path root = checkpoints(dir);
  fabric.save(root / "sync", job.state(2));
  fabric.save_in_background(root / "background", job.state(2));
  fabric.wait_for_background_save();
  expect(root != dir || fs::exists(dir / "background"), "the background save is complete after wait_for_background_save");
  return 0;
}

int continues(const std::string& strategy, const fs::path& dir) {
  auto fabric = make_fabric(strategy);
  Job job(fabric, 256, 3, 1, int64_t{256} << 20);  // a cheap step, a checkpoint of 256 MB
  job.step();
  const double saved_loss = job.loss(), saved_optimizer = job.optimizer_fingerprint();
  fabric.save_in_background(dir / "ck", job.state(1));
  // Every rank leaves the loop at the same step (rank 0's view decides): a single file appears
  // when rank 0's thread renames it, at any moment.
  auto saved = [&] { return fabric.broadcast(std::string(fs::exists(dir / "ck") ? "1" : "0"), 0) == "1"; };
  int steps_while_writing = 0;
  for (int step = 0; step < 500 && !saved(); ++step) {
    job.step();
    if (!fs::exists(dir / "ck")) ++steps_while_writing;
  }
  fabric.wait_for_background_save();
  std::cout << "rank " << fabric.global_rank() << ": " << steps_while_writing
            << " training steps ran while the checkpoint was written" << std::endl;
  expect(steps_while_writing >= 1, "training steps run while the background save writes");
  expect(job.loss() != saved_loss, "training changed the weights after the save call");
  expect(job.optimizer_fingerprint() != saved_optimizer, "training changed Adam's state after the save call");

  // The next save waits for the one in flight; so does fabric.load.
  fabric.save_in_background(dir / "second", job.state(2));
  fabric.save(dir / "third", job.state(3));
  expect(fs::exists(dir / "second"), "fabric.save completes the background save in flight first");
  fabric.save_in_background(dir / "fourth", job.state(4));
  Job fresh(fabric, 256, 3, 99, int64_t{256} << 20);
  lf::State state = fresh.state(0);
  fabric.load(dir / "ck", state);
  expect(state.at("step").to<int64_t>() == 1, "the plain values of the save call come back");
  expect(fresh.loss() == saved_loss, "the checkpoint holds the weights of the save call, not later ones (loss " +
                                         exact(fresh.loss()) + " against " + exact(saved_loss) + ")");
  expect(fresh.optimizer_fingerprint() == saved_optimizer, "the checkpoint holds Adam's state of the save call");
  lf::State fourth = fresh.state(0);
  fabric.load(dir / "fourth", fourth);
  expect(fourth.at("step").to<int64_t>() == 4, "fabric.load of a folder still being written waits for it");
  // Left in flight at the end: the Fabric's destructor completes it (background_save.sh checks).
  fabric.save_in_background(dir / "at-exit", job.state(5));
  return 0;
}

int hang(const std::string& strategy, const fs::path& dir) {
  auto fabric = make_fabric(strategy);
  Job job(fabric, hang_width(), 8, 1);
  auto record_loss = [&](int step) {  // a forward, so collective under fsdp
    const double loss = job.loss();
    if (fabric.is_global_zero()) std::ofstream(dir / ("loss-" + std::to_string(step) + ".txt")) << exact(loss) << "\n";
  };
  job.step();
  record_loss(1);
  fabric.save(checkpoints(dir) / "ck", job.state(1));
  job.step();
  record_loss(2);
  fabric.save_in_background(checkpoints(dir) / "ck", job.state(2));
  std::cout << "background save started" << std::endl;
  for (;;) {
    job.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int check(const std::string& strategy, const fs::path& dir) {
  auto fabric = make_fabric(strategy);
  Job job(fabric, hang_width(), 8, 99);
  lf::State state = job.state(0);
  fabric.load(checkpoints(dir) / "ck", state);
  const int64_t step = state.at("step").to<int64_t>();
  std::ifstream in(dir / ("loss-" + std::to_string(step) + ".txt"));
  double expected = 0;
  in >> expected;
  expect((step == 1 || step == 2) && in.good(), "the checkpoint is one of the two saves (step " + std::to_string(step) + ")");
  expect(job.loss() == expected, "the checkpoint of step " + std::to_string(step) + " is whole: loss " + exact(job.loss()) +
                                     " against " + exact(expected));
  if (fabric.is_global_zero()) std::cout << "intact step " << step << std::endl;
  return 0;
}

int refused(const std::string& strategy, const fs::path& dir, const std::string& cause, const std::string& when) {
  auto fabric = make_fabric(strategy);
  Job job(fabric, 1024, 8, 1);
  job.step();
  std::string error, where = "nowhere";
  try {
    where = "the save_in_background call";
    fabric.save_in_background(dir / "ck", job.state(1));
    where = "a training step";
    for (int step = 0; step < 3; ++step) job.step();
    where = "wait_for_background_save";
    fabric.wait_for_background_save();
    where = "nowhere";
  } catch (const lf::RuntimeError& raised) {
    error = raised.what();
  }
  std::cout << "rank " << fabric.global_rank() << " saw the error at " << where << ": " << error << std::endl;
  const std::string call = "fabric.save_in_background(" + (dir / "ck").string() + ") failed on rank ";
  expect(error.find(call) != std::string::npos, "the error names the call and the path: " + error);
  expect(error.find(cause) != std::string::npos, "the error gives the cause (" + cause + "): " + error);
  expect(when == "any" || where != "the save_in_background call",
         "the failure happened in the background write and was raised by a later call");
  // Every rank raised it at the same call, so the job goes on in step.
  const double agreed = fabric.all_reduce(static_cast<double>(where.size()), "max");
  expect(agreed == static_cast<double>(where.size()), "every rank raised the error at the same call");
  job.step();
  fabric.barrier();
  if (fabric.is_global_zero()) {
    for (const auto& left : fs::directory_iterator(dir)) expect(false, "nothing is left behind, found " + left.path().string());
  }
  return 0;
}

int bench(const std::string& strategy, const fs::path& dir, int megabytes, int repeats) {
  auto fabric = make_fabric(strategy);
  const int64_t width = 4096;  // 64 MiB of float32 weights per layer
  const int layers = std::max(1, megabytes / 64);
  Job job(fabric, width, layers, 1);
  job.step();  // Adam's state exists from here: the checkpoint is about three times the weights
  auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int repeat = 0; repeat < repeats; ++repeat) {
    fabric.barrier();
    auto start = std::chrono::steady_clock::now();
    fabric.save(dir / "sync", job.state(repeat));
    const double sync = fabric.all_reduce(seconds_since(start), "max");
    fabric.barrier();
    start = std::chrono::steady_clock::now();
    fabric.save_in_background(dir / "background", job.state(repeat));
    const double blocked = seconds_since(start);
    const double blocked_max = fabric.all_reduce(blocked, "max");  // (this all_reduce is not timed)
    start = std::chrono::steady_clock::now();
    fabric.wait_for_background_save();
    const double rest = fabric.all_reduce(seconds_since(start), "max");
    if (fabric.is_global_zero()) {
      std::cout << "P9 " << strategy << " " << layers * 64 << " MiB weights, repeat " << repeat + 1 << ": save "
                << sync << " s, save_in_background blocked " << blocked_max << " s (ratio " << blocked_max / sync
                << "), then complete after " << rest << " s more" << std::endl;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "same" && argc == 4) same(argv[2], argv[3]);
    else if (mode == "continues" && argc == 4) continues(argv[2], argv[3]);
    else if (mode == "hang" && argc == 4) hang(argv[2], argv[3]);
    else if (mode == "check" && argc == 4) check(argv[2], argv[3]);
    else if (mode == "refused" && argc == 6) refused(argv[2], argv[3], argv[4], argv[5]);
    else if (mode == "bench" && argc == 6) bench(argv[2], argv[3], std::stoi(argv[4]), std::stoi(argv[5]));
    else {
      std::cerr << "usage: background_save_checks same|continues|hang|check STRATEGY DIR | refused STRATEGY DIR CAUSE any|later | "
                   "bench STRATEGY DIR MB REPEATS" << std::endl;
      return 2;
    }
  } catch (const std::exception& error) {
    std::cout << "FAIL: " << error.what() << std::endl;
    return 1;
  }
  if (checks::failures() == 0) std::cout << "all background save checks passed" << std::endl;
  return checks::failures() == 0 ? 0 : 1;
}
