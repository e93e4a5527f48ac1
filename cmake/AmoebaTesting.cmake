# Helpers shared by every test folder. Each folder under tests/ has its own CMakeLists.txt that calls these.
find_package(Catch2 2 REQUIRED)

# One precompiled Catch2 main for every CPU test binary (compiling catch.hpp's main once saves minutes on 2 cores).
if(NOT TARGET amoeba_catch_main)
  add_library(amoeba_catch_main STATIC ${PROJECT_SOURCE_DIR}/tests/catch_main.cpp)
  target_link_libraries(amoeba_catch_main PUBLIC Catch2::Catch2)
endif()

include(Catch)  # catch_discover_tests, from Debian's catch2 package

# amoeba_add_cpu_test(NAME SOURCES src... [LABELS l...] [LIBS lib...])
# A Catch2 binary; every TEST_CASE becomes its own ctest test ("NAME: test case name"), found by running the
# binary with --list-test-names-only after it is built, so ctest's closing line counts test cases.
function(amoeba_add_cpu_test name)
  cmake_parse_arguments(ARG "" "" "LABELS;LIBS;SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE amoeba::amoeba amoeba_catch_main amoeba_warnings ${ARG_LIBS})
  # --warn NoTests: a registered name that matches no test case fails instead of passing with nothing run
  # (catch_discover_tests splits names at ';', so such a name would silently test nothing).
  catch_discover_tests(${name} TEST_PREFIX "${name}: " TEST_LIST ${name}_TESTS EXTRA_ARGS --warn NoTests)
  # Labels are set by a second ctest include that runs after discovery (a list value does not survive being
  # passed through catch_discover_tests' PROPERTIES).
  set(_labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${_labels_file} "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"cpu;${ARG_LABELS}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_labels_file})
endfunction()

# One Catch2 main for every GPU test binary: exits 77 (ctest: skipped) when no CUDA device is present.
if(AMOEBA_HAS_CUDA AND NOT TARGET amoeba_gpu_catch_main)
  add_library(amoeba_gpu_catch_main STATIC ${PROJECT_SOURCE_DIR}/tests/gpu_main.cpp)
  target_link_libraries(amoeba_gpu_catch_main PUBLIC Catch2::Catch2 CUDA::cudart_static)
endif()

# amoeba_add_gpu_test(NAME TARGET exe [ARGS ...]): a device test. The binary exits with 77 when no CUDA device
# is present, which ctest reports as skipped (never as passed).
function(amoeba_add_gpu_test name)
  cmake_parse_arguments(ARG "" "TARGET" "ARGS" ${ARGN})
  add_test(NAME ${name} COMMAND ${ARG_TARGET} ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77)
endfunction()
