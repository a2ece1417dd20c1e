// The distributed checkpoint folder every sharded strategy writes (fsdp, model_parallel): the
// staging folder, each rank's items, and the commit that makes the folder complete at once.
#include <unistd.h>

#include "lightning/fabric/checkpoint/atomic_file.h"
#include "lightning/fabric/checkpoint/background_write.h"
#include "lightning/fabric/checkpoint/checkpoint_io.h"
#include "lightning/fabric/checkpoint/dcp.h"
#include "lightning/fabric/errors.h"
#include "lightning/fabric/strategies/parallel.h"

namespace lightning::fabric {

namespace fs = std::filesystem;

CheckpointWrite ParallelStrategy::prepare_dcp_folder(
    const std::string& call, const fs::path& path, bool host_copy,
    const std::function<std::vector<dcp::SaveItem>(StateDict& rest)>& collect) {
  const fs::path staging =
      broadcast_bytes(is_global_zero() ? path.string() + ".tmp-" + std::to_string(::getpid()) : std::string(), 0);
  const bool zero = is_global_zero();
  auto discard = [zero, staging] {
    std::error_code ignored;
    if (zero) fs::remove_all(staging, ignored);  // nothing half-written stays behind
  };
  run_on_rank_zero(call, [&] {
    fs::remove_all(staging);
    fs::create_directories(staging);
  });
  auto items = std::make_shared<std::vector<dcp::SaveItem>>();
  auto rest = std::make_shared<StateDict>(make_state_dict());  // what Python Fabric keeps in meta.pt
  try {
    run_on_every_rank(call, [&] {
      *items = collect(*rest);
      if (!host_copy) return;
      for (dcp::SaveItem& item : *items) item.value = lightning::fabric::host_copy(item.value);
      *rest = lightning::fabric::host_copy(*rest).toGenericDict();
    });
  } catch (const RuntimeError&) {
    discard();
    throw;
  }
  auto written = std::make_shared<std::string>();  // this rank's metadata, pickled
  CheckpointWrite steps;
  steps.write = [staging, rank = global_rank(), items, written] {
    *written = dcp::write_metadata(dcp::write_rank_items(staging, rank, *items));
  };
  steps.commit = [this, call, staging, path, rest, written] {
    std::vector<std::string> every_rank;
    for (int rank = 0; rank < world_size(); ++rank) {
      std::string bytes = broadcast_bytes(rank == global_rank() ? *written : std::string(), rank);
      if (is_global_zero()) every_rank.push_back(std::move(bytes));
    }
    run_on_rank_zero(call, [&] {
      std::vector<dcp::Metadata> parts;
      for (size_t rank = 0; rank < every_rank.size(); ++rank) {
        parts.push_back(dcp::parse_metadata(every_rank[rank], "rank " + std::to_string(rank) + "'s items"));
      }
      save_state_dict_file(staging / dcp::kLightningMetaFile, *rest);
      write_file_atomically(staging / dcp::kMetadataFile, dcp::write_metadata(dcp::merge_metadata(parts)));
      replace_folder(staging, path, dcp::kMetadataFile);
    });
  };
  steps.discard = discard;
  return steps;
}

}  // namespace lightning::fabric
