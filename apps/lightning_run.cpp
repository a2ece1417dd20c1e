// lightning-run: the front end. It does not load LibTorch (0.7 s of start-up here): it runs
// `lightning-run model consolidate` itself and execs lightning-run-launcher, installed beside it,
// for everything else, with the same arguments, process id and signals.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "lightning/launcher/consolidate.h"

namespace {
std::filesystem::path launcher_program() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return (error ? std::filesystem::path(".") : self.parent_path()) / "lightning-run-launcher";
}
}  // namespace

int main(int argc, char** argv) {
  namespace launcher = lightning::launcher;
  if (launcher::is_consolidate_command(argc, argv)) return launcher::run_consolidate(argc, argv, std::cout, std::cerr);
  const std::filesystem::path program = launcher_program();
  ::execv(program.c_str(), argv);
  std::cerr << "lightning-run: cannot start " << program.string() << ": " << std::strerror(errno)
            << ". It is installed beside lightning-run; reinstall both (cmake --install).\n";
  return 1;
}
