# Required dependencies, all from Debian packages (scripts/bootstrap installs them).
include_guard(GLOBAL)

find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED)           # header-only Asio and Beast
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
# verifiers' environment server protocol (session/adapters/verifiers_client): libzmq and cppzmq's header.
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
# Its replies are decoded with msgpuck (Debian's libmsgpuck-dev: a header and a static library), which
# reads maps with integer keys; nlohmann-json's codec does not. (msgpack-cxx cannot be installed beside
# Boost 1.81: Debian's package pulls Boost 1.74's headers.)
find_path(MSGPUCK_INCLUDE_DIR msgpuck.h REQUIRED)
find_library(MSGPUCK_LIBRARY NAMES libmsgpuck.a msgpuck REQUIRED)
add_library(arlo_msgpuck STATIC IMPORTED GLOBAL)
set_target_properties(arlo_msgpuck PROPERTIES IMPORTED_LOCATION "${MSGPUCK_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${MSGPUCK_INCLUDE_DIR}")
if(ARLO_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ARLO_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
