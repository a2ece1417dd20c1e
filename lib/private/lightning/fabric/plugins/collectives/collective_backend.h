// Builds the c10d backend that moves a Collective's tensors (lib/src/plugins/collectives/
// collective_backend.cpp, the one file that includes ProcessGroupGloo.hpp and ProcessGroupNCCL.hpp).
// Private to the library.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/collectives/collective_rendezvous.h"

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace lightning::fabric::internal {

/// The backend over store for rank of world_size ranks. gloo sends through
/// settings.socket_interface when set (ValueError naming GLOO_SOCKET_IFNAME and this host's
/// interfaces when it does not exist), else 127.0.0.1 for a loopback main_address, else the
/// interface of this host's name. nccl: RuntimeError when this LibTorch has no NCCL. shm+gloo:
/// its three groups (shm_gloo_backend.h) after layout, which must be equal (vote_host_layout).
c10::intrusive_ptr<c10d::Backend> make_group_backend(ProcessGroupBackend backend,
                                                     const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int world_size, const CollectiveOptions& options,
                                                     const HostLayout& layout = {});

}  // namespace lightning::fabric::internal
