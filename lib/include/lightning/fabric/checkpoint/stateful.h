// Stateful: the interface of every live object a checkpoint saves and restores in place. Derive
// your own classes from it to put them into an lf::State next to the model and optimizer, as
// Python Fabric accepts any object with state_dict() / load_state_dict():
//
//   struct Counter : lf::Stateful {
//     int64_t seen = 0;
//     lf::StateDict state_dict() const override {
//       lf::StateDict state = lf::make_state_dict();
//       state.insert("seen", seen);
//       return state;
//     }
//     void load_state_dict(const lf::StateDict& state) override { seen = state.at("seen").toInt(); }
//   };
//   Counter counter;
//   fabric.save(path, {{"model", model}, {"counter", counter}});   // borrowed for the call
//
// Called on every rank by fabric.save / fabric.load; not collective. state_dict() returns what the
// file stores under the entry's name (string keys; tensors, numbers, strings, lists, dicts);
// load_state_dict() receives that dict back and raises (any exception) when it cannot use it.
#pragma once

#include "lightning/fabric/export.h"

#include "lightning/fabric/checkpoint/state_fwd.h"

namespace lightning::fabric {

class LF_API Stateful {
 public:
  virtual ~Stateful() = default;
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;
};

/// A new empty StateDict (string keys, any values).
LF_API StateDict make_state_dict();

}  // namespace lightning::fabric
