// torch.distributed.checkpoint folders (checkpoint/dcp_format.h, checkpoint/dcp.h): flat ranges as
// boxes, the .metadata pickle read back, nested states flattened as Python flattens them, and
// chunks that are not flat ranges (another rank layout, e.g. column shards) read and consolidated.
// Python reading and writing these folders is tested in tests/integration/python_dcp_interop.sh.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "lightning/fabric.h"
#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/consolidate.h"
#include "lightning/fabric/checkpoint/dcp.h"
#include "lightning/fabric/utilities/process.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace dcp = lightning::fabric::dcp;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
fs::path scratch(const std::string& name) {
  static const fs::path root = lf::make_temporary_directory("lf-dcp-test");
  return root / name;
}

at::Tensor box_of(at::Tensor tensor, const dcp::Box& box) {
  for (size_t d = 0; d < box.sizes.size(); ++d) tensor = tensor.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
  return tensor;
}

// A folder whose tensor "model.w" (4 x 6) was saved as two column halves, as a tensor-parallel
// or Shard(1) layout writes it, with one bytes item beside it.
void write_column_folder(const fs::path& folder, const at::Tensor& whole, bool leave_out_second) {
  fs::create_directories(folder);
  dcp::Metadata metadata;
  dcp::Item item;
  item.kind = dcp::Item::Kind::Tensor;
  item.dtype = "Float";
  item.size = {4, 6};
  item.path = {{"model", -1}, {"w", -1}};
  std::string bytes;
  for (int half = 0; half < (leave_out_second ? 1 : 2); ++half) {
    const dcp::Box box{{0, 3 * half}, {4, 3}};
    const std::string archive = lf::archive_bytes(box_of(whole, box).contiguous());
    item.chunks.push_back(box);
    item.locations.push_back({"__0_0.distcp", bytes.size(), archive.size()});
    bytes += archive;
  }
  metadata.add("model.w", item);
  dcp::Item step;
  step.path = {{"step", -1}};
  const std::string archive = lf::archive_bytes(c10::IValue(int64_t{7}));
  step.locations.push_back({"__0_0.distcp", bytes.size(), archive.size()});
  bytes += archive;
  metadata.add("step", step);
  lf::write_file_atomically(folder / "__0_0.distcp", bytes);
  lf::write_file_atomically(folder / ".metadata", dcp::write_metadata(metadata));
}
}  // namespace

TEST_CASE("a flat range of a tensor splits into contiguous boxes that cover exactly it", "[checkpoint][dcp]") {
  std::mt19937 random(3);
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{7}, {5, 33}, {3, 4, 5}, {2, 1, 3, 4}}) {
    const int64_t numel = c10::multiply_integers(shape);
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t begin = std::uniform_int_distribution<int64_t>(0, numel)(random);
      const int64_t length = std::uniform_int_distribution<int64_t>(0, numel - begin)(random);
      const auto boxes = dcp::flat_range_boxes(shape, begin, length);
      CHECK(boxes.size() <= 2 * shape.size());
      at::Tensor marks = torch::zeros(shape, torch::kInt);
      int64_t at = begin;
      for (const auto& box : boxes) {
        box_of(marks, box).add_(1);
        // Contiguous in the tensor: the box's elements are the next box.numel() flat positions.
        const auto flat_positions = box_of(torch::arange(numel).view(shape), box).reshape(-1);
        CHECK(torch::equal(flat_positions, torch::arange(at, at + box.numel())));
        at += box.numel();
      }
      at::Tensor expected = torch::zeros({numel}, torch::kInt);
      expected.narrow(0, begin, length).fill_(1);
      CHECK(torch::equal(marks.reshape(-1), expected));
    }
  }
  CHECK(dcp::flat_range_boxes({}, 0, 1).size() == 1);  // a 0-d tensor: one box of no dimensions
}

TEST_CASE("the .metadata pickle reads back what was written", "[checkpoint][dcp]") {
  dcp::Metadata metadata;
  dcp::Item weight;
  weight.kind = dcp::Item::Kind::Tensor;
  weight.dtype = "BFloat16";
  weight.size = {33, 16};
  weight.path = {{"optimizer", -1}, {"state", -1}, {"fc1.weight", -1}, {"exp_avg", -1}};
  weight.chunks = dcp::flat_range_boxes(weight.size, 100, 300);
  for (size_t i = 0; i < weight.chunks.size(); ++i) weight.locations.push_back({"__1_0.distcp", 4096 * i, 4000});
  metadata.add("optimizer.state.fc1.weight.exp_avg", weight);
  dcp::Item lr;
  lr.path = {{"optimizer", -1}, {"param_groups", -1}, {"", 0}, {"lr", -1}};
  lr.locations.push_back({"__0_0.distcp", uint64_t{1} << 33, 1261});
  metadata.add("optimizer.param_groups.0.lr", lr);
  const dcp::Metadata back = dcp::parse_metadata(dcp::write_metadata(metadata), "test");
  REQUIRE(back.order == metadata.order);
  const auto& w = back.items.at("optimizer.state.fc1.weight.exp_avg");
  CHECK(w.kind == dcp::Item::Kind::Tensor);
  CHECK(w.dtype == "BFloat16");
  CHECK(w.size == weight.size);
  CHECK((w.chunks == weight.chunks));
  CHECK(w.locations[1].offset == 4096);
  CHECK(dcp::flat_key(w.path) == "optimizer.state.fc1.weight.exp_avg");
  const auto& l = back.items.at("optimizer.param_groups.0.lr");
  CHECK(l.kind == dcp::Item::Kind::Bytes);
  CHECK(l.path[2].index == 0);
  CHECK(l.locations[0].offset == uint64_t{1} << 33);
  CHECK_THROWS_WITH(dcp::parse_metadata(lf::archive_bytes(c10::IValue(int64_t{3})), "Checkpoint X/.metadata"),
                    Contains("Checkpoint X/.metadata"));
}

TEST_CASE("a nested state flattens as Python's checkpoint flattens it and back", "[checkpoint][dcp]") {
  lf::StateDict group = lf::make_state_dict();
  group.insert("lr", 0.01);
  group.insert("params", c10::List<int64_t>({0, 1}));  // a plain list: one leaf
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);  // a list of dicts: by index
  lf::StateDict optimizer = lf::make_state_dict();
  optimizer.insert("param_groups", groups);
  lf::StateDict state = lf::make_state_dict();
  state.insert("optimizer", optimizer);
  state.insert("weights", torch::ones({2}));
  const auto leaves = dcp::flatten_state(state);
  std::vector<std::string> keys;
  for (const auto& leaf : leaves) keys.push_back(dcp::flat_key(leaf.path));
  CHECK(keys == std::vector<std::string>{"optimizer.param_groups.0.lr", "optimizer.param_groups.0.params", "weights"});
  const lf::StateDict back = dcp::unflatten_state(leaves);
  const auto back_group = back.at("optimizer").toGenericDict().at("param_groups").toList().get(0).toGenericDict();
  CHECK(back_group.at("lr").toDouble() == 0.01);
  CHECK(back_group.at("params").toList().size() == 2);
  CHECK(torch::equal(back.at("weights").toTensor(), torch::ones({2})));
}

TEST_CASE("chunks that are not flat ranges are read in part and consolidated whole", "[checkpoint][dcp]") {
  const at::Tensor whole = torch::arange(24, torch::kFloat).view({4, 6});
  const fs::path folder = scratch("columns");
  write_column_folder(folder, whole, false);
  dcp::FolderReader reader(folder);
  CHECK(torch::equal(reader.flat_range("model.w", 5, 11), whole.reshape(-1).narrow(0, 5, 11)));
  CHECK(torch::equal(reader.value("model.w").toTensor(), whole));
  CHECK(reader.value("step").toInt() == 7);
  const auto summary = lf::consolidate_sharded_folder(folder, scratch("columns.pt"));
  CHECK(summary.tensors == 1);
  const auto merged = lf::load_state_dict_file(scratch("columns.pt"));
  CHECK(torch::equal(merged.at("model").toGenericDict().at("w").toTensor(), whole));
  CHECK(merged.at("step").toInt() == 7);

  const fs::path incomplete = scratch("half");
  write_column_folder(incomplete, whole, true);
  dcp::FolderReader half(incomplete);
  CHECK(torch::equal(half.flat_range("model.w", 6, 3), whole.reshape(-1).narrow(0, 6, 3)));  // row 1, left half
  CHECK_THROWS_WITH(half.flat_range("model.w", 0, 24), Contains("cover 12 of the 24 elements"));
  CHECK_THROWS_WITH(lf::consolidate_sharded_folder(incomplete, scratch("half.pt")), Contains("hold 12 of its 24 elements"));
  CHECK_FALSE(fs::exists(scratch("half.pt")));
}

TEST_CASE("flat ranges of boxes (fsdp over tensor-parallel slices) are written and read under any placement",
          "[checkpoint][dcp]") {
  // A 4 x 6 tensor split into column halves (tensor rank t) whose flattened halves are split again
  // in two uneven flat ranges (data rank d): four ranks, four parts, as a (2, 2) mesh saves them.
  const at::Tensor whole = torch::arange(24, torch::kFloat).view({4, 6});
  const fs::path folder = scratch("two_d");
  fs::create_directories(folder);
  std::vector<dcp::Metadata> parts;
  for (int t = 0; t < 2; ++t) {
    for (int d = 0; d < 2; ++d) {
      lf::Placement placement = lf::Placement::whole({4, 6});
      placement.box = dcp::Box{{0, 3 * t}, {4, 3}};
      placement.flat = lf::ShardSlice{d == 0 ? 0 : 7, d == 0 ? 7 : 5};
      const at::Tensor value = lf::part_of_whole(whole, placement, "model/w");
      CHECK(value.sizes() == c10::IntArrayRef({placement.flat->length}));
      at::Tensor rebuilt = torch::zeros({4, 6});
      lf::place_into_whole(rebuilt, placement, value);
      CHECK(torch::equal(lf::part_of_whole(rebuilt, placement, "model/w"), value));
      parts.push_back(dcp::write_rank_items(folder, dcp::data_file_name(2 * t + d), {dcp::SaveItem{{{"model", -1}, {"w", -1}}, value, placement}}));
    }
  }
  const dcp::Metadata merged = dcp::merge_metadata(parts);
  CHECK(merged.items.at("model.w").size == std::vector<int64_t>{4, 6});
  lf::write_file_atomically(folder / dcp::kMetadataFile, dcp::write_metadata(merged));
  dcp::FolderReader reader(folder);
  CHECK(torch::equal(reader.value("model.w").toTensor(), whole));
  // Read back as row halves (a tensor split along the other dimension) and as a flat range of one.
  lf::Placement rows = lf::Placement::whole({4, 6});
  rows.box = dcp::Box{{2, 0}, {2, 6}};
  CHECK(torch::equal(reader.part("model.w", rows), whole.narrow(0, 2, 2)));
  rows.flat = lf::ShardSlice{4, 5};
  CHECK(torch::equal(reader.part("model.w", rows), whole.narrow(0, 2, 2).reshape(-1).narrow(0, 4, 5)));
  CHECK_THROWS_WITH(lf::part_of_whole(torch::zeros({6, 4}), rows, "model/w"),
                    Contains("'model/w' has shape [6, 4] in the checkpoint, but this model's tensor is [4, 6] whole"));
}
