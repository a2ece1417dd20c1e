# Run by CTest: install the build tree into WORK_DIR/prefix, then
#   MODE=consumer (default): build the consumer project against it with find_package(LightningFabric),
#     run it, check the shared library exports the public API and hides the internals, and dry-run
#     the installed launcher;
#   MODE=headers: compile every installed header alone, and check no private header is installed.
# Any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "step failed (${code}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)

if(MODE STREQUAL "headers")
  foreach(private IN ITEMS utilities/process.h utilities/error_file.h utilities/launch_env.h checkpoint/zip_archive.h
                           checkpoint/pickle_tree.h checkpoint/sharded.h plugins/collectives/collective.h
                           strategies/launchers/subprocess_launcher.h connector.h)
    if(EXISTS ${WORK_DIR}/prefix/include/lightning/fabric/${private})
      message(FATAL_ERROR "a private header was installed: lightning/fabric/${private}")
    endif()
  endforeach()
  # Compiling 53 headers alone costs minutes, and its answer changes only with the headers, the
  # LibTorch they include or the compiler: a stamp file (committed, STAMP) holds the fingerprint of
  # the last set that passed. An equal fingerprint passes without compiling; any other compiles
  # every header and, when all pass, writes the new fingerprint there (commit it with the change).
  file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/prefix/include ${WORK_DIR}/prefix/include/lightning/*.h)
  list(SORT installed)
  set(fingerprint_text "LibTorch ${TORCH_VERSION}\ncompiler ${CXX_ID} ${CXX_VERSION}\n")
  foreach(header IN LISTS installed)
    file(SHA256 ${WORK_DIR}/prefix/include/${header} digest)
    string(APPEND fingerprint_text "${digest} ${header}\n")
  endforeach()
  string(SHA256 fingerprint "${fingerprint_text}")
  set(checked "")
  if(EXISTS ${STAMP})
    file(STRINGS ${STAMP} checked LIMIT_COUNT 1)
  endif()
  if(checked STREQUAL fingerprint AND NOT DEFINED ENV{LF_CHECK_HEADERS_ALWAYS})
    message(STATUS "installed headers unchanged since they last compiled alone (fingerprint ${fingerprint} in ${STAMP}); "
                   "LF_CHECK_HEADERS_ALWAYS=1 compiles them anyway")
    return()
  endif()
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_CXX_COMPILER=${CXX}
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCHECK_HEADERS_ALONE=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel 2)
  file(WRITE ${STAMP} "${fingerprint}\n# The fingerprint of the installed headers, LibTorch and compiler that last compiled alone\n"
                      "# (install.every_installed_header_compiles_alone writes it; commit it with a header change).\n")
  message(STATUS "every installed header compiled alone; fingerprint ${fingerprint} written to ${STAMP}")
  return()
endif()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
# Hidden visibility: the public API is exported, the internals are not.
file(GLOB library ${WORK_DIR}/prefix/lib*/liblightning_fabric.so)
execute_process(COMMAND nm -D -C --defined-only ${library} OUTPUT_VARIABLE exported RESULT_VARIABLE code)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "nm failed on ${library}")
endif()
foreach(public IN ITEMS "lightning::fabric::Fabric::backward" "lightning::fabric::ddp_strategy"
                        "typeinfo for lightning::fabric::ValueError" "lightning::fabric::make_state_dict")
  string(FIND "${exported}" "${public}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${library} does not export ${public}")
  endif()
endforeach()
foreach(internal IN ITEMS "lightning::fabric::make_temporary_directory" "lightning::fabric::zip::Reader"
                          "lightning::fabric::Collective::" "lightning::fabric::write_error_file")
  string(FIND "${exported}" "${internal}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${library} exports the internal ${internal}")
  endif()
endforeach()
# The installed launcher: the front end finds lightning-run-launcher beside it (a dry run prints
# the worker's command without starting it).
run(${WORK_DIR}/prefix/bin/lightning-run model --accelerator cpu --devices 1 --dry-run ${WORK_DIR}/build/consumer)
