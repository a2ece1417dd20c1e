// Waiting for a TCP listener to accept connections, quietly: ranks poll rank 0's store port this
// way before c10d's TCPStore connects, so that a rank 0 that never comes up costs exactly the
// rendezvous timeout and one clear error, not c10d's retries with their logged stack traces.
#pragma once

#include <chrono>
#include <string>

namespace lightning::fabric::internal {

/// True once host:port accepts a TCP connection (the probe connection is closed at once); false
/// when timeout passes first. Host names are resolved on every try (DNS may lag a node's start).
bool wait_for_listener(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace lightning::fabric::internal
