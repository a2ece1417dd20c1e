# Imported targets over the header-only copies in LF_THIRD_PARTY_DIR (scripts/vendor-headers.sh),
# named like the Debian packages' targets so the rest of the build does not change. spdlog and
# fmt are used header-only (a wheel's LibTorch may use another C++ ABI than Debian's compiled
# libraries: BUILD-NOTES "CMake"); zlib links the system's libz.so.1.
set(_lf_tp "${LF_THIRD_PARTY_DIR}")
foreach(header CLI/CLI.hpp nlohmann/json.hpp spdlog/spdlog.h fmt/format.h catch2/catch.hpp zlib.h)
  if(NOT EXISTS "${_lf_tp}/include/${header}")
    message(FATAL_ERROR "LF_THIRD_PARTY_DIR=${_lf_tp} lacks include/${header}: run scripts/vendor-headers.sh ${_lf_tp} "
                        "on a machine with the Debian packages (scripts/install-deps.sh) and carry the folder.")
  endif()
endforeach()
function(_lf_header_target name)
  add_library(${name} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_lf_tp}/include")
endfunction()
_lf_header_target(CLI11::CLI11)
_lf_header_target(nlohmann_json::nlohmann_json)
_lf_header_target(fmt::fmt)
set_property(TARGET fmt::fmt PROPERTY INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
_lf_header_target(spdlog::spdlog)
set_property(TARGET spdlog::spdlog PROPERTY INTERFACE_COMPILE_DEFINITIONS SPDLOG_FMT_EXTERNAL=1 FMT_HEADER_ONLY=1)
_lf_header_target(Catch2::Catch2)
find_library(LF_LIBZ NAMES z libz.so.1 PATHS /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu REQUIRED)
add_library(ZLIB::ZLIB UNKNOWN IMPORTED GLOBAL)
set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION "${LF_LIBZ}" INTERFACE_INCLUDE_DIRECTORIES "${_lf_tp}/include")
# ProcessGroupGloo.hpp needs gloo's headers; a wheel usually ships them, the copy is the fallback.
if(EXISTS "${_lf_tp}/gloo-include/gloo")
  find_file(LF_TORCH_GLOO_HEADER gloo/config.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(NOT LF_TORCH_GLOO_HEADER)
    include_directories(SYSTEM "${_lf_tp}/gloo-include")
  endif()
endif()
message(STATUS "lightning-fabric: third-party headers from ${_lf_tp}")
