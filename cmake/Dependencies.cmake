# Every third-party package the build uses (why each: docs/decisions.md); scripts/install-deps.sh
# installs them.
#
# LibTorch: 2.11 or newer. Without a hint the build takes the one inside the project's own Python
# environment (.venv, made by scripts/install-deps.sh: PyTorch 2.11.0 from PyPI, built for CUDA 13.0).
# Point it elsewhere with -DCMAKE_PREFIX_PATH=/path/to/libtorch (an official zip), or with
# -DLF_PYTHON=/path/to/python (a conda or pip torch: its torch.utils.cmake_prefix_path is used).
set(LF_PYTHON "" CACHE FILEPATH "A Python whose torch provides LibTorch (default: .venv/bin/python when it exists)")
if(NOT LF_PYTHON AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(LF_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
if(LF_PYTHON AND NOT Torch_DIR)
  execute_process(COMMAND "${LF_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path, end='')"
                  OUTPUT_VARIABLE _lf_torch_prefix RESULT_VARIABLE _lf_python_status ERROR_QUIET)
  if(_lf_python_status EQUAL 0 AND _lf_torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH "${_lf_torch_prefix}")
  endif()
endif()
find_package(Torch 2 QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "lightning-fabric needs LibTorch 2.11 or newer and found none. Run scripts/install-deps.sh "
                      "(PyTorch 2.11.0 into .venv), or pass -DCMAKE_PREFIX_PATH=/path/to/libtorch, or "
                      "-DLF_PYTHON=/path/to/python with torch installed.")
endif()
if(Torch_VERSION VERSION_LESS 2.11)
  message(WARNING "lightning-fabric: LibTorch ${Torch_VERSION} is older than 2.11, the oldest supported "
                  "(docs/decisions.md): it may build and then fail in a gloo collective at run time.")
endif()
find_package(Threads REQUIRED)
# LF_THIRD_PARTY_DIR: a folder made by scripts/vendor-headers.sh with header-only copies of the
# libraries below, for machines without Debian's packages (the GPU machine: scripts/device-check.sh).
set(LF_THIRD_PARTY_DIR "" CACHE PATH "Header-only copies of CLI11, nlohmann/json, Catch2, zlib headers")
if(LF_THIRD_PARTY_DIR)
  include(${CMAKE_CURRENT_LIST_DIR}/ThirdPartyHeaders.cmake)
else()
  find_package(nlohmann_json 3 REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(ZLIB REQUIRED)
endif()
# elfutils' libdw (Debian: libdw-dev) names file and line in the native stacks of hang reports;
# without it they name functions only. LF_HAVE_LIBDW tells the tests which they get.
find_path(LF_LIBDW_INCLUDE_DIR elfutils/libdwfl.h)
find_library(LF_LIBDW_LIBRARY dw)
set(LF_HAVE_LIBDW OFF)
add_library(lf_libdw INTERFACE)
if(LF_LIBDW_INCLUDE_DIR AND LF_LIBDW_LIBRARY)
  set(LF_HAVE_LIBDW ON)
  target_include_directories(lf_libdw INTERFACE ${LF_LIBDW_INCLUDE_DIR})
  target_link_libraries(lf_libdw INTERFACE ${LF_LIBDW_LIBRARY})
  target_compile_definitions(lf_libdw INTERFACE LF_HAVE_LIBDW=1)
else()
  message(STATUS "lightning-fabric: libdw not found (Debian: libdw-dev): native stacks in hang reports name "
                 "functions, without file and line")
endif()
# libjpeg-turbo and libpng (Debian: libjpeg62-turbo-dev, libpng-dev) decode the JPEG and PNG leaves
# of streaming datasets; without them such leaves are refused with that reason (LF_HAVE_IMAGE_CODECS).
find_package(JPEG QUIET)
find_package(PNG QUIET)
add_library(lf_image_codecs INTERFACE)
if(JPEG_FOUND AND PNG_FOUND)
  target_link_libraries(lf_image_codecs INTERFACE JPEG::JPEG PNG::PNG)
  target_compile_definitions(lf_image_codecs INTERFACE LF_HAVE_IMAGE_CODECS=1)
else()
  message(STATUS "lightning-fabric: libjpeg or libpng not found (Debian: libjpeg62-turbo-dev libpng-dev): "
                 "streaming datasets refuse JPEG and PNG leaves")
endif()
# libzstd (Debian: libzstd-dev) reads and writes LitData's zstd-compressed chunks; without it such
# datasets are refused with that reason (LF_HAVE_ZSTD).
find_path(LF_ZSTD_INCLUDE_DIR zstd.h)
find_library(LF_ZSTD_LIBRARY zstd)
add_library(lf_zstd INTERFACE)
if(LF_ZSTD_INCLUDE_DIR AND LF_ZSTD_LIBRARY)
  target_include_directories(lf_zstd INTERFACE ${LF_ZSTD_INCLUDE_DIR})
  target_link_libraries(lf_zstd INTERFACE ${LF_ZSTD_LIBRARY})
  target_compile_definitions(lf_zstd INTERFACE LF_HAVE_ZSTD=1)
else()
  message(STATUS "lightning-fabric: libzstd not found (Debian: libzstd-dev): streaming datasets refuse zstd compression")
endif()
# libcurl (Debian: libcurl4-openssl-dev) reaches S3-compatible object storage for s3:// datasets,
# signing requests with AWS Signature Version 4; without it s3:// is refused with that reason
# (LF_HAVE_CURL).
find_package(CURL QUIET)
add_library(lf_curl INTERFACE)
if(CURL_FOUND)
  target_link_libraries(lf_curl INTERFACE CURL::libcurl)
  target_compile_definitions(lf_curl INTERFACE LF_HAVE_CURL=1)
else()
  message(STATUS "lightning-fabric: libcurl not found (Debian: libcurl4-openssl-dev): s3:// datasets are refused")
endif()
# LibTorch's public headers include <nlohmann/json.hpp> but the wheel does not ship it.
get_target_property(_lf_json_include nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
if(_lf_json_include)
  include_directories(SYSTEM ${_lf_json_include})
endif()

# Tell the user which LibTorch was found and what it can do.
set(LF_TORCH_HAS_CUDA OFF)
if(TORCH_CUDA_LIBRARIES)
  set(LF_TORCH_HAS_CUDA ON)
endif()
set(LF_TORCH_HAS_NCCL OFF)
if(TARGET torch_cuda)
  get_target_property(_lf_cuda_definitions torch_cuda INTERFACE_COMPILE_DEFINITIONS)
  if(_lf_cuda_definitions MATCHES "USE_C10D_NCCL")
    set(LF_TORCH_HAS_NCCL ON)
  endif()
endif()
get_filename_component(LF_TORCH_DIR "${Torch_DIR}" REALPATH)
set(LF_TORCH_CMAKE_DIR "${Torch_DIR}")
get_filename_component(LF_TORCH_LIBRARY_DIR "${TORCH_LIBRARY}" DIRECTORY)  # for installed run paths
message(STATUS "lightning-fabric: LibTorch ${Torch_VERSION} from ${LF_TORCH_DIR} (CUDA: ${LF_TORCH_HAS_CUDA}, NCCL: ${LF_TORCH_HAS_NCCL})")
if(LF_TORCH_HAS_CUDA)
  add_compile_definitions(LF_TORCH_HAS_CUDA=1)  # every target, the shared precompiled header included
endif()
if(LF_WITH_CUDA AND NOT LF_TORCH_HAS_CUDA)
  message(FATAL_ERROR "LF_WITH_CUDA=ON but the LibTorch at ${LF_TORCH_DIR} has no CUDA. "
                      "Point CMAKE_PREFIX_PATH at a CUDA LibTorch (e.g. a pip wheel's torch/share/cmake).")
endif()
# A CUDA LibTorch 2.x links the CUDA runtime, never the driver: programs start and train on a
# machine without a GPU or driver (test build.programs_do_not_need_the_gpu_driver). No
# --as-needed here: it would drop libtorch_cuda.so, whose load registers the CUDA kernels.

# LF_TORCH_LINK: what every target links instead of ${TORCH_LIBRARIES}. The PyPI wheel's
# libtorch.so exports its own copies of std::filesystem functions (built with a newer libstdc++),
# and a program that finds them before the system libstdc++'s crashes in them (seen with
# std::filesystem::remove_all on Debian 12). Naming libstdc++ first in the link puts it first in
# the symbol lookup order of every program that links lightning::fabric (docs/decisions.md).
set(LF_TORCH_LINK "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state" ${TORCH_LIBRARIES})
