#pragma once
// libnccl and libcudart loaded with dlopen: the function tables the real backend calls. The headers
// give only types and constants; nothing links against either library, so arlo binaries start on
// machines without a GPU driver and the NCCL version is chosen by path at run time (it must equal
// the inference servers' version). Built only with ARLO_NCCL_BACKEND (CMake found CUDA and NCCL).
#ifdef ARLO_NCCL_BACKEND
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "common/result.h"

namespace arlo::weight_sync::nccl {

// The functions of each table, X(name) for the library's nccl<name> / cuda<name>: one list both
// declares the fields below and resolves them (library.cc).
// clang-format off
#define ARLO_NCCL_FUNCTIONS(X)                                                                     \
  X(GetVersion) X(GetUniqueId) X(CommInitRankConfig) X(CommGetAsyncError) X(CommFinalize)          \
  X(CommDestroy) X(CommAbort) X(Broadcast) X(AllReduce) X(GetErrorString) X(GetLastError)
#define ARLO_CUDART_FUNCTIONS(X)                                                                   \
  X(GetDeviceCount) X(SetDevice) X(GetErrorString) X(StreamCreateWithFlags) X(StreamDestroy)       \
  X(EventCreateWithFlags) X(EventDestroy) X(EventRecord) X(EventQuery) X(Free) X(FreeHost)         \
  X(MemcpyAsync)
// clang-format on

struct NcclLibrary {
  std::string path;
  std::string version;  // "2.28.9", from ncclGetVersion
#define ARLO_NCCL_FIELD(name) decltype(&::nccl##name) name = nullptr;
  ARLO_NCCL_FUNCTIONS(ARLO_NCCL_FIELD)
#undef ARLO_NCCL_FIELD
};

struct CudaRuntime {
  std::string path;
#define ARLO_CUDART_FIELD(name) decltype(&::cuda##name) name = nullptr;
  ARLO_CUDART_FUNCTIONS(ARLO_CUDART_FIELD)
#undef ARLO_CUDART_FIELD
  // Spelled out: the untyped (void**) overloads, resolved by name in library.cc.
  cudaError_t (*Malloc)(void** ptr, size_t bytes) = nullptr;
  cudaError_t (*HostAlloc)(void** ptr, size_t bytes, unsigned int flags) = nullptr;
};

// Loads (once per path, for the life of the process) the libnccl at `path` (empty:
// kDefaultLibraryPath) and resolves every function above. Fails naming the path and dlerror's text,
// or the missing symbol. Thread-safe.
Result<const NcclLibrary*> load_nccl(const std::string& path);

// Loads libcudart.so.<CUDA major this was built with>: first by soname (the loader's search path),
// then next to `nccl_path`, then in the pip layout beside it (nvidia/cuda_runtime/lib), then in
// /usr/local/cuda/lib64. Fails listing every place tried. Thread-safe; loaded once.
Result<const CudaRuntime*> load_cudart(const std::string& nccl_path);

}  // namespace arlo::weight_sync::nccl
#endif  // ARLO_NCCL_BACKEND
