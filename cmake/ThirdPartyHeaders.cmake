# Imported targets over the header-only copies in LF_THIRD_PARTY_DIR (scripts/vendor-headers.sh),
# named like the Debian packages' targets so the rest of the build does not change; zlib links the
# system's libz.so.1.
set(_lf_tp "${LF_THIRD_PARTY_DIR}")
foreach(header CLI/CLI.hpp nlohmann/json.hpp catch2/catch.hpp zlib.h)
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
_lf_header_target(Catch2::Catch2)
find_library(LF_LIBZ NAMES z libz.so.1 PATHS /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu REQUIRED)
add_library(ZLIB::ZLIB UNKNOWN IMPORTED GLOBAL)
set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION "${LF_LIBZ}" INTERFACE_INCLUDE_DIRECTORIES "${_lf_tp}/include")
message(STATUS "lightning-fabric: third-party headers from ${_lf_tp}")
