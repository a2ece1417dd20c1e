# Use ccache when it is installed. The sloppiness settings let ccache cache translation units
# compiled against a precompiled header (clang also needs -fno-pch-timestamp, see Pch.cmake).
find_program(LF_CCACHE ccache)
if(LF_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${LF_CCACHE})
  message(STATUS "lightning-fabric: compiling through ccache (${LF_CCACHE})")
endif()
