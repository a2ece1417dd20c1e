#include "lightning/launcher/consolidate.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <string>

#include "lightning/fabric/checkpoint/checkpoint_storage.h"
#include "lightning/fabric/checkpoint/consolidate.h"
#include "lightning/fabric/checkpoint/dcp_format.h"
#include "lightning/fabric/checkpoint/sharded_format.h"

namespace lightning::launcher {

namespace fs = std::filesystem;

bool is_consolidate_command(int argc, const char* const* argv) {
  return argc >= 3 && std::string(argv[1]) == "model" && std::string(argv[2]) == "consolidate";
}

namespace {
// A problem with the arguments (exit 2) rather than with the checkpoint's content (exit 1).
struct ArgumentProblem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const std::string kWho = "lightning-run model consolidate";
void check_local_folder(const fs::path& folder);

void check_arguments(const fs::path& folder, const fs::path& output) {
  namespace storage = fabric::checkpoint_storage;
  for (const auto& path : {folder, output}) {
    if (path.string().rfind("memory://", 0) == 0) {
      throw ArgumentProblem(path.string() + ": memory:// objects live only inside a running job (lightning-run "
                            "--in-memory-replicas); save a checkpoint to a local path or s3:// to consolidate it.");
    }
    try {
      fabric::storage::refuse_unknown_schemes(path.string(), kWho);
    } catch (const std::exception& e) {
      throw ArgumentProblem(std::string(e.what()).substr(kWho.size() + 2));
    }
  }
  bool output_exists = false;
  try {
    if (storage::is_remote(folder) && !storage::is_remote_folder(folder, kWho)) {
      throw ArgumentProblem(folder.string() + " is not a sharded checkpoint: no .metadata is under it (a sharded save "
                            "writes it last; a single-file checkpoint needs no consolidation).");
    }
    output_exists = storage::is_remote(output) ? storage::remote_exists(output, kWho) : fs::exists(output);
  } catch (const fabric::ValueError& e) {  // a URL without a bucket, no credentials: the arguments' fault
    throw ArgumentProblem(std::string(e.what()).substr(kWho.size() + 2));
  }
  if (!storage::is_remote(folder)) check_local_folder(folder);
  if (output_exists) {
    throw ArgumentProblem("the output " + output.string() + " already exists; consolidate never overwrites. Remove it "
                          "or choose another with --output-file PATH.");
  }
}

void check_local_folder(const fs::path& folder) {
  if (!fs::exists(folder)) throw ArgumentProblem(folder.string() + " does not exist.");
  if (!fs::is_directory(folder)) {
    throw ArgumentProblem(folder.string() + " is a file, not a sharded checkpoint folder. A single-file checkpoint "
                          "needs no consolidation: fabric.load and torch.load read it as it is.");
  }
  if (!fabric::dcp::is_dcp_checkpoint(folder) && !fabric::is_sharded_checkpoint(folder)) {
    throw ArgumentProblem(folder.string() + " is not a sharded checkpoint: it has no .metadata (strategy=\"fsdp\" and "
                          "Python's torch.distributed.checkpoint write one with every sharded save).");
  }
}
}  // namespace

int run_consolidate(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"Merge a sharded checkpoint folder into one file that fabric.load and torch.load read"};
  app.name("lightning-run model consolidate");
  std::string folder_text, output_text;
  app.add_option("checkpoint_folder", folder_text, "The sharded checkpoint folder (written by strategy=\"fsdp\" or torch.distributed.checkpoint)")->required();
  app.add_option("--output-file,--output_file", output_text, "Where to write the file (default: FOLDER.consolidated)");
  try {
    app.parse(argc - 2, argv + 2);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error, out, err);
    return error.get_exit_code() == 0 ? code : 2;
  }
  std::string remote = fabric::checkpoint_storage::is_remote(folder_text) ? folder_text : std::string();
  while (remote.size() > 5 && remote.back() == '/') remote.pop_back();  // s3:// keeps its double slash
  const fs::path folder = fs::path(folder_text).lexically_normal();
  const fs::path stripped = !remote.empty() ? fs::path(remote) : folder.has_filename() ? folder : folder.parent_path();
  const fs::path output = output_text.empty() ? fs::path(stripped.string() + ".consolidated") : fs::path(output_text);
  const auto start = std::chrono::steady_clock::now();
  fabric::ConsolidateSummary summary;
  try {
    check_arguments(stripped, output);
    // s3://: the folder is downloaded, consolidated locally, and the file uploaded in one PUT.
    const auto input = fabric::checkpoint_storage::fetch(stripped, kWho);
    if (fabric::checkpoint_storage::is_remote(output)) {
      const fabric::checkpoint_storage::TemporaryFolder staging("consolidate");
      const fs::path local = staging.path() / "consolidated.pt";
      summary = fabric::consolidate_sharded_folder(input.path(), local);
      fabric::checkpoint_storage::upload_file(local, output, kWho);
    } else {
      summary = fabric::consolidate_sharded_folder(input.path(), output);
    }
  } catch (const ArgumentProblem& problem) {
    err << "lightning-run model consolidate: " << problem.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    err << "lightning-run model consolidate: " << error.what() << "\n";
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out << "lightning-run: consolidated " << stripped.string() << " into " << output.string() << " ("
      << summary.bytes << " bytes, " << summary.tensors << " tensors merged, " << seconds << " s)\n";
  return 0;
}

}  // namespace lightning::launcher
