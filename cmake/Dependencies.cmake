# Every third-party package the build uses (DESIGN.md §3). scripts/install-deps.sh installs them.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
# LF_THIRD_PARTY_DIR: a folder made by scripts/vendor-headers.sh with header-only copies of the
# libraries below, for machines without Debian's packages (the GPU machine: scripts/device-check.sh).
set(LF_THIRD_PARTY_DIR "" CACHE PATH "Header-only copies of CLI11, nlohmann/json, spdlog, fmt, Catch2, zlib headers")
if(LF_THIRD_PARTY_DIR)
  include(${CMAKE_CURRENT_LIST_DIR}/ThirdPartyHeaders.cmake)
else()
  find_package(spdlog REQUIRED)
  find_package(fmt REQUIRED)
  find_package(nlohmann_json 3 REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(ZLIB REQUIRED)
endif()

# Tell the user which LibTorch was found and what it can do.
set(LF_TORCH_HAS_CUDA OFF)
if(TORCH_CUDA_LIBRARIES)
  set(LF_TORCH_HAS_CUDA ON)
endif()
set(LF_TORCH_HAS_NCCL OFF)
find_file(LF_NCCL_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(LF_TORCH_HAS_CUDA AND LF_NCCL_HEADER)
  set(LF_TORCH_HAS_NCCL ON)
endif()
get_filename_component(LF_TORCH_DIR "${Torch_DIR}" REALPATH)
message(STATUS "lightning-fabric: LibTorch ${Torch_VERSION} from ${LF_TORCH_DIR} (CUDA: ${LF_TORCH_HAS_CUDA}, NCCL: ${LF_TORCH_HAS_NCCL})")
if(LF_TORCH_HAS_CUDA)
  add_compile_definitions(LF_TORCH_HAS_CUDA=1)  # every target, the shared precompiled header included
endif()
if(LF_WITH_CUDA AND NOT LF_TORCH_HAS_CUDA)
  message(FATAL_ERROR "LF_WITH_CUDA=ON but the LibTorch at ${LF_TORCH_DIR} has no CUDA. "
                      "Point CMAKE_PREFIX_PATH at a CUDA LibTorch (e.g. a pip wheel's torch/share/cmake).")
endif()

# Debian ships reducer.hpp but not the distributed-autograd header it includes; a compatibility
# header of ours stands in for it only when the real one is missing (BUILD-NOTES "CMake").
find_file(LF_DIST_AUTOGRAD_CONTEXT torch/csrc/distributed/autograd/context/context.h
          PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
