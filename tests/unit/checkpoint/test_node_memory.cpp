// The memory:// store (storage/node_memory.h) in one process: a NodeMemoryServer as lightning-run
// runs it, clients as workers use them, and the checkpoint calls through memory:// URLs.
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
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

// A node lost in the middle of a copy, as its buddy sees it: a connection to `port` that greets
// with `token`, starts copying `key` (`declared` bytes), sends only `sent` of them and closes.
// Returns once the buddy has closed its end too, so it has handled the torn copy.
void send_torn_copy(int port, const std::string& token, const std::string& key, uint64_t declared, size_t sent) {
  const int socket = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  // A request: op, key length (4 bytes), payload length (8 bytes), little-endian; the key; the payload.
  auto request = [&](char op, const std::string& name, uint64_t payload) {
    std::string header(13, '\0');
    header[0] = op;
    for (int i = 0; i < 4; ++i) header[1 + i] = static_cast<char>((name.size() >> (8 * i)) & 0xff);
    for (int i = 0; i < 8; ++i) header[5 + i] = static_cast<char>((payload >> (8 * i)) & 0xff);
    const std::string bytes = header + name;
    REQUIRE(::send(socket, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  };
  request('H', token, 0);
  request('C', key, declared);
  const std::string part(sent, 'p');
  REQUIRE(::send(socket, part.data(), part.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(part.size()));
  ::shutdown(socket, SHUT_WR);
  char ignored[64];
  while (::recv(socket, ignored, sizeof(ignored), 0) > 0) {
  }
  ::close(socket);
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
    // ("snapshots-began": a whole snapshot was held once, so none whole later means one was lost.)
    CHECK(client.list_folder("") == std::map<std::string, int64_t>{{"snapshot-000000000002", held_size(client, 2)},
                                                                   {"snapshot-000000000004", held_size(client, 4)},
                                                                   {"snapshots-began", 1}});
    fabric.snapshot(state);  // the sixth call drops the second's
    fabric.wait_for_background_save();
    const auto held = client.list_folder("");
    CHECK(held.size() == 3);
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

TEST_CASE("memory:// across nodes: each server copies its objects to its buddy, and reads reach every node",
          "[checkpoint][memory]") {
  // Three nodes' servers in one process, on 127.0.0.1: node k's buddy is node k + 1 (wrapping).
  std::vector<std::unique_ptr<storage::NodeMemoryServer>> nodes;
  std::vector<std::string> endpoints;
  for (int k = 0; k < 3; ++k) {
    nodes.push_back(std::make_unique<storage::NodeMemoryServer>());
    endpoints.push_back("127.0.0.1:" + std::to_string(nodes.back()->listen_for_peers("job-token")));
  }
  for (int k = 0; k < 3; ++k) nodes[static_cast<size_t>(k)]->set_peers(k, endpoints);
  std::vector<std::unique_ptr<storage::NodeMemoryClient>> workers;
  for (auto& node : nodes) workers.push_back(std::make_unique<storage::NodeMemoryClient>(node->address(), "test"));

  const std::string big(3 << 20, 'b');
  workers[2]->put("snapshot-000000000001/__2_0.distcp", big);
  workers[0]->put("snapshot-000000000001/.metadata", "m");
  for (auto& worker : workers) worker->wait_until_copied(30);
  // Node 2's object is on node 2 and, copied, on node 0 only.
  CHECK(nodes[2]->bytes_held() == static_cast<int64_t>(big.size()));
  CHECK(nodes[0]->copied_bytes_held() == static_cast<int64_t>(big.size()));
  CHECK(nodes[1]->copied_bytes_held() == 1);  // node 0's .metadata
  // Node 1 holds neither of node 2's copies, yet reads and lists them through the others.
  CHECK(workers[1]->list_folder("snapshot-000000000001") ==
        std::map<std::string, int64_t>{{".metadata", 1}, {"__2_0.distcp", int64_t(big.size())}});
  CHECK(workers[1]->exists("snapshot-000000000001/__2_0.distcp"));
  CHECK(workers[1]->get("snapshot-000000000001/__2_0.distcp") == big);

  // Node 2 is lost: its object survives on its buddy, and node 1 still reads it.
  nodes[2].reset();
  workers[2].reset();
  CHECK(workers[1]->get("snapshot-000000000001/__2_0.distcp") == big);
  CHECK(workers[0]->list_folder("snapshot-000000000001").size() == 2);
  CHECK_FALSE(workers[1]->exists("snapshot-000000000001/never-put"));
  CHECK_THROWS_WITH(workers[1]->get("snapshot-000000000001/never-put"), Contains("no such object in the memory of any node"));

  // The next attempt: the two that remain, node 1 now node 0's buddy (it gets what node 0 holds).
  const std::vector<std::string> remaining{endpoints[0], endpoints[1]};
  nodes[0]->set_peers(0, remaining);
  nodes[1]->set_peers(1, remaining);
  workers[0]->wait_until_copied(30);
  CHECK(nodes[1]->copied_bytes_held() >= 1);
  // Dropping before snapshot 2 keeps 2 and what is under it, on both, own and copies.
  workers[0]->put("snapshot-000000000002/.metadata", "n");
  workers[0]->wait_until_copied(30);
  for (int k = 0; k < 2; ++k) workers[static_cast<size_t>(k)]->drop_before("snapshot-", "snapshot-000000000002");
  CHECK(workers[1]->list_folder("") == std::map<std::string, int64_t>{{"snapshot-000000000002/.metadata", 1}});

  // A server given another job's token answers nothing: its copies fail, and it waits no longer.
  storage::NodeMemoryServer stranger;
  stranger.listen_for_peers("another-job");
  stranger.set_peers(0, {"127.0.0.1:1", endpoints[0]});
  storage::NodeMemoryClient stranger_worker(stranger.address(), "test");
  stranger_worker.put("x", "y");  // to node 0, under the wrong token
  CHECK_THROWS_WITH(stranger_worker.wait_until_copied(30), Contains("copying x to the buddy node failed"));
  CHECK_FALSE(workers[0]->exists("x"));

  // A node lost in the middle of a copy leaves nothing of that object at its buddy: no torn object
  // is ever held, listed or read; the buddy keeps what it held and goes on serving.
  const int64_t copies_before = nodes[0]->copied_bytes_held();
  const int node0_port = std::stoi(endpoints[0].substr(endpoints[0].rfind(':') + 1));
  send_torn_copy(node0_port, "job-token", "snapshot-000000000003/__7_0.distcp", 1 << 20, 64 << 10);
  CHECK(nodes[0]->copied_bytes_held() == copies_before);
  CHECK_FALSE(workers[1]->exists("snapshot-000000000003/__7_0.distcp"));
  CHECK(workers[1]->list_folder("snapshot-000000000003").empty());
  workers[1]->put("snapshot-000000000003/.metadata", "o");
  workers[1]->wait_until_copied(30);
  CHECK(workers[0]->get("snapshot-000000000003/.metadata") == "o");
}

TEST_CASE("restore_snapshot: snapshots taken but none left whole is an error naming it, or the fallback checkpoint",
          "[checkpoint][memory]") {
  storage::NodeMemoryServer server;
  MemoryEnvironment environment(server);
  ::setenv(lf::env::kInMemoryReplicas, "1", 1);
  const fs::path disk = fs::temp_directory_path() / ("lf-snapshot-fallback-" + std::to_string(::getpid()) + ".ckpt");
  torch::nn::Linear net(4, 3);
  {
    lf::Fabric fabric(lf::FabricOptions().accelerator("cpu").devices(1));
    lf::State state{{"model", net}, {"step", int64_t{7}}};
    fabric.save(disk, state);
    fabric.snapshot(state);
    fabric.snapshot(state);  // the first is whole and copied: snapshots began
    fabric.wait_for_background_save();
  }
  storage::NodeMemoryClient client(server.address(), "test");
  for (const auto& [key, size] : client.list_folder(""))
    if (key.rfind("snapshot-", 0) == 0) client.remove(key);  // every copy lost
  client.put("snapshot-000000000003/__0_0.distcp", "a part whose .metadata never came");
  lf::Fabric restarted(lf::FabricOptions().accelerator("cpu").devices(1));
  torch::manual_seed(99);
  torch::nn::Linear fresh(4, 3);
  lf::State state{{"model", fresh}, {"step", int64_t{0}}};
  CHECK_THROWS_WITH(restarted.restore_snapshot(state),
                    Contains("none survived whole") && Contains("snapshot 3: its .metadata (written last) is missing") &&
                        Contains("fallback_checkpoint"));
  REQUIRE(restarted.restore_snapshot(state, disk.string()));
  CHECK(state.at("step").to<int64_t>() == 7);
  CHECK(torch::equal(fresh->weight, net->weight));
  CHECK(client.list_folder("") == std::map<std::string, int64_t>{{"snapshots-began", 1}});  // the torn one dropped
  fs::remove(disk);
  ::unsetenv(lf::env::kInMemoryReplicas);
}
