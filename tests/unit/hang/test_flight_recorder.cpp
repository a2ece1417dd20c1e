// The flight recorder (ring, progress, file sharing, text) and the hang analysis that reads it.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "lightning/fabric/hang/flight_recorder.h"
#include "lightning/fabric/hang/hang_report.h"

namespace lf = lightning::fabric;
namespace flight = lightning::fabric::flight;
using Catch::Matchers::Contains;

namespace {
uint64_t issue(flight::Recorder& recorder, const char* op, std::vector<int64_t> shape, bool finish = true) {
  uint64_t numel = 1;
  for (auto size : shape) numel *= static_cast<uint64_t>(size);
  const uint64_t seq = recorder.begin(op, "world", "float32", shape.data(), shape.size(), numel);
  recorder.wait(seq);
  if (finish) recorder.end(seq, false);
  return seq;
}

flight::Progress waiting_in(int rank, uint64_t seq, const std::string& op, const std::string& shape, double seconds) {
  flight::Progress progress;
  progress.rank = rank;
  progress.pid = 100 + rank;
  progress.entered = {seq, op, "world", "float32", shape, false, false};
  progress.completed = {seq - 1, "all_reduce", "world", "float32", "[4]", true, false};
  progress.waiting = true;
  progress.waiting_call = progress.entered;
  progress.waiting_s = seconds;
  return progress;
}

flight::Progress idle_after(int rank, uint64_t seq, double seconds) {
  flight::Progress progress;
  progress.rank = rank;
  progress.pid = 100 + rank;
  progress.entered = {seq, "all_reduce", "world", "float32", "[4]", true, false};
  progress.completed = progress.entered;
  progress.idle_s = seconds;
  return progress;
}
}  // namespace

TEST_CASE("flight recorder: progress names the last entered, completed and waited-in collectives", "[flight]") {
  auto recorder = flight::Recorder::create(1, 2, 8, "");
  issue(*recorder, "broadcast", {2, 4});
  issue(*recorder, "all_reduce", {10});
  const uint64_t stuck = issue(*recorder, "barrier", {}, false);
  const flight::Progress progress = recorder->progress();
  CHECK(progress.rank == 1);
  CHECK(progress.pid == ::getpid());
  CHECK(progress.completed.describe() == "#2 all_reduce float32[10] on world");
  CHECK(progress.entered.seq == stuck);
  CHECK(progress.waiting);
  CHECK(progress.waiting_call.describe() == "#3 barrier float32[] on world");
  CHECK(progress.waiting_s >= 0.0);
  recorder->end(stuck, true);
  CHECK_FALSE(recorder->progress().waiting);
  CHECK(recorder->progress().completed.failed);
}

TEST_CASE("flight recorder: the ring keeps the last N records, oldest first in the dump", "[flight]") {
  auto recorder = flight::Recorder::create(0, 2, 4, "");
  for (int i = 0; i < 10; ++i) issue(*recorder, "all_reduce", {i + 1});
  CHECK_FALSE(recorder->call(6).has_value());  // overwritten
  REQUIRE(recorder->call(7).has_value());
  CHECK(recorder->call(7)->shape == "[7]");
  const std::string dump = recorder->dump_text();
  CHECK_THAT(dump, Contains("rank 0 of 2") && Contains("\n7  all_reduce  world  float32  [7]  7  done") &&
                       Contains("\n10  all_reduce") && !Contains("\n6  all_reduce"));
  CHECK(dump.find("\n7  ") < dump.find("\n10  "));
}

TEST_CASE("flight recorder: a long shape is cut, not overflowed", "[flight]") {
  auto recorder = flight::Recorder::create(0, 2, 4, "");
  std::vector<int64_t> shape(40, 123456789);
  issue(*recorder, "all_gather", shape);
  const auto call = recorder->call(1);
  REQUIRE(call.has_value());
  CHECK(call->shape.size() < 96);
  CHECK_THAT(call->shape, Contains("...]"));
}

TEST_CASE("flight recorder: another process's view through the file sees progress and sets dump requests", "[flight]") {
  const auto dir = std::filesystem::temp_directory_path() / ("lf-flight-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "rank_3.flight").string();
  auto writer = flight::Recorder::create(3, 4, 16, file);
  writer->header().hang_timeout_ms = 1234;
  issue(*writer, "all_reduce", {4});
  issue(*writer, "all_gather", {2, 2}, false);
  auto reader = flight::Recorder::attach(file);
  REQUIRE(reader != nullptr);
  CHECK(reader->header().rank == 3);
  CHECK(reader->header().hang_timeout_ms == 1234);
  CHECK(reader->progress().waiting_call.describe() == "#2 all_gather float32[2, 2] on world");
  reader->header().dump_request.store(1);
  CHECK(writer->header().dump_request.load() == 1);
  CHECK(flight::Recorder::attach((dir / "missing.flight").string()) == nullptr);
  std::filesystem::resize_file(file, 10);
  CHECK(flight::Recorder::attach(file) == nullptr);  // too short to be a recorder
  std::filesystem::remove_all(dir);
}

TEST_CASE("flight recorder: progress survives the trip through the store's text form", "[flight]") {
  flight::Progress progress = waiting_in(2, 7, "broadcast", "[3, 1]", 4.5);
  progress.host = "node-a";
  progress.exited = "exit code 0";
  const flight::Progress back = flight::Progress::parse(progress.serialize());
  CHECK(back.rank == 2);
  CHECK(back.host == "node-a");
  CHECK(back.waiting_call.describe() == "#7 broadcast float32[3, 1] on world");
  CHECK(back.completed.done);
  CHECK(back.waiting_s == Approx(4.5));
  CHECK(back.exited == "exit code 0");
  CHECK(flight::Progress::parse("garbage").rank == -1);
}

TEST_CASE("hang analysis: no verdict until some rank has waited the whole timeout", "[flight]") {
  const auto verdict = lf::analyze_hang({waiting_in(0, 5, "all_reduce", "[4]", 2.9), idle_after(1, 4, 2.9)}, 2, 3.0);
  CHECK_FALSE(verdict.hung);
  CHECK_FALSE(lf::analyze_hang({idle_after(0, 4, 100), idle_after(1, 4, 100)}, 2, 3.0).hung);
}

TEST_CASE("hang analysis: a rank that never entered the collective is named", "[flight]") {
  const auto verdict = lf::analyze_hang({waiting_in(0, 5, "all_reduce", "[4]", 3.5), idle_after(1, 4, 3.6)}, 2, 3.0);
  REQUIRE(verdict.hung);
  CHECK(verdict.blamed_rank == 1);
  CHECK_THAT(verdict.cause, Contains("rank 1 never entered collective #5 all_reduce float32[4] on world that rank 0 waits in"));
  CHECK_THAT(verdict.report, Contains("rank 0 has waited 3.5 s") && Contains("rank 1 (pid 101): not in a collective for 3.6 s"));
}

TEST_CASE("hang analysis: silent and exited ranks are told apart from busy ones", "[flight]") {
  flight::Progress silent = idle_after(1, 4, 9);
  silent.silent_s = 9;
  flight::Progress gone = idle_after(2, 4, 9);
  gone.exited = "exit code 0";
  const auto verdict = lf::analyze_hang({waiting_in(0, 5, "barrier", "", 4), silent, gone}, 3, 3.0);
  REQUIRE(verdict.hung);
  CHECK_THAT(verdict.cause, Contains("rank 1 stopped responding") && Contains("rank 2 exited while collective #5"));
  CHECK_THAT(verdict.report, Contains("no heartbeat for 9.0 s"));
}

TEST_CASE("hang analysis: ranks in different collectives, and mismatched shapes, are named", "[flight]") {
  const auto order = lf::analyze_hang({waiting_in(0, 5, "all_reduce", "[4]", 4), waiting_in(1, 5, "barrier", "", 4)}, 2, 3.0);
  CHECK_THAT(order.cause, Contains("inside different collectives (rank 0 in #5 all_reduce, rank 1 in #5 barrier)"));
  const auto shapes = lf::analyze_hang({waiting_in(0, 5, "all_gather", "[4]", 4), waiting_in(1, 5, "all_gather", "[8]", 4)}, 2, 3.0);
  CHECK_THAT(shapes.cause, Contains("mismatched shapes or dtypes in collective #5 all_gather (rank 0: float32[4], rank 1: float32[8])"));
  const auto same = lf::analyze_hang({waiting_in(0, 5, "all_reduce", "[4]", 4), waiting_in(1, 5, "all_reduce", "[4]", 4)}, 2, 3.0);
  CHECK_THAT(same.cause, Contains("every rank waits in the same collective"));
  const auto missing = lf::analyze_hang({waiting_in(0, 5, "all_reduce", "[4]", 4)}, 2, 3.0);
  CHECK_THAT(missing.cause, Contains("rank 1 reported no progress"));
}

TEST_CASE("hang analysis: after a crash, positions show where each rank was and a mismatch", "[flight]") {
  flight::Progress zero = waiting_in(0, 10, "all_reduce", "[4]", 0.1);
  zero.exited = "signal SIGABRT (6)";
  flight::Progress one = waiting_in(1, 10, "all_reduce", "[8]", 0.1);
  const std::string text = lf::describe_positions({zero, one});
  CHECK_THAT(text, Contains("rank 0 (pid 100): exited (signal SIGABRT (6)); last entered #10 all_reduce float32[4]"));
  CHECK_THAT(text, Contains("collective #10 differs across ranks (rank 0: all_reduce float32[4]; rank 1: all_reduce float32[8])"));
  CHECK(lf::describe_positions({idle_after(0, 3, 1), idle_after(1, 3, 1)}).find("likely cause") == std::string::npos);
}

TEST_CASE("flight recorder: entries give entry times on the monotonic clock or counted back from the leave",
          "[flight]") {
  auto recorder = flight::Recorder::create(0, 2, 8, "");
  for (int call = 0; call < 3; ++call) {
    const int64_t shape[] = {4};
    const uint64_t seq = recorder->begin("all_reduce", "world", "float32", shape, 1, 4);
    recorder->wait(seq);
    usleep(static_cast<useconds_t>(20000 * (call + 1)));  // waits of 20, 40 and 60 ms
    recorder->end(seq, false);
  }
  issue(*recorder, "barrier", {}, false);  // in flight: not an entry yet
  const auto monotonic = recorder->entries(8);
  const auto from_leave = recorder->entries(8, flight::EntryTimes::kFromLeave);
  REQUIRE(monotonic.size() == 3);
  REQUIRE(from_leave.size() == 3);
  CHECK(monotonic[0].first == 3);  // newest first
  CHECK(monotonic[0].second > monotonic[2].second);
  for (size_t i = 0; i < 3; ++i) {
    const double waited_ms = -static_cast<double>(from_leave[i].second) / 1e6;
    CHECK(from_leave[i].first == monotonic[i].first);
    CHECK(waited_ms >= 20.0 * static_cast<double>(3 - i));
    CHECK(waited_ms < 20.0 * static_cast<double>(3 - i) + 500);
  }
  CHECK(recorder->entries(2, flight::EntryTimes::kFromLeave).size() == 2);
}
