# Run by CTest: install the build tree into WORK_DIR/prefix, build the consumer project against it
# with find_package(LightningFabric), run it. Any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "step failed (${code}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
# The installed launcher: the front end finds lightning-run-launcher beside it (a dry run prints
# the worker's command without starting it).
run(${WORK_DIR}/prefix/bin/lightning-run model --accelerator cpu --devices 1 --dry-run ${WORK_DIR}/build/consumer)
