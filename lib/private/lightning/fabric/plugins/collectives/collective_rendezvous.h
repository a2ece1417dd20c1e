// How a Collective's ranks find each other (lib/src/plugins/collectives/collective_rendezvous.cpp):
// the TCPStore they share, the wait until every rank has arrived, and the same-host vote that
// picks shm over gloo. Private to the library; Collective's constructor calls them in this order.
#pragma once

#include <c10/util/intrusive_ptr.h>

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

/// Whether every rank of the group runs on rank 0's machine (same host name): each rank publishes
/// its name, rank 0 publishes the verdict, so all ranks get the same answer. Collective.
bool all_ranks_on_one_host(c10d::Store& store, int rank, int world_size);

}  // namespace lightning::fabric::internal
