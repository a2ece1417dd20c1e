// Merging a sharded checkpoint folder (dcp_format.h, or the earlier sharded_format.h) into one torch.save file without
// LibTorch: the pickles are edited as trees (pickle_tree.h) and the tensor bytes are spliced from
// the shard files into the output inside the kernel (zip_archive.h), never decoded. What
// `lightning-run model consolidate` runs; the output reads back with fabric.load, torch::pickle_load
// and Python's torch.load as one dict with every tensor whole. Not collective.
#pragma once

#include <cstdint>
#include <filesystem>

namespace lightning::fabric {

struct ConsolidateSummary {
  uint64_t bytes = 0;     // size of the written file
  int64_t tensors = 0;    // tensors assembled from shards
};

/// Writes the whole checkpoint of `folder` to `output` atomically (replacing it if it exists).
/// Every input entry's CRC-32 is checked. RuntimeError naming the file for a folder that is not a
/// sharded checkpoint, a missing data file (DCP) or common.pt or shard (earlier layout), a
/// truncated or corrupted file, or tensors that disagree with the metadata or that the saved
/// chunks do not cover; output is then left untouched.
/// force_zip64 writes ZIP64 records even when the file is small (tests of the large-file path).
ConsolidateSummary consolidate_sharded_folder(const std::filesystem::path& folder, const std::filesystem::path& output,
                                              bool force_zip64 = false);

}  // namespace lightning::fabric
