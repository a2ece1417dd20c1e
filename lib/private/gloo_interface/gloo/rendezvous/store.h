// Stand-in for gloo/rendezvous/store.h (README.md): the virtual functions that c10d's GlooStore
// overrides. GlooStore is never constructed here, so no vtable of it is emitted by this project.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace gloo::rendezvous
