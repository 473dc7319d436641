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

struct NcclLibrary {
  std::string path;
  std::string version;  // "2.28.9", from ncclGetVersion
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
};

struct CudaRuntime {
  std::string path;
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags = nullptr;
  decltype(&::cudaStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cudaEventCreateWithFlags) EventCreateWithFlags = nullptr;
  decltype(&::cudaEventDestroy) EventDestroy = nullptr;
  decltype(&::cudaEventRecord) EventRecord = nullptr;
  decltype(&::cudaEventQuery) EventQuery = nullptr;
  cudaError_t (*Malloc)(void** ptr, size_t bytes) = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  cudaError_t (*HostAlloc)(void** ptr, size_t bytes, unsigned int flags) = nullptr;
  decltype(&::cudaFreeHost) FreeHost = nullptr;
  decltype(&::cudaMemcpyAsync) MemcpyAsync = nullptr;
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
