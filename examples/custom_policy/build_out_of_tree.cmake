# cmake -DAMOEBA_SOURCE_DIR=<root> -DWORK_DIR=<scratch> -P build_out_of_tree.cmake
# Installs the header-only library into WORK_DIR/prefix, builds this example against it through
# find_package(amoeba) and runs it. Used by the ctest entry example_custom_policy_out_of_tree.
foreach(v AMOEBA_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} must be set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} -S ${AMOEBA_SOURCE_DIR} -B ${WORK_DIR}/lib -DAMOEBA_BUILD_TESTS=OFF
    -DAMOEBA_BUILD_BENCHMARKS=OFF -DAMOEBA_CUDA=OFF)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/lib --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${AMOEBA_SOURCE_DIR}/examples/custom_policy -B ${WORK_DIR}/example
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/example)
run(${WORK_DIR}/example/custom_policy)
