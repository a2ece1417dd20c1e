// The LibTorch-free checkpoint pieces behind `lightning-run model consolidate`: the pickle tree
// rewrites what LibTorch wrote without changing a value, the zip writer's output (ZIP64 too) reads
// back in LibTorch, and splicing a sharded folder gives the same checkpoint as assembling it with
// LibTorch tensors, including shards that are views at an offset into a larger record.
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "lightning/fabric.h"
#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/consolidate.h"
#include "lightning/fabric/checkpoint/pickle_tree.h"
#include "lightning/fabric/checkpoint/sharded.h"
#include "lightning/fabric/checkpoint/zip_archive.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
fs::path scratch(const std::string& name) {
  static const fs::path root = lf::make_temporary_directory("lf-format-test");
  return root / name;
}

// Every kind of value LibTorch's pickler writes for a checkpoint.
lf::StateDict varied_state() {
  lf::StateDict inner = lf::make_state_dict();
  inner.insert("negative", int64_t{-5});
  inner.insert("large", int64_t{1} << 40);
  inner.insert("most_negative", std::numeric_limits<int64_t>::min());
  inner.insert("real", -2.75e-3);
  inner.insert("flag", true);
  inner.insert("nothing", c10::IValue());
  inner.insert("text", std::string("héllo\nworld"));
  inner.insert("ints", c10::List<int64_t>({1, 2, 300000}));
  inner.insert("reals", c10::List<double>({0.5, -1.0}));
  lf::StateDict state = lf::make_state_dict();
  state.insert("nested", inner);
  state.insert("weights", torch::arange(12, torch::kFloat32).view({3, 4}));
  state.insert("view", torch::arange(20, torch::kFloat64).narrow(0, 5, 10));  // storage offset 5
  state.insert("ids", torch::tensor({7, -8}, torch::kInt64));
  return state;
}

bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() && b.isTensor()) return a.toTensor().dtype() == b.toTensor().dtype() && torch::equal(a.toTensor(), b.toTensor());
  if (a.isGenericDict() && b.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return false;
    for (const auto& item : x) {
      auto other = y.find(item.key());
      if (other == y.end() || !same_value(item.value(), other->value())) return false;
    }
    return true;
  }
  if (a.isList() && b.isList()) {  // element by element: files hold untagged lists (no element type)
    const auto x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!same_value(x.get(i), y.get(i))) return false;
    }
    return true;
  }
  return a == b;
}

// Rewrites an archive through the pickle tree and the zip writer, keeping its tensor records.
void rewrite(const fs::path& from, const fs::path& to, bool zip64) {
  lf::zip::MappedFile file(from);
  lf::zip::Reader reader(file.bytes(), from.string());
  const lf::zip::Entry* pickle_entry = reader.find_suffix("/data.pkl");
  REQUIRE(pickle_entry != nullptr);
  const auto tree = lf::pickle::parse(reader.content(*pickle_entry), from.string());
  lf::write_file_atomically_fd(to, [&](int fd) {
    lf::zip::Writer writer(fd, to.string(), zip64);
    writer.add("archive/data.pkl", lf::pickle::write(*tree));
    for (const auto& entry : reader.entries()) {
      if (&entry == pickle_entry) continue;
      writer.add(entry.name, {{file.fd(), entry.data_offset, entry.size}}, entry.crc32);
    }
    writer.finish();
  });
}

// A sharded folder as fsdp writes it, built directly: each part's slice of every tensor. With
// offset_views, a part's slice is a view into a larger tensor (its record holds more bytes).
void write_sharded_folder(const fs::path& folder, const lf::StateDict& whole, const std::vector<std::string>& sharded,
                          int parts, bool offset_views) {
  fs::create_directories(folder);
  lf::ShardedLayout metadata;
  metadata.parts = metadata.world_size = parts;
  lf::StateDict common = c10::IValue(whole).deepcopy().toGenericDict();  // nested dicts are shared otherwise
  for (const auto& path : sharded) {
    const auto tensor = lf::tensor_at_path(whole, path);
    metadata.tensors[path] = {tensor.sizes().vec(), c10::toString(tensor.scalar_type())};
    lf::remove_at_path(common, path);
  }
  for (int part = 0; part < parts; ++part) {
    lf::StateDict shard = lf::make_state_dict();
    for (const auto& path : sharded) {
      at::Tensor slice = lf::slice_for_part(lf::tensor_at_path(whole, path), parts, part);
      if (offset_views) slice = torch::cat({torch::zeros({3}, slice.options()), slice}).narrow(0, 3, slice.numel());
      shard.insert(path, slice);
    }
    lf::save_state_dict_file(folder / lf::shard_file_name(part, parts), shard);
  }
  lf::save_state_dict_file(folder / "common.pt", common);
  lf::write_sharded_layout(folder, metadata);
}
}  // namespace

TEST_CASE("the pickle reader: an object referenced twice keeps the fields BUILD gave it", "[checkpoint][format]") {
  // (obj, obj) where obj = Obj() built with {"a": 5}; the second is a memo reference (BINGET 0)
  // to the object memoised before its BUILD, as Python's pickler writes a shared object.
  const std::string bytes = std::string("\x80\x02" "c__main__\nObj\n" ")" "\x81" "q\x00" "}" "X\x01\x00\x00\x00" "a"
                                        "K\x05" "s" "b" "h\x00" "\x86" ".", 35);
  const auto root = lf::pickle::parse(bytes, "a shared object");
  REQUIRE(root->kind == lf::pickle::Node::Kind::Tuple);
  REQUIRE(root->items.size() == 2);
  for (const auto& object : root->items) {
    REQUIRE(object->kind == lf::pickle::Node::Kind::Build);
    CHECK(object->items.at(0)->kind == lf::pickle::Node::Kind::NewObj);
    auto* fields = lf::pickle::as_dict(object->items.at(1));
    REQUIRE(fields != nullptr);
    const auto* a = lf::pickle::dict_find(*fields, "a");
    REQUIRE(a != nullptr);
    CHECK((*a)->integer == 5);
  }
}

TEST_CASE("a checkpoint rewritten through the pickle tree and zip writer loads equal", "[checkpoint][format]") {
  const auto state = varied_state();
  lf::save_state_dict_file(scratch("varied.pt"), state);
  for (bool zip64 : {false, true}) {
    const fs::path copy = scratch(zip64 ? "varied-zip64.pt" : "varied-copy.pt");
    rewrite(scratch("varied.pt"), copy, zip64);
    INFO("zip64 " << zip64);
    CHECK(same_value(lf::load_state_dict_file(copy), state));
  }
}

TEST_CASE("splicing a sharded folder equals assembling it with LibTorch", "[checkpoint][format]") {
  torch::manual_seed(3);
  lf::StateDict whole = lf::make_state_dict();
  lf::StateDict model = lf::make_state_dict();
  model.insert("fc.weight", torch::randn({7, 5}));
  model.insert("fc.bias", torch::randn({7}).to(torch::kFloat64));
  model.insert("norm.running_mean", torch::randn({5}));  // stays in common.pt
  whole.insert("model", model);
  whole.insert("step", int64_t{12});
  const std::vector<std::string> sharded = {"model/fc.weight", "model/fc.bias"};
  for (int parts : {1, 3, 4}) {
    for (bool offset_views : {false, true}) {
      for (bool zip64 : {false, true}) {
        INFO(parts << " parts, offset views " << offset_views << ", zip64 " << zip64);
        const fs::path folder = scratch("ck-" + std::to_string(parts) + (offset_views ? "-views" : ""));
        fs::remove_all(folder);
        write_sharded_folder(folder, whole, sharded, parts, offset_views);
        const fs::path output = scratch("out.pt");
        const auto summary = lf::consolidate_sharded_folder(folder, output, zip64);
        CHECK(summary.tensors == 2);
        CHECK(summary.bytes == fs::file_size(output));
        CHECK(same_value(lf::load_state_dict_file(output), whole));
        CHECK(same_value(lf::load_state_dict_file(output), lf::consolidate_sharded_checkpoint(folder)));
        // LibTorch's own reader of torch.save files reads it too.
        std::ifstream in(output, std::ios::binary);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        CHECK(same_value(torch::pickle_load(bytes), whole));
      }
    }
  }
}

TEST_CASE("splicing places a tensor whose dicts common.pt lacks in plain dicts, which torch.load's weights_only reads",
          "[checkpoint][format]") {
  lf::StateDict whole = lf::make_state_dict();
  lf::StateDict model = lf::make_state_dict();
  model.insert("fc.weight", torch::arange(12, torch::kFloat32).view({4, 3}));
  whole.insert("model", model);
  const fs::path folder = scratch("no-parent");
  fs::remove_all(folder);
  write_sharded_folder(folder, whole, {"model/fc.weight"}, 2, false);
  lf::StateDict common = lf::make_state_dict();  // the earlier layout's common.pt without the "model" dict
  common.insert("step", int64_t{3});
  lf::save_state_dict_file(folder / "common.pt", common);
  const fs::path output = scratch("no-parent.pt");
  lf::consolidate_sharded_folder(folder, output);
  std::ifstream in(output, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(bytes.find("restore_type_tag") == std::string::npos);  // a torch.jit global weights_only refuses
  whole.insert("step", int64_t{3});
  CHECK(same_value(lf::load_state_dict_file(output), whole));
}

TEST_CASE("splicing refuses a corrupted shard and one that disagrees with metadata.json", "[checkpoint][format][errors]") {
  lf::StateDict whole = lf::make_state_dict();
  whole.insert("w", torch::arange(1000, torch::kFloat32));
  const fs::path folder = scratch("bad");
  write_sharded_folder(folder, whole, {"w"}, 2, false);
  const fs::path output = scratch("bad.consolidated");

  const fs::path shard = folder / lf::shard_file_name(1, 2);
  const std::string original = [&] {
    std::ifstream in(shard, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  {  // one byte of the tensor record flipped
    std::string bytes = original;
    lf::zip::Reader reader(bytes, "shard");
    const auto* record = reader.find_suffix("/data/0");
    REQUIRE(record != nullptr);
    bytes[record->data_offset + 100] ^= 0x40;
    std::ofstream(shard, std::ios::binary) << bytes;
  }
  CHECK_THROWS_WITH(lf::consolidate_sharded_folder(folder, output), Contains("is corrupted") && Contains("shard-1-of-2.pt"));
  CHECK_FALSE(fs::exists(output));

  // A shard holding a different number of values than metadata.json gives its part.
  lf::StateDict wrong = lf::make_state_dict();
  wrong.insert("w", torch::zeros({10}));
  lf::save_state_dict_file(shard, wrong);
  CHECK_THROWS_WITH(lf::consolidate_sharded_folder(folder, output), Contains("holds 10 values of w") && Contains("expected 500"));
  CHECK_FALSE(fs::exists(output));
}

TEST_CASE("the pickle reader names the file for an opcode it does not know", "[checkpoint][format][errors]") {
  CHECK_THROWS_WITH(lf::pickle::parse(std::string("\x80\x02\xff.", 4), "demo.pkl"),
                    Contains("demo.pkl") && Contains("opcode 0xff"));
  CHECK_THROWS_WITH(lf::pickle::parse(std::string("\x80\x02(K\x01", 5), "cut.pkl"), Contains("ends early"));
}

TEST_CASE("damaged archives and pickles give errors and never crash", "[checkpoint][format][errors]") {
  lf::save_state_dict_file(scratch("intact.pt"), varied_state());
  std::ifstream in(scratch("intact.pt"), std::ios::binary);
  const std::string intact((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Reads an archive the way consolidate does; only lf::RuntimeError may come out.
  auto read = [](const std::string& bytes) {
    try {
      lf::zip::Reader reader(bytes, "damaged");
      reader.verify_all();
      if (const auto* entry = reader.find_suffix("/data.pkl")) lf::pickle::parse(reader.content(*entry), "damaged");
      return true;
    } catch (const lf::RuntimeError&) {
      return false;
    }
  };
  CHECK(read(intact));
  int refused = 0, cases = 0;
  for (size_t length = 0; length < intact.size(); length += 7, ++cases) refused += read(intact.substr(0, length)) ? 0 : 1;
  CHECK(refused == cases);  // every truncation is noticed
  std::mt19937 random(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = intact;
    bytes[random() % bytes.size()] = static_cast<char>(random());
    read(bytes);  // may pass (a flipped padding byte), must not crash
  }
  // Pickles cut anywhere or with a byte changed.
  lf::zip::Reader reader(intact, "intact");
  const std::string pickle(reader.content(*reader.find_suffix("/data.pkl")));
  for (size_t length = 0; length + 1 < pickle.size(); ++length) {
    CHECK_THROWS_AS(lf::pickle::parse(pickle.substr(0, length), "cut"), lf::RuntimeError);
  }
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = pickle;
    bytes[random() % bytes.size()] = static_cast<char>(random());
    try {
      lf::pickle::parse(bytes, "flipped");
    } catch (const lf::RuntimeError&) {
    }
  }
}
