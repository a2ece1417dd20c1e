// lf::StreamingDataset / StreamingWriter / StreamingDataLoader from outside, against Python's
// litdata (litdata_peer.py) and inside lightning-run jobs (litdata_interop.sh, streaming_resume.sh):
//   streaming_checks dump DIR               every item, one canonical line each (litdata_peer.py's form)
//   streaming_checks dump-when DIR FLAG     opens DIR, prints "opened N items", then dumps once FLAG exists
//   streaming_checks load PATH              fabric.load(PATH): the names of its entries
//   streaming_checks checkpoint PATH        fabric.save of a Linear(4, 3) and a step to PATH (a file or
//                                           s3:// URL), fabric.load into a zeroed one: equal
//   streaming_checks write mixed|ids|ids-zstd DIR    a dataset written by lf::StreamingWriter
//   streaming_checks order DIR CONFIG...    the batches the loader yields (litdata_peer.py order's lines)
//   streaming_checks train DIR LOG [--batch B] [--shuffle] [--workers W] [--epochs E]
//                          [--save-after K CKPT [--kill]] [--resume CKPT] [--roll-back-at K]
//       a Fabric job training a linear model (ddp) on the loader set up behind Fabric
//       (fabric.setup_dataloaders): each rank logs "epoch E: ids" per batch to LOG/rank-R.log, and
//       the loss (exact, hexadecimal) per batch and the final parameters to LOG/rank-R.loss;
//       --save-after saves model, optimizer and fabric.resume_state() after K batches of the first
//       epoch (then --kill: SIGKILL on rank 0); --roll-back-at K saves before the first batch with
//       the loader in the rollback State and rolls back after batch K (the loader reads on).
#include "lightning/fabric/data/streaming_dataset.h"
#include "lightning/fabric/data/streaming_loader.h"
#include "lightning/fabric/data/streaming_writer.h"
#include "lightning/fabric/fabric.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace lf = lightning::fabric;

namespace {

std::string hex(const void* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 15]);
  }
  return out;
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kUInt16: return "uint16";
    case at::kUInt32: return "uint32";
    case at::kUInt64: return "uint64";
    default: return c10::toString(type);
  }
}

std::string canonical(const c10::IValue& value) {
  if (value.isBool()) return std::string("b:") + (value.toBool() ? "1" : "0");
  if (value.isInt()) return "i:" + std::to_string(value.toInt());
  if (value.isDouble()) {
    const double d = value.toDouble();
    return "f:" + hex(&d, 8);
  }
  if (value.isNone()) return "n";
  if (value.isString()) return "s:" + hex(value.toStringRef().data(), value.toStringRef().size());
  if (value.isTensor()) {
    const at::Tensor t = value.toTensor().contiguous();
    std::string shape;
    for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? "," : "") + std::to_string(t.size(d));
    return "t:" + dtype_name(t.scalar_type()) + ":" + shape + ":" + hex(t.data_ptr(), t.numel() * t.element_size());
  }
  std::string out;
  if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) out += (out.empty() ? "" : ",") + canonical(e);
    return "(" + out + ")";
  }
  if (value.isList()) {
    for (const auto& e : value.toListRef()) out += (out.empty() ? "" : ",") + canonical(e);
    return "[" + out + "]";
  }
  if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict())
      out += (out.empty() ? "" : ",") + e.key().toStringRef() + "=" + canonical(e.value());
    return "{" + out + "}";
  }
  throw std::runtime_error("no canonical form for " + value.tagKind());
}

c10::IValue tuple(std::vector<c10::IValue> values) { return c10::ivalue::Tuple::create(std::move(values)); }

void write(const std::string& kind, const std::string& dir) {
  if (kind == "ids-zstd") {  // chunks of 300 items in zstd frames of 256
    lf::StreamingWriter writer(dir, lf::StreamingWriterOptions().chunk_size(300).compression("zstd"));
    for (int64_t i = 0; i < 700; ++i) writer.add(tuple({i, at::full({4}, static_cast<double>(i), at::kFloat)}));
    writer.finish();
    return;
  }
  if (kind == "ids") {
    lf::StreamingWriter writer(dir, lf::StreamingWriterOptions().chunk_size(17));
    for (int64_t i = 0; i < 203; ++i) writer.add(tuple({i, at::full({4}, static_cast<double>(i), at::kFloat)}));
    writer.finish();
    return;
  }
  // Every writable leaf format, nested in a tuple, a list and a dict.
  lf::StreamingWriter writer(dir, lf::StreamingWriterOptions().chunk_bytes(1500).formats(
      {"int", "float", "bool", "str", "bytes", "tensor", "no_header_tensor:16", "numpy", "no_header_numpy:1",
       "tensor", "jpeg", "pickle", "str", "int"}));
  for (int64_t i = 0; i < 19; ++i) {
    c10::impl::GenericDict nested(c10::StringType::get(), c10::AnyType::get());
    nested.insert("name", "n" + std::to_string(i));
    nested.insert("k", i * 7);
    c10::impl::GenericList list(c10::AnyType::get());
    list.push_back(tuple({nested}));
    const auto image = at::arange(3 * 8 * 8, at::kInt).remainder(251).add(i).remainder(256).to(at::kByte).reshape({3, 8, 8});
    writer.add(tuple({i, i * 0.5 - 3.25, i % 2 == 0, "item " + std::to_string(i) + ": \xc3\xa9\xe4\xb8\xad",
                      std::string("\x00\x01\xff", 3) + std::to_string(i), at::arange(6, at::kDouble).reshape({2, 3}) * i,
                      at::arange(i % 4 + 1, at::kInt), at::arange(4, at::kFloat).reshape({2, 2}) + i,
                      at::arange(3, at::kShort) + i, at::tensor(i), image, c10::IValue(), list}));
  }
  writer.finish();
}

// An s3:// dataset's cache budget: MAX_CACHE_BYTES when set, else the default.
lf::StreamingDatasetOptions dataset_options() {
  lf::StreamingDatasetOptions options;
  if (const char* bytes = std::getenv("MAX_CACHE_BYTES")) options.max_cache_bytes(std::stoll(bytes));
  return options;
}

void order(const std::string& dir, const std::vector<std::string>& configs) {
  lf::StreamingDataset dataset(dir, dataset_options());
  for (const auto& config : configs) {
    std::vector<int64_t> p;  // world, rank, workers, batch, shuffle, epochs[, drop_last or -[, seed]]
    std::stringstream in(config);
    for (std::string part; std::getline(in, part, ',');) p.push_back(part == "-" ? -1 : std::stoll(part));
    auto options = lf::StreamingLoaderOptions()
                       .world_size(static_cast<int>(p[0])).rank(static_cast<int>(p[1]))
                       .num_workers(static_cast<int>(p[2])).batch_size(p[3]).shuffle(p[4] != 0);
    if (p.size() > 6 && p[6] >= 0) options.drop_last(p[6] != 0);
    if (p.size() > 7) options.seed(p[7]);
    lf::StreamingDataLoader loader(dataset, options);
    for (int64_t epoch = 1; epoch <= p[5]; ++epoch) {
      for (auto& batch : loader) {
        const at::Tensor ids = batch.data.toTupleRef().elements()[0].toTensor();
        std::string line;
        for (int64_t k = 0; k < ids.numel(); ++k) {
          if (ids[k].item<int64_t>() != batch.indices[k]) throw std::runtime_error("an item's id is not its index");
          line += (k ? " " : "") + std::to_string(batch.indices[k]);
        }
        std::cout << config << " epoch " << epoch << ": " << line << "\n";
      }
    }
  }
  std::cerr << "cache peak " << dataset.cache_peak_bytes() << " downloads " << dataset.chunks_downloaded() << "\n";
}

int train(int argc, char** argv) {
  const std::string dir = argv[2], log_dir = argv[3];
  int64_t batch_size = 4, save_after = -1, epochs = 1, roll_back_at = -1;
  int workers = 0;
  bool shuffle = false, kill = false;
  std::string save_path, resume_path;
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--batch") batch_size = std::stoll(argv[++i]);
    else if (flag == "--workers") workers = std::stoi(argv[++i]);
    else if (flag == "--epochs") epochs = std::stoll(argv[++i]);
    else if (flag == "--shuffle") shuffle = true;
    else if (flag == "--kill") kill = true;
    else if (flag == "--save-after") save_after = std::stoll(argv[++i]), save_path = argv[++i];
    else if (flag == "--resume") resume_path = argv[++i];
    else if (flag == "--roll-back-at") roll_back_at = std::stoll(argv[++i]);
    else throw std::runtime_error("unknown flag " + flag);
  }
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
  lf::StreamingDataset dataset(dir, dataset_options());
  lf::StreamingDataLoader loader(dataset,
                                 lf::StreamingLoaderOptions().batch_size(batch_size).shuffle(shuffle).num_workers(workers));
  fabric.setup_dataloaders(loader);  // the data ranks' share, batches on fabric.device(), resume_state()
  fabric.seed_everything(7);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [model, optimizer] = fabric.setup(net, sgd);
  lf::State state{{"model", model}, {"optimizer", optimizer}, {"resume", fabric.resume_state()}};
  if (!resume_path.empty()) fabric.load(resume_path, state);
  if (roll_back_at > 0) {
    lf::State rollback{{"model", model}, {"optimizer", optimizer}, {"loader", loader}};
    fabric.roll_back_on_bad_steps(rollback);
    fabric.save(log_dir + "/rollback.ckpt", rollback);  // before the first batch: what the rollback restores
  }
  const std::string rank = std::to_string(fabric.global_rank());
  std::ofstream log(log_dir + "/rank-" + rank + ".log", std::ios::app), losses(log_dir + "/rank-" + rank + ".loss", std::ios::app);
  char text[64];
  int64_t step = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    int64_t taken = 0;
    for (auto& batch : loader) {
      log << "epoch " << loader.epoch() << ":";
      for (int64_t index : batch.indices) log << " " << index;
      log << "\n";
      log.flush();
      const auto& fields = batch.data.toTupleRef().elements();
      const at::Tensor ids = fields[0].toTensor(), features = fields[1].toTensor();
      if (features.device() != fabric.device()) throw std::runtime_error("a batch is not on fabric.device()");
      optimizer.zero_grad();
      const at::Tensor target = (ids.to(at::kFloat) * 0.05).sin().unsqueeze(1);
      at::Tensor loss = (model(features / 203.0) - target).pow(2).mean();
      fabric.backward(loss);
      optimizer.step();
      std::snprintf(text, sizeof(text), "%a", loss.item<float>());
      losses << text << "\n";
      losses.flush();
      ++taken, ++step;
      if (step == roll_back_at) fabric.roll_back("planted at batch " + std::to_string(step));
      if (e == 0 && taken == save_after) {
        fabric.save(save_path, state);
        if (kill) {
          fabric.barrier();
          if (fabric.global_rank() == 0) std::raise(SIGKILL);
          fabric.barrier();  // the launcher stops the others
        }
      }
    }
  }
  for (const auto& parameter : model->parameters()) {
    const at::Tensor flat = parameter.detach().reshape(-1);
    for (int64_t k = 0; k < flat.numel(); ++k) {
      std::snprintf(text, sizeof(text), "%a", flat[k].item<float>());
      losses << "parameter " << text << "\n";
    }
  }
  std::ofstream(log_dir + "/rank-" + rank + ".cache") << dataset.cache_peak_bytes() << " " << dataset.chunks_downloaded() << "\n";
  std::cout << "rank " << fabric.global_rank() << " of " << fabric.world_size() << ": done, waited "
            << loader.wait_seconds() << " s on data\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "checkpoint" && argc == 3) {  // a job's model and step saved to URL, loaded back by a fresh model
      lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
      fabric.seed_everything(3);
      torch::nn::Linear saved_net(4, 3), loaded_net(4, 3);
      torch::NoGradGuard no_grad;
      for (auto& p : loaded_net->parameters()) p.zero_();
      int64_t step = 17;
      fabric.save(argv[2], {{"model", saved_net}, {"step", step}});
      lf::State state{{"model", loaded_net}, {"step", int64_t{0}}};
      fabric.load(argv[2], state);
      if (state.at("step").to<int64_t>() != 17) throw std::runtime_error("the step did not come back");
      for (size_t i = 0; i < saved_net->parameters().size(); ++i) {
        if (!saved_net->parameters()[i].equal(loaded_net->parameters()[i])) throw std::runtime_error("a parameter differs");
      }
      std::cout << "rank " << fabric.global_rank() << ": saved and loaded " << argv[2] << "\n";
      return 0;
    }
    if (command == "load" && argc == 3) {  // fabric.load(PATH): its entries' names
      lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"));
      for (const auto& item : fabric.load(argv[2])) std::cout << item.key().toStringRef() << "\n";
      return 0;
    }
    if (command == "dump-when" && argc == 4) {  // opens the dataset, says so, and reads once FLAG exists
      lf::StreamingDataset dataset(argv[2]);
      std::cout << "opened " << dataset.size() << " items" << std::endl;
      while (!std::filesystem::exists(argv[3])) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int64_t i = 0; i < dataset.size(); ++i) std::cout << canonical(dataset.get(i)) << "\n";
      return 0;
    }
    if (command == "dump" && argc == 3) {
      lf::StreamingDataset dataset(argv[2], dataset_options());
      for (int64_t i = 0; i < dataset.size(); ++i) std::cout << canonical(dataset.get(i)) << "\n";
      return 0;
    }
    if (command == "write" && argc == 4) return write(argv[2], argv[3]), 0;
    if (command == "order" && argc >= 4) return order(argv[2], std::vector<std::string>(argv + 3, argv + argc)), 0;
    if (command == "train" && argc >= 4) return train(argc, argv);
    std::cerr << "usage: streaming_checks dump DIR | write mixed|ids DIR | order DIR CONFIG... | train DIR LOG [flags]\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "FAIL: " << e.what() << "\n";
    return 1;
  }
}
