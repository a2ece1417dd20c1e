// Cluster environments detected from crafted environments, in Lightning's order, and env::Reader,
// the typed reader they and the hang settings read every variable through.
#include "lightning/fabric/errors.h"
#include "lightning/fabric/plugins/collectives/collective.h"
#include "lightning/fabric/plugins/environments/cluster_environment.h"
#include "lightning/fabric/utilities/env_vars.h"
// Catch2 last: glog (inside LibTorch) defines its own CHECK macro, Catch2 must win.
#include <set>
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <type_traits>
#include <unistd.h>

namespace lf = lightning::fabric;
using Catch::Matchers::Contains;
using Env = std::map<std::string, std::string>;

namespace {
std::shared_ptr<lf::ClusterEnvironment> detect(Env env) { return lf::detect_cluster_environment(lf::env::map_env(std::move(env))); }
}  // namespace

TEST_CASE("host lists expand as SLURM writes them", "[environments]") {
  using V = std::vector<std::string>;
  CHECK(lf::expand_host_list("node[01-03,7],gpu5") == V{"node01", "node02", "node03", "node7", "gpu5"});
  CHECK(lf::expand_host_list("a,b") == V{"a", "b"});
  CHECK(lf::expand_host_list("x[8-10]y") == V{"x8y", "x9y", "x10y"});
  CHECK(lf::expand_host_list("host") == V{"host"});
  // Spaces separate hosts and vanish inside brackets, as Python Lightning resolves them.
  CHECK(lf::expand_host_list("alpha beta gamma") == V{"alpha", "beta", "gamma"});
  CHECK(lf::expand_host_list("1.2.3.[089, 100-101]") == V{"1.2.3.089", "1.2.3.100", "1.2.3.101"});
  CHECK_THROWS_WITH(lf::expand_host_list("n[1-"), Contains("unclosed"));
  CHECK_THROWS_WITH(lf::expand_host_list("n[a-b]"), Contains("invalid range"));
}

TEST_CASE("no variables: the Lightning environment, not launched", "[environments]") {
  auto environment = detect({});
  CHECK(environment->name() == "lightning");
  CHECK_FALSE(environment->creates_processes_externally());
  CHECK(environment->main_address() == "127.0.0.1");
}

TEST_CASE("slurm: ranks, host list, port from the job id, counts per node", "[environments]") {
  // As srun sets them for one task of an 8-task step over 4 nodes (values seen on slurm-wlm 22.05).
  Env slurm{{"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "5"},
            {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"}, {"SLURM_STEP_NODELIST", "gpu[07-10]"},
            {"SLURM_JOB_ID", "1234567"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"}, {"SLURM_STEP_NUM_NODES", "4"},
            {"SLURM_NNODES", "4"}};
  auto environment = detect(slurm);
  CHECK(environment->name() == "slurm");
  CHECK(environment->creates_processes_externally());
  CHECK(environment->world_size() == 8);
  CHECK(environment->global_rank() == 5);
  CHECK(environment->local_rank() == 1);
  CHECK(environment->node_rank() == 2);
  CHECK(environment->main_address() == "gpu07");
  CHECK(environment->main_port() == 15000 + 4567);  // step 0: Python Lightning's port
  CHECK(environment->launched_processes_per_node() == 2);
  CHECK(environment->launched_num_nodes() == 4);
  CHECK_NOTHROW(environment->validate_settings(2, 4));
  CHECK_THROWS_WITH(environment->validate_settings(4, 4),
                    Contains("devices=4") && Contains("SLURM_STEP_TASKS_PER_NODE=2(x4)") && Contains("\"auto\""));
  CHECK_THROWS_WITH(environment->validate_settings(2, 1), Contains("num_nodes=1") && Contains("SLURM_STEP_NUM_NODES=4"));
  slurm["SLURM_STEP_TASKS_PER_NODE"] = "3(x2),1(x2)";  // uneven: this node (2) runs 1
  CHECK(detect(slurm)->launched_processes_per_node() == 1);
  // Concurrent steps of one allocation get ports of their own, five apart in steps.
  std::set<int> ports;
  for (const char* step : {"0", "1", "2", "3", "4"}) {
    slurm["SLURM_STEP_ID"] = step;
    ports.insert(detect(slurm)->main_port());
  }
  CHECK(ports == std::set<int>{19567, 29567, 39567, 49567, 59567});
  slurm["SLURM_STEP_ID"] = "5";
  CHECK(detect(slurm)->main_port() == 19567);
  slurm["SLURM_STEP_ID"] = "0";
  slurm["MASTER_ADDR"] = "10.0.0.9";
  slurm["MASTER_PORT"] = "4000";
  CHECK(detect(slurm)->main_address() == "10.0.0.9");
  CHECK(detect(slurm)->main_port() == 4000);
}

TEST_CASE("slurm: only a task of a multi-task srun step is launched by Slurm", "[environments]") {
  // A batch script or an salloc shell: job variables, no step. The program starts its own processes.
  Env batch{{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_JOB_NAME", "job.sh"}};
  CHECK(detect(batch)->name() == "lightning");
  Env salloc_shell{{"SLURM_JOB_ID", "8"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NAME", "interactive"}};
  CHECK(detect(salloc_shell)->name() == "lightning");
  // srun inside salloc: the allocation's name is "interactive", but this is a step's task.
  Env step{{"SLURM_JOB_ID", "8"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_ID", "0"},
           {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NAME", "interactive"}};
  CHECK(detect(step)->name() == "slurm");
  // A one-task step (srun --pty bash, srun -n1 ./train) is like a workstation's shell.
  step["SLURM_STEP_NUM_TASKS"] = "1";
  step["SLURM_NTASKS"] = "1";
  CHECK(detect(step)->name() == "lightning");
}

TEST_CASE("torchelastic wins over slurm", "[environments]") {
  Env both{{"SLURM_NTASKS", "2"}, {"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "0"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "0"},
           {"LOCAL_WORLD_SIZE", "1"}};
  CHECK(detect(both)->name() == "torchelastic");
}

TEST_CASE("lsf: jsrun ranks and the compute hosts of the rank file", "[environments]") {
  const std::string rankfile = "/tmp/lf-test-rankfile-" + std::to_string(::getpid());
  std::ofstream(rankfile) << "launch\nbatch1\nbatch1\nbatch2\nbatch2\n";
  Env lsf{{"LSB_JOBID", "4321"}, {"LSB_DJOB_RANKFILE", rankfile}, {"JSM_NAMESPACE_SIZE", "4"},
          {"JSM_NAMESPACE_RANK", "3"}, {"JSM_NAMESPACE_LOCAL_RANK", "1"}};
  auto environment = detect(lsf);
  CHECK(environment->name() == "lsf");
  CHECK(environment->world_size() == 4);
  CHECK(environment->global_rank() == 3);
  CHECK(environment->local_rank() == 1);
  CHECK(environment->main_address() == "batch1");
  CHECK(environment->main_port() == 10000 + 321);
  CHECK(environment->launched_num_nodes() == 2);
  CHECK(environment->launched_processes_per_node() == 2);
  CHECK_THROWS_WITH(environment->node_rank(), Contains("not in the job's host list"));  // this host is neither
  std::remove(rankfile.c_str());
}

TEST_CASE("mpi: Open MPI and PMI variables", "[environments]") {
  Env ompi{{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29555"}};
  auto environment = detect(ompi);
  CHECK(environment->name() == "mpi");
  CHECK(environment->world_size() == 4);
  CHECK(environment->global_rank() == 3);
  CHECK(environment->local_rank() == 1);
  CHECK(environment->node_rank() == 1);
  CHECK(environment->main_address() == "node0");
  CHECK(environment->main_port() == 29555);
  CHECK(environment->launched_num_nodes() == 2);
  ompi.erase("MASTER_ADDR");  // two nodes and no address: say what to export
  CHECK_THROWS_WITH(detect(ompi)->main_address(), Contains("spans 2 nodes") && Contains("-x MASTER_ADDR"));
  ompi["OMPI_COMM_WORLD_SIZE"] = "1";  // a one-process job is a plain run
  CHECK(detect(ompi)->name() == "lightning");
  Env pmi{{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
  auto hydra = detect(pmi);
  CHECK(hydra->name() == "mpi");
  CHECK(hydra->global_rank() == 1);
  CHECK(hydra->node_rank() == 0);
  CHECK(hydra->main_address() == "127.0.0.1");  // every rank on this node
  CHECK_THROWS_WITH(hydra->main_port(), Contains("MASTER_PORT is not set") && Contains("mpirun -x"));
}

TEST_CASE("mpi on one node: rank 0 publishes a free port in the job's directory", "[environments]") {
  char folder[] = "/tmp/lf-test-pmix-XXXXXX";
  REQUIRE(::mkdtemp(folder) != nullptr);
  Env rank0{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"OMPI_MCA_orte_num_nodes", "1"}, {"PMIX_SERVER_TMPDIR", folder}, {"PMIX_NAMESPACE", "4242"},
            {"LT_RENDEZVOUS_TIMEOUT", "0.5"}};
  Env rank1 = rank0;
  rank1["OMPI_COMM_WORLD_RANK"] = "1";
  CHECK_THROWS_WITH(detect(rank1)->main_port(), Contains("did not publish") && Contains("0.5 s"));  // none yet
  const int port = detect(rank0)->main_port();
  CHECK(port > 0);
  CHECK(detect(rank1)->main_port() == port);
  CHECK(detect(rank0)->main_address() == "127.0.0.1");
  std::remove((std::string(folder) + "/lightning-fabric-4242.port").c_str());
  ::rmdir(folder);
}

TEST_CASE("kubeflow: one process per pod", "[environments]") {
  Env kubeflow{{"KUBERNETES_PORT", "tcp://10.0.0.1:443"}, {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"},
               {"WORLD_SIZE", "3"}, {"RANK", "2"}};
  auto environment = detect(kubeflow);
  CHECK(environment->name() == "kubeflow");
  CHECK(environment->global_rank() == 2);
  CHECK(environment->node_rank() == 2);
  CHECK(environment->local_rank() == 0);
  CHECK(environment->main_address() == "job-master-0");
  CHECK(environment->launched_processes_per_node() == 1);
  CHECK(environment->launched_num_nodes() == 3);
}

TEST_CASE("outside a job, slurm and torchelastic give Python Lightning's defaults", "[environments]") {
  lf::SLURMEnvironment slurm(lf::env::map_env({}));
  CHECK(slurm.main_address() == "127.0.0.1");
  CHECK(slurm.main_port() == 12910);
  CHECK(lf::SLURMEnvironment(lf::env::map_env({{"SLURM_NODELIST", "alpha beta"}})).main_address() == "alpha");
  lf::TorchElasticEnvironment elastic(lf::env::map_env({}));
  CHECK(elastic.main_address() == "127.0.0.1");
  CHECK(elastic.main_port() == 12910);
  CHECK(elastic.node_rank() == 0);
}

TEST_CASE("a variable an environment needs, missing or empty, is named in the error", "[environments]") {
  for (const std::string address : {"", "unset"}) {
    Env kubeflow{{"KUBERNETES_PORT", "tcp://10.0.0.1:443"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}};
    if (address != "unset") kubeflow["MASTER_ADDR"] = address;
    lf::KubeflowEnvironment environment(lf::env::map_env(kubeflow));
    CHECK_THROWS_WITH(environment.main_address(), Contains("kubeflow environment: MASTER_ADDR is"));
  }
  Env lsf{{"LSB_JOBID", "4321"}, {"JSM_NAMESPACE_SIZE", "4"}, {"JSM_NAMESPACE_RANK", "0"}, {"JSM_NAMESPACE_LOCAL_RANK", "0"}};
  lf::LSFEnvironment without_hosts(lf::env::map_env(lsf));
  CHECK_THROWS_WITH(without_hosts.main_address(), Contains("lsf environment: LSB_HOSTS is not set"));
  CHECK_THROWS_WITH(without_hosts.node_rank(), Contains("lsf environment: LSB_HOSTS is not set"));
}

// Every accessor that worked with the whole environment, with one variable removed or emptied:
// it returns (a default, as Python's) or throws an lf::Error naming that variable. Never another
// exception type (bad_alloc, a crash under the sanitizers).
TEST_CASE("every environment: each variable missing or empty gives a default or an error naming it", "[environments]") {
  using Make = std::function<std::shared_ptr<lf::ClusterEnvironment>(const Env&)>;
  auto of = [](auto tag) -> Make {
    using T = typename decltype(tag)::type;
    return [](const Env& env) { return std::make_shared<T>(lf::env::map_env(env)); };
  };
  struct Case {
    std::string name;
    Env whole;
    Make make;
  };
  const std::vector<Case> cases = {
      {"lightning", {{"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "2345"}, {"LOCAL_RANK", "1"}, {"NODE_RANK", "1"},
                     {"WORLD_SIZE", "4"}, {"RANK", "3"}}, of(std::common_type<lf::LightningEnvironment>())},
      {"torchelastic", {{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "1"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "2345"}},
       of(std::common_type<lf::TorchElasticEnvironment>())},
      {"slurm", {{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_NODEID", "0"}, {"SLURM_NODELIST", "node[1-2]"}, {"SLURM_JOB_ID", "1234"},
                 {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NNODES", "1"}}, of(std::common_type<lf::SLURMEnvironment>())},
      {"lsf", {{"LSB_JOBID", "4321"}, {"JSM_NAMESPACE_SIZE", "4"}, {"JSM_NAMESPACE_RANK", "0"},
               {"JSM_NAMESPACE_LOCAL_RANK", "0"}, {"LSB_HOSTS", "batch a a b b"}}, of(std::common_type<lf::LSFEnvironment>())},
      {"mpi", {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_NODE_RANK", "0"}, {"MASTER_ADDR", "10.0.0.2"},
               {"MASTER_PORT", "2345"}}, of(std::common_type<lf::MPIEnvironment>())},
      {"kubeflow", {{"KUBERNETES_PORT", "tcp://10.0.0.1:443"}, {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "2345"},
                    {"WORLD_SIZE", "2"}, {"RANK", "1"}}, of(std::common_type<lf::KubeflowEnvironment>())},
  };
  using Accessor = std::function<std::string(lf::ClusterEnvironment&)>;
  const std::vector<std::pair<std::string, Accessor>> accessors = {
      {"main_address", [](lf::ClusterEnvironment& e) { return e.main_address(); }},
      {"main_port", [](lf::ClusterEnvironment& e) { return std::to_string(e.main_port()); }},
      {"world_size", [](lf::ClusterEnvironment& e) { return std::to_string(e.world_size()); }},
      {"global_rank", [](lf::ClusterEnvironment& e) { return std::to_string(e.global_rank()); }},
      {"local_rank", [](lf::ClusterEnvironment& e) { return std::to_string(e.local_rank()); }},
      {"node_rank", [](lf::ClusterEnvironment& e) { return std::to_string(e.node_rank()); }},
  };
  for (const auto& c : cases) {
    std::vector<std::pair<std::string, Accessor>> working;  // with the whole environment
    for (const auto& accessor : accessors) {
      auto environment = c.make(c.whole);
      try {
        accessor.second(*environment);
        working.push_back(accessor);
      } catch (const lf::Error&) {
      }
    }
    CHECK(working.size() >= 4);
    for (const auto& [variable, value] : c.whole) {
      for (const bool empty : {false, true}) {
        Env changed = c.whole;
        if (empty) {
          changed[variable] = "";
        } else {
          changed.erase(variable);
        }
        for (const auto& [call, accessor] : working) {
          INFO(c.name << " environment, " << variable << (empty ? " empty" : " unset") << ", " << call << "()");
          auto environment = c.make(changed);
          try {
            accessor(*environment);
          } catch (const lf::Error& error) {
            CHECK_THAT(error.what(), Contains(variable));
          } catch (const std::exception& error) {
            FAIL("not an lf::Error: " << error.what());
          }
        }
      }
    }
  }
}

TEST_CASE("env::Reader: typed values, each spelling launchers write", "[environments]") {
  const lf::env::Reader reader(lf::env::map_env({{"N", "42"}, {"SIGNED", " -3"}, {"SEED", "18446744073709551615"},
                                                 {"ON_1", "1"}, {"ON_TRUE", "True"}, {"ON_YES", "YES"}, {"OFF_0", "0"},
                                                 {"OFF_FALSE", "false"}, {"OFF_NO", "No"}, {"S", "0.5"}, {"S_INT", "3"},
                                                 {"TEXT", ""}}));
  CHECK(reader.integer("N") == 42);
  CHECK(reader.integer("SIGNED") == -3);
  CHECK(reader.integer("N", 0, 65535) == 42);
  CHECK(reader.unsigned_integer("SEED") == 18446744073709551615ULL);
  for (const char* on : {"ON_1", "ON_TRUE", "ON_YES"}) CHECK(reader.flag(on));
  for (const char* off : {"OFF_0", "OFF_FALSE", "OFF_NO"}) CHECK_FALSE(reader.flag(off, true));
  CHECK(reader.seconds("S") == 0.5);
  CHECK(reader.seconds("S_INT") == 3.0);
  CHECK(reader.text("TEXT") == std::string());
  // Unset: nullopt, or the flag's fallback.
  CHECK_FALSE(reader.integer("UNSET").has_value());
  CHECK_FALSE(reader.unsigned_integer("UNSET").has_value());
  CHECK_FALSE(reader.seconds("UNSET").has_value());
  CHECK_FALSE(reader.text("UNSET").has_value());
  CHECK(reader.flag("UNSET", true));
  CHECK_FALSE(reader.flag("UNSET"));
}

TEST_CASE("env::Reader: a malformed value is a ValueError naming the variable, value and fix", "[environments]") {
  const lf::env::Reader reader(lf::env::map_env({{"LT_COUNT", "abc"}, {"LT_TRAILING", "3x"}, {"LT_PORT", "70000"},
                                                 {"LT_SEED", "-1"}, {"LT_SWITCH", "maybe"}, {"LT_WAIT", "soon"},
                                                 {"LT_NEGATIVE", "-1"}, {"LT_FOREVER", "inf"}}));
  CHECK_THROWS_AS(reader.integer("LT_COUNT"), lf::ValueError);
  CHECK_THROWS_WITH(reader.integer("LT_COUNT"), Contains("LT_COUNT=\"abc\" is not an integer") && Contains("unset it"));
  CHECK_THROWS_WITH(reader.integer("LT_TRAILING"), Contains("LT_TRAILING=\"3x\" is not an integer"));
  CHECK_THROWS_WITH(reader.integer("LT_PORT", 0, 65535), Contains("LT_PORT=\"70000\" is out of range") &&
                                                          Contains("from 0 to 65535"));
  CHECK_THROWS_WITH(reader.unsigned_integer("LT_SEED"), Contains("LT_SEED=\"-1\" is not an unsigned integer"));
  CHECK_THROWS_AS(reader.flag("LT_SWITCH"), lf::ValueError);
  CHECK_THROWS_WITH(reader.flag("LT_SWITCH"), Contains("LT_SWITCH=\"maybe\" is not a flag") && Contains("true") &&
                                                  Contains("yes") && Contains("false"));
  CHECK_THROWS_AS(reader.seconds("LT_WAIT"), lf::ValueError);
  CHECK_THROWS_WITH(reader.seconds("LT_WAIT"), Contains("LT_WAIT=\"soon\" is not a number of seconds"));
  CHECK_THROWS_WITH(reader.seconds("LT_NEGATIVE"), Contains("LT_NEGATIVE=\"-1\""));
  CHECK_THROWS_WITH(reader.seconds("LT_FOREVER"), Contains("LT_FOREVER=\"inf\""));
}

TEST_CASE("a malformed rank names its variable", "[environments]") {
  Env torchrun{{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "1x"}, {"GROUP_RANK", "0"}, {"LOCAL_RANK", "0"},
               {"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}};
  CHECK_THROWS_WITH(detect(torchrun)->global_rank(), Contains("RANK=\"1x\" is not an integer"));
}
