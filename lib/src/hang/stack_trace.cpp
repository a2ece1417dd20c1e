#include "lightning/fabric/hang/stack_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef LF_HAVE_LIBDW
#include <elfutils/libdwfl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace lightning::fabric::internal {
namespace {

constexpr int kMaxFrames = 64;
void* captured_frames[kMaxFrames];
std::atomic<int> captured_count{-1};  // -1: awaited, -2: being written, else the frame count
std::atomic<long> capture_target{0};   // the thread asked now; a late signal of an earlier capture that timed out
                                       // lands on another thread, or finds the capture taken, and writes nothing

void on_stack_signal(int) {
  const int saved_errno = errno;
  int awaited = -1;
  if (::syscall(SYS_gettid) == capture_target.load(std::memory_order_acquire) &&
      captured_count.compare_exchange_strong(awaited, -2, std::memory_order_acq_rel)) {
    captured_count.store(backtrace(captured_frames, kMaxFrames), std::memory_order_release);
  }
  errno = saved_errno;
}

bool read_at(int fd, void* out, size_t size, uint64_t offset) {
  return ::pread(fd, out, size, static_cast<off_t>(offset)) == static_cast<ssize_t>(size);
}

// The function of the ELF file `path` (loaded at `base`) that holds `address`, from the file's
// full symbol table (.symtab), which also lists what the dynamic table behind dladdr lacks: static
// and hidden-visibility functions, an executable's functions without -rdynamic. Streams the table
// in blocks and reads only the one name, so nothing stays in memory (libtorch's table is ~13 MB).
// False for a stripped file or when no function covers the address.
bool symtab_function(const char* path, void* base, void* address, std::string& name, uint64_t& offset_in) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  Elf64_Ehdr header{};
  std::vector<Elf64_Shdr> sections;
  if (read_at(fd, &header, sizeof(header), 0) && std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 &&
      header.e_ident[EI_CLASS] == ELFCLASS64 && header.e_shentsize == sizeof(Elf64_Shdr)) {
    sections.resize(header.e_shnum);
    if (!read_at(fd, sections.data(), sections.size() * sizeof(Elf64_Shdr), header.e_shoff)) sections.clear();
  }
  // ET_EXEC: symbol values are addresses; otherwise offsets from the load base.
  const uint64_t wanted = reinterpret_cast<uint64_t>(address) - (header.e_type == ET_EXEC ? 0 : reinterpret_cast<uint64_t>(base));
  Elf64_Sym best{};
  const Elf64_Shdr* names = nullptr;
  for (const Elf64_Shdr& table : sections) {
    if (table.sh_type != SHT_SYMTAB || table.sh_link >= sections.size() || table.sh_entsize != sizeof(Elf64_Sym)) continue;
    names = &sections[table.sh_link];
    std::vector<Elf64_Sym> block(4096);
    const uint64_t count = table.sh_size / sizeof(Elf64_Sym);
    for (uint64_t first = 0; first < count; first += block.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), count - first));
      if (!read_at(fd, block.data(), n * sizeof(Elf64_Sym), table.sh_offset + first * sizeof(Elf64_Sym))) break;
      for (size_t i = 0; i < n; ++i) {
        const Elf64_Sym& symbol = block[i];
        if (ELF64_ST_TYPE(symbol.st_info) != STT_FUNC || symbol.st_value == 0 || symbol.st_value > wanted) continue;
        if (symbol.st_size != 0 && wanted >= symbol.st_value + symbol.st_size) continue;
        if (symbol.st_value > best.st_value) best = symbol;
      }
    }
    break;
  }
  bool found = false;
  if (names != nullptr && best.st_value != 0 && best.st_name < names->sh_size) {
    char text[1024] = {};
    const uint64_t length = std::min<uint64_t>(sizeof(text) - 1, names->sh_size - best.st_name);
    found = ::pread(fd, text, length, static_cast<off_t>(names->sh_offset + best.st_name)) > 0 && text[0] != '\0';
    name = text;
    offset_in = wanted - best.st_value;
  }
  ::close(fd);
  return found;
}

#ifdef LF_HAVE_LIBDW
// This process's modules as elfutils sees them, for source lines from DWARF (where a file has
// debug information). Made for one capture and ended with it.
class SourceLines {
 public:
  SourceLines() {
    static char* debuginfo_path = nullptr;
    static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, local_debuginfo, nullptr, &debuginfo_path};
    dwfl_ = dwfl_begin(&callbacks);
    if (dwfl_ != nullptr && (dwfl_linux_proc_report(dwfl_, ::getpid()) != 0 || dwfl_report_end(dwfl_, nullptr, nullptr) != 0)) {
      dwfl_end(dwfl_);
      dwfl_ = nullptr;
    }
  }
  ~SourceLines() {
    if (dwfl_ != nullptr) dwfl_end(dwfl_);
  }
  SourceLines(const SourceLines&) = delete;
  SourceLines& operator=(const SourceLines&) = delete;
  /// " at file:line" for the instruction at address, or "" without debug information.
  std::string at(uintptr_t address) const {
    if (dwfl_ == nullptr) return "";
    Dwfl_Line* line = dwfl_getsrc(dwfl_, static_cast<Dwarf_Addr>(address));
    int number = 0;
    const char* file = line != nullptr ? dwfl_lineinfo(line, nullptr, &number, nullptr, nullptr, nullptr) : nullptr;
    if (file == nullptr || number <= 0) return "";
    return std::string(" at ") + file + ":" + std::to_string(number);
  }

 private:
  // Never a debuginfod server: with DEBUGINFOD_URLS set, elfutils' standard lookup of separate
  // debug files asks the network for every module without local debug information, for up to
  // 90 s each, while the hang report waits. Then only each file's own debug information counts
  // (libdw reads it before asking for a separate file).
  static int local_debuginfo(Dwfl_Module* module, void** user, const char* name, Dwarf_Addr base, const char* file,
                             const char* debuglink, GElf_Word crc, char** found) {
    const char* servers = std::getenv("DEBUGINFOD_URLS");
    if (servers != nullptr && servers[0] != '\0') return -1;
    return dwfl_standard_find_debuginfo(module, user, name, base, file, debuglink, crc, found);
  }
  Dwfl* dwfl_ = nullptr;
};
#else
struct SourceLines {
  std::string at(uintptr_t) const { return ""; }
};
#endif

std::string frame_text(void* address) {
  Dl_info info{};
  char line[1024];
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    std::snprintf(line, sizeof(line), "%p ??", address);
    return line;
  }
  const char* file = std::strrchr(info.dli_fname, '/');
  file = file != nullptr ? file + 1 : info.dli_fname;
  // The full symbol table first: the dynamic one that dladdr reads lacks hidden functions, and
  // would name the nearest exported function before them instead.
  uint64_t offset = 0;
  std::string full_name;
  const char* name = nullptr;
  if (symtab_function(info.dli_fname, info.dli_fbase, address, full_name, offset)) {
    name = full_name.c_str();
  } else if (info.dli_sname != nullptr) {
    name = info.dli_sname;
    offset = static_cast<uint64_t>(static_cast<char*>(address) - static_cast<char*>(info.dli_saddr));
  }
  if (name == nullptr) {
    std::snprintf(line, sizeof(line), "%p ?? (%s+0x%lx)", address, file,
                  static_cast<unsigned long>(static_cast<char*>(address) - static_cast<char*>(info.dli_fbase)));
    return line;
  }
  int status = 0;
  char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::snprintf(line, sizeof(line), "%p %s+0x%lx (%s)", address, status == 0 && readable ? readable : name,
                static_cast<unsigned long>(offset), file);
  std::free(readable);
  return line;
}

}  // namespace

int stack_signal() { return SIGRTMIN + 7; }

void install_stack_capture() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[2];
    backtrace(warm, 2);  // loads the unwinder now, not inside the handler
    struct sigaction action {};
    action.sa_handler = on_stack_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(stack_signal(), &action, nullptr);
  });
}

std::string capture_thread_stack(int tid, std::chrono::milliseconds timeout) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  install_stack_capture();
  capture_target.store(tid, std::memory_order_release);
  captured_count.store(-1, std::memory_order_release);
  if (::syscall(SYS_tgkill, ::getpid(), tid, stack_signal()) != 0) {
    return "no stack: thread " + std::to_string(tid) + " is gone (" + std::strerror(errno) + ")\n";
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int count = -1;
  while ((count = captured_count.load(std::memory_order_acquire)) < 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return "no stack: thread " + std::to_string(tid) + " did not answer within " +
             std::to_string(timeout.count()) + " ms (blocked in the kernel with signals masked?)\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string text;
  const SourceLines lines;
  // Frame 0 is the handler, frame 1 the kernel's signal trampoline. Frame 2 is where the thread
  // was interrupted; the others are return addresses, whose call is the instruction before.
  for (int i = 2; i < count; ++i) {
    const auto address = reinterpret_cast<uintptr_t>(captured_frames[i]);
    text += "  #" + std::to_string(i - 2) + " " + frame_text(captured_frames[i]) + lines.at(i == 2 ? address : address - 1) + "\n";
  }
  return text;
}

}  // namespace lightning::fabric::internal
