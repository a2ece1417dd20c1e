// Checkpoint files exercised from outside: the atomic-write test kills this writer mid-save, the
// Python test reads what it writes.
//   checkpoint_tool loop PATH MB      save forever: version N, a tensor of MB megabytes all equal
//                                     to N; prints "saved N" after each save
//   checkpoint_tool check PATH        load, verify the tensor is uniformly the version, print it
//   checkpoint_tool write PATH        a small model + Adam + values, for Python's torch.load
//   checkpoint_tool same PATH PATH KEY  exit 0 when both files hold bitwise-equal tensors under KEY
//   checkpoint_tool interop-save PATH AFTER   the interop MLP + Adam after 3 steps to PATH (model,
//                                     optimizer, step), then one more step; its weights to AFTER
//   checkpoint_tool interop-save-fused PATH AFTER   the same, stepped through fabric.setup's fused Adam
//   checkpoint_tool interop-load PATH AFTER   loads PATH (written by Python Fabric) into the interop
//                                     MLP + Adam, takes one step, compares with AFTER within 1e-6
// The interop MLP, batch and steps are mirrored by tests/integration/python_fabric_interop.py.
#include <torch/torch.h>

#include <iostream>

#include "lightning/fabric.h"

namespace lf = lightning::fabric;

namespace {
// Bitwise equality of checkpoint values: tensors, dicts and lists compared element by element.
bool same(const c10::IValue& a, const c10::IValue& b) {
  if (a.tagKind() != b.tagKind()) return false;
  if (a.isTensor()) return torch::equal(a.toTensor(), b.toTensor());
  if (a.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return false;
    for (const auto& item : x) {
      auto found = y.find(item.key());
      if (found == y.end() || !same(item.value(), found->value())) return false;
    }
    return true;
  }
  if (a.isList()) {
    const auto x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!same(x.get(i), y.get(i))) return false;
    }
    return true;
  }
  if (a.isDouble()) return a.toDouble() == b.toDouble();
  if (a.isInt()) return a.toInt() == b.toInt();
  if (a.isBool()) return a.toBool() == b.toBool();
  if (a.isString()) return a.toStringRef() == b.toStringRef();
  return a.isNone();
}

// The interop model: Sequential(Linear(4, 8), Tanh, Linear(8, 2)), Adam(lr=0.01), MSE on one
// fixed batch; the same in python_fabric_interop.py.
torch::nn::Sequential interop_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
}
void interop_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer) {
  const auto x = torch::linspace(-1, 1, 32).reshape({8, 4});
  const auto y = x.index({torch::indexing::Slice(), torch::indexing::Slice(0, 2)}) * 0.5 + 0.1;
  optimizer.zero_grad();
  torch::mse_loss(model->forward(x), y).backward();
  optimizer.step();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: checkpoint_tool loop PATH MB | check PATH | write PATH" << std::endl;
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
  try {
    if (mode == "loop") {
      const int64_t elements = std::stoll(argc > 3 ? argv[3] : "64") * 1024 * 1024 / 4;
      for (int64_t version = 1;; ++version) {
        fabric.save(path, {{"version", version}, {"payload", torch::full({elements}, static_cast<float>(version))}});
        std::cout << "saved " << version << std::endl;
      }
    }
    if (mode == "check") {
      auto checkpoint = fabric.load(path);
      const int64_t version = checkpoint.at("version").toInt();
      const auto payload = checkpoint.at("payload").toTensor();
      if (!payload.eq(static_cast<float>(version)).all().item<bool>()) {
        std::cout << "FAIL: payload does not match version " << version << std::endl;
        return 1;
      }
      std::cout << "intact version " << version << std::endl;
      return 0;
    }
    if (mode == "same" && argc == 5) {
      const bool equal = same(fabric.load(path).at(argv[4]), fabric.load(argv[3]).at(argv[4]));
      std::cout << (equal ? "same " : "FAIL: different ") << argv[4] << " in " << path << " and " << argv[3] << std::endl;
      return equal ? 0 : 1;
    }
    if (mode == "interop-save" && argc == 4) {
      auto model = interop_model();
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
      for (int step = 0; step < 3; ++step) interop_step(model, adam);
      fabric.save(path, {{"model", model}, {"optimizer", adam}, {"step", 3}});
      interop_step(model, adam);
      fabric.save(argv[3], {{"model", model}});
      std::cout << "saved after 3 steps, then stepped once more" << std::endl;
      return 0;
    }
    if (mode == "interop-save-fused" && argc == 4) {  // the same steps through Fabric's fused Adam kernel
      auto model = interop_model();
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
      auto setup = fabric.setup(model, adam);
      auto& fabric_model = std::get<0>(setup);
      auto& optimizer = std::get<1>(setup);
      if (!optimizer.fused()) {
        std::cout << "FAIL: Adam does not step through the fused kernel" << std::endl;
        return 1;
      }
      const auto x = torch::linspace(-1, 1, 32).reshape({8, 4});
      const auto y = x.index({torch::indexing::Slice(), torch::indexing::Slice(0, 2)}) * 0.5 + 0.1;
      auto step = [&] {
        optimizer.zero_grad();
        fabric.backward(torch::mse_loss(fabric_model(x), y));
        optimizer.step();
      };
      for (int i = 0; i < 3; ++i) step();
      fabric.save(path, {{"model", model}, {"optimizer", adam}, {"step", 3}});
      step();
      fabric.save(argv[3], {{"model", model}});
      std::cout << "saved after 3 fused steps, then stepped once more" << std::endl;
      return 0;
    }
    if (mode == "interop-load" && argc == 4) {
      auto model = interop_model();
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));  // lr comes from the file
      lf::State state{{"model", model}, {"optimizer", adam}};
      auto rest = fabric.load(path, state);
      const int64_t step = rest.at("step").toInt();
      interop_step(model, adam);
      const auto expected = fabric.load(argv[3]).at("model").toGenericDict();
      double worst = 0;
      for (const auto& item : model->named_parameters()) {
        const auto theirs = expected.at(item.key()).toTensor();
        worst = std::max(worst, (item.value() - theirs).abs().max().item<double>());
      }
      const bool ok = step == 3 && worst <= 1e-6;
      std::cout << (ok ? "" : "FAIL: ") << "loaded Python Fabric's step " << step << ", one more step differs by "
                << worst << " from Python's" << std::endl;
      return ok ? 0 : 1;
    }
    if (mode == "write") {
      torch::manual_seed(0);
      torch::nn::Linear model(3, 2);
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
      adam.zero_grad();
      model(torch::ones({4, 3})).sum().backward();
      adam.step();
      fabric.save(path, {{"model", model}, {"optimizer", adam}, {"step", 7}, {"name", std::string("demo")},
                         {"loss", 0.5}, {"nested", lf::State{{"epoch", 2}}}});
      std::cout << "weight_sum " << model->weight.sum().item<double>() << std::endl;
      return 0;
    }
  } catch (const std::exception& error) {
    std::cerr << "checkpoint_tool: " << error.what() << std::endl;
    return 1;
  }
  std::cerr << "checkpoint_tool: unknown mode " << mode << std::endl;
  return 2;
}
