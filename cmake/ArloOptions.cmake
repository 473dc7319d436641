# Build options. Optional dependencies are auto-detected: a missing one degrades with one line of
# output; one asked for explicitly (-DARLO_WITH_X=ON) but missing stops configuration.
include_guard(GLOBAL)

set(ARLO_WITH_TORCH "AUTO" CACHE STRING "Build the built-in libtorch policy (ON, OFF, AUTO)")
set(ARLO_WITH_CUDA "AUTO" CACHE STRING "Build CUDA paths (ON, OFF, AUTO)")
set(ARLO_WITH_NCCL "AUTO" CACHE STRING "Build the NCCL weight transport (ON, OFF, AUTO)")
set(ARLO_SANITIZE "" CACHE STRING "Sanitizers, comma-separated: address,undefined,thread")
option(ARLO_FUZZ "Build libFuzzer targets (requires clang)" OFF)
option(ARLO_BUILD_TESTS "Build the test suite" ON)
option(ARLO_BUILD_BENCH "Build benchmarks" ON)

foreach(opt ARLO_WITH_TORCH ARLO_WITH_CUDA ARLO_WITH_NCCL)
  string(TOUPPER "${${opt}}" value)
  if(NOT value MATCHES "^(ON|OFF|AUTO|TRUE|FALSE|1|0|YES|NO)$")
    message(FATAL_ERROR "${opt}=${${opt}}: expected ON, OFF or AUTO")
  endif()
  if(value MATCHES "^(TRUE|1|YES)$")
    set(value ON)
  elseif(value MATCHES "^(FALSE|0|NO)$")
    set(value OFF)
  endif()
  set(${opt}_REQUEST ${value})
endforeach()

# arlo_resolve_option(NAME FOUND REASON): turns a request (ON/OFF/AUTO) plus a detection result into
# the final ${NAME}_ENABLED, or stops when ON was asked for and the dependency is missing.
function(arlo_resolve_option name found reason)
  if(${name}_REQUEST STREQUAL "OFF")
    set(${name}_ENABLED OFF PARENT_SCOPE)
  elseif(found)
    set(${name}_ENABLED ON PARENT_SCOPE)
    message(STATUS "arlo: ${name} enabled")
  elseif(${name}_REQUEST STREQUAL "ON")
    message(FATAL_ERROR "arlo: ${name}=ON but ${reason}")
  else()
    set(${name}_ENABLED OFF PARENT_SCOPE)
    message(STATUS "arlo: ${name} disabled: ${reason}")
  endif()
endfunction()

# libtorch (Debian's libtorch-dev ships TorchConfig.cmake).
if(NOT ARLO_WITH_TORCH_REQUEST STREQUAL "OFF")
  find_package(Torch QUIET)
endif()
arlo_resolve_option(ARLO_WITH_TORCH "${Torch_FOUND}" "libtorch not found (install libtorch-dev: scripts/bootstrap)")

# CUDA and NCCL under CUDA_HOME or /usr/local/cuda, else from NVIDIA's wheels in the project's Python
# environment (torch's nvidia-cuda-runtime and nvidia-nccl, when scripts/bootstrap --python made it
# before this configure, as `make test` does). The NCCL transport needs only their headers to build:
# it loads libnccl and libcudart by path at run time.
file(GLOB arlo_wheel_roots "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/nvidia/cu1*"
                           "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/nvidia/nccl")
set(arlo_cuda_roots $ENV{CUDA_HOME} /usr/local/cuda ${arlo_wheel_roots})
if(NOT ARLO_WITH_CUDA_REQUEST STREQUAL "OFF")
  find_path(ARLO_CUDA_INCLUDE cuda_runtime.h PATHS ${arlo_cuda_roots} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(ARLO_CUDART NAMES cudart libcudart.so.13 libcudart.so.12 PATHS ${arlo_cuda_roots}
               PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH)
endif()
if(ARLO_CUDA_INCLUDE AND ARLO_CUDART)
  set(arlo_cuda_found TRUE)
else()
  set(arlo_cuda_found FALSE)
endif()
arlo_resolve_option(ARLO_WITH_CUDA "${arlo_cuda_found}" "no CUDA toolkit under CUDA_HOME or /usr/local/cuda")

if(NOT ARLO_WITH_NCCL_REQUEST STREQUAL "OFF")
  find_path(ARLO_NCCL_INCLUDE nccl.h PATHS ${arlo_cuda_roots} /usr PATH_SUFFIXES include)
  find_library(ARLO_NCCL_LIB NAMES nccl libnccl.so.2 PATHS ${arlo_cuda_roots} /usr PATH_SUFFIXES lib64 lib)
endif()
if(ARLO_NCCL_INCLUDE AND ARLO_NCCL_LIB AND ARLO_WITH_CUDA_ENABLED)
  set(arlo_nccl_found TRUE)
else()
  set(arlo_nccl_found FALSE)
endif()
arlo_resolve_option(ARLO_WITH_NCCL "${arlo_nccl_found}" "NCCL (nccl.h, libnccl) not found next to the CUDA toolkit")
if(ARLO_WITH_NCCL_ENABLED AND NOT ARLO_WITH_CUDA_ENABLED)
  message(FATAL_ERROR "arlo: ARLO_WITH_NCCL needs ARLO_WITH_CUDA")
endif()

# Sanitizers apply to everything we compile.
if(ARLO_SANITIZE)
  string(REPLACE "," ";" arlo_sanitizers "${ARLO_SANITIZE}")
  foreach(s ${arlo_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "ARLO_SANITIZE: unknown sanitizer '${s}' (use address, undefined, thread, leak)")
    endif()
  endforeach()
  if("address" IN_LIST arlo_sanitizers AND "thread" IN_LIST arlo_sanitizers)
    message(FATAL_ERROR "ARLO_SANITIZE: address and thread cannot be combined")
  endif()
  add_compile_options(-fsanitize=${ARLO_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${ARLO_SANITIZE})
  message(STATUS "arlo: sanitizers ${ARLO_SANITIZE}")
endif()

if(ARLO_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "ARLO_FUZZ=ON needs clang: configure with -DCMAKE_CXX_COMPILER=clang++ (make fuzz does)")
endif()

# The project's Python environment (scripts/bootstrap --python makes it from python/requirements.lock):
# the interpreter of the monitors (session/monitors.h) and of the tests that need its packages.
set(ARLO_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "The project's Python interpreter (scripts/bootstrap --python creates it)")
