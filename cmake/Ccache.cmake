# Use ccache when it is installed. The sloppiness settings let ccache cache translation units
# compiled against a precompiled header (clang also needs -fno-pch-timestamp, see Pch.cmake).
# CCACHE_BASEDIR makes the paths under the source tree (the build folders and .venv's LibTorch
# headers among them) relative in the cache key, so a second clone of the project in another
# folder hits the cache the first one filled.
find_program(LF_CCACHE ccache)
if(LF_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" CCACHE_NOHASHDIR=1
      ${LF_CCACHE})
  message(STATUS "lightning-fabric: compiling through ccache (${LF_CCACHE})")
endif()
