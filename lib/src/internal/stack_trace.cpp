#include "internal/stack_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace lightning::fabric::internal {
namespace {

constexpr int kMaxFrames = 64;
void* captured_frames[kMaxFrames];
std::atomic<int> captured_count{-1};

void on_stack_signal(int) {
  const int saved_errno = errno;
  captured_count.store(backtrace(captured_frames, kMaxFrames), std::memory_order_release);
  errno = saved_errno;
}

// The function symbols of one ELF file's full symbol table (.symtab), which also holds the
// functions hidden from the dynamic one (static and hidden-visibility functions, an executable's
// functions without -rdynamic). Empty for a stripped file.
struct FunctionSymbols {
  struct Symbol {
    uint64_t begin = 0, size = 0;
    std::string name;
  };
  bool absolute = false;  // ET_EXEC: values are addresses; else offsets from the load base
  std::vector<Symbol> sorted;
};

bool read_at(int fd, void* out, size_t size, uint64_t offset) {
  return ::pread(fd, out, size, static_cast<off_t>(offset)) == static_cast<ssize_t>(size);
}

FunctionSymbols read_function_symbols(const char* path) {
  FunctionSymbols symbols;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return symbols;
  Elf64_Ehdr header{};
  std::vector<Elf64_Shdr> sections;
  if (read_at(fd, &header, sizeof(header), 0) && std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 &&
      header.e_ident[EI_CLASS] == ELFCLASS64 && header.e_shentsize == sizeof(Elf64_Shdr)) {
    sections.resize(header.e_shnum);
    if (!read_at(fd, sections.data(), sections.size() * sizeof(Elf64_Shdr), header.e_shoff)) sections.clear();
  }
  symbols.absolute = header.e_type == ET_EXEC;
  for (const Elf64_Shdr& table : sections) {
    if (table.sh_type != SHT_SYMTAB || table.sh_link >= sections.size() || table.sh_entsize != sizeof(Elf64_Sym)) continue;
    const Elf64_Shdr& names = sections[table.sh_link];
    std::vector<Elf64_Sym> entries(table.sh_size / sizeof(Elf64_Sym));
    std::string text(names.sh_size, '\0');
    if (!read_at(fd, entries.data(), entries.size() * sizeof(Elf64_Sym), table.sh_offset) ||
        !read_at(fd, text.data(), text.size(), names.sh_offset)) {
      break;
    }
    for (const Elf64_Sym& entry : entries) {
      if (ELF64_ST_TYPE(entry.st_info) != STT_FUNC || entry.st_value == 0 || entry.st_name >= text.size()) continue;
      symbols.sorted.push_back({entry.st_value, entry.st_size, text.c_str() + entry.st_name});
    }
  }
  ::close(fd);
  std::sort(symbols.sorted.begin(), symbols.sorted.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  return symbols;
}

// The function of `path` that holds `address` (loaded at `base`), from its .symtab; null if none.
// Files are read once and kept (callers hold capture_thread_stack's lock).
const FunctionSymbols::Symbol* function_at(const char* path, void* base, void* address, uint64_t& offset_in) {
  static std::map<std::string, FunctionSymbols> cache;
  auto found = cache.find(path);
  if (found == cache.end()) found = cache.emplace(path, read_function_symbols(path)).first;
  const FunctionSymbols& symbols = found->second;
  const uint64_t wanted = reinterpret_cast<uint64_t>(address) - (symbols.absolute ? 0 : reinterpret_cast<uint64_t>(base));
  auto after = std::upper_bound(symbols.sorted.begin(), symbols.sorted.end(), wanted,
                                [](uint64_t value, const auto& symbol) { return value < symbol.begin; });
  if (after == symbols.sorted.begin()) return nullptr;
  const FunctionSymbols::Symbol& symbol = *std::prev(after);
  if (symbol.size != 0 && wanted >= symbol.begin + symbol.size) return nullptr;
  offset_in = wanted - symbol.begin;
  return &symbol;
}

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
  const char* name = nullptr;
  if (const auto* symbol = function_at(info.dli_fname, info.dli_fbase, address, offset)) {
    name = symbol->name.c_str();
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
  captured_count.store(-1, std::memory_order_relaxed);
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
  // Frame 0 is the handler, frame 1 the kernel's signal trampoline.
  for (int i = 2; i < count; ++i) text += "  #" + std::to_string(i - 2) + " " + frame_text(captured_frames[i]) + "\n";
  return text;
}

}  // namespace lightning::fabric::internal
