// How a Collective's ranks find each other (lib/src/plugins/collectives/collective_rendezvous.cpp):
// the TCPStore they share, the wait until every rank has arrived, and the host vote that picks
// shm, shm+gloo or gloo. Private to the library; Collective's constructor calls them in this order.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <vector>

#include "lightning/fabric/plugins/collectives/collective.h"

namespace c10d {
class Store;
}

namespace lightning::fabric::internal {

/// Joins the job's TCPStore (rank 0 hosts it unless options.use_agent_store). A client first
/// waits, quietly, for the store to listen, up to the rendezvous timeout; RuntimeError saying why
/// that happens when it never does.
c10::intrusive_ptr<c10d::Store> connect_store(const CollectiveOptions& options);

/// Every rank announces itself and waits until all world_size ranks have (collective); after the
/// rendezvous timeout a RuntimeError names the ranks that never arrived.
void await_all_ranks(c10d::Store& store, const CollectiveOptions& options);

/// Where the group's ranks run, as this rank sees it. Hosts are told apart by host name and
/// numbered in the order of their lowest rank; each host's ranks are in rank order.
struct HostLayout {
  int host = 0;         // this rank's host
  int local_index = 0;  // this rank's position among its host's ranks
  int hosts = 1;
  int ranks_per_host = 1;  // this rank's host's count
  bool equal = true;       // every host has ranks_per_host ranks
  std::string counts;      // "host0: 2 ranks, host1: 3 ranks" (for messages)
  bool one_host() const { return hosts == 1; }
};

/// Every rank's layout, from the host names in rank order (what rank 0 decides in the vote).
std::vector<HostLayout> host_layouts(const std::vector<std::string>& names);

/// The host vote (collective): each rank publishes its host name, rank 0 reads them all and
/// publishes every rank's layout in one request, so all ranks get one consistent answer.
HostLayout vote_host_layout(c10d::Store& store, int rank, int world_size);

}  // namespace lightning::fabric::internal
