#include "weight_sync/transports/nccl/library.h"

#ifdef ARLO_NCCL_BACKEND
#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "weight_sync/transports/nccl/group.h"

namespace arlo::weight_sync::nccl {
namespace {

std::string last_dlerror() {
  const char* text = dlerror();
  return text ? text : "unknown dlopen error";
}

// Resolves `name` into `slot`; records the first missing symbol.
template <typename Fn>
void resolve(void* handle, const char* name, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!slot && missing.empty()) missing = name;
}

// dlopens `path` and resolves the library's functions into a new Library through
// `resolve_all(handle, library, missing)`; on success the handle stays open for the life of the
// process. Fails with what went wrong: kNotFound with dlerror's text when it does not load,
// kMismatch with "no symbol <name>" (the first missing one) when it loads without a function.
template <typename Library, typename ResolveAll>
Result<std::unique_ptr<Library>> open_library(const std::string& path, ResolveAll resolve_all) {
  dlerror();
  // RTLD_LOCAL: another copy in the process (torch's) keeps its own symbols.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return make_error(ErrorCode::kNotFound, last_dlerror());
  auto lib = std::make_unique<Library>();
  lib->path = path;
  std::string missing;
  resolve_all(handle, *lib, missing);
  if (!missing.empty()) {
    dlclose(handle);
    return make_error(ErrorCode::kMismatch, "no symbol " + missing);
  }
  return lib;
}

Result<std::unique_ptr<NcclLibrary>> open_nccl(const std::string& path) {
  auto lib = open_library<NcclLibrary>(path, [](void* handle, NcclLibrary& l, std::string& missing) {
#define ARLO_RESOLVE_NCCL(name) resolve(handle, "nccl" #name, l.name, missing);
    ARLO_NCCL_FUNCTIONS(ARLO_RESOLVE_NCCL)
#undef ARLO_RESOLVE_NCCL
  });
  if (!lib && lib.error().code() == ErrorCode::kNotFound) {
    return make_error(ErrorCode::kNotFound, "nccl: cannot load libnccl from " + path + ": " + lib.error().message() +
                                                " (set the transport's nccl library path to the libnccl.so.2 "
                                                "the inference servers use)");
  }
  if (!lib) {
    return make_error(ErrorCode::kMismatch, "nccl: " + path + " has " + lib.error().message() +
                                                " (arlo needs NCCL >= 2.14 with non-blocking communicators)");
  }
  int code = 0;
  if (ncclResult_t r = (*lib)->GetVersion(&code); r != ncclSuccess) {
    return make_error(ErrorCode::kInternal,
                      "nccl: ncclGetVersion failed in " + path + ": " + (*lib)->GetErrorString(r));
  }
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  (*lib)->version =
      std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
  return std::move(*lib);
}

Result<std::unique_ptr<CudaRuntime>> open_cudart(const std::string& nccl_path) {
  const std::string soname = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  std::vector<std::string> candidates = {soname};
  std::filesystem::path dir = std::filesystem::path(nccl_path).parent_path();
  if (!dir.empty()) {
    candidates.push_back((dir / soname).string());
    candidates.push_back((dir.parent_path().parent_path() / "cuda_runtime" / "lib" / soname).string());
  }
  candidates.push_back((std::filesystem::path("/usr/local/cuda/lib64") / soname).string());
  std::string tried;
  for (const std::string& candidate : candidates) {
    auto rt = open_library<CudaRuntime>(candidate, [](void* handle, CudaRuntime& r, std::string& missing) {
#define ARLO_RESOLVE_CUDART(name) resolve(handle, "cuda" #name, r.name, missing);
      ARLO_CUDART_FUNCTIONS(ARLO_RESOLVE_CUDART)
#undef ARLO_RESOLVE_CUDART
      resolve(handle, "cudaMalloc", r.Malloc, missing);
      resolve(handle, "cudaHostAlloc", r.HostAlloc, missing);
    });
    if (rt) return rt;
    tried += "\n  " + candidate + ": " + rt.error().message();
  }
  return make_error(ErrorCode::kNotFound,
                    "nccl: cannot load the CUDA runtime " + soname + "; tried:" + tried +
                        "\n(install the CUDA runtime or put its lib directory on LD_LIBRARY_PATH)");
}

std::mutex& load_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Result<const NcclLibrary*> load_nccl(const std::string& path_in) {
  const std::string path = path_in.empty() ? kDefaultLibraryPath : path_in;
  static std::map<std::string, std::unique_ptr<NcclLibrary>> loaded;  // never unloaded
  std::lock_guard lock(load_mutex());
  if (auto it = loaded.find(path); it != loaded.end()) return it->second.get();
  ARLO_ASSIGN_OR_RETURN(auto lib, open_nccl(path));
  return loaded.emplace(path, std::move(lib)).first->second.get();
}

Result<const CudaRuntime*> load_cudart(const std::string& nccl_path) {
  static std::unique_ptr<CudaRuntime> loaded;  // one runtime per process
  std::lock_guard lock(load_mutex());
  if (loaded) return loaded.get();
  ARLO_ASSIGN_OR_RETURN(loaded, open_cudart(nccl_path.empty() ? kDefaultLibraryPath : nccl_path));
  return loaded.get();
}

}  // namespace arlo::weight_sync::nccl
#endif  // ARLO_NCCL_BACKEND
