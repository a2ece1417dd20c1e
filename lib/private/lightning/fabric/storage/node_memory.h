// Objects held in the memory of a node's lightning-run (--in-memory-replicas): the store behind
// memory:// URLs, where fabric.snapshot() keeps the job's newest state (docs/launcher.md, "In-memory
// replicas").
//
// lightning-run runs a NodeMemoryServer for the job's lifetime and gives its workers its address
// (LT_NODE_MEMORY, an abstract unix socket of this user). A worker's NodeMemoryClient writes an
// object into a memory file (memfd, or a file of /dev/shm it staged) and hands the server the file
// descriptor: the object's bytes are copied once, into memory, and never named anywhere a crash
// could leave them. The server holds the descriptors, so the objects outlive the worker that wrote
// them (a restarted worker reads them back) and vanish with the server, however it ends.
// Objects are immutable once put: a put of an existing key replaces the object whole.
// On several nodes the servers also talk to each other over TCP (set_peers): each copies what its
// workers put to one buddy node, and a read of an object this node lacks asks the others, so a
// worker sees the objects of the whole job, and those of a lost node survive on its buddy.
// Nothing here uses LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lightning/fabric/storage/object_store.h"

namespace lightning::fabric::storage {

class NodeMemoryServer {
 public:
  /// Listens on a fresh abstract socket and serves from a thread of its own. RuntimeError when the
  /// socket cannot be made.
  NodeMemoryServer();
  ~NodeMemoryServer();  // closes every connection and drops every object
  NodeMemoryServer(const NodeMemoryServer&) = delete;
  NodeMemoryServer& operator=(const NodeMemoryServer&) = delete;
  /// The value of LT_NODE_MEMORY for the workers.
  const std::string& address() const;
  /// The bytes of every object held now.
  int64_t bytes_held() const;
  /// The folder of /dev/shm (this user's only) where the workers stage files before they put them
  /// (LT_NODE_MEMORY_STAGING); removed with the server.
  const std::string& staging_folder() const;
  /// Removes what the staging folder holds (call while no worker runs: a killed one's leftovers).
  void clear_staging() const;

  // ---- several nodes: copies on a buddy node, reads from every node ----
  /// Listens on every address of this host, on a port of the system's choosing, for the other
  /// nodes' servers, which must greet with `token` (the job's rendezvous run id); returns the port.
  /// Anyone who can reach it and knows the token can read the objects: run jobs on a trusted
  /// network, as for the rendezvous.
  int listen_for_peers(const std::string& token);
  /// Call between attempts, while no worker runs, after listen_for_peers (a node greets the others
  /// with its token). endpoints: every node's "host:port" by node rank;
  /// this node is endpoints[self]. Its buddy is the next node (self + 1, wrapping): every object put
  /// here from now on is copied to the buddy in the background, in the order of the puts, and so
  /// is every object held here already (a new buddy after a node was lost). Reads of objects not
  /// held here (get, exists, listings) ask the other nodes. One node (or no endpoints): no copies.
  void set_peers(int self, const std::vector<std::string>& endpoints);
  /// Bytes held for other nodes (their copies, and objects fetched from them for a read).
  int64_t copied_bytes_held() const;
  /// The most bytes held at once so far, own and copies.
  int64_t peak_bytes_held() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// A worker's connection to its node's server (thread-safe: one request at a time).
class NodeMemoryClient final : public ObjectStore {
 public:
  /// Connects to `address`. RuntimeError naming `who` when nothing listens there.
  NodeMemoryClient(const std::string& address, const std::string& who);
  /// The client for LT_NODE_MEMORY, shared by the process. ValueError naming `who` when the variable
  /// is unset (the job was not started by lightning-run --in-memory-replicas).
  static std::shared_ptr<const NodeMemoryClient> from_environment(const std::string& who);
  ~NodeMemoryClient() override;

  std::string get(const std::string& key) const override;
  int64_t get_to_file(const std::string& key, const std::filesystem::path& path) const override;
  void put(const std::string& key, std::string_view bytes) const override;
  void put_file(const std::string& key, const std::filesystem::path& file) const override;
  std::map<std::string, int64_t> list_folder(const std::string& folder) const override;
  bool exists(const std::string& key) const override;
  void remove(const std::string& key) const override;
  std::string url(const std::string& key) const override { return "memory://" + key; }
  bool stages_in_memory() const override { return true; }
  int open_object(const std::string& key) const override { int64_t size = 0; return get_fd(key, &size); }
  /// Where files put here are staged: LT_NODE_MEMORY_STAGING, else /dev/shm.
  static std::string staging_base();
  /// Waits until every object put on this node so far is copied to its buddy node (at once on one
  /// node). RuntimeError when the copy failed (the buddy is lost) or `timeout_s` passed.
  void wait_until_copied(double timeout_s) const;
  /// Drops every object of this node, and every copy held for another, whose key starts with
  /// `prefix` and sorts before `keep`, except `keep` itself and the objects under `keep` + "/".
  void drop_before(const std::string& prefix, const std::string& keep) const;

 private:
  /// Sends one request (with `fd_out` attached when >= 0) and returns the answer's text, with the
  /// descriptor it carried in *fd_in (or -1). RuntimeError naming the key on an error answer.
  std::string call(const std::string& request, int fd_out, int* fd_in, const std::string& key) const;
  /// Hands the server `fd` (a memory file) as the object `key`.
  void put_fd(const std::string& key, int fd) const;
  /// The object's descriptor, to read from (the caller closes it).
  int get_fd(const std::string& key, int64_t* size) const;

  int socket_ = -1;
  std::string who_;
  mutable std::mutex mutex_;
};

}  // namespace lightning::fabric::storage
