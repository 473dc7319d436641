# Helpers that give every arlo target the same flags, include root and test wiring.
include_guard(GLOBAL)
include(GoogleTest)

# Warnings as errors on project code only (third-party headers are included as SYSTEM).
set(ARLO_WARNINGS -Wall -Wextra -Werror)
function(arlo_target_defaults target)
  target_compile_options(${target} PRIVATE ${ARLO_WARNINGS})
  target_compile_features(${target} PUBLIC cxx_std_23)
  arlo_pch_register(${target})   # ArloBuildSpeed.cmake
endfunction()

# arlo_library(NAME SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# One CMake target per module; headers are included from the repo root ("weight_sync/manifest.h").
function(arlo_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  arlo_target_defaults(${name})
endfunction()

# arlo_test(NAME SOURCES ... DEPS ... [LABELS unit|integration|e2e|gpu] [TIMEOUT s])
# One gtest executable; each test case becomes a ctest test carrying the labels.
function(arlo_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  arlo_target_defaults(${name})
  # The environment travels as an `env` launcher: a list-valued ENVIRONMENT property does not survive
  # gtest_discover_tests' re-quoting, and the launcher also runs test discovery with the same variables.
  set_target_properties(${name} PROPERTIES CROSSCOMPILING_EMULATOR
    "/usr/bin/env;ARLO_SOURCE_DIR=${PROJECT_SOURCE_DIR};ARLO_BUILD_DIR=${PROJECT_BINARY_DIR};OMP_NUM_THREADS=1;MKL_NUM_THREADS=1")
  # gtest_discover_tests flattens a list-valued property ("e2e;fault" would become LABELS e2e and a
  # property named fault), so it gets the first label and a script run after discovery sets them all.
  list(GET ARG_LABELS 0 first_label)
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS ${first_label} TIMEOUT ${ARG_TIMEOUT})
  list(LENGTH ARG_LABELS label_count)
  if(label_count GREATER 1)
    set(script "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    file(WRITE "${script}"
         "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  endif()
endfunction()
