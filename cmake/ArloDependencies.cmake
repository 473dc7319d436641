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
if(ARLO_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ARLO_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
