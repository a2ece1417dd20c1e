// Callbacks: user objects whose hooks Fabric::call(name, ...) invokes. This is the base class
// FabricOptions::callbacks() accepts; the hook set and Fabric::call arrive with the trainer toolkit.
#pragma once

namespace lightning::fabric {

class Callback {
 public:
  virtual ~Callback() = default;
};

}  // namespace lightning::fabric
