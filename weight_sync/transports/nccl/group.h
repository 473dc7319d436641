#pragma once
// One rank's side of one NCCL communicator, and the broadcasts that move a weight set over it.
//
// libnccl and libcudart are loaded at run time (library.h), so arlo runs on machines without a GPU
// driver and the NCCL version is the one the inference servers use, chosen by path. Every call
// goes through a Backend (backend.h): the real one, or a test's double (testing/nccl_fake_backend.h).
//
// Deadlines: NCCL has no operation timeout, so every wait here polls ncclCommGetAsyncError (and a
// CUDA event for collectives) against its deadline and calls ncclCommAbort on expiry. After an
// abort the group is dead: every later call fails at once; make a new group on a new rendezvous
// port (the peers' side of an aborted transfer is wedged and must be re-initialised too).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "weight_sync/transports/nccl/layout.h"
#include "weight_sync/transports/nccl/unique_id.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::nccl {

// The CUDA install's NCCL, used when a config leaves the path empty.
inline constexpr const char* kDefaultLibraryPath = "/usr/local/cuda/lib64/libnccl.so.2";

// Whether this build has the real backend (CMake found CUDA and NCCL). Without it every call below
// that needs NCCL fails with "built without NCCL" (a test double still works).
bool backend_built();

// ncclGetVersion of the library at `library_path` (empty: kDefaultLibraryPath), e.g. "2.28.9".
// Every peer must run the same version (NCCL refuses mismatched ranks at init).
Result<std::string> library_version(const std::string& library_path);
// ncclGetUniqueId: rank 0 mints the id (it opens the bootstrap root socket) and publishes it.
Result<UniqueId> new_unique_id(const std::string& library_path);

struct GroupConfig {
  std::string library_path;  // empty: kDefaultLibraryPath
  int world_size = 0;
  int rank = 0;
  int device = 0;                                       // CUDA ordinal (cudaSetDevice before init)
  std::chrono::milliseconds collective_timeout{30000};  // deadline of each collective (each bucket)
};

struct TransferReport {
  std::size_t collectives = 0;  // broadcasts issued
  std::uint64_t bytes = 0;      // payload bytes moved
  double seconds = 0;           // first issue to last completion
};

// Thread-safety: one thread makes the calls (start/wait_ready/warmup/send/receive, then the
// destructor); abort() and aborted() may be called from any thread at any time.
class Group {
 public:
  // cudaSetDevice, then a non-blocking ncclCommInitRankConfig; returns at once (the peers join
  // while the caller does other work, e.g. the HTTP calls that make the servers join).
  static Result<std::unique_ptr<Group>> start(const GroupConfig& config, const UniqueId& id);
  // Destroys the communicator (finalize, then destroy), or aborts it if anything is in flight or
  // the finalize does not finish within a few seconds.
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Init finished. Aborts on expiry; errors name the rank, the world size and NCCL's message.
  Status wait_ready(Deadline deadline);
  // One float32 element, sum all-reduce: what vLLM's workers issue right after init.
  Status warmup(Deadline deadline);

  // Rank 0: broadcasts every tensor of `source` in `layout`. Host tensors are staged through pinned
  // memory into device buffers; device tensors (on this group's device) are sent from device
  // memory. Packed buckets are filled into one of packed_num_buffers device buffers, each on its own
  // stream, so filling bucket i+1 overlaps sending bucket i. `cancelled` is polled between and
  // during collectives: when it returns true the group aborts (e.g. a receiver's HTTP call failed).
  // Each collective's deadline is min(deadline, its issue + collective_timeout). The source's bytes
  // are read until this returns.
  Result<TransferReport> send(const WeightSource& source, const Layout& layout, Deadline deadline,
                              const std::function<bool()>& cancelled = {});
  // Rank > 0 (arlo's own GPU receiver): receives every tensor of `specs` into `sink` (device buffers
  // when sink.device() is cuda; host sinks staged through pinned memory), same layout and order as
  // the sender. Neither commits nor discards: the caller does.
  Result<TransferReport> receive(WeightSink& sink, const std::vector<TensorSpec>& specs, const Layout& layout,
                                 Deadline deadline, const std::function<bool()>& cancelled = {});

  // From any thread: the group aborts (at once when idle, else within a poll of the call in flight,
  // which then fails with `why`). Idempotent; the first reason wins.
  void abort(std::string why);
  bool aborted() const;

  const GroupConfig& config() const;

 private:
  class Impl;
  explicit Group(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arlo::weight_sync::nccl
