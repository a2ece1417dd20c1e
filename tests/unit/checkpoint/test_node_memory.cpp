// The memory:// store (storage/node_memory.h) in one process: a NodeMemoryServer as lightning-run
// runs it, clients as workers use them, and the checkpoint calls through memory:// URLs.
#include <torch/torch.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lightning/fabric.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/storage/node_memory.h"
#include "lightning/fabric/utilities/env_vars.h"

#include <catch2/catch.hpp>

namespace lf = lightning::fabric;
namespace storage = lightning::fabric::storage;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
// LT_NODE_MEMORY and LT_NODE_MEMORY_STAGING pointing at `server` for the scope.
struct MemoryEnvironment {
  explicit MemoryEnvironment(const storage::NodeMemoryServer& server) {
    ::setenv(lf::env::kNodeMemory, server.address().c_str(), 1);
    ::setenv(lf::env::kNodeMemoryStaging, server.staging_folder().c_str(), 1);
  }
  ~MemoryEnvironment() {
    ::unsetenv(lf::env::kNodeMemory);
    ::unsetenv(lf::env::kNodeMemoryStaging);
  }
};
int64_t held_size(const storage::NodeMemoryClient& client, int number) {
  const std::string name = "snapshot-00000000000" + std::to_string(number);
  return static_cast<int64_t>(client.get(name).size());
}
}  // namespace

TEST_CASE("memory://: objects put by one client are read, listed, replaced and removed by another",
          "[checkpoint][memory]") {
  std::string staging;
  {
    storage::NodeMemoryServer server;
    staging = server.staging_folder();
    CHECK(fs::is_directory(staging));
    CHECK((fs::status(staging).permissions() & fs::perms::others_all) == fs::perms::none);
    storage::NodeMemoryClient writer(server.address(), "test");
    storage::NodeMemoryClient reader(server.address(), "test");
    std::string big(9 << 20, 'x');  // larger than a packet: the bytes travel as a descriptor
    big[12345] = 'y';
    writer.put("step-1/big", big);
    writer.put("step-1/.metadata", "m");
    writer.put("step-2", "");
    CHECK(reader.get("step-1/big") == big);
    CHECK(reader.get("step-2").empty());
    CHECK(server.bytes_held() == static_cast<int64_t>(big.size()) + 1);
    CHECK(reader.list_folder("step-1") == std::map<std::string, int64_t>{{".metadata", 1}, {"big", int64_t(big.size())}});
    CHECK(reader.list_folder("").size() == 3);
    CHECK(reader.exists("step-2"));
    CHECK_FALSE(reader.exists("step-1"));
    writer.put("step-2", "again");  // replaced whole
    CHECK(reader.get("step-2") == "again");
    // A file on disk is copied into memory; one in /dev/shm is handed over as it is.
    const fs::path disk = fs::temp_directory_path() / ("lf-node-memory-" + std::to_string(::getpid()));
    std::ofstream(disk) << "from disk";
    writer.put_file("file", disk);
    fs::remove(disk);
    CHECK(reader.get("file") == "from disk");
    const fs::path read_back = fs::temp_directory_path() / ("lf-node-memory-read-" + std::to_string(::getpid()));
    CHECK(reader.get_to_file("step-1/big", read_back) == static_cast<int64_t>(big.size()));
    CHECK(fs::file_size(read_back) == big.size());
    fs::remove(read_back);
    writer.remove("step-1/big");
    CHECK_THROWS_WITH(reader.get("step-1/big"), Contains("memory://step-1/big") && Contains("no such object"));
    writer.remove("never-there");  // removing a missing object is not an error, as on S3
    std::ofstream(fs::path(staging) / "left-by-a-killed-rank") << "x";
    server.clear_staging();
    CHECK(fs::is_empty(staging));
  }
  CHECK_FALSE(fs::exists(staging));  // the server's end removes its staging folder
}

TEST_CASE("memory://: a client whose server is gone, and a process without one, get clear errors",
          "[checkpoint][memory]") {
  std::unique_ptr<storage::NodeMemoryClient> client;
  std::string address;
  {
    storage::NodeMemoryServer server;
    address = server.address();
    client = std::make_unique<storage::NodeMemoryClient>(address, "fabric.save(memory://x)");
  }
  CHECK_THROWS_WITH(client->get("x"), Contains("memory://x") && Contains("stopped answering"));
  CHECK_THROWS_WITH(storage::NodeMemoryClient(address, "fabric.load(memory://x)"),
                    Contains("fabric.load(memory://x)") && Contains("cannot reach this node's lightning-run memory"));
  ::unsetenv(lf::env::kNodeMemory);
  CHECK_THROWS_AS(lf::save_state_dict_file("memory://x", lf::make_state_dict()), lf::ValueError);
  CHECK_THROWS_WITH(lf::save_state_dict_file("memory://x", lf::make_state_dict()),
                    Contains("fabric.save(memory://x)") && Contains("--in-memory-replicas") && Contains("LT_NODE_MEMORY"));
}

TEST_CASE("memory://: a checkpoint saved there loads back equal; snapshot() without the flag does nothing",
          "[checkpoint][memory]") {
  storage::NodeMemoryServer server;
  MemoryEnvironment environment(server);
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
  torch::manual_seed(3);
  torch::nn::Linear net(4, 3);
  torch::nn::Linear copy(4, 3);
  int64_t step = 7;
  fabric.save("memory://ck/one.ckpt", {{"model", net}, {"step", step}});
  lf::State restore{{"model", copy}, {"step", int64_t{0}}};
  fabric.load("memory://ck/one.ckpt", restore);
  CHECK(restore.at("step").to<int64_t>() == 7);
  CHECK(torch::equal(copy->weight, net->weight));
  // Without LT_IN_MEMORY_REPLICAS (lightning-run --in-memory-replicas) snapshots are off.
  lf::State state{{"model", net}};
  CHECK_FALSE(fabric.snapshot(state));
  CHECK_FALSE(fabric.restore_snapshot(state));
  CHECK(server.bytes_held() > 0);
}

TEST_CASE("snapshot: every K-th call takes one, the newest whole one kept while it is written; restore_snapshot brings back the newest, generators included",
          "[checkpoint][memory]") {
  storage::NodeMemoryServer server;
  MemoryEnvironment environment(server);
  ::setenv(lf::env::kInMemoryReplicas, "2", 1);
  torch::nn::Linear net(4, 3);
  {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
    fabric.seed_everything(5);
    int64_t step = 0;
    lf::State state{{"model", net}, {"step", step}};
    lf::State restored = state;
    CHECK_FALSE(fabric.restore_snapshot(restored));  // a first start: nothing to restore
    for (step = 1; step <= 5; ++step) {
      state.at("step").set_value(step);
      CHECK(fabric.snapshot(state) == (step % 2 == 0));
    }
    fabric.wait_for_background_save();
    // The fourth call's snapshot, and the second's, kept until the fourth was whole.
    storage::NodeMemoryClient client(server.address(), "test");
    CHECK(client.list_folder("") == std::map<std::string, int64_t>{{"snapshot-000000000002", held_size(client, 2)},
                                                                   {"snapshot-000000000004", held_size(client, 4)}});
    fabric.snapshot(state);  // the sixth call drops the second's
    fabric.wait_for_background_save();
    const auto held = client.list_folder("");
    CHECK(held.size() == 2);
    CHECK(held.count("snapshot-000000000004") == 1);
    CHECK(held.count("snapshot-000000000006") == 1);
    client.remove("snapshot-000000000006");  // the newest whole one is then the fourth:
    client.put("snapshot-000000000008/__0_0.distcp", "a part of one that never finished (no .metadata)");
  }
  const torch::Tensor expected_draw = [] {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
    fabric.seed_everything(5);
    return torch::rand({3});  // what the generator gave after the snapshot was taken
  }();
  lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
  torch::manual_seed(99);
  torch::nn::Linear fresh(4, 3);
  lf::State state{{"model", fresh}, {"step", int64_t{0}}};
  REQUIRE(fabric.restore_snapshot(state));
  CHECK(state.at("step").to<int64_t>() == 4);
  CHECK(fabric.snapshot_number() == 4);
  CHECK(torch::equal(fresh->weight, net->weight));
  CHECK(torch::equal(torch::rand({3}), expected_draw));
  CHECK_FALSE(fabric.snapshot(state));  // the fifth call
  CHECK(fabric.snapshot(state));        // the sixth
  fabric.wait_for_background_save();
  ::unsetenv(lf::env::kInMemoryReplicas);
}
