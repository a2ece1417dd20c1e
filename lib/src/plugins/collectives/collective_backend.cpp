#include "lightning/fabric/plugins/collectives/collective_backend.h"

#include <arpa/inet.h>
#include <net/if.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // gloo names: lib/private/gloo_interface
#if defined(USE_C10D_NCCL) && !defined(LF_WITHOUT_NCCL)
#define LF_NCCL_BACKEND 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/shm_backend.h"
#include "lightning/fabric/plugins/collectives/shm_gloo_backend.h"

namespace lightning::fabric::internal {
namespace {
bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

std::string interface_names() {
  std::string names;
  if (struct if_nameindex* all = if_nameindex()) {
    for (auto* entry = all; entry->if_index != 0; ++entry) names += (names.empty() ? "" : ", ") + std::string(entry->if_name);
    if_freenameindex(all);
  }
  return names.empty() ? "none found" : names;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const CollectiveOptions& options) {
  const std::string& interface = options.settings.socket_interface;
  if (!interface.empty()) {
    LF_CHECK(if_nametoindex(interface.c_str()) != 0, ValueError, "GLOO_SOCKET_IFNAME (process_group.socket_interface)=\"",
             interface, "\" names no network interface of this host. Its interfaces: ", interface_names(),
             ". Name one of them, or unset it to use the interface of this host's name.");
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (is_loopback(options.main_address)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
}  // namespace

c10::intrusive_ptr<c10d::Backend> make_group_backend(ProcessGroupBackend backend,
                                                     const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int world_size, const CollectiveOptions& options,
                                                     const HostLayout& layout) {
  switch (backend) {
    case ProcessGroupBackend::Gloo: {
      auto gloo = c10d::ProcessGroupGloo::Options::create(options.settings.timeout);
      gloo->devices.push_back(gloo_device(options));
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo);
    }
    case ProcessGroupBackend::Nccl: {
#ifdef LF_NCCL_BACKEND
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = options.settings.timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl);
#else
      throw RuntimeError("The nccl backend is not available in this program: it was built without NCCL (a LibTorch "
                         "without it, or lightning-run's own launcher). Use a CUDA LibTorch (CMAKE_PREFIX_PATH) or "
                         "accelerator=\"cpu\" (gloo or shm).");
#endif
    }
    case ProcessGroupBackend::Shm:
      return c10::make_intrusive<ShmBackend>(store, rank, world_size, options.settings.timeout);
    case ProcessGroupBackend::ShmGloo: {
      auto world = make_group_backend(ProcessGroupBackend::Gloo, store, rank, world_size, options);
      auto host = c10::make_intrusive<ShmBackend>(
          c10::make_intrusive<c10d::PrefixStore>("/host/" + std::to_string(layout.host), store), layout.local_index,
          layout.ranks_per_host, options.settings.timeout);
      auto column_store = c10::make_intrusive<c10d::PrefixStore>("/column/" + std::to_string(layout.local_index), store);
      auto column = make_group_backend(ProcessGroupBackend::Gloo, column_store, layout.host, layout.hosts, options);
      return c10::make_intrusive<ShmGlooBackend>(rank, world_size, world, host, column);
    }
  }
  throw ValueError("make_group_backend: unknown backend");
}

}  // namespace lightning::fabric::internal
