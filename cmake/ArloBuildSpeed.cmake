# What makes a build on few cores fast without changing what is built: ccache when it is installed,
# and precompiled headers for the third-party headers nearly every unit includes (Boost.Asio,
# nlohmann/json, spdlog/fmt; gtest/gmock for tests). Measured on GCC 12 -O3: those headers cost
# 2 s of each unit's parse (gtest 1.6 s more); loaded from a .gch, 0.5 s.
include_guard(GLOBAL)

# ccache, when installed (not required). Sloppiness as its manual asks for precompiled headers;
# paths relative to the checkout, so another clone of the same sources hits the same cache.
option(ARLO_CCACHE "Compile through ccache when it is installed" ON)
find_program(ARLO_CCACHE_PROGRAM ccache)
if(ARLO_CCACHE AND ARLO_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(arlo_launcher env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} ${ARLO_CCACHE_PROGRAM})
  set(CMAKE_C_COMPILER_LAUNCHER ${arlo_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${arlo_launcher})
  message(STATUS "arlo: compiling through ${ARLO_CCACHE_PROGRAM}")
endif()

# Precompiled headers with GCC. Clang is left out: it rejects a .gch built with other flags, and the
# fuzz build (the clang one) gives arlo_common its own instrumentation flags.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT ARLO_FUZZ)
  set(arlo_pch_default ON)
else()
  set(arlo_pch_default OFF)
endif()
option(ARLO_PCH "Precompile the heaviest third-party headers (GCC only)" ${arlo_pch_default})

set(ARLO_PCH_HEADERS
  <algorithm> <chrono> <expected> <filesystem> <functional> <map> <memory> <mutex> <optional>
  <string> <string_view> <thread> <vector>
  <boost/asio/any_io_executor.hpp> <boost/asio/awaitable.hpp> <boost/asio/co_spawn.hpp>
  <boost/asio/detached.hpp> <boost/asio/io_context.hpp> <boost/asio/post.hpp>
  <boost/asio/redirect_error.hpp> <boost/asio/steady_timer.hpp> <boost/asio/use_awaitable.hpp>
  <boost/beast/http/verb.hpp> <nlohmann/json.hpp> <fmt/format.h> <spdlog/spdlog.h>)
set(ARLO_PCH_TEST_HEADERS <gtest/gtest.h> <gmock/gmock.h>)

# Unity builds of the libraries and programs (ARLO_UNITY; `make` turns it on for a new build dir): a library's
# units are compiled in groups (at most ARLO_UNITY_GROUP_SIZE), each group one unit that includes them,
# so the Asio coroutine, json and fmt code they share is instantiated and optimized once per group
# instead of once per file (measured: common/'s 12 units took 71.6 s of CPU one by one and 35.3 s
# as one). The groups are made from each library's sources at configure time, so a new file joins
# one. Two files of a group share one unit: names at file scope (anonymous namespaces, statics) must
# not repeat across the files of a library, or the group does not compile; a file that cannot
# follow that is listed in ARLO_UNITY_SKIP and compiled on its own. -DARLO_UNITY=OFF compiles
# every file on its own (the better choice while editing a few files again and again).
option(ARLO_UNITY "Compile each library's units in groups (unity build)" OFF)
set(ARLO_UNITY_GROUP_SIZE 32 CACHE STRING "Most units in one unity group")
# Sources (paths relative to the checkout, or the folders they start with) compiled on their own.
set(ARLO_UNITY_SKIP
  common/http_server.cc      # its Connection and constants have the names of http_client.cc's
  orchestrator/train_sink.cc # a helper seconds() as in another file of the module
  session/run_session.cc     # a helper seconds() as in another file of the module
  rollout/admin_dialects/    # each says `using namespace admin_detail`, which would reach the next file
  rollout/rewards/)          # each registers its kind through a function named make()

function(arlo_unity_groups)
  if(NOT ARLO_UNITY)
    return()
  endif()
  get_property(targets GLOBAL PROPERTY ARLO_PCH_TARGETS)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    get_target_property(dir ${target} SOURCE_DIR)
    string(FIND "${dir}/" "${PROJECT_SOURCE_DIR}/apps/" at)
    if(NOT type STREQUAL "STATIC_LIBRARY" AND NOT (type STREQUAL "EXECUTABLE" AND at EQUAL 0))
      continue()   # the libraries and the programs of apps/; tests and benches compile file by file
    endif()
    get_target_property(sources ${target} SOURCES)
    set(members "")
    foreach(source ${sources})
      if(NOT source MATCHES "\\.cc$")
        continue()
      endif()
      cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY ${dir} OUTPUT_VARIABLE path)
      cmake_path(RELATIVE_PATH path BASE_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE relative)
      set(skip OFF)
      foreach(prefix ${ARLO_UNITY_SKIP})
        string(FIND "${relative}" "${prefix}" at)
        if(at EQUAL 0)
          set(skip ON)
        endif()
      endforeach()
      if(NOT skip AND EXISTS ${path})
        list(APPEND members ${path})
      endif()
    endforeach()
    list(LENGTH members count)
    if(count LESS 2)
      continue()
    endif()
    # groups of about equal size, none over ARLO_UNITY_GROUP_SIZE
    math(EXPR groups "(${count} + ${ARLO_UNITY_GROUP_SIZE} - 1) / ${ARLO_UNITY_GROUP_SIZE}")
    set(index 0)
    foreach(path ${members})
      math(EXPR group "${index} * ${groups} / ${count}")
      set_source_files_properties(${path} TARGET_DIRECTORY ${target} PROPERTIES UNITY_GROUP ${target}_${group})
      math(EXPR index "${index} + 1")
    endforeach()
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
    # a file included into a group's unit is no longer the main file: GCC then warns about every
    # type of an anonymous namespace used in another type, which is not a problem inside one unit
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-subobject-linkage>)
  endforeach()
endfunction()

# arlo_target_defaults() registers every arlo target here; arlo_precompile_headers() (called once
# at the end of the top-level CMakeLists.txt, when all links are known) gives each a shared .gch.
function(arlo_pch_register target)
  set_property(GLOBAL APPEND PROPERTY ARLO_PCH_TARGETS ${target})
endfunction()

# Whether `item`'s compile usage requirements reach the target through its links: walks the
# targets it links and their INTERFACE_LINK_LIBRARIES ($<LINK_ONLY:...> carries no compile flags).
function(arlo_pch_reaches links item out)
  set(seen "")
  set(queue ${links})
  set(found OFF)
  while(queue)
    list(POP_FRONT queue lib)
    if(lib IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${lib})
    if(lib STREQUAL item)
      set(found ON)
      break()
    endif()
    if(TARGET ${lib})
      get_target_property(next ${lib} INTERFACE_LINK_LIBRARIES)
      if(next)
        list(FILTER next EXCLUDE REGEX "^\\$<LINK_ONLY:")
        list(APPEND queue ${next})
      endif()
    endif()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# A .gch is only used by units compiled with the flags it was built with (GCC checks: -fPIC/-fPIE,
# macros the headers test, such as libtorch's -D_GLIBCXX_USE_CXX11_ABI): one for the libraries
# (-fPIC) and one for the tests (-fPIE, plus gtest), the two groups with many units. Programs have
# few units, and libtorch code is left alone: its .gch (ATen) takes 20 s and 400 MB to write and
# saves 3 s per unit, and a few units include ATen.
function(arlo_precompile_headers)
  if(NOT ARLO_PCH)
    return()
  endif()
  get_property(targets GLOBAL PROPERTY ARLO_PCH_TARGETS)
  set(source ${PROJECT_BINARY_DIR}/arlo_pch.cc)
  if(NOT EXISTS ${source})
    file(WRITE ${source} "// the translation unit that builds a precompiled header\n")
  endif()
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    get_target_property(links ${target} LINK_LIBRARIES)
    if(NOT links)
      set(links "")
    endif()
    arlo_pch_reaches("${links}" arlo_third_party third_party)
    arlo_pch_reaches("${links}" torch torch)
    arlo_pch_reaches("${links}" GTest::gtest gtest)
    if(torch OR NOT third_party)   # a unit without arlo_third_party's macros cannot use the .gch
      continue()
    elseif(type MATCHES "LIBRARY$")
      set(owner arlo_pch_lib)
      set(deps arlo_third_party)
      set(headers ${ARLO_PCH_HEADERS})
    elseif(gtest)
      set(owner arlo_pch_test)
      set(deps arlo_third_party GTest::gtest GTest::gmock)
      set(headers ${ARLO_PCH_HEADERS} ${ARLO_PCH_TEST_HEADERS})
    else()
      continue()
    endif()
    if(NOT TARGET ${owner})
      add_library(${owner} OBJECT EXCLUDE_FROM_ALL ${source})
      target_link_libraries(${owner} PRIVATE ${deps})
      target_compile_options(${owner} PRIVATE ${ARLO_WARNINGS})
      if(NOT type MATCHES "LIBRARY$")   # an object library compiles -fPIC; programs compile -fPIE
        set_target_properties(${owner} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
        target_compile_options(${owner} PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
      endif()
      target_precompile_headers(${owner} PRIVATE ${headers})
    endif()
    set_target_properties(${target} PROPERTIES PRECOMPILE_HEADERS_REUSE_FROM ${owner})
  endforeach()
endfunction()
