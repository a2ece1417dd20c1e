// What fabric.save and fabric.load do with an lf::ResumeState entry (checkpoint/resume_state.h):
// gather every rank's generators and loader positions into one plain value, and put them back.
#pragma once

#include <ATen/core/ivalue.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/checkpoint/state_fwd.h"
#include "lightning/fabric/utilities/data.h"

namespace lightning::fabric {

class Fabric;
class StreamingDataLoader;

namespace resume {

/// The names of state's top-level ResumeState entries (refused when made by another Fabric).
std::vector<std::string> entry_names(const State& state, const Fabric& fabric, const char* call);

/// Every rank's generator states and loaders' positions, and the streaming loaders' own states
/// (this rank's; each is the job's position, the same on every rank), as the dict the file stores
/// (a collective: every rank calls it, loaders in the same order).
c10::IValue gather(Fabric& fabric, const std::vector<std::shared_ptr<LoaderProgress>>& loaders,
                   const std::vector<StreamingDataLoader*>& streaming);

/// Restores this rank's generators, each streaming loader's position, and arms each loader's next
/// pass from what gather saved. path and name only name the checkpoint in errors.
void restore(Fabric& fabric, const c10::IValue& saved, const std::vector<std::shared_ptr<LoaderProgress>>& loaders,
             const std::vector<StreamingDataLoader*>& streaming, const std::filesystem::path& path,
             const std::string& name);

}  // namespace resume
}  // namespace lightning::fabric
