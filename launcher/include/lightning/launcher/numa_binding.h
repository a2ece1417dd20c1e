// --numa-binding (torchrun's): the CPUs each local worker may run on, and the NUMA node its memory
// should come from, by the rules of torch.numa.binding. The arithmetic (numa_cpus_for_device,
// plan_numa_binding) takes a described topology, so that it is tested against machines we do not
// have; the readers fill that description from sysfs and the CUDA driver. ChildProcess applies a
// binding between fork and exec (ProcessSpec::cpu_affinity, preferred_memory_node).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lightning/launcher/args.h"

namespace lightning::launcher {

/// torch.numa.binding.AffinityMode.
enum class NumaBinding { Node, Socket, Exclusive, CoreComplex };

/// --numa-binding's choices, in torch's order: node, socket, exclusive, core-complex.
std::vector<std::string> numa_binding_choices();
/// The mode with that name; throws fabric::ValueError naming --numa-binding, the value and the choices.
NumaBinding parse_numa_binding(const std::string& name);

/// One logical CPU, as sysfs describes it.
struct CpuInfo {
  int id = 0;
  int node = 0;    // its NUMA node
  int socket = 0;  // topology/physical_package_id
  int core = 0;    // its physical core, named by the smallest id in topology/thread_siblings_list
  int cache = 0;   // its core complex, named by the smallest id among the CPUs sharing its last-level cache
};

/// What the binding rules read.
struct CpuTopology {
  std::vector<CpuInfo> cpus;      // the CPUs this process may run on (its affinity); others do not count
  std::vector<int> device_nodes;  // the NUMA node of each device, by device index (CUDA's; without GPUs, see cpu_device_nodes)
};

/// Where one local worker runs.
struct CpuBinding {
  std::vector<int> cpus;  // ascending, never empty
  int node = 0;           // its device's NUMA node, where its memory is preferred
};

/// The CPUs of device `device` (torch.numa.binding's rules; only the CPUs of topology.cpus count):
///   node          every CPU of the device's NUMA node;
///   socket        every CPU of every node of the socket that holds the device's node (a node's
///                 socket is that of its smallest CPU);
///   exclusive     the node's physical cores, in order of their smallest CPU, split among the node's
///                 devices in index order: each gets cores / devices of them, and the lowest devices
///                 one more each while the remainder lasts; every logical CPU of those cores.
///                 Fewer cores than devices on the node: fabric::ValueError;
///   core-complex  one core complex of the node (the CPUs sharing a last-level cache): the complexes
///                 ordered by CPU count (most first), then by smallest CPU, and the device's position
///                 among the node's devices picks one, wrapping around when the node has more devices
///                 than complexes (those devices share).
/// Throws fabric::ValueError when the device's node has no CPU in topology.cpus.
std::vector<int> numa_cpus_for_device(const CpuTopology& topology, NumaBinding mode, int device);

/// Each local worker's binding: worker r runs on device rank_devices[r].
std::vector<CpuBinding> plan_numa_binding(const CpuTopology& topology, NumaBinding mode, const std::vector<int>& rank_devices);

/// Without GPUs, each local rank is a device of its own (device index = local rank) and this gives
/// their nodes: of the N nodes that have CPUs in topology.cpus, ascending, local rank r of n takes
/// node number r * N / n (rounded down), so the ranks spread evenly over the nodes in blocks.
std::vector<int> cpu_device_nodes(const CpuTopology& topology, int local_world_size);

/// "0-3,8,10-11" (a sysfs list) -> {0, 1, 2, 3, 8, 10, 11}; blank text -> {}. Throws
/// fabric::ValueError on anything else.
std::vector<int> parse_cpu_list(const std::string& text);

/// The topology of the CPUs `allowed`, from the sysfs mounted at `root` ("/sys"): NUMA nodes from
/// devices/system/node/node<N>/cpulist, and for each CPU devices/system/cpu/cpu<C>/topology/
/// {physical_package_id,thread_siblings_list} and cache/index<I>/{level,type,shared_cpu_list} (the
/// highest level of type Unified or Data). Where sysfs lacks them: a machine without NUMA nodes is
/// one node, 0; a CPU without a socket is on socket 0, without siblings its own core, and without
/// caches in one complex with its whole node. device_nodes is left empty.
CpuTopology read_cpu_topology(const std::string& root, const std::vector<int>& allowed);

/// The NUMA node of PCI device `bus_id` ("0000:3b:00.0"): root/bus/pci/devices/<bus_id>/numa_node.
/// -1 (a machine with one node) or no such file: 0, as torch reads it.
int pci_numa_node(const std::string& root, const std::string& bus_id);

/// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

/// The PCI addresses ("0000:3b:00.0", as sysfs names them) of the CUDA devices this process sees,
/// by CUDA index, from the driver (libcuda.so.1: lightning-run loads no CUDA runtime). Empty when
/// there is no driver or it does not answer.
std::vector<std::string> cuda_pci_bus_ids();

/// This machine's binding for the job's `local_count` workers, --numa-binding's mode: a CUDA job
/// binds local rank r near its GPU (local_gpu_indices), a CPU job by cpu_device_nodes. A CUDA job
/// whose driver gives no PCI addresses is bound as a CPU job, and `note` says so. Throws
/// fabric::ValueError when the mode cannot bind (exclusive with fewer cores than devices on a node).
std::vector<CpuBinding> numa_binding_for_job(const LaunchArgs& args, int local_count,
                                             const std::function<void(const std::string&)>& note);

/// "local rank 0: CPUs 0-7,16-23 (NUMA node 0); local rank 1: ..."
std::string describe_numa_binding(const std::vector<CpuBinding>& bindings);

}  // namespace lightning::launcher
