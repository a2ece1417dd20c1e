// How the rendezvous talks to its store, shared by the files that implement it (rendezvous.cpp,
// and rendezvous_rounds.cpp for elastic jobs): values as text, the poll interval, and
// Rendezvous::bounded, which gives up on a store that does not answer.
#pragma once

#include <future>
#include <memory>
#include <thread>
#include <type_traits>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "lightning/launcher/rendezvous.h"

namespace lightning::launcher {

inline std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
inline std::string text(const std::vector<uint8_t>& data) { return {data.begin(), data.end()}; }

inline constexpr auto kPollInterval = std::chrono::milliseconds(50);

template <typename Op>
auto Rendezvous::bounded(Op op) -> decltype(op(std::declval<c10d::TCPStore&>())) {
  using Result = decltype(op(std::declval<c10d::TCPStore&>()));
  if (hosts_store_) return op(*store_);  // node 0's own store, served in this process
  if (unreachable_) throw std::runtime_error("an earlier call got no answer");
  auto promise = std::make_shared<std::promise<Result>>();
  std::future<Result> answer = promise->get_future();
  // The thread owns everything it touches (op holds copies), so it may outlive this call.
  std::thread([store = store_, promise, op]() mutable {
    try {
      if constexpr (std::is_void_v<Result>) {
        op(*store);
        promise->set_value();
      } else {
        promise->set_value(op(*store));
      }
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (answer.wait_for(node_timeout_) != std::future_status::ready) {
    unreachable_ = true;
    throw std::runtime_error("no answer for " + format_seconds(static_cast<double>(node_timeout_.count()) / 1000.0) +
                             "s (--node-timeout): node 0's machine is down or the network to it is");
  }
  return answer.get();
}

}  // namespace lightning::launcher
