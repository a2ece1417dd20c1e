#include "lightning/fabric/hang/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <sstream>

#include "lightning/fabric/errors.h"
#include "lightning/fabric/utilities/process.h"

namespace lightning::fabric::flight {
namespace {

constexpr char kMagic[8] = {'L', 'F', 'F', 'L', 'I', 'G', 'H', 'T'};
constexpr uint32_t kRecordVersion = 2;
constexpr char kFieldSeparator = '\x1f';

int64_t clock_ns(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

template <size_t N>
void copy_text(char (&into)[N], const char* text) {
  size_t i = 0;
  for (; text != nullptr && text[i] != '\0' && i + 1 < N; ++i) into[i] = text[i];
  into[i] = '\0';
}

// Decimal digits of value into out (no terminator); returns the count. Faster than snprintf, which
// dominated the recorder's cost.
size_t decimal(char* out, int64_t value) {
  char reversed[24];
  size_t count = 0;
  uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  do {
    reversed[count++] = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0);
  size_t used = 0;
  if (value < 0) out[used++] = '-';
  while (count > 0) out[used++] = reversed[--count];
  return used;
}

// "[4, 8]" without allocating; cut with "..." when it does not fit.
template <size_t N>
void format_shape(char (&into)[N], const int64_t* sizes, size_t dims) {
  constexpr size_t kReserve = sizeof(", ...]");  // room to close the list when cutting
  size_t used = 0;
  into[used++] = '[';
  for (size_t d = 0; d < dims; ++d) {
    char number[26];
    size_t length = 0;
    if (d > 0) {
      number[length++] = ',';
      number[length++] = ' ';
    }
    length += decimal(number + length, sizes[d]);
    if (used + length + kReserve > N) {
      const char* cut = d == 0 ? "..." : ", ...";
      for (; *cut != '\0'; ++cut) into[used++] = *cut;
      break;
    }
    for (size_t i = 0; i < length; ++i) into[used++] = number[i];
  }
  into[used++] = ']';
  into[used] = '\0';
}

thread_local int32_t cached_tid = 0;
int32_t current_tid() {
  if (cached_tid == 0) cached_tid = static_cast<int32_t>(::syscall(SYS_gettid));
  return cached_tid;
}

Call call_of(const Record& record) {
  Call call;
  call.seq = record.seq;
  call.op = record.op;
  call.group = record.group;
  call.dtype = record.dtype;
  call.shape = record.shape;
  call.done = record.state != 0;
  call.failed = record.state == 2;
  return call;
}

std::string seconds_with_unit(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", seconds);
  return text;
}

Recorder* installed = nullptr;
std::unique_ptr<Recorder>& installed_owner() {
  static std::unique_ptr<Recorder> owner;
  return owner;
}

}  // namespace

int64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }

std::string Call::describe() const {
  if (seq == 0) return "none";
  return "#" + std::to_string(seq) + " " + op + (dtype.empty() ? "" : " " + dtype + shape) + " on " + group;
}

std::string Progress::serialize() const {
  std::ostringstream out;
  const auto call = [&](const Call& c) {
    out << c.seq << kFieldSeparator << c.op << kFieldSeparator << c.group << kFieldSeparator << c.dtype
        << kFieldSeparator << c.shape << kFieldSeparator << (c.failed ? 2 : c.done ? 1 : 0) << kFieldSeparator;
  };
  out << rank << kFieldSeparator << pid << kFieldSeparator << host << kFieldSeparator;
  call(entered);
  call(completed);
  call(waiting_call);
  out << (waiting ? 1 : 0) << kFieldSeparator << waiting_s << kFieldSeparator << idle_s << kFieldSeparator
      << silent_s << kFieldSeparator << exited << kFieldSeparator << steps << kFieldSeparator << since_step_s;
  return out.str();
}

Progress Progress::parse(const std::string& text) {
  std::vector<std::string> fields;
  std::string field;
  for (char c : text) {
    if (c == kFieldSeparator) {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  fields.push_back(field);
  Progress progress;
  if (fields.size() != 28) return progress;  // rank -1: unreadable
  size_t i = 0;
  const auto next = [&]() -> const std::string& { return fields[i++]; };
  const auto call = [&](Call& c) {
    c.seq = std::stoull(next());
    c.op = next();
    c.group = next();
    c.dtype = next();
    c.shape = next();
    const std::string state = next();
    c.done = state != "0";
    c.failed = state == "2";
  };
  try {
    progress.rank = std::stoi(next());
    progress.pid = std::stoi(next());
    progress.host = next();
    call(progress.entered);
    call(progress.completed);
    call(progress.waiting_call);
    progress.waiting = next() == "1";
    progress.waiting_s = std::stod(next());
    progress.idle_s = std::stod(next());
    progress.silent_s = std::stod(next());
    progress.exited = next();
    progress.steps = std::stoll(next());
    progress.since_step_s = std::stod(next());
  } catch (const std::exception&) {
    progress.rank = -1;
  }
  return progress;
}

std::unique_ptr<Recorder> Recorder::create(int rank, int world_size, uint32_t capacity, const std::string& file) {
  std::unique_ptr<Recorder> recorder(new Recorder());
  recorder->bytes_ = sizeof(Header) + sizeof(Record) * capacity;
  void* memory = nullptr;
  if (file.empty()) {
    memory = ::mmap(nullptr, recorder->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    LF_CHECK(fd >= 0, RuntimeError, "flight recorder: cannot create ", file, ": ", std::strerror(errno),
             " (LT_FLIGHT_DIR names the folder).");
    const bool sized = ::ftruncate(fd, static_cast<off_t>(recorder->bytes_)) == 0;
    if (sized) memory = ::mmap(nullptr, recorder->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    LF_CHECK(sized && memory != MAP_FAILED, RuntimeError, "flight recorder: cannot map ", file, ": ",
             std::strerror(errno));
  }
  LF_CHECK(memory != MAP_FAILED, RuntimeError, "flight recorder: cannot allocate ", recorder->bytes_, " bytes.");
  recorder->mapped_ = true;
  recorder->header_ = new (memory) Header();
  recorder->records_ = reinterpret_cast<Record*>(static_cast<char*>(memory) + sizeof(Header));
  Header& header = *recorder->header_;
  header.version = kRecordVersion;
  header.capacity = capacity;
  header.rank = rank;
  header.world_size = world_size;
  header.pid = static_cast<int32_t>(::getpid());
  header.start_mono_ns = clock_ns(CLOCK_MONOTONIC);
  header.start_wall_ns = clock_ns(CLOCK_REALTIME);
  header.heartbeat_ns.store(header.start_mono_ns);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(header.magic, kMagic, sizeof(kMagic));  // last: a reader sees a whole header or none
  return recorder;
}

std::unique_ptr<Recorder> Recorder::attach(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < sizeof(Header)) {
    ::close(fd);
    return nullptr;
  }
  void* memory = ::mmap(nullptr, static_cast<size_t>(info.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (memory == MAP_FAILED) return nullptr;
  std::unique_ptr<Recorder> recorder(new Recorder());
  recorder->bytes_ = static_cast<size_t>(info.st_size);
  recorder->mapped_ = true;
  recorder->header_ = static_cast<Header*>(memory);
  recorder->records_ = reinterpret_cast<Record*>(static_cast<char*>(memory) + sizeof(Header));
  const Header& header = *recorder->header_;
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 || header.version != kRecordVersion ||
      sizeof(Header) + sizeof(Record) * header.capacity > recorder->bytes_) {
    return nullptr;  // the destructor unmaps
  }
  return recorder;
}

Recorder::~Recorder() {
  if (mapped_) ::munmap(header_, bytes_);
}

Recorder* Recorder::process() { return installed; }

Recorder* Recorder::install(std::unique_ptr<Recorder> recorder) {
  if (installed == nullptr && recorder) {
    installed_owner() = std::move(recorder);
    installed = installed_owner().get();
  }
  return installed;
}

uint64_t Recorder::begin(const char* op, const std::string& group, const char* dtype, const int64_t* sizes,
                         size_t dims, uint64_t numel) {
  Header& header = *header_;
  const uint64_t seq = header.entered.load(std::memory_order_relaxed) + 1;
  if (header.capacity > 0) {
    Record& record = records_[seq % header.capacity];
    record.seq = 0;  // a reader racing with this rewrite drops the slot
    std::atomic_thread_fence(std::memory_order_release);
    record.enter_ns = clock_ns(CLOCK_MONOTONIC);
    record.leave_ns = 0;
    record.numel = numel;
    record.state = 0;
    copy_text(record.op, op);
    copy_text(record.group, group.c_str());
    copy_text(record.dtype, dtype);
    format_shape(record.shape, sizes, dims);
    std::atomic_thread_fence(std::memory_order_release);
    record.seq = seq;
  }
  header.issuing_tid.store(current_tid(), std::memory_order_relaxed);
  header.entered.store(seq, std::memory_order_release);
  return seq;
}

void Recorder::wait(uint64_t seq) {
  header_->waiting_since_ns.store(clock_ns(CLOCK_MONOTONIC), std::memory_order_relaxed);
  header_->issuing_tid.store(current_tid(), std::memory_order_relaxed);
  header_->waiting_seq.store(seq, std::memory_order_release);
}

void Recorder::end(uint64_t seq, bool failed) {
  Header& header = *header_;
  const int64_t now = clock_ns(CLOCK_MONOTONIC);
  if (header.capacity > 0) {
    Record& record = records_[seq % header.capacity];
    if (record.seq == seq) {
      record.leave_ns = now;
      record.state = failed ? 2 : 1;
    }
  }
  header.waiting_seq.store(0, std::memory_order_release);
  header.last_leave_ns.store(now, std::memory_order_relaxed);
  if (seq > header.completed.load(std::memory_order_relaxed)) header.completed.store(seq, std::memory_order_release);
}

void Recorder::heartbeat() { header_->heartbeat_ns.store(clock_ns(CLOCK_MONOTONIC), std::memory_order_release); }

void Recorder::note_step() {
  header_->last_step_ns.store(clock_ns(CLOCK_MONOTONIC), std::memory_order_relaxed);
  header_->steps.fetch_add(1, std::memory_order_release);
}

uint32_t Recorder::request_dump(const std::string& dir) {
  copy_text(header_->dump_dir, dir.c_str());
  return header_->dump_request.fetch_add(1, std::memory_order_acq_rel) + 1;
}

bool Recorder::dump_answered(uint32_t request) const {
  return header_->dump_done.load(std::memory_order_acquire) >= request;
}

std::optional<Call> Recorder::call(uint64_t seq) const {
  if (seq == 0 || header_->capacity == 0) return std::nullopt;
  const Record& record = records_[seq % header_->capacity];
  std::atomic_thread_fence(std::memory_order_acquire);
  Call result = call_of(record);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (result.seq != seq || record.seq != seq) return std::nullopt;
  return result;
}

std::vector<std::pair<uint64_t, int64_t>> Recorder::entries(size_t count, EntryTimes times) const {
  std::vector<std::pair<uint64_t, int64_t>> result;
  if (header_->capacity == 0) return result;
  const uint64_t completed = header_->completed.load(std::memory_order_acquire);
  for (uint64_t seq = completed; seq > 0 && result.size() < count && completed - seq < header_->capacity; --seq) {
    const Record& record = records_[seq % header_->capacity];
    std::atomic_thread_fence(std::memory_order_acquire);
    const int64_t enter_ns = record.enter_ns;
    const int64_t leave_ns = record.leave_ns;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (record.seq != seq) continue;
    result.emplace_back(seq, times == EntryTimes::kMonotonic ? enter_ns : enter_ns - leave_ns);
  }
  return result;
}

Progress Recorder::progress() const {
  const Header& header = *header_;
  const int64_t now = clock_ns(CLOCK_MONOTONIC);
  Progress progress;
  progress.rank = header.rank;
  progress.pid = header.pid;
  progress.host = host_name();
  const uint64_t entered = header.entered.load(std::memory_order_acquire);
  const uint64_t completed = header.completed.load(std::memory_order_acquire);
  const uint64_t waiting = header.waiting_seq.load(std::memory_order_acquire);
  const auto lookup = [&](uint64_t seq) {
    Call call = this->call(seq).value_or(Call{});
    call.seq = seq;  // known even when the ring lost the record
    if (call.op.empty() && seq != 0) call.op = "?";
    return call;
  };
  progress.entered = lookup(entered);
  progress.completed = lookup(completed);
  if (waiting != 0) {
    progress.waiting = true;
    progress.waiting_call = lookup(waiting);
    progress.waiting_s = static_cast<double>(now - header.waiting_since_ns.load(std::memory_order_relaxed)) / 1e9;
  }
  const int64_t last_leave = header.last_leave_ns.load(std::memory_order_relaxed);
  progress.idle_s = static_cast<double>(now - (last_leave != 0 ? last_leave : header.start_mono_ns)) / 1e9;
  progress.silent_s = static_cast<double>(now - header.heartbeat_ns.load(std::memory_order_acquire)) / 1e9;
  progress.steps = header.steps.load(std::memory_order_acquire);
  const int64_t last_step = header.last_step_ns.load(std::memory_order_relaxed);
  progress.since_step_s = static_cast<double>(now - (last_step != 0 ? last_step : header.start_mono_ns)) / 1e9;
  return progress;
}

std::string Recorder::dump_text() const {
  const Header& header = *header_;
  const int64_t now = clock_ns(CLOCK_MONOTONIC);
  std::ostringstream out;
  const Progress state = progress();
  out << "# lightning-fabric flight recorder: rank " << header.rank << " of " << header.world_size << ", pid "
      << header.pid << ", host " << state.host << "\n";
  out << "# last entered " << state.entered.describe() << "; last completed " << state.completed.describe();
  if (state.waiting) {
    out << "; waiting in " << state.waiting_call.describe() << " for " << seconds_with_unit(state.waiting_s);
  }
  out << "\n# seq  op  group  dtype  shape  numel  state  entered(wall clock)  entered_ago  duration\n";
  const uint64_t entered = header.entered.load(std::memory_order_acquire);
  const uint64_t first = entered > header.capacity ? entered - header.capacity + 1 : 1;
  for (uint64_t seq = first; seq <= entered && header.capacity > 0; ++seq) {
    const Record& slot = records_[seq % header.capacity];
    Record record;
    std::memcpy(static_cast<void*>(&record), &slot, sizeof(Record));
    if (record.seq != seq) continue;
    const int64_t wall_ns = header.start_wall_ns + (record.enter_ns - header.start_mono_ns);
    const std::time_t wall_s = static_cast<std::time_t>(wall_ns / 1000000000LL);
    std::tm local{};
    localtime_r(&wall_s, &local);
    char when[40];
    std::strftime(when, sizeof(when), "%H:%M:%S", &local);
    char line[512];
    const char* state_text = record.state == 0 ? "in-flight" : (record.state == 1 ? "done" : "failed");
    const double ago = static_cast<double>(now - record.enter_ns) / 1e9;
    const double took = static_cast<double>((record.leave_ns != 0 ? record.leave_ns : now) - record.enter_ns) / 1e6;
    std::snprintf(line, sizeof(line), "%llu  %s  %s  %s  %s  %llu  %s  %s.%06lld  %.3fs  %.3fms\n",
                  static_cast<unsigned long long>(record.seq), record.op, record.group, record.dtype, record.shape,
                  static_cast<unsigned long long>(record.numel), state_text, when,
                  static_cast<long long>((wall_ns / 1000) % 1000000), ago, took);
    out << line;
  }
  return out.str();
}

Scope::Scope(Recorder* recorder, const char* op, const std::string& group, const char* dtype, const int64_t* sizes,
             size_t dims, uint64_t numel)
    : recorder_(recorder) {
  if (recorder_ == nullptr) return;
  uncaught_ = std::uncaught_exceptions();
  seq_ = recorder_->begin(op, group, dtype, sizes, dims, numel);
  recorder_->wait(seq_);
}

Scope::~Scope() {
  if (recorder_ != nullptr) recorder_->end(seq_, std::uncaught_exceptions() > uncaught_);
}

}  // namespace lightning::fabric::flight
