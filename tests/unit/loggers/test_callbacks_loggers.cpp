// Callbacks through fabric.call (order, arguments, skipping, user hooks), fabric.log/log_dict
// into loggers, the CSV logger's files, and CRC-32C. The TensorBoard file is read back by an
// independent reader in tests/integration/tensorboard_reader.sh.
#include <torch/torch.h>

#include <fstream>
#include <sstream>

#include "lightning/fabric.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
std::vector<std::string>& journal() {
  static std::vector<std::string> entries;
  return entries;
}

struct Recorder : lf::Callback {
  explicit Recorder(std::string id) : id(std::move(id)) {}
  void on_train_batch_end(const lf::HookArgs& args) override {
    journal().push_back(id + ":on_train_batch_end:" + std::to_string(args.get<int64_t>("batch_idx")) + ":" +
                        std::to_string(args.get<double>("loss")));
  }
  void on_before_backward(const lf::HookArgs& args) override {
    journal().push_back(id + ":on_before_backward:" + std::to_string(args.get<torch::Tensor>("loss").item<float>()));
  }
  void on_hook(const std::string& name, const lf::HookArgs& args) override {
    journal().push_back(id + ":" + name + ":" + args.get<std::string>("message"));
  }
  std::string id;
};

// Overrides one hook only: every other hook skips it.
struct EpochOnly : lf::Callback {
  void on_train_epoch_end(const lf::HookArgs& args) override {
    journal().push_back("epoch:" + std::to_string(args.get<int64_t>("epoch")));
  }
};

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

fs::path scratch() { return lf::make_temporary_directory("lf-logger-test"); }
}  // namespace

TEST_CASE("fabric.call runs hooks in callback order with their arguments and skips the rest", "[callbacks]") {
  journal().clear();
  lf::Fabric fabric(lf::FabricOptions()
                        .accelerator("cpu")
                        .callback(std::make_shared<Recorder>("a"))
                        .callback(std::make_shared<EpochOnly>())
                        .callback(std::make_shared<Recorder>("b")),
                    lf::env::map_env({}));
  fabric.call("on_train_batch_end", {{"batch_idx", 3}, {"loss", 0.5f}});
  fabric.call("on_before_backward", {{"loss", torch::tensor(2.0f)}});
  fabric.call("on_train_epoch_end", {{"epoch", 1}});
  fabric.call("on_my_event", {{"message", "hello"}});  // a user-defined hook
  fabric.call("on_validation_epoch_start");             // nobody overrides it: nothing happens
  const std::vector<std::string> expected = {
      "a:on_train_batch_end:3:0.500000", "b:on_train_batch_end:3:0.500000", "a:on_before_backward:2.000000",
      "b:on_before_backward:2.000000",   "epoch:1",                         "a:on_my_event:hello",
      "b:on_my_event:hello"};
  CHECK(journal() == expected);
  CHECK(lf::trainer_hook_names().size() == 12);
}

TEST_CASE("HookArgs: a missing or mistyped argument names itself and what was passed", "[callbacks][errors]") {
  lf::HookArgs args{{"loss", 1.5}, {"step", 7}};
  CHECK(args.get<int64_t>("step") == 7);
  CHECK(args.find<std::string>("loss") == nullptr);
  CHECK_THROWS_WITH(args.get<double>("epoch"), Contains("'epoch'") && Contains("not passed") && Contains("loss, step"));
  CHECK_THROWS_WITH(args.get<std::string>("loss"), Contains("another type"));
  CHECK_THROWS_AS(args.get<std::string>("loss"), lf::TypeError);
}

TEST_CASE("CSVLogger: a step column, one column per metric, widened when a metric appears late", "[loggers]") {
  const fs::path root = scratch();
  auto csv = std::make_shared<lf::CSVLogger>(root, "run");
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").logger(csv), lf::env::map_env({}));
  fabric.log("loss", 0.5, 0);
  fabric.log_dict({{"loss", 0.25}}, 1);
  fabric.log_dict({{"loss", 0.125}, {"acc", 0.75}}, 2);
  fabric.log("acc", torch::tensor(1.0), 3);
  CHECK(csv->log_dir() == root / "run" / "version_0");
  CHECK(read(csv->log_dir() / "metrics.csv") == "step,loss,acc\n0,0.5,\n1,0.25,\n2,0.125,0.75\n3,,1\n");
  csv->log_hyperparams({{"lr", "0.001"}, {"batch_size", "64"}});
  CHECK(read(csv->log_dir() / "hparams.yaml") == "batch_size: 64\nlr: 0.001\n");
  CHECK_THROWS_WITH(fabric.log("bad", torch::ones(3)), Contains("3 elements"));
  CHECK_THROWS_WITH(fabric.log("a,b", 1.0), Contains("comma"));
  // A second logger in the same folder gets the next version.
  lf::CSVLogger second(root, "run");
  second.log_metrics({{"x", 1.0}}, std::nullopt);
  CHECK(second.log_dir() == root / "run" / "version_1");
  CHECK(read(second.log_dir() / "metrics.csv") == "step,x\n,1\n");
  CHECK(fabric.logger() == csv);
}

TEST_CASE("log on a rank other than zero writes nothing", "[loggers]") {
  const fs::path root = scratch();
  auto csv = std::make_shared<lf::CSVLogger>(root, "run");
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").logger(csv),
                    lf::env::map_env({{"LT_CLI_USED", "1"}, {"LT_ACCELERATOR", "cpu"}, {"LT_DEVICES", "2"},
                                      {"LOCAL_RANK", "1"}, {"NODE_RANK", "0"}, {"WORLD_SIZE", "2"}, {"RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}));
  REQUIRE(fabric.global_rank() == 1);
  fabric.log("loss", 1.0, 0);
  CHECK_FALSE(fs::exists(root / "run" / "version_0" / "metrics.csv"));
}

TEST_CASE("crc32c matches the standard check value", "[loggers]") {
  CHECK(lf::crc32c("123456789") == 0xE3069283u);
  CHECK(lf::crc32c("") == 0u);
}

// Hidden: tests/integration/tensorboard_reader.sh runs it to get an event file to read back.
TEST_CASE("write a TensorBoard event file into $LF_TB_DIR", "[.][tensorboard-writer]") {
  const char* dir = std::getenv("LF_TB_DIR");
  REQUIRE(dir != nullptr);
  auto board = std::make_shared<lf::TensorBoardLogger>(dir, "tb", 0);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").logger(board), lf::env::map_env({}));
  fabric.log_dict({{"loss", 0.5}, {"acc", 0.25}}, 10);
  fabric.log("loss", 0.125, 20);
  std::cout << "event_file " << board->event_file().string() << std::endl;
}

// Hidden: tests/integration/tensorboard_rich.sh runs it and reads the file with TensorBoard's own
// readers. Every value is exact in the formats: the script checks them one by one.
TEST_CASE("write images, histograms, text and hyperparameters into $LF_TB_DIR", "[.][tensorboard-rich]") {
  const char* dir = std::getenv("LF_TB_DIR");
  REQUIRE(dir != nullptr);
  lf::TensorBoardLogger board(dir, "rich", 0);
  // RGB 3 x 2 x 4: channel c, row y, column x holds (c * 8 + y * 4 + x) / 255 * 10.
  const auto rgb = (torch::arange(24, torch::kFloat).view({3, 2, 4}) * 10 / 255);
  board.log_image("samples/rgb", rgb, 5);
  board.log_image("samples/grey", torch::arange(6, torch::kByte).view({2, 3}) * 40, 6);
  board.log_histogram("weights", torch::tensor({0.0, 1.0, 1.0, 2.0, 4.0, std::nan("")}), 7, 4);
  board.log_text("notes", "**bold** and plain", 8);
  board.log_hyperparams({{"lr", 0.5}, {"optimizer", "adam"}, {"nesterov", true}, {"layers", 3}}, {{"val/loss", 0.25}});
  std::cout << "event_file " << board.event_file().string() << std::endl;
}

// Hidden: tests/integration/tensorboard_vs_pytorch.sh runs it, has PyTorch's SummaryWriter write
// the same images (from the bytes saved here: "image TAG STEP DTYPE FILE SIZES...") and
// hyperparameters, and compares the two files' events.
TEST_CASE("write images and hyperparameters of every kind into $LF_TB_DIR", "[.][tensorboard-pytorch]") {
  const char* dir = std::getenv("LF_TB_DIR");
  REQUIRE(dir != nullptr);
  lf::TensorBoardLogger board(dir, "ours", 0);
  // (k + 0.6) / 255 for k = 0..143: times 255 in float32 it lies just below or above k + 0.6, which
  // truncation and rounding tell apart; then values below 0 and above 1, a NaN, 1 and 0.
  const auto rgb = ((torch::arange(144, torch::kFloat) + 0.6) / 255).view({3, 6, 8});
  rgb[0][0][0].fill_(-0.25);
  rgb[1][0][0].fill_(1.75);
  rgb[2][0][0].fill_(std::nan(""));
  rgb[0][5][7].fill_(1.0);
  rgb[1][5][7].fill_(0.0);
  const std::vector<std::pair<std::string, torch::Tensor>> images = {
      {"float32/rgb", rgb},
      {"float64/grey_hw", ((torch::arange(20, torch::kDouble) * 13 + 0.5) / 255).view({4, 5})},
      {"bfloat16/rgb", rgb.to(torch::kBFloat16)},
      {"uint8/grey", (torch::arange(12, torch::kLong) * 21).to(torch::kByte).view({1, 3, 4})},
      {"uint8/rgba", (torch::arange(60, torch::kLong) * 37).remainder(256).to(torch::kByte).view({4, 3, 5})},
  };
  for (size_t i = 0; i < images.size(); ++i) {
    const auto& [tag, image] = images[i];
    const auto step = static_cast<int64_t>(i + 1);
    board.log_image(tag, image, step);
    const torch::Tensor data = image.contiguous();
    const std::string name = "image" + std::to_string(i) + ".bin";
    std::ofstream(fs::path(dir) / name, std::ios::binary)
        .write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.nbytes()));
    std::cout << "image " << tag << " " << step << " " << c10::toString(data.scalar_type()) << " " << name;
    for (const int64_t size : data.sizes()) std::cout << " " << size;
    std::cout << std::endl;
  }
  board.log_hyperparams({{"flag_on", true}, {"flag_off", false}, {"int", 12}, {"float", 3e-4}, {"text", "adamw"},
                         {"text_empty", ""}, {"tensor_float32", torch::tensor({0.1f, 0.7f})},
                         {"tensor_int64", torch::tensor({int64_t{7}})},
                         {"tensor_bfloat16", torch::tensor({0.1f}).to(torch::kBFloat16)}},
                        {{"val/acc", 0.5}, {"val/loss", 0.25}});
  std::cout << "event_file " << board.event_file().string() << std::endl;
}

TEST_CASE("HParam reads a tensor as PyTorch's hparams does: the first element of a 1-D tensor", "[loggers]") {
  CHECK(lf::HParam(torch::tensor({2.5, 1.0})).number() == 2.5);
  CHECK(lf::HParam(torch::tensor({0.1f})).number() == static_cast<double>(0.1f));
  CHECK(lf::HParam(torch::tensor({0.1f}).to(torch::kBFloat16)).number() == 0.10009765625);
  CHECK(lf::HParam(torch::tensor(int64_t{7})).number() == 7);
  CHECK(lf::HParam(torch::tensor({int64_t{7}})).kind() == lf::HParam::Kind::Number);
  CHECK_THROWS_WITH(lf::HParam(torch::zeros({1, 1})), Contains("expected a real 1-D tensor") && Contains("[1, 1]"));
  CHECK_THROWS_WITH(lf::HParam(torch::zeros({0})), Contains("expected a real 1-D tensor"));
  CHECK_THROWS_WITH(lf::HParam(torch::Tensor()), Contains("an undefined tensor"));
}

TEST_CASE("TensorBoardLogger refuses images and histograms it cannot write", "[loggers]") {
  lf::TensorBoardLogger board(std::filesystem::temp_directory_path() / "lf-tb-refusals", "x", 0);
  CHECK_THROWS_WITH(board.log_image("a", torch::zeros({2, 4, 4})), Contains("expected [C, H, W] with C = 1, 3 or 4"));
  CHECK_THROWS_WITH(board.log_image("a", torch::zeros({3, 4, 4}, torch::kLong)), Contains("floating values in [0, 1] or uint8"));
  CHECK_THROWS_WITH(board.log_histogram("h", torch::full({3}, std::nan(""))), Contains("no finite value"));
  CHECK_THROWS_WITH(board.log_histogram("h", torch::ones({3}), 0, 0), Contains("bins is 0"));
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / "lf-tb-refusals");
}

TEST_CASE("make_image_grid tiles images as torchvision's make_grid", "[loggers]") {
  const auto images = torch::arange(5, torch::kFloat).view({5, 1, 1, 1}).expand({5, 1, 2, 3}) + 1;
  const auto grid = lf::make_image_grid(images, 2, 1, -1);
  REQUIRE(grid.sizes() == torch::IntArrayRef({1, 3 * (2 + 1) + 1, 2 * (3 + 1) + 1}));
  CHECK(grid[0][1][1].item<float>() == 1);   // image 0 at the top left, inside the padding
  CHECK(grid[0][1][5].item<float>() == 2);   // image 1 to its right
  CHECK(grid[0][4][1].item<float>() == 3);   // image 2 on the next row
  CHECK(grid[0][7][5].item<float>() == -1);  // no sixth image: padding value
  CHECK(grid[0][0][0].item<float>() == -1);
  CHECK_THROWS_WITH(lf::make_image_grid(torch::zeros({2, 3, 4})), Contains("expected images [N, C, H, W]"));
}

TEST_CASE("encode_png writes the PNG signature, IHDR and zlib-compressed rows", "[loggers]") {
  const uint8_t pixels[] = {0, 255, 128, 7};
  const std::string png = lf::encode_png(pixels, 2, 2, 1);
  CHECK(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
  CHECK(png.compare(12, 4, "IHDR") == 0);
  CHECK(png.compare(png.size() - 8, 4, "IEND") == 0);
  CHECK_THROWS_WITH(lf::encode_png(pixels, 2, 2, 5), Contains("1 to 4 channels"));
}

TEST_CASE("ProgressBar: plain periodic lines off a terminal, rate, ETA and loss", "[progress]") {
  double now = 0;
  std::ostringstream out;
  lf::ProgressBarOptions options;
  options.terminal = false;
  options.plain_interval_s = 10;
  options.clock = [&] { return now; };
  {
    lf::ProgressBar bar("epoch 1", 100, true, out, options);
    for (int i = 0; i < 50; ++i) {
      now += 0.5;  // 2 it/s
      bar.update(1, 1.0 / (i + 1));
    }
    CHECK(bar.line() == "epoch 1: 50/100 (50%) 00:25<00:25, 2.00 it/s, loss 0.02");
  }
  // Lines at 0.5 s (the first update), 10.5 s and 20.5 s, then the final one at close.
  const std::string text = out.str();
  CHECK(std::count(text.begin(), text.end(), '\n') == 4);
  CHECK_THAT(text, Contains("epoch 1: 1/100 (1%)") && Contains("epoch 1: 50/100 (50%) 00:25<00:25"));
  CHECK(text.find('\r') == std::string::npos);
}

TEST_CASE("ProgressBar: a terminal line redrawn in place, and disabled bars print nothing", "[progress]") {
  double now = 0;
  std::ostringstream out, silent;
  lf::ProgressBarOptions options;
  options.terminal = true;
  options.clock = [&] { return now; };
  lf::ProgressBar bar("train", 4, true, out, options);
  lf::ProgressBar other_rank("train", 4, false, silent, options);
  for (int i = 0; i < 4; ++i) {
    now += 1;
    bar.update();
    other_rank.update();
  }
  bar.close();
  other_rank.close();
  CHECK_THAT(out.str(), Contains("\r\033[Ktrain: ####################") && Contains("4/4 (100%)"));
  CHECK(silent.str().empty());
  lf::ProgressBar unknown("eval", std::nullopt, true, out, options);
  now += 2;
  unknown.update(3);
  CHECK_THAT(unknown.line(), Contains("eval: 3 00:02, 1.50 it/s"));
}
