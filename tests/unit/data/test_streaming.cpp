// Streaming datasets: LitData's random numbers and chunk assignment, the writer and the reader
// both ways with every bad input they refuse, and the loader's resume rule across world sizes.
// Python's litdata is the reference in tests/integration/litdata_interop.sh.
#include <ATen/ATen.h>

#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "lightning/fabric/data/litdata_format.h"
#include "lightning/fabric/data/litdata_order.h"
#include "lightning/fabric/data/streaming_dataset.h"
#include "lightning/fabric/data/streaming_loader.h"
#include "lightning/fabric/data/streaming_writer.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/fabric.h"
#include "lightning/fabric/utilities/env_vars.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace dd = lightning::fabric::data_detail;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char name[] = "/tmp/lf-streaming-XXXXXX";
    path = mkdtemp(name);
  }
  ~TempDir() { fs::remove_all(path); }
};

c10::IValue id_item(int64_t i) { return c10::ivalue::Tuple::create({i, at::full({2}, static_cast<double>(i), at::kFloat)}); }

void write_ids(const fs::path& dir, int64_t items, int64_t chunk_size) {
  lf::StreamingWriter writer(dir, lf::StreamingWriterOptions().chunk_size(chunk_size));
  for (int64_t i = 0; i < items; ++i) writer.add(id_item(i));
  writer.finish();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// Every sample id a set of loaders (one per rank) yields in one pass.
std::vector<int64_t> take(lf::StreamingDataLoader& loader, int64_t limit = -1) {
  std::vector<int64_t> ids;
  int64_t batches = 0;
  for (auto& batch : loader) {
    ids.insert(ids.end(), batch.indices.begin(), batch.indices.end());
    if (++batches == limit) break;
  }
  return ids;
}

}  // namespace

TEST_CASE("NumPy's legacy RandomState, seeded with a list, is reproduced bit for bit", "[streaming]") {
  dd::NumpyRandomState rng({0x123, 0x234, 0x345, 0x456});
  CHECK(rng.next_uint32() == 1067595299u);
  CHECK(rng.next_uint32() == 955945823u);
  CHECK(rng.next_uint32() == 477289528u);
  auto permutation = [](std::vector<uint32_t> key, int n) {
    std::vector<int> values(n);
    for (int i = 0; i < n; ++i) values[i] = i;
    dd::NumpyRandomState(key).shuffle(values);
    return values;
  };
  // numpy.random.RandomState(key).permutation(n)
  CHECK(permutation({42, 1}, 10) == std::vector<int>{3, 1, 2, 9, 5, 0, 6, 8, 7, 4});
  CHECK(permutation({42, 2}, 10) == std::vector<int>{6, 3, 1, 7, 2, 5, 8, 9, 4, 0});
  CHECK(permutation({7}, 5) == std::vector<int>{1, 3, 2, 4, 0});
  CHECK(permutation({0xffffffffu, 0}, 8) == std::vector<int>{5, 3, 6, 7, 1, 0, 4, 2});
}

TEST_CASE("Items in a chunk are shuffled in aligned blocks as litdata's _block_shuffle", "[streaming]") {
  dd::OrderSpec spec;
  spec.shuffle = true;
  spec.seed = 42;
  spec.epoch = 1;
  // _block_shuffle(range(n), 256, RandomState([42, 10, 1, 3])): 10 chunks, epoch 1, chunk 3.
  dd::ChunkPiece small{3, 0, 0, 10, 10};
  CHECK(dd::piece_items(small, 10, spec) == std::vector<int64_t>{5, 4, 2, 7, 0, 1, 6, 9, 3, 8});
  dd::ChunkPiece large{3, 0, 0, 600, 600};
  const auto items = dd::piece_items(large, 10, spec);
  CHECK(std::vector<int64_t>(items.begin(), items.begin() + 8) == std::vector<int64_t>{60, 220, 151, 0, 32, 19, 175, 54});
}

TEST_CASE("Chunks are split over workers by litdata's quotas", "[streaming]") {
  // One rank, two workers, batches of 4, chunks of 10, 10 and 5 items: quotas 13 and 12.
  dd::OrderSpec spec;
  spec.num_workers = 2;
  spec.batch_size = 4;
  const auto pieces = dd::assign_pieces({10, 10, 5}, spec);
  REQUIRE(pieces.size() == 2);
  REQUIRE(pieces[0].size() == 2);
  CHECK(pieces[0][0].roi_start == 0);
  CHECK(pieces[0][0].roi_end == 10);
  CHECK(pieces[0][1].roi_start == 10);
  CHECK(pieces[0][1].roi_end == 13);
  REQUIRE(pieces[1].size() == 2);
  CHECK(pieces[1][0].roi_start == 13);
  CHECK(pieces[1][0].roi_end == 20);
  CHECK(pieces[1][1].roi_end == 25);
  // The batches alternate between the workers, the last ones short.
  const auto batches = dd::rank_batches({10, 10, 5}, spec, 0);
  REQUIRE(batches.size() == 7);  // worker 0: 4 + 4 + 4 + 1 items, worker 1: 4 + 4 + 4
  CHECK(batches[0] == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(batches[1] == std::vector<int64_t>{13, 14, 15, 16});
  CHECK(batches[5] == std::vector<int64_t>{21, 22, 23, 24});
  CHECK(batches[6] == std::vector<int64_t>{12});
}

TEST_CASE("The writer's items read back as written, in every writable format", "[streaming]") {
  TempDir dir;
  const auto image = at::arange(3 * 4 * 5, at::kInt).remainder(256).to(at::kByte).reshape({3, 4, 5});
  {
    lf::StreamingWriter writer(dir.path / "data", lf::StreamingWriterOptions().chunk_bytes(300).formats(
        {"int", "float", "bool", "str", "bytes", "tensor", "no_header_tensor:18", "numpy", "no_header_numpy:9", "jpeg", "pickle"}));
    for (int64_t i = 0; i < 9; ++i) {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      dict.insert("z", i * 2.5);
      dict.insert("a", i % 2 == 1);
      writer.add(c10::ivalue::Tuple::create(
          {i, dict, "s" + std::to_string(i), std::string("\0\xff", 2), at::ones({2, 3}, at::kHalf) * i,
           at::arange(i + 1), at::full({2, 2}, i, at::kDouble), at::full({3}, i, at::kFloat), image, c10::IValue()}));
    }
    CHECK(writer.size() == 9);
    writer.finish();
    CHECK_THROWS_WITH(writer.add(id_item(0)), Contains("the writer is finished"));
  }
  lf::StreamingDataset dataset(dir.path / "data");
  REQUIRE(dataset.size() == 9);
  CHECK(dataset.chunk_sizes().size() > 1);  // chunk_bytes 300 splits them
  CHECK(dataset.data_format()[5] == "tensor");
  for (int64_t i = 0; i < 9; ++i) {
    const auto item = dataset.get(i);
    const auto& e = item.toTupleRef().elements();
    CHECK(e[0].toInt() == i);
    const auto dict = e[1].toGenericDict();
    CHECK(dict.begin()->key().toStringRef() == "z");  // written order, not sorted
    CHECK(dict.at("z").toDouble() == i * 2.5);
    CHECK(dict.at("a").toBool() == (i % 2 == 1));
    CHECK(e[2].toStringRef() == "s" + std::to_string(i));
    CHECK(e[3].toStringRef() == std::string("\0\xff", 2));
    CHECK(at::equal(e[4].toTensor(), at::ones({2, 3}, at::kHalf) * i));
    CHECK(at::equal(e[5].toTensor(), at::arange(i + 1)));
    CHECK(at::equal(e[6].toTensor(), at::full({2, 2}, i, at::kDouble)));
    CHECK(at::equal(e[7].toTensor(), at::full({3}, i, at::kFloat)));
    const at::Tensor decoded = e[8].toTensor();
    CHECK(decoded.sizes() == image.sizes());
    CHECK((decoded.to(at::kInt) - image.to(at::kInt)).abs().max().item<int>() <= 24);  // JPEG is lossy
    CHECK(e[9].isNone());
  }
  CHECK_THROWS_WITH(dataset.get(9), Contains("out of range; the dataset has 9 items"));
}

TEST_CASE("The writer refuses what it cannot write, and leaves nothing half written", "[streaming]") {
  TempDir dir;
  CHECK_THROWS_WITH(lf::StreamingWriter(dir.path / "a", {}), Contains("set exactly one of chunk_size"));
  {
    lf::StreamingWriter writer(dir.path / "b", lf::StreamingWriterOptions().chunk_size(2));
    writer.add(id_item(0));
    CHECK_THROWS_WITH(writer.add(c10::ivalue::Tuple::create({int64_t{1}})), Contains("the first item's was"));
    CHECK_THROWS_WITH(writer.add(c10::ivalue::Tuple::create({1.5, at::zeros({2})})), Contains("format 'int' takes an int"));
    writer.add(id_item(1));
    writer.add(id_item(2));  // one chunk written
    CHECK(fs::exists(dir.path / "b" / "chunk-0-0.bin"));
  }  // destroyed before finish: its chunks go, no index appears
  CHECK(fs::is_empty(dir.path / "b"));
  CHECK_THROWS_WITH(lf::StreamingDataset(dir.path / "b"), Contains("has no index.json"));
  write_ids(dir.path / "c", 3, 2);
  CHECK_THROWS_WITH(lf::StreamingWriter(dir.path / "c", lf::StreamingWriterOptions().chunk_size(2)),
                    Contains("already holds a dataset"));
  lf::StreamingWriter tuple_writer(dir.path / "d", lf::StreamingWriterOptions().chunk_size(2));
  c10::impl::GenericDict bad(c10::IntType::get(), c10::AnyType::get());
  bad.insert(int64_t{1}, int64_t{2});
  CHECK_THROWS_WITH(tuple_writer.add(bad), Contains("a dict key that is not a string"));
}

TEST_CASE("Several writers fill one folder; their indexes merge in rank order", "[streaming]") {
  TempDir dir;
  for (int rank : {1, 0}) {
    lf::StreamingWriter writer(dir.path, lf::StreamingWriterOptions().chunk_size(2).writer_rank(rank));
    for (int64_t i = 0; i < 3; ++i) writer.add(id_item(rank * 10 + i));
    writer.finish();
  }
  lf::StreamingDataset before_merge(dir.path);  // reads the parts itself
  CHECK(before_merge.size() == 6);
  lf::StreamingWriter::merge_index(dir.path);
  CHECK(fs::exists(dir.path / "index.json"));
  CHECK_FALSE(fs::exists(dir.path / "0.index.json"));
  lf::StreamingDataset dataset(dir.path);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < dataset.size(); ++i) ids.push_back(dataset.get(i).toTupleRef().elements()[0].toInt());
  CHECK(ids == std::vector<int64_t>{0, 1, 2, 10, 11, 12});
}

TEST_CASE("Damaged datasets are refused naming the file, the chunk and the fix", "[streaming]") {
  TempDir dir;
  const auto data = dir.path / "data";
  auto fresh = [&] {
    fs::remove_all(data);
    write_ids(data, 10, 4);
  };
  fresh();
  fs::remove(data / "chunk-0-1.bin");
  CHECK_THROWS_WITH(lf::StreamingDataset(data), Contains("chunk chunk-0-1.bin listed in index.json is missing"));

  fresh();
  fs::resize_file(data / "chunk-0-2.bin", 10);
  CHECK_THROWS_WITH(lf::StreamingDataset(data), Contains("chunk chunk-0-2.bin has 10 bytes, index.json says"));

  fresh();
  std::string index = read_text(data / "index.json");
  index.replace(index.find("\"chunk_size\": 4"), 15, "\"chunk_size\": 3");
  write_text(data / "index.json", index);
  {
    lf::StreamingDataset dataset(data);
    CHECK_THROWS_WITH(dataset.get(0), Contains("its header counts 4 items, index.json says 3 (the index does not match the chunk)"));
  }

  fresh();
  index = read_text(data / "index.json");
  index.replace(index.find("\"int\""), 5, "\"audio:wav\"");
  write_text(data / "index.json", index);
  CHECK_THROWS_WITH(lf::StreamingDataset(data), Contains("leaf format 'audio:wav' is not readable here"));

  fresh();
  write_text(data / "index.json", read_text(data / "index.json").substr(0, 40));
  CHECK_THROWS_WITH(lf::StreamingDataset(data), Contains("index.json is not valid JSON"));

  fresh();
  {  // a chunk whose items are in an Arrow table (litdata with pyarrow)
    std::ofstream chunk(data / "chunk-0-0.bin", std::ios::app | std::ios::binary);
    chunk.write("LDARW01\0", 8);
  }
  {
    lf::StreamingDataset dataset(data);
    CHECK_THROWS_WITH(dataset.get(0), Contains("keeps its items in an Arrow table"));
    CHECK(dataset.get(5).toTupleRef().elements()[0].toInt() == 5);  // other chunks still read
  }

  fresh();
  index = read_text(data / "index.json");
  index.replace(index.find("\"compression\": null"), 19, "\"compression\": \"zstd\"");
  write_text(data / "index.json", index);
  {  // the index says whole-file zstd, the chunks are plain
    lf::StreamingDataset dataset(data);
    CHECK_THROWS_WITH(dataset.get(0), Contains("chunk-0-0.bin is damaged: it does not inflate as index.json's compression says"));
  }

  fresh();
  {  // a flipped offset inside a chunk
    std::fstream chunk(data / "chunk-0-0.bin", std::ios::in | std::ios::out | std::ios::binary);
    chunk.seekp(4);
    const uint32_t bad = 7;
    chunk.write(reinterpret_cast<const char*>(&bad), 4);
  }
  {
    lf::StreamingDataset dataset(data);
    CHECK_THROWS_WITH(dataset.get(1), Contains("chunk-0-0.bin is damaged: its offset table points outside the file"));
  }
}

TEST_CASE("A loader's position resumes exactly, across world sizes, twice in one epoch", "[streaming]") {
  TempDir dir;
  write_ids(dir.path, 101, 7);
  lf::StreamingDataset dataset(dir.path);
  auto options = [](int world, int rank) {
    return lf::StreamingLoaderOptions().batch_size(3).shuffle(true).num_workers(2).world_size(world).rank(rank);
  };
  // 2 ranks take 4 batches each, then the job moves to 3 ranks, which take 2 each, then to 1.
  std::multiset<int64_t> seen;
  lf::StateDict state = lf::make_state_dict();
  for (int rank = 0; rank < 2; ++rank) {
    lf::StreamingDataLoader loader(dataset, options(2, rank));
    for (int64_t id : take(loader, 4)) seen.insert(id);
    if (rank == 0) state = loader.state_dict();
  }
  CHECK(state.at("num_samples_yielded").toInt() == 12);
  lf::StateDict second = lf::make_state_dict();
  for (int rank = 0; rank < 3; ++rank) {
    lf::StreamingDataLoader loader(dataset, options(3, rank));
    loader.load_state_dict(state);
    CHECK(loader.epoch() == 1);
    for (int64_t id : take(loader, 2)) seen.insert(id);
    if (rank == 0) second = loader.state_dict();
  }
  lf::StreamingDataLoader last(dataset, options(1, 0).drop_last(false));
  last.load_state_dict(second);
  for (int64_t id : take(last)) seen.insert(id);
  for (int64_t id : seen) CHECK(seen.count(id) == 1);
  // 2 ranks serve 96 of 101 (whole rounds of 2 x 3); 1 rank then takes all that is left.
  CHECK(seen.size() == 96);
  // The pass finished: saved now, a loader resumes at the next epoch.
  lf::StreamingDataLoader next(dataset, options(1, 0));
  next.load_state_dict(last.state_dict());
  CHECK(next.epoch() == 2);
}

TEST_CASE("The same topology resumes with the very batches an uninterrupted loader takes", "[streaming]") {
  TempDir dir;
  write_ids(dir.path, 50, 6);
  lf::StreamingDataset dataset(dir.path);
  const auto options = lf::StreamingLoaderOptions().batch_size(4).shuffle(true).threads(3).prefetch_batches(2);
  lf::StreamingDataLoader whole(dataset, options);
  const auto all = take(whole);
  CHECK(all.size() == 50);
  CHECK(std::set<int64_t>(all.begin(), all.end()).size() == 50);
  lf::StreamingDataLoader first(dataset, options);
  auto ids = take(first, 5);
  lf::StreamingDataLoader resumed(dataset, options);
  resumed.load_state_dict(first.state_dict());
  const auto rest = take(resumed);
  ids.insert(ids.end(), rest.begin(), rest.end());
  CHECK(ids == all);
  CHECK(resumed.batches_taken() == 13);
  // The next pass is epoch 2, in another order; set_epoch(1) reads epoch 1 again.
  CHECK(take(whole) != all);
  whole.set_epoch(1);
  CHECK(take(whole) == all);
}

TEST_CASE("The loader refuses bad options and checkpoints of another dataset or order", "[streaming]") {
  TempDir dir;
  write_ids(dir.path / "a", 20, 5);
  write_ids(dir.path / "b", 21, 5);
  lf::StreamingDataset a(dir.path / "a"), b(dir.path / "b");
  CHECK_THROWS_WITH(lf::StreamingDataLoader(a, lf::StreamingLoaderOptions().batch_size(0)), Contains("batch_size must be 1 or more"));
  CHECK_THROWS_WITH(lf::StreamingDataLoader(a, lf::StreamingLoaderOptions().seed(-1)), Contains("seed must be in [0, 2^32 - 1]"));
  CHECK_THROWS_WITH(lf::StreamingDataLoader(a, lf::StreamingLoaderOptions().world_size(2).rank(2)),
                    Contains("rank 2 of world size 2 is out of range"));
  CHECK_THROWS_WITH(lf::StreamingDataLoader(a, lf::StreamingLoaderOptions().pin_memory(true)), Contains("pin_memory(true) needs a CUDA device"));
  lf::StreamingDataLoader loader_a(a, lf::StreamingLoaderOptions().shuffle(true));
  take(loader_a, 2);
  lf::StreamingDataLoader loader_b(b, lf::StreamingLoaderOptions().shuffle(true));
  CHECK_THROWS_WITH(loader_b.load_state_dict(loader_a.state_dict()),
                    Contains("dataset_items=20, this one has dataset_items=21; the checkpoint was saved while reading another dataset"));
  lf::StreamingDataLoader unshuffled(a, lf::StreamingLoaderOptions());
  CHECK_THROWS_WITH(unshuffled.load_state_dict(loader_a.state_dict()), Contains("shuffle=True, this one has shuffle=False"));
  CHECK_THROWS_WITH(unshuffled.load_state_dict(lf::make_state_dict()), Contains("the entry lacks \"state_version\""));
}

TEST_CASE("collate_items stacks like Python's default_collate and names what differs", "[streaming]") {
  auto item = [](int64_t i, int64_t size) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("x", at::zeros({size}));
    dict.insert("label", i);
    dict.insert("name", std::string("n"));
    return c10::ivalue::Tuple::create({c10::IValue(dict), 0.5});
  };
  const auto batch = lf::collate_items({item(1, 2), item(2, 2)});
  const auto dict = batch.toTupleRef().elements()[0].toGenericDict();
  CHECK(dict.at("x").toTensor().sizes() == at::IntArrayRef{2, 2});
  CHECK(at::equal(dict.at("label").toTensor(), at::tensor({int64_t{1}, int64_t{2}})));
  CHECK(dict.at("name").toListRef().size() == 2);
  CHECK(batch.toTupleRef().elements()[1].toTensor().scalar_type() == at::kDouble);
  CHECK_THROWS_WITH(lf::collate_items({item(1, 2), item(2, 3)}), Contains("item 1 has a tensor of shape [3] at [0][\"x\"]"));
}

TEST_CASE("A loaded position wins over set_epoch; a set_epoch after a finished pass is saved", "[streaming]") {
  TempDir dir;
  write_ids(dir.path, 30, 4);
  lf::StreamingDataset dataset(dir.path);
  const auto options = lf::StreamingLoaderOptions().batch_size(3).shuffle(true);
  lf::StreamingDataLoader first(dataset, options);
  auto ids = take(first, 4);
  lf::StreamingDataLoader resumed(dataset, options);
  resumed.load_state_dict(first.state_dict());
  resumed.set_epoch(1);  // the usual loop calls it: the saved position still wins
  CHECK(resumed.epoch() == 1);
  const auto rest = take(resumed);
  ids.insert(ids.end(), rest.begin(), rest.end());
  CHECK(std::set<int64_t>(ids.begin(), ids.end()).size() == 30);
  CHECK(ids.size() == 30);
  resumed.set_epoch(5);  // after a finished pass: what a save now records
  lf::StreamingDataLoader later(dataset, options);
  later.load_state_dict(resumed.state_dict());
  CHECK(later.epoch() == 5);
}

TEST_CASE("fabric.setup_dataloaders sets the data share and refuses other ranks or a begun pass", "[streaming]") {
  TempDir dir;
  write_ids(dir.path, 30, 4);
  lf::StreamingDataset dataset(dir.path);
  // The environment of rank 1 of 2 (as lightning-run sets it); the Fabric of this process is one rank.
  setenv("WORLD_SIZE", "2", 1), setenv("RANK", "1", 1);
  lf::StreamingDataLoader loader(dataset, lf::StreamingLoaderOptions().batch_size(3));
  unsetenv("WORLD_SIZE"), unsetenv("RANK");
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu"), lf::env::map_env({}));
  fabric.setup_dataloaders(loader);  // the strategy's share: one rank, every sample
  CHECK(take(loader).size() == 30);
  CHECK(loader.batches_per_pass() == 10);  // no drop_last on one rank
  CHECK_THROWS_WITH(fabric.setup_dataloaders(loader), Contains("has begun a pass"));
  lf::StreamingDataLoader pinned_ranks(dataset, lf::StreamingLoaderOptions().world_size(2).rank(1));
  CHECK_THROWS_WITH(fabric.setup_dataloaders(pinned_ranks),
                    Contains("fabric.setup_dataloaders") && Contains("world_size 2 and rank 1") &&
                        Contains("data ranks are 1 with this rank 0") && Contains("Leave world_size and rank unset"));
}

TEST_CASE("A pass whose batch failed to read raises, then refuses to go on instead of hanging", "[streaming]") {
  TempDir dir;
  write_ids(dir.path, 10, 4);
  {  // the second chunk (items 4 to 7) turns into one the reader refuses
    std::ofstream chunk(dir.path / "chunk-0-1.bin", std::ios::app | std::ios::binary);
    chunk.write("LDARW01\0", 8);
  }
  lf::StreamingDataset dataset(dir.path);
  lf::StreamingDataLoader loader(dataset, lf::StreamingLoaderOptions().batch_size(2));
  auto it = loader.begin();
  CHECK(it->indices == std::vector<int64_t>{0, 1});
  ++it;
  CHECK(it->indices == std::vector<int64_t>{2, 3});
  CHECK_THROWS_WITH(++it, Contains("chunk-0-1.bin keeps its items in an Arrow table"));
  CHECK_THROWS_WITH(++it, Contains("this pass was stopped"));
}

TEST_CASE("A first item the writer refuses leaves no formats behind; a damaged pil leaf is refused", "[streaming]") {
  TempDir dir;
  lf::StreamingWriter writer(dir.path / "w", lf::StreamingWriterOptions().chunk_size(4));
  CHECK_THROWS_WITH(writer.add(c10::ivalue::Tuple::create({int64_t{1}, c10::IValue(c10::Device(c10::kCPU))})),
                    Contains("has no LitData format"));
  writer.add(id_item(7));
  writer.finish();
  lf::StreamingDataset dataset(dir.path / "w");
  CHECK(dataset.data_format() == std::vector<std::string>{"int", "no_header_tensor:1"});
  CHECK(dataset.get(0).toTupleRef().elements()[0].toInt() == 7);
  // width 1, height 1, a mode length near 2^32: must not read past the leaf
  const uint32_t header[3] = {1, 1, 0xFFFFFFF8u};
  CHECK_THROWS_WITH(dd::decode_leaf("pil", reinterpret_cast<const uint8_t*>(header), sizeof(header)),
                    Contains("pil leaf is truncated"));
}

TEST_CASE("Whole-file zstd chunks are inflated while read, not kept for the dataset's life", "[streaming]") {
  TempDir dir;
  {  // 12 chunks of 16 items of 64 KiB: 1 MiB per chunk inflated
    lf::StreamingWriter writer(dir.path, lf::StreamingWriterOptions().chunk_size(16));
    for (int64_t i = 0; i < 192; ++i) writer.add(c10::ivalue::Tuple::create({i, at::full({16384}, static_cast<float>(i))}));
    writer.finish();
  }
  for (const auto& entry : fs::directory_iterator(dir.path)) {  // compress each chunk whole (compression_level "chunk")
    if (entry.path().extension() != ".bin") continue;
    const std::string plain = read_text(entry.path());
    const std::string packed = dd::zstd_deflate(reinterpret_cast<const uint8_t*>(plain.data()), plain.size(), 3);
    std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << packed;
  }
  std::string index = read_text(dir.path / "index.json");
  index.replace(index.find("\"compression\": null"), 19, "\"compression\": \"zstd\"");
  write_text(dir.path / "index.json", index);
  lf::StreamingDataset dataset(dir.path);
  REQUIRE(dataset.chunk_sizes().size() == 12);
  const auto in_use = [] { const struct mallinfo2 info = mallinfo2(); return static_cast<double>(info.uordblks + info.hblkhd); };
  const double before = in_use();
  double most = 0;
  for (int64_t i = 0; i < dataset.size(); ++i) {  // every item read back, chunk after chunk
    const auto fields = dataset.get(i).toTupleRef().elements();
    CHECK(fields[0].toInt() == i);
    CHECK(fields[1].toTensor().eq(static_cast<float>(i)).all().item<bool>());
    most = std::max(most, in_use() - before);
  }
  // At most the 4 most recent chunks inflated (4 MiB) and an item in hand; keeping all 12 would be 12 MiB.
  CHECK(most < 6.0 * (1 << 20));
  CHECK(dataset.get(3).toTupleRef().elements()[0].toInt() == 3);  // an evicted chunk inflates again
}

TEST_CASE("zstd-compressed chunks (litdata's frames of 256 items) read back, and damaged frames are named", "[streaming]") {
  TempDir dir;
  {
    lf::StreamingWriter writer(dir.path / "z", lf::StreamingWriterOptions().chunk_size(600).compression("zstd:3"));
    for (int64_t i = 0; i < 700; ++i) writer.add(id_item(i));
    writer.finish();
  }
  CHECK_THROWS_WITH(lf::StreamingWriter(dir.path / "bad", lf::StreamingWriterOptions().chunk_size(2).compression("gzip")),
                    Contains("compression \"gzip\" is not one LitData offers; use \"zstd\" or \"zstd:LEVEL\""));
  const std::string index = read_text(dir.path / "z" / "index.json");
  CHECK_THAT(index, Contains("\"compression\": \"zstd:3\"") && Contains("\"compression_level\": \"batch\""));
  {
    lf::StreamingDataset dataset(dir.path / "z");
    REQUIRE(dataset.size() == 700);
    for (int64_t i : {0, 255, 256, 599, 600, 699})  // frame edges, chunk edges
      CHECK(dataset.get(i).toTupleRef().elements()[0].toInt() == i);
    // Smaller than the plain chunks: 700 items of (int, 2 floats) are 20 bytes of payload each.
    CHECK(fs::file_size(dir.path / "z" / "chunk-0-0.bin") < 600 * 20);
  }
  {  // the second frame of the first chunk loses its zstd magic number
    std::fstream chunk(dir.path / "z" / "chunk-0-0.bin", std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff frame_table = 24 + 4 * 601, second_frame = frame_table + 24;
    uint64_t offset = 0;
    chunk.seekg(second_frame + 8);
    chunk.read(reinterpret_cast<char*>(&offset), 8);
    chunk.seekp(static_cast<std::streamoff>(offset));
    chunk.write("\xff\xff\xff\xff", 4);
  }
  lf::StreamingDataset dataset(dir.path / "z");
  CHECK(dataset.get(10).toTupleRef().elements()[0].toInt() == 10);  // the first frame still reads
  CHECK_THROWS_WITH(dataset.get(300), Contains("chunk-0-0.bin is damaged: frame 1"));
}
