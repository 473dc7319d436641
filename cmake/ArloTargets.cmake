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

# arlo_add_subdirectories(<glob>...)
# Adds each folder the globs match that has a CMakeLists.txt (one program, example or test suite per
# folder; a folder without one has no code yet). The globs are checked again at build time, so a new
# folder is picked up without a hand-run configure.
function(arlo_add_subdirectories)
  file(GLOB dirs LIST_DIRECTORIES true CONFIGURE_DEPENDS ${ARGN})
  foreach(dir ${dirs})
    if(IS_DIRECTORY ${dir} AND EXISTS ${dir}/CMakeLists.txt)
      add_subdirectory(${dir})
    endif()
  endforeach()
endfunction()

# arlo_library(NAME SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# One CMake target per module; headers are included from the repo root ("weight_sync/manifest.h").
function(arlo_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  arlo_target_defaults(${name})
  set_property(GLOBAL APPEND PROPERTY ARLO_LIBRARIES ${name})
endfunction()

# arlo_write_link_graph(FILE): one line per arlo library, "name: what it links" (its LINK_LIBRARIES,
# every target_link_libraries call included, generator expressions stripped), for the layering test
# (tests/unit/layering/module_links.sh). Called once every target exists.
function(arlo_write_link_graph file)
  get_property(libraries GLOBAL PROPERTY ARLO_LIBRARIES)
  set(text "")
  foreach(library IN LISTS libraries)
    get_target_property(links ${library} LINK_LIBRARIES)
    if(NOT links)
      set(links "")
    endif()
    string(GENEX_STRIP "${links}" links)
    list(JOIN links " " links)
    string(APPEND text "${library}: ${links}\n")
  endforeach()
  file(WRITE ${file} "${text}")
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
  # Discovery runs the executable once (--gtest_list_tests); a cold page cache makes loading libtorch
  # alone take longer than CMake's default 5 s on a loaded machine, which failed a whole CI run.
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 120
    PROPERTIES LABELS ${first_label} TIMEOUT ${ARG_TIMEOUT})
  list(LENGTH ARG_LABELS label_count)
  if(label_count GREATER 1)
    set(script "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    file(WRITE "${script}"
         "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  endif()
endfunction()

# arlo_process_test(NAME PROGRAMS <target>... [REQUIRES <target>...] SOURCES ... [DEPS ...] [LABELS ...] [TIMEOUT s])
# An arlo_test that drives the project's programs as real processes (tests/e2e, tests/cluster). Where a
# program or a REQUIRES target is not part of this configuration, the test is not defined (there is
# nothing to run it against); check with if(TARGET NAME) before adding to it. Otherwise the programs
# are built before it, and it is told where each one is by a compile definition: ARLO_BINARY for arlo,
# ARLO_<REST>_BINARY for arlo-<rest> (ARLO_WORKER_BINARY, ARLO_TRAINER_BINARY, ...), and
# ARLO_<REST>_LIBRARY for a library target arlo_<rest> (arlo_bridge: ARLO_BRIDGE_LIBRARY).
function(arlo_process_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;PROGRAMS;REQUIRES" ${ARGN})
  foreach(target IN LISTS ARG_PROGRAMS ARG_REQUIRES)
    if(NOT TARGET ${target})
      return()
    endif()
  endforeach()
  set(test_args SOURCES ${ARG_SOURCES} DEPS ${ARG_DEPS} LABELS ${ARG_LABELS})
  if(ARG_TIMEOUT)
    list(APPEND test_args TIMEOUT ${ARG_TIMEOUT})
  endif()
  arlo_test(${name} ${test_args})
  add_dependencies(${name} ${ARG_PROGRAMS})
  foreach(program IN LISTS ARG_PROGRAMS)
    string(TOUPPER "${program}" define)
    string(REPLACE "-" "_" define "${define}")
    get_target_property(type ${program} TYPE)
    if(type STREQUAL "EXECUTABLE")
      string(APPEND define "_BINARY")
    else()
      string(APPEND define "_LIBRARY")
    endif()
    target_compile_definitions(${name} PRIVATE ${define}="$<TARGET_FILE:${program}>")
  endforeach()
endfunction()

# arlo_script_test(NAME REQUIRES <target>... COMMAND <program> <args>... [LABELS ...] [TIMEOUT s] [ENVIRONMENT VAR=value...])
# A test that is a script (Python, node), not a gtest binary, driving the project's programs as real
# processes. As arlo_process_test, it is not defined where a REQUIRES target is not part of this
# configuration; it runs with OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1 besides its ENVIRONMENT.
function(arlo_script_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "COMMAND;REQUIRES;LABELS;ENVIRONMENT" ${ARGN})
  foreach(target IN LISTS ARG_REQUIRES)
    if(NOT TARGET ${target})
      return()
    endif()
  endforeach()
  add_test(NAME ${name} COMMAND ${ARG_COMMAND})
  set(environment OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ${ARG_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${environment}")
endfunction()
