// The real Backend: the dlopen'ed libnccl and libcudart (library.h). Built only with
// ARLO_NCCL_BACKEND; without it open_backend() says "built without NCCL" (group.cc).
#include "weight_sync/transports/nccl/backend.h"

#ifdef ARLO_NCCL_BACKEND
#include <cstring>
#include <thread>

#include "weight_sync/transports/nccl/library.h"

namespace arlo::weight_sync::nccl {
namespace {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const NcclLibrary* nccl) : nccl_(nccl) {}

  Result<std::string> version() override { return nccl_->version; }

  Result<UniqueId> unique_id() override {
    ncclUniqueId raw;
    ARLO_TRY(check(nccl_->GetUniqueId(&raw), "ncclGetUniqueId"));
    UniqueId id;
    static_assert(sizeof(raw.internal) == sizeof(id.bytes));
    std::memcpy(id.bytes.data(), raw.internal, id.bytes.size());
    return id;
  }

  Status set_device(int device) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    int count = 0;
    if (cudaError_t e = rt->GetDeviceCount(&count); e != cudaSuccess) {
      return make_error(ErrorCode::kUnavailable, std::string("cuda: no usable GPU (cudaGetDeviceCount: ") +
                                                     rt->GetErrorString(e) + ", runtime " + rt->path + ")");
    }
    if (device < 0 || device >= count) {
      return make_error(ErrorCode::kInvalidArgument, "cuda: device " + std::to_string(device) + " does not exist (" +
                                                         std::to_string(count) + " visible)");
    }
    return cuda_check(rt->SetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }

  Result<CommHandle> comm_init(int world_size, int rank, const UniqueId& id) override {
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), id.bytes.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; progress is polled (ncclCommGetAsyncError)
    ncclComm_t comm = nullptr;
    ncclResult_t r = nccl_->CommInitRankConfig(&comm, world_size, raw, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string message = describe(r);
      if (comm) nccl_->CommAbort(comm);
      return make_error(ErrorCode::kUnavailable, "ncclCommInitRankConfig: " + message);
    }
    return static_cast<CommHandle>(comm);
  }

  Result<bool> comm_poll(CommHandle comm) override {
    ncclResult_t state = ncclSuccess;
    ARLO_TRY(check(nccl_->CommGetAsyncError(as_comm(comm), &state), "ncclCommGetAsyncError"));
    if (state == ncclInProgress) return false;
    if (state == ncclSuccess) return true;
    return make_error(ErrorCode::kUnavailable, describe(state));
  }

  Status broadcast(CommHandle comm, const void* send, void* recv, std::size_t count, int dtype, int root,
                   StreamHandle stream) override {
    return check(
        nccl_->Broadcast(send, recv, count, static_cast<ncclDataType_t>(dtype), root, as_comm(comm), as_stream(stream)),
        "ncclBroadcast");
  }

  Status all_reduce_sum(CommHandle comm, const void* send, void* recv, std::size_t count, int dtype,
                        StreamHandle stream) override {
    return check(nccl_->AllReduce(send, recv, count, static_cast<ncclDataType_t>(dtype), ncclSum, as_comm(comm),
                                  as_stream(stream)),
                 "ncclAllReduce");
  }

  Status comm_finalize(CommHandle comm) override {
    return check(nccl_->CommFinalize(as_comm(comm)), "ncclCommFinalize");
  }
  Status comm_destroy(CommHandle comm) override { return check(nccl_->CommDestroy(as_comm(comm)), "ncclCommDestroy"); }
  void comm_abort(CommHandle comm) override { nccl_->CommAbort(as_comm(comm)); }

  Result<StreamHandle> stream_create() override {
    return create_with_flags<StreamHandle>(&CudaRuntime::StreamCreateWithFlags, cudaStreamNonBlocking,
                                           "cudaStreamCreateWithFlags");
  }
  void stream_destroy(StreamHandle stream) override {
    if (rt_ && stream) rt_->StreamDestroy(as_stream(stream));
  }

  Result<EventHandle> event_create() override {
    return create_with_flags<EventHandle>(&CudaRuntime::EventCreateWithFlags, cudaEventDisableTiming,
                                          "cudaEventCreateWithFlags");
  }
  void event_destroy(EventHandle event) override {
    if (rt_ && event) rt_->EventDestroy(static_cast<cudaEvent_t>(event));
  }
  Status event_record(EventHandle event, StreamHandle stream) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    return cuda_check(rt->EventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)), "cudaEventRecord");
  }
  Result<bool> event_done(EventHandle event) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    cudaError_t e = rt->EventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return std::unexpected(cuda_error(e, "cudaEventQuery"));
  }

  Result<void*> device_alloc(std::size_t bytes) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    void* ptr = nullptr;
    ARLO_TRY(cuda_check(rt->Malloc(&ptr, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)"));
    return ptr;
  }
  void device_free(void* ptr) override {
    if (rt_ && ptr) rt_->Free(ptr);
  }
  Result<void*> pinned_alloc(std::size_t bytes) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    void* ptr = nullptr;
    ARLO_TRY(cuda_check(rt->HostAlloc(&ptr, bytes, cudaHostAllocDefault),
                        "cudaHostAlloc(" + std::to_string(bytes) + " bytes)"));
    return ptr;
  }
  void pinned_free(void* ptr) override {
    if (rt_ && ptr) rt_->FreeHost(ptr);
  }
  Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, StreamHandle stream) override {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDeviceToDevice;
    return cuda_check(rt->MemcpyAsync(dst, src, bytes, k, as_stream(stream)),
                      "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes)");
  }

  void pause(std::chrono::microseconds max) override { std::this_thread::sleep_for(max); }

 private:
  static ncclComm_t as_comm(CommHandle comm) { return static_cast<ncclComm_t>(comm); }
  static cudaStream_t as_stream(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

  // "ncclSystemError: <last error text>"
  std::string describe(ncclResult_t r) const {
    std::string text = nccl_->GetErrorString(r);
    const char* last = nccl_->GetLastError(nullptr);
    if (last && *last) text += ": " + std::string(last);
    return text;
  }
  Status check(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess || r == ncclInProgress) return ok();
    return make_error(ErrorCode::kUnavailable, std::string(call) + ": " + describe(r));
  }

  Result<const CudaRuntime*> cuda() {
    if (!rt_) {
      ARLO_ASSIGN_OR_RETURN(rt_, load_cudart(nccl_->path));
    }
    return rt_;
  }
  Error cuda_error(cudaError_t e, const std::string& call) const {
    return Error(ErrorCode::kUnavailable, "cuda: " + call + ": " + rt_->GetErrorString(e));
  }
  Status cuda_check(cudaError_t e, const std::string& call) const {
    if (e == cudaSuccess) return ok();
    return std::unexpected(cuda_error(e, call));
  }
  // A CUDA stream or event: made by the runtime's `create` entry (named `call`) with `flags`.
  template <typename Handle, typename Raw>
  Result<Handle> create_with_flags(cudaError_t (*CudaRuntime::*create)(Raw*, unsigned int), unsigned int flags,
                                   const char* call) {
    ARLO_ASSIGN_OR_RETURN(const CudaRuntime* rt, cuda());
    Raw raw = nullptr;
    ARLO_TRY(cuda_check((rt->*create)(&raw, flags), call));
    return static_cast<Handle>(raw);
  }

  const NcclLibrary* nccl_;
  const CudaRuntime* rt_ = nullptr;  // loaded at the first CUDA call (ncclGetVersion needs none)
};

}  // namespace

Result<std::shared_ptr<Backend>> open_nccl_backend(const std::string& library_path) {
  ARLO_ASSIGN_OR_RETURN(const NcclLibrary* nccl, load_nccl(library_path));
  return std::shared_ptr<Backend>(std::make_shared<NcclBackend>(nccl));
}

}  // namespace arlo::weight_sync::nccl
#endif  // ARLO_NCCL_BACKEND
