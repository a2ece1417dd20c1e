// OutputRouter on real pipes: tagging, the failure report's tail, per-rank log files, and progress
// redraws (carriage returns) kept out of the logs and the tail.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lightning/fabric/utilities/process.h"
#include "lightning/launcher/output.h"

namespace launcher = lightning::launcher;
using Catch::Matchers::Contains;

namespace {
void write_all(int fd, const std::string& text) { REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size())); }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

TEST_CASE("output router: lines reach the tail and the log files, redraws only the console", "[output]") {
  const std::string dir = lightning::fabric::make_temporary_directory("lf-output-test-");
  launcher::OutputOptions options;
  options.tag = true;
  options.console_local_ranks = std::set<int>{};  // nothing on this test's console
  options.log_dir = dir;
  options.tail_lines = 2;
  {
    launcher::OutputRouter router(options);
    auto [out, err] = router.open_worker(/*global_rank=*/3, /*local_rank=*/0, /*attempt=*/0);
    write_all(out, "first\nsecond\n");
    write_all(err, "progress 1/2\rprogress 2/2\r");
    write_all(out, "third line without newline");
    ::close(out);
    ::close(err);
    router.drain(200);
    CHECK(router.fds().empty());  // both pipes reached end of file and were closed
    const auto tail = router.tail(3);
    REQUIRE(tail.size() == 2);    // tail_lines
    CHECK(tail[0] == "second");
    CHECK(tail[1] == "third line without newline");
    CHECK(router.tail(0).empty());
  }
  const auto attempt = std::filesystem::path(dir) / "attempt_0";
  CHECK(read_file(attempt / "rank_3.stdout") == "first\nsecond\nthird line without newline\n");
  CHECK_THAT(read_file(attempt / "rank_3.stderr"), !Contains("progress 1/2"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("output router: reset drops every stream before a restart and keeps the tails", "[output]") {
  launcher::OutputOptions options;
  options.console_local_ranks = std::set<int>{};
  launcher::OutputRouter router(options);
  auto [out, err] = router.open_worker(0, 0, 0);
  write_all(out, "before the restart\n");
  ::close(out);
  ::close(err);
  router.drain(100);
  router.reset();
  CHECK(router.fds().empty());
  CHECK(router.tail(0) == std::vector<std::string>{"before the restart"});  // the report may still need them
}
