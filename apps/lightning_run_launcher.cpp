// lightning-run-launcher: the launcher proper (LibTorch's TCPStore for the rendezvous). Users run
// lightning-run, which execs this program for every command but `model consolidate`; everything
// it does lives in launcher/ (a library).
#include <iostream>

#include "lightning/launcher/args.h"
#include "lightning/launcher/run.h"
#include "lightning/launcher/status.h"

int main(int argc, char** argv) {
  namespace launcher = lightning::launcher;
  if (launcher::is_status_command(argc, argv)) return launcher::run_status_command(argc, argv, std::cout, std::cerr);
  launcher::block_launcher_signals();  // before any thread exists (the store starts some)
  const auto parsed = launcher::parse_command_line(argc, argv, std::cout, std::cerr);
  if (parsed.exit_now) return *parsed.exit_now;
  if (parsed.args.dry_run) return launcher::print_dry_run(parsed.args);
  return launcher::run_job(parsed.args);
}
