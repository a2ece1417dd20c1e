// Exact resume: one more entry in the State you save and load makes a resumed run continue as the
// run that was never stopped, bit for bit:
//
//   lf::State state{{"model", model}, {"optimizer", optimizer}, {"step", step},
//                   {"resume", fabric.resume_state()}};
//
// fabric.save then stores, under that name, every rank's random generators (CPU, and each visible
// CUDA device's) and the position of every loader this Fabric set up (its epoch and how many
// batches this pass has handed out; a streaming loader's own state); fabric.load puts them back,
// so the next pass of each loader starts at the batch after the last one taken, with the
// sampler's order of that epoch.
//
// Contract:
//   - Set up the same loaders, in the same order, before fabric.load as before fabric.save.
//   - Bitwise equality also needs what LibTorch computes to be deterministic: loaders with
//     workers == 0 (LibTorch's worker threads draw from the shared generator in any order), and
//     no std::rand() (its state cannot be read).
//   - Another world size: the loaders continue at the same global sample (each rank skips its
//     share of what all ranks had taken), the generators keep their seeded states, and rank 0
//     warns that the resume is not exact.
//   - A file without the entry: fabric.load refuses (strict, the default) or warns (strict=false).
#pragma once

#include "lightning/fabric/export.h"

#include "lightning/fabric/checkpoint/stateful.h"

namespace lightning::fabric {

class Fabric;

/// The marker fabric.resume_state() returns; only fabric.save / fabric.load / save_in_background
/// know what to do with it (a collective: every rank calls them). Its own state_dict() and
/// load_state_dict() are RuntimeErrors (save_raw, or a State not passed to a Fabric).
class LF_API ResumeState final : public Stateful {
 public:
  explicit ResumeState(const Fabric& fabric) : fabric_(&fabric) {}
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  const Fabric* fabric() const { return fabric_; }

 private:
  const Fabric* fabric_;
};

}  // namespace lightning::fabric
