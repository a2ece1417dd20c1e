#include "lightning/fabric/plugins/environments/cluster_environment.h"

#include "lightning/fabric/errors.h"

namespace lightning::fabric {
namespace {

// Reads an integer variable; a malformed value is an error naming the variable.
std::optional<int> int_var(const env::EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  try {
    size_t used = 0;
    int parsed = std::stoi(*value, &used);
    if (used == value->size()) return parsed;
  } catch (const std::exception&) {
  }
  throw ValueError("Environment variable " + name + "=\"" + *value + "\" is not an integer. Fix or unset it.");
}

int required_int(const env::EnvLookup& env, const std::string& name, const std::string& who) {
  auto value = int_var(env, name);
  LF_CHECK(value.has_value(), RuntimeError, who, " environment: ", name,
           " is not set. Launch with lightning-run or torchrun, which set it.");
  return *value;
}

}  // namespace

LightningEnvironment::LightningEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool LightningEnvironment::creates_processes_externally() const { return env_(env::kLocalRank).has_value(); }

std::string LightningEnvironment::main_address() const {
  return env_(env::kMasterAddr).value_or("127.0.0.1");
}

int LightningEnvironment::main_port() const { return int_var(env_, env::kMasterPort).value_or(29400); }

int LightningEnvironment::local_rank() const { return int_var(env_, env::kLocalRank).value_or(0); }

int LightningEnvironment::node_rank() const {
  if (auto rank = int_var(env_, env::kNodeRank)) return *rank;
  return int_var(env_, env::kGroupRank).value_or(0);
}

TorchElasticEnvironment::TorchElasticEnvironment(env::EnvLookup env) : env_(std::move(env)) {}

bool TorchElasticEnvironment::detect(const env::EnvLookup& env) {
  for (const char* name : {env::kRunId, env::kRank, env::kGroupRank, env::kLocalRank, env::kLocalWorldSize}) {
    if (!env(name)) return false;
  }
  return true;
}

std::string TorchElasticEnvironment::main_address() const {
  auto address = env_(env::kMasterAddr);
  LF_CHECK(address.has_value(), RuntimeError, "torchelastic environment: MASTER_ADDR is not set.");
  return *address;
}

int TorchElasticEnvironment::main_port() const { return required_int(env_, env::kMasterPort, "torchelastic"); }
int TorchElasticEnvironment::world_size() const { return required_int(env_, env::kWorldSize, "torchelastic"); }
int TorchElasticEnvironment::global_rank() const { return required_int(env_, env::kRank, "torchelastic"); }
int TorchElasticEnvironment::local_rank() const { return required_int(env_, env::kLocalRank, "torchelastic"); }
int TorchElasticEnvironment::node_rank() const { return required_int(env_, env::kGroupRank, "torchelastic"); }

void TorchElasticEnvironment::validate_settings(int num_devices, int num_nodes) const {
  // Per node, not WORLD_SIZE: nodes may run different numbers of processes.
  (void)num_nodes;
  const int local_world = required_int(env_, env::kLocalWorldSize, "torchelastic");
  LF_CHECK(local_world == num_devices, ValueError, "The launcher started LOCAL_WORLD_SIZE=", local_world,
           " processes on this node, but this Fabric is configured for devices=", num_devices,
           ". Make the launcher's --devices (torchrun: --nproc_per_node) match the Fabric options, or "
           "leave devices at \"auto\" and launch with lightning-run, which passes its value in LT_DEVICES.");
}

std::shared_ptr<ClusterEnvironment> detect_cluster_environment(const env::EnvLookup& env) {
  if (TorchElasticEnvironment::detect(env)) return std::make_shared<TorchElasticEnvironment>(env);
  return std::make_shared<LightningEnvironment>(env);
}

}  // namespace lightning::fabric
