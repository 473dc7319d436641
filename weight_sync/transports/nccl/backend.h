#pragma once
// The collective interface: what a Group needs from NCCL and CUDA, and nothing more. The real
// backend (backend_nccl.cc) calls the dlopen'ed libraries; the test double (testing/nccl_fake_backend.h) records the
// calls and lets a test decide when pending work completes.
//
// Handles are opaque pointers owned by the backend that made them. Every call returns promptly
// (the communicator is non-blocking): completion is observed through comm_poll and event_done.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "weight_sync/transports/nccl/unique_id.h"

namespace arlo::weight_sync::nccl {

using CommHandle = void*;    // ncclComm_t
using StreamHandle = void*;  // cudaStream_t
using EventHandle = void*;   // cudaEvent_t

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Backend {
 public:
  virtual ~Backend() = default;

  // --- NCCL library
  virtual Result<std::string> version() = 0;  // "2.28.9"
  virtual Result<UniqueId> unique_id() = 0;   // ncclGetUniqueId

  // --- communicator (non-blocking: ncclConfig_t.blocking = 0)
  virtual Status set_device(int device) = 0;  // cudaSetDevice; also checks that the device exists
  // ncclCommInitRankConfig; returns at once with the handle while the init runs.
  virtual Result<CommHandle> comm_init(int world_size, int rank, const UniqueId& id) = 0;
  // ncclCommGetAsyncError: true when the last operation finished (ncclSuccess), false while it is
  // in progress, an error (NCCL's code name and last-error text) when it failed.
  virtual Result<bool> comm_poll(CommHandle comm) = 0;
  // ncclBroadcast (send is read on the root only; send == recv is in place).
  virtual Status broadcast(CommHandle comm, const void* send, void* recv, std::size_t count, int nccl_dtype, int root,
                           StreamHandle stream) = 0;
  // ncclAllReduce with ncclSum.
  virtual Status all_reduce_sum(CommHandle comm, const void* send, void* recv, std::size_t count, int nccl_dtype,
                                StreamHandle stream) = 0;
  virtual Status comm_finalize(CommHandle comm) = 0;  // ncclCommFinalize (poll comm_poll after it)
  virtual Status comm_destroy(CommHandle comm) = 0;   // ncclCommDestroy (after a finished finalize)
  virtual void comm_abort(CommHandle comm) = 0;       // ncclCommAbort: kills in-flight work, frees

  // --- CUDA
  virtual Result<StreamHandle> stream_create() = 0;  // non-blocking stream
  virtual void stream_destroy(StreamHandle stream) = 0;
  virtual Result<EventHandle> event_create() = 0;  // timing disabled
  virtual void event_destroy(EventHandle event) = 0;
  virtual Status event_record(EventHandle event, StreamHandle stream) = 0;
  virtual Result<bool> event_done(EventHandle event) = 0;  // cudaEventQuery: true once reached
  virtual Result<void*> device_alloc(std::size_t bytes) = 0;
  virtual void device_free(void* ptr) = 0;
  virtual Result<void*> pinned_alloc(std::size_t bytes) = 0;  // page-locked host memory
  virtual void pinned_free(void* ptr) = 0;
  virtual Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, StreamHandle stream) = 0;

  // Waits up to `max` for something to change before the next poll. The real backend sleeps; the
  // double wakes early when a test completes work, so tests need no sleeps.
  virtual void pause(std::chrono::microseconds max) = 0;
};

// The backend for a libnccl path (empty: kDefaultLibraryPath): the override a test installed
// (testing/nccl_fake_backend.h), else the real one, else (a build without NCCL) an error "built without NCCL".
Result<std::shared_ptr<Backend>> open_backend(const std::string& library_path);

// The real backend (backend_nccl.cc), in builds with ARLO_NCCL_BACKEND only; callers use open_backend.
Result<std::shared_ptr<Backend>> open_nccl_backend(const std::string& library_path);

// testing/nccl_fake_backend.h installs a factory here; nullptr restores the real backend. Process-wide.
using BackendFactory = std::function<Result<std::shared_ptr<Backend>>(const std::string& library_path)>;
// Returns the factory it replaces.
BackendFactory set_backend_factory(BackendFactory factory);

}  // namespace arlo::weight_sync::nccl
