// `lightning-run status HOST:PORT`: a live look inside a running job. The command joins the job's
// rendezvous store (the address lightning-run prints as "rendezvous at HOST:PORT") and adds a
// request there; every node's lightning-run sees it within a quarter second, has each of its ranks
// write its native stack (the ranks' watchdog threads answer; the job goes on) and writes back one
// text per node: each rank's step, the collective it is in or last left and when, and its stack.
// The command prints the nodes' texts in order. docs/launcher.md, "Looking inside a running job".
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace lightning::launcher {

/// The store keys of the exchange: a counter of requests, and under each request the number of
/// nodes (written by node 0) and one text per node ("node/<node rank>").
std::string status_requests_key();
std::string status_answer_key(int64_t request, const std::string& what);

/// argv[1] is "status".
bool is_status_command(int argc, const char* const* argv);

/// Runs `lightning-run status ADDRESS [--timeout SECONDS]`. Returns 0 when every node answered,
/// 1 when the job could not be reached or some node did not answer in time (each said on err),
/// 2 for a bad command line. A peer that accepts the connection but never answers ends the
/// process with std::_Exit(1) at the deadline: this is the command's own entry point.
int run_status_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace lightning::launcher
