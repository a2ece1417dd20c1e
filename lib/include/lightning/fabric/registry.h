// Name registries: the extension point for accelerators, strategies and precision plugins.
// The built-in names are registered in one place (src/builtin_registrations.cpp) the first time a
// registry is used, never by static initialisers, so the set of names is predictable. Users add
// their own with add(). names() keeps registration order: it is the order of every list of
// choices in error messages and --help.
#pragma once

#include "lightning/fabric/export.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lightning/fabric/errors.h"

namespace lightning::fabric {

/// Joins names as "a, b, c" for error messages.
LF_API std::string join_names(const std::vector<std::string>& names, const std::string& separator = ", ");

/// Maps a name to a factory that builds a Base from Args. Not thread-safe: fill it at start-up.
template <class Base, class... Args>
class Registry {
 public:
  using Factory = std::function<std::shared_ptr<Base>(Args...)>;

  /// kind names the registry in messages, e.g. "strategy".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  /// Registers name; a name already present is an error unless override_existing is true.
  void add(const std::string& name, Factory factory, std::string description = {},
           bool override_existing = false) {
    LF_CHECK(override_existing || entries_.count(name) == 0, ValueError, "The ", kind_, " name '",
             name, "' is already registered. Pass override_existing=true to replace it.");
    if (entries_.count(name) == 0) order_.push_back(name);
    entries_[name] = Entry{std::move(factory), std::move(description)};
  }

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  /// Builds the named object; an unknown name is a ValueError listing every registered name.
  std::shared_ptr<Base> create(const std::string& name, Args... args) const {
    auto found = entries_.find(name);
    LF_CHECK(found != entries_.end(), ValueError, "No ", kind_, " named '", name,
             "' is registered. Registered ", kind_, " names: ", join_names(names()), ".");
    return found->second.factory(std::forward<Args>(args)...);
  }

  /// Every registered name, in registration order.
  const std::vector<std::string>& names() const { return order_; }

  const std::string& description(const std::string& name) const { return entries_.at(name).description; }

 private:
  struct Entry {
    Factory factory;
    std::string description;
  };
  std::string kind_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

}  // namespace lightning::fabric
