#pragma once
// Test seam for the NCCL communicator: a Backend double that records every call and simulates the
// device in host memory, and a scoped override so that group.h (and everything above it) uses it.
//
//   nccl::testing::ScopedBackend fake;            // process-wide until it goes out of scope
//   fake->hold_init();                            // init stays in progress ...
//   auto group = nccl::Group::start(config, id);  // ... uses the double
//   fake->release_init();                         // ... until the test says so
//
// The simulation: "device" and "pinned" memory are host allocations; each stream runs its queued
// copies and collectives in order, a collective runs only when every earlier one ran and the test
// lets it (hold_collectives_from), and runs when anything polls the backend. An event is reached
// when everything queued on its stream before it ran. A broadcast on the root captures the send
// buffer's bytes when it runs; on other ranks it writes the next payload a test queued
// (push_incoming). Not for production callers.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "weight_sync/transports/nccl/backend.h"

namespace arlo::weight_sync::nccl::testing {

struct Call {
  enum class Kind { kSetDevice, kInit, kBroadcast, kAllReduce, kFinalize, kDestroy, kAbort };
  Kind kind = Kind::kInit;
  int device = 0;                // kSetDevice
  int world_size = 0, rank = 0;  // kInit
  std::size_t count = 0;         // kBroadcast, kAllReduce: elements
  int dtype = -1;                // ncclDataType_t value
  int root = -1;                 // kBroadcast
  bool in_place = false;         // send == recv
  bool ran = false;              // the collective ran (its bytes are final)
  std::vector<std::byte> bytes;  // broadcast: what travelled (root: its send buffer; else what it received)
};

class FakeBackend final : public Backend {
 public:
  FakeBackend();
  ~FakeBackend() override;

  // --- test controls (any thread)
  void hold_init();  // comm_poll reports "in progress" after init until release_init()
  void release_init();
  // Collectives with an index (0-based, in issue order, broadcasts and all-reduces together) >= n
  // do not run until release_collectives(); n = 0 holds every one.
  void hold_collectives_from(std::size_t n);
  void release_collectives();
  // The next comm_poll fails with ncclRemoteError and this text (as a peer's failure would).
  void inject_async_error(std::string message);
  void fail_set_device(std::string message);  // set_device fails (e.g. no such device)
  void set_version(std::string version);      // what version() reports; "2.28.9" by default
  // What the next non-root broadcast receives (its size must match that broadcast's bytes).
  void push_incoming(std::vector<std::byte> payload);

  // --- observations (any thread)
  std::vector<Call> calls() const;
  std::vector<Call> calls(Call::Kind kind) const;
  std::size_t count(Call::Kind kind) const;
  // Blocks until `pred(calls())` holds or `timeout` passes (condition variable; no polling).
  bool wait_for(const std::function<bool(const std::vector<Call>&)>& pred, std::chrono::milliseconds timeout) const;
  // Misuse the double detected: a call on an aborted or destroyed comm, a free of an unknown
  // pointer, a copy out of bounds, a collective on a stream of another backend... Tests expect none.
  std::vector<std::string> misuse() const;
  std::size_t live_allocations() const;  // device + pinned buffers not freed
  std::size_t live_handles() const;      // comms, streams and events not destroyed

  // --- Backend
  Result<std::string> version() override;
  Result<UniqueId> unique_id() override;
  Status set_device(int device) override;
  Result<CommHandle> comm_init(int world_size, int rank, const UniqueId& id) override;
  Result<bool> comm_poll(CommHandle comm) override;
  Status broadcast(CommHandle comm, const void* send, void* recv, std::size_t count, int nccl_dtype, int root,
                   StreamHandle stream) override;
  Status all_reduce_sum(CommHandle comm, const void* send, void* recv, std::size_t count, int nccl_dtype,
                        StreamHandle stream) override;
  Status comm_finalize(CommHandle comm) override;
  Status comm_destroy(CommHandle comm) override;
  void comm_abort(CommHandle comm) override;
  Result<StreamHandle> stream_create() override;
  void stream_destroy(StreamHandle stream) override;
  Result<EventHandle> event_create() override;
  void event_destroy(EventHandle event) override;
  Status event_record(EventHandle event, StreamHandle stream) override;
  Result<bool> event_done(EventHandle event) override;
  Result<void*> device_alloc(std::size_t bytes) override;
  void device_free(void* ptr) override;
  Result<void*> pinned_alloc(std::size_t bytes) override;
  void pinned_free(void* ptr) override;
  Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, StreamHandle stream) override;
  void pause(std::chrono::microseconds max) override;

 private:
  struct Op;
  struct Stream;
  struct CommState;
  void progress_locked();  // runs every op that may run
  Status enqueue_collective_locked(const char* name, Call call, CommHandle comm, const void* send, void* recv,
                                   std::size_t count, int dtype, StreamHandle stream);
  void note_misuse_locked(std::string what);
  void record_locked(Call::Kind kind);
  bool owns_locked(const void* ptr, std::size_t bytes) const;
  CommState* comm_locked(CommHandle comm, const char* call);
  // Finalize, destroy, abort: false (a misuse noted) unless `comm` is live; else sets its `mark`
  // (when given) and records `kind`.
  bool comm_call_locked(CommHandle comm, const char* call, Call::Kind kind, bool CommState::*mark);

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::vector<Call> calls_;
  std::vector<std::string> misuse_;
  std::map<const std::byte*, std::size_t> allocations_;  // start -> size (device and pinned)
  std::set<const std::byte*> pinned_;
  std::set<Stream*> streams_;
  std::map<EventHandle, std::pair<Stream*, std::uint64_t>> events_;  // event -> (stream, ops before it)
  std::set<CommState*> comms_;
  std::deque<std::vector<std::byte>> incoming_;
  std::size_t collectives_issued_ = 0;
  std::size_t collectives_ran_ = 0;
  std::size_t hold_from_ = std::numeric_limits<std::size_t>::max();
  bool hold_init_ = false;
  std::optional<std::string> async_error_;
  std::optional<std::string> set_device_error_;
  std::string version_ = "2.28.9";
  int next_event_ = 1;
};

// Installs a FakeBackend for every open_backend() call (any library path) until destroyed, then
// restores what was installed before.
class ScopedBackend {
 public:
  ScopedBackend();
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

  FakeBackend* operator->() const { return fake_.get(); }
  FakeBackend& operator*() const { return *fake_; }
  const std::shared_ptr<FakeBackend>& get() const { return fake_; }

 private:
  std::shared_ptr<FakeBackend> fake_;
  BackendFactory previous_;
};

}  // namespace arlo::weight_sync::nccl::testing
