#include "lightning/launcher/numa_binding.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/registry.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::launcher {
namespace {

// "a, b, c" (the launcher's unit tests link this file without the runtime's registry).
std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

namespace fs = std::filesystem;

const std::vector<std::pair<std::string, NumaBinding>>& modes() {
  static const std::vector<std::pair<std::string, NumaBinding>> all = {{"node", NumaBinding::Node},
                                                                       {"socket", NumaBinding::Socket},
                                                                       {"exclusive", NumaBinding::Exclusive},
                                                                       {"core-complex", NumaBinding::CoreComplex}};
  return all;
}

std::string mode_name(NumaBinding mode) {
  for (const auto& [name, value] : modes()) {
    if (value == mode) return name;
  }
  return "?";
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::optional<int> read_int(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    size_t used = 0;
    const std::string value = trim(*text);
    const int number = std::stoi(value, &used);
    if (used == value.size()) return number;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The smallest CPU of a sysfs list file; nullopt when the file is missing, blank or malformed.
std::optional<int> smallest_in_list(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    const auto cpus = parse_cpu_list(*text);
    if (!cpus.empty()) return *std::min_element(cpus.begin(), cpus.end());
  } catch (const fabric::ValueError&) {
  }
  return std::nullopt;
}

// The CPU complex key of one CPU (torch's max-level cache): the smallest CPU sharing the cache of
// the highest level whose type is Unified or Data.
std::optional<int> last_level_cache(const fs::path& cache_dir) {
  std::error_code error;
  int best_level = -1;
  std::optional<int> key;
  for (fs::directory_iterator entry(cache_dir, error), end; !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.rfind("index", 0) != 0 || !all_digits(name.substr(5))) continue;
    const auto type = read_text(entry->path() / "type");
    if (!type || (trim(*type) != "Unified" && trim(*type) != "Data")) continue;
    const auto level = read_int(entry->path() / "level");
    if (!level || *level <= best_level) continue;
    if (const auto smallest = smallest_in_list(entry->path() / "shared_cpu_list")) {
      best_level = *level;
      key = smallest;
    }
  }
  return key;
}

// topology.cpus sorted by id.
std::vector<CpuInfo> sorted_cpus(const CpuTopology& topology) {
  std::vector<CpuInfo> cpus = topology.cpus;
  std::sort(cpus.begin(), cpus.end(), [](const CpuInfo& a, const CpuInfo& b) { return a.id < b.id; });
  return cpus;
}

std::vector<int> cpus_of_node(const std::vector<CpuInfo>& cpus, int node) {
  std::vector<int> ids;
  for (const CpuInfo& cpu : cpus) {
    if (cpu.node == node) ids.push_back(cpu.id);
  }
  return ids;
}

// A node's socket: that of its smallest CPU (cpus sorted by id; the node has one).
int socket_of_node(const std::vector<CpuInfo>& cpus, int node) {
  for (const CpuInfo& cpu : cpus) {
    if (cpu.node == node) return cpu.socket;
  }
  return -1;
}

// The devices on `node`, ascending.
std::vector<int> devices_on_node(const CpuTopology& topology, int node) {
  std::vector<int> devices;
  for (size_t index = 0; index < topology.device_nodes.size(); ++index) {
    if (topology.device_nodes[index] == node) devices.push_back(static_cast<int>(index));
  }
  return devices;
}

}  // namespace

std::vector<std::string> numa_binding_choices() {
  std::vector<std::string> names;
  for (const auto& entry : modes()) names.push_back(entry.first);
  return names;
}

NumaBinding parse_numa_binding(const std::string& name) {
  for (const auto& [known, mode] : modes()) {
    if (known == name) return mode;
  }
  throw fabric::ValueError("--numa-binding=" + name + " is not valid. Choose one of: " +
                           joined(numa_binding_choices()) + ".");
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream items(trim(text));
  std::string item;
  const auto bad = [&text] {
    return fabric::ValueError("'" + trim(text) + "' is not a CPU list: write it as sysfs does, e.g. 0-3,8,10-11.");
  };
  while (std::getline(items, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    const std::string first = item.substr(0, dash), last = dash == std::string::npos ? first : item.substr(dash + 1);
    if (!all_digits(first) || !all_digits(last) || first.size() > 9 || last.size() > 9) throw bad();
    const int from = std::stoi(first), to = std::stoi(last);
    if (to < from) throw bad();
    for (int cpu = from; cpu <= to; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> numa_cpus_for_device(const CpuTopology& topology, NumaBinding mode, int device) {
  LF_CHECK(device >= 0 && device < static_cast<int>(topology.device_nodes.size()), ValueError,
           "--numa-binding=", mode_name(mode), ": device ", device, " is not among the ",
           topology.device_nodes.size(), " device(s) of this machine.");
  const std::vector<CpuInfo> cpus = sorted_cpus(topology);
  const int node = topology.device_nodes[static_cast<size_t>(device)];
  const std::vector<int> node_cpus = cpus_of_node(cpus, node);
  std::vector<int> all;
  for (const CpuInfo& cpu : cpus) all.push_back(cpu.id);
  LF_CHECK(!node_cpus.empty(), ValueError, "--numa-binding=", mode_name(mode), ": NUMA node ", node,
           " (device ", device, "'s) has none of the CPUs lightning-run may run on (", fabric::cpu_list_text(all),
           "). Start lightning-run with CPUs of that node allowed (taskset, cpuset), or leave --numa-binding out.");
  switch (mode) {
    case NumaBinding::Node:
      return node_cpus;
    case NumaBinding::Socket: {
      const int socket = socket_of_node(cpus, node);
      std::vector<int> bound;
      for (const CpuInfo& cpu : cpus) {
        if (socket_of_node(cpus, cpu.node) == socket) bound.push_back(cpu.id);
      }
      return bound;
    }
    case NumaBinding::Exclusive:
    case NumaBinding::CoreComplex:
      break;
  }
  const std::vector<int> devices = devices_on_node(topology, node);
  const int position = static_cast<int>(std::find(devices.begin(), devices.end(), device) - devices.begin());
  if (mode == NumaBinding::Exclusive) {
    std::map<int, std::vector<int>> cores;  // by the smallest CPU of the core, ascending
    for (const CpuInfo& cpu : cpus) {
      if (cpu.node == node) cores[cpu.core].push_back(cpu.id);
    }
    const int count = static_cast<int>(devices.size()), per = static_cast<int>(cores.size()) / count,
              extra = static_cast<int>(cores.size()) % count;
    std::vector<std::string> names;
    for (int other : devices) names.push_back(std::to_string(other));
    LF_CHECK(per >= 1, ValueError, "--numa-binding=exclusive: NUMA node ", node, " has ", cores.size(),
             " physical core(s) lightning-run may run on (CPUs ", fabric::cpu_list_text(node_cpus), "), but ", count,
             " devices are on it (", joined(names), "; GPUs, or local ranks without GPUs), and each needs "
             "a core of its own. Use --numa-binding node or socket, or start fewer workers on this machine.");
    const int start = position * per + std::min(position, extra);
    const int end = start + per + (position < extra ? 1 : 0);
    std::vector<int> bound;
    int index = 0;
    for (const auto& [core, ids] : cores) {
      if (index >= start && index < end) bound.insert(bound.end(), ids.begin(), ids.end());
      ++index;
    }
    std::sort(bound.begin(), bound.end());
    return bound;
  }
  std::map<int, std::vector<int>> complexes;  // by the smallest CPU sharing the cache
  for (const CpuInfo& cpu : cpus) {
    if (cpu.node == node) complexes[cpu.cache].push_back(cpu.id);
  }
  std::vector<std::pair<int, std::vector<int>>> ordered(complexes.begin(), complexes.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.first < b.first;
  });
  return ordered[static_cast<size_t>(position) % ordered.size()].second;
}

std::vector<CpuBinding> plan_numa_binding(const CpuTopology& topology, NumaBinding mode, const std::vector<int>& rank_devices) {
  std::vector<CpuBinding> bindings;
  for (int device : rank_devices) {
    CpuBinding binding;
    binding.cpus = numa_cpus_for_device(topology, mode, device);
    binding.node = topology.device_nodes[static_cast<size_t>(device)];
    bindings.push_back(std::move(binding));
  }
  return bindings;
}

std::vector<int> cpu_device_nodes(const CpuTopology& topology, int local_world_size) {
  std::set<int> present;
  for (const CpuInfo& cpu : topology.cpus) present.insert(cpu.node);
  LF_CHECK(!present.empty(), ValueError, "--numa-binding: this process may run on no CPU.");
  const std::vector<int> nodes(present.begin(), present.end());
  std::vector<int> assigned;
  for (int rank = 0; rank < local_world_size; ++rank) {
    const auto index = static_cast<size_t>(static_cast<long long>(rank) * static_cast<long long>(nodes.size()) /
                                           std::max(1, local_world_size));
    assigned.push_back(nodes[index]);
  }
  return assigned;
}

CpuTopology read_cpu_topology(const std::string& root, const std::vector<int>& allowed) {
  const fs::path system = fs::path(root) / "devices" / "system";
  std::map<int, int> node_of;
  std::error_code error;
  for (fs::directory_iterator entry(system / "node", error), end; !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    if (name.rfind("node", 0) != 0 || !all_digits(name.substr(4))) continue;
    const auto list = read_text(entry->path() / "cpulist");
    if (!list) continue;
    const int node = std::stoi(name.substr(4));
    for (int cpu : parse_cpu_list(*list)) node_of[cpu] = node;
  }
  CpuTopology topology;
  for (int id : allowed) {
    const fs::path cpu = system / "cpu" / ("cpu" + std::to_string(id));
    CpuInfo info;
    info.id = id;
    const auto node = node_of.find(id);
    info.node = node == node_of.end() ? 0 : node->second;
    info.socket = read_int(cpu / "topology" / "physical_package_id").value_or(0);
    info.core = smallest_in_list(cpu / "topology" / "thread_siblings_list").value_or(id);
    info.cache = last_level_cache(cpu / "cache").value_or(-1);
    topology.cpus.push_back(info);
  }
  std::sort(topology.cpus.begin(), topology.cpus.end(), [](const CpuInfo& a, const CpuInfo& b) { return a.id < b.id; });
  // Without cache information a CPU is in one complex with its whole node (named by its smallest CPU).
  for (CpuInfo& info : topology.cpus) {
    if (info.cache >= 0) continue;
    for (const CpuInfo& other : topology.cpus) {
      if (other.node == info.node) {
        info.cache = other.id;
        break;
      }
    }
  }
  return topology;
}

int pci_numa_node(const std::string& root, const std::string& bus_id) {
  return std::max(0, read_int(fs::path(root) / "bus" / "pci" / "devices" / bus_id / "numa_node").value_or(0));
}

std::vector<int> allowed_cpus() {
  for (int count = 1024; count <= (1 << 20); count *= 2) {
    cpu_set_t* set = CPU_ALLOC(count);
    LF_CHECK(set != nullptr, RuntimeError, "CPU_ALLOC(", count, ") failed: ", std::strerror(errno));
    const size_t size = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      std::vector<int> cpus;
      for (int cpu = 0; cpu < count; ++cpu) {
        if (CPU_ISSET_S(static_cast<size_t>(cpu), size, set)) cpus.push_back(cpu);
      }
      CPU_FREE(set);
      return cpus;
    }
    const int failure = errno;
    CPU_FREE(set);
    LF_CHECK(failure == EINVAL, RuntimeError, "sched_getaffinity failed: ", std::strerror(failure));
  }
  throw fabric::RuntimeError("sched_getaffinity failed: this machine has more than 2^20 CPUs");
}

std::vector<std::string> cuda_pci_bus_ids() {
  // The driver API by name: lightning-run-launcher links no CUDA library. Kept loaded, as
  // the accelerator keeps it.
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return {};
  using Init = int (*)(unsigned int);
  using Count = int (*)(int*);
  using Get = int (*)(int*, int);
  using Attribute = int (*)(int*, int, int);
  const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  const auto count = reinterpret_cast<Count>(dlsym(driver, "cuDeviceGetCount"));
  const auto get = reinterpret_cast<Get>(dlsym(driver, "cuDeviceGet"));
  const auto attribute = reinterpret_cast<Attribute>(dlsym(driver, "cuDeviceGetAttribute"));
  // CUdevice_attribute values of the driver API: the PCI bus, device and domain ids, as torch reads them.
  constexpr int kPciBusId = 33, kPciDeviceId = 34, kPciDomainId = 50;
  int devices = 0;
  if (init == nullptr || count == nullptr || get == nullptr || attribute == nullptr || init(0) != 0 ||
      count(&devices) != 0) {
    return {};
  }
  std::vector<std::string> ids;
  for (int index = 0; index < devices; ++index) {
    int device = 0, domain = 0, bus = 0, slot = 0;
    if (get(&device, index) != 0 || attribute(&domain, kPciDomainId, device) != 0 ||
        attribute(&bus, kPciBusId, device) != 0 || attribute(&slot, kPciDeviceId, device) != 0) {
      return {};
    }
    char text[32] = {};
    std::snprintf(text, sizeof(text), "%04x:%02x:%02x.0", domain, bus, slot);
    ids.push_back(text);
  }
  return ids;
}

std::vector<CpuBinding> numa_binding_for_job(const LaunchArgs& args, int local_count,
                                             const std::function<void(const std::string&)>& note) {
  const NumaBinding mode = parse_numa_binding(args.numa_binding.value_or("node"));
  CpuTopology topology = read_cpu_topology("/sys", allowed_cpus());
  std::vector<int> rank_devices;
  const std::vector<int> gpus = local_gpu_indices(args);
  if (!gpus.empty()) {
    const std::vector<std::string> bus_ids = cuda_pci_bus_ids();
    const bool known = std::all_of(gpus.begin(), gpus.end(), [&](int gpu) { return gpu < static_cast<int>(bus_ids.size()); });
    if (known && static_cast<int>(gpus.size()) >= local_count) {
      for (const std::string& id : bus_ids) topology.device_nodes.push_back(pci_numa_node("/sys", id));
      rank_devices.assign(gpus.begin(), gpus.begin() + local_count);
      return plan_numa_binding(topology, mode, rank_devices);
    }
    note("--numa-binding: the CUDA driver gave no PCI address for the GPUs, so their NUMA nodes are unknown: "
         "the workers are bound as CPU workers are (local ranks spread evenly over the NUMA nodes)");
  }
  topology.device_nodes = cpu_device_nodes(topology, local_count);
  for (int rank = 0; rank < local_count; ++rank) rank_devices.push_back(rank);
  return plan_numa_binding(topology, mode, rank_devices);
}

std::string describe_numa_binding(const std::vector<CpuBinding>& bindings) {
  std::string text;
  for (size_t rank = 0; rank < bindings.size(); ++rank) {
    text += (rank == 0 ? "" : "; ") + std::string("local rank ") + std::to_string(rank) + ": CPUs " +
            fabric::cpu_list_text(bindings[rank].cpus) + " (NUMA node " + std::to_string(bindings[rank].node) + ")";
  }
  return text;
}

}  // namespace lightning::launcher
