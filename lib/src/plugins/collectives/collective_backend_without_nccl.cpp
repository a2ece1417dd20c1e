// collective_backend.cpp without the NCCL backend, for lightning-run's launcher, which links
// LibTorch's CPU parts only (lib/CMakeLists.txt): asking it for nccl is the RuntimeError that a
// LibTorch without NCCL gives.
#define LF_WITHOUT_NCCL 1
#include "collective_backend.cpp"  // NOLINT(bugprone-suspicious-include): one source, two builds
