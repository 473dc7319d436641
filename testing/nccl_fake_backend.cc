#include "testing/nccl_fake_backend.h"

#include <cstring>
#include <utility>

namespace arlo::weight_sync::nccl::testing {
namespace {

std::size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case 0:
    case 1:
    case 10:
    case 11: return 1;  // int8, uint8, fp8 e4m3/e5m2
    case 6:
    case 9: return 2;  // float16, bfloat16
    case 2:
    case 3:
    case 7: return 4;  // int32, uint32, float32
    case 4:
    case 5:
    case 8: return 8;  // int64, uint64, float64
    default: return 0;
  }
}

}  // namespace

struct FakeBackend::Op {
  bool collective = false;
  // copy
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::vector<std::byte> staged;  // pageable host source: copied at issue, as CUDA does
  bool use_staged = false;
  // collective
  std::size_t index = 0;  // in issue order over all collectives
  std::size_t call = 0;   // into calls_
  CommState* comm = nullptr;
  bool broadcast = false;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t bytes = 0;
};

struct FakeBackend::Stream {
  std::deque<Op> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t ran = 0;
};

struct FakeBackend::CommState {
  int world_size = 0, rank = 0;
  bool init_pending = false;
  bool aborted = false;
  bool destroyed = false;
};

FakeBackend::FakeBackend() = default;

FakeBackend::~FakeBackend() {
  for (auto& [ptr, size] : allocations_) delete[] ptr;
  for (Stream* s : streams_) delete s;
  for (CommState* c : comms_) delete c;
}

// --- test controls

void FakeBackend::hold_init() {
  std::lock_guard lock(mutex_);
  hold_init_ = true;
  changed_.notify_all();
}
void FakeBackend::release_init() {
  std::lock_guard lock(mutex_);
  hold_init_ = false;
  for (CommState* c : comms_) c->init_pending = false;
  changed_.notify_all();
}
void FakeBackend::hold_collectives_from(std::size_t n) {
  std::lock_guard lock(mutex_);
  hold_from_ = n;
  changed_.notify_all();
}
void FakeBackend::release_collectives() {
  std::lock_guard lock(mutex_);
  hold_from_ = std::numeric_limits<std::size_t>::max();
  progress_locked();
  changed_.notify_all();
}
void FakeBackend::inject_async_error(std::string message) {
  std::lock_guard lock(mutex_);
  async_error_ = std::move(message);
  changed_.notify_all();
}
void FakeBackend::fail_set_device(std::string message) {
  std::lock_guard lock(mutex_);
  set_device_error_ = std::move(message);
}
void FakeBackend::set_version(std::string version) {
  std::lock_guard lock(mutex_);
  version_ = std::move(version);
}
void FakeBackend::push_incoming(std::vector<std::byte> payload) {
  std::lock_guard lock(mutex_);
  incoming_.push_back(std::move(payload));
  changed_.notify_all();
}

// --- observations

std::vector<Call> FakeBackend::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}
std::vector<Call> FakeBackend::calls(Call::Kind kind) const {
  std::lock_guard lock(mutex_);
  std::vector<Call> out;
  for (const Call& c : calls_) {
    if (c.kind == kind) out.push_back(c);
  }
  return out;
}
std::size_t FakeBackend::count(Call::Kind kind) const { return calls(kind).size(); }

bool FakeBackend::wait_for(const std::function<bool(const std::vector<Call>&)>& pred,
                           std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return pred(calls_); });
}
std::vector<std::string> FakeBackend::misuse() const {
  std::lock_guard lock(mutex_);
  return misuse_;
}
std::size_t FakeBackend::live_allocations() const {
  std::lock_guard lock(mutex_);
  return allocations_.size();
}
std::size_t FakeBackend::live_handles() const {
  std::lock_guard lock(mutex_);
  std::size_t live = streams_.size() + events_.size();
  for (CommState* c : comms_) live += (c->aborted || c->destroyed) ? 0 : 1;
  return live;
}

// --- internals

void FakeBackend::record_locked(Call::Kind kind) {
  Call call;
  call.kind = kind;
  calls_.push_back(std::move(call));
  changed_.notify_all();
}

void FakeBackend::note_misuse_locked(std::string what) {
  misuse_.push_back(std::move(what));
  changed_.notify_all();
}

bool FakeBackend::owns_locked(const void* ptr, std::size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

FakeBackend::CommState* FakeBackend::comm_locked(CommHandle comm, const char* call) {
  auto* c = static_cast<CommState*>(comm);
  if (!comms_.contains(c)) {
    note_misuse_locked(std::string(call) + " on an unknown communicator");
    return nullptr;
  }
  if (c->aborted || c->destroyed) {
    note_misuse_locked(std::string(call) + " on a communicator already " + (c->aborted ? "aborted" : "destroyed"));
    return nullptr;
  }
  return c;
}

bool FakeBackend::comm_call_locked(CommHandle comm, const char* call, Call::Kind kind, bool CommState::*mark) {
  CommState* c = comm_locked(comm, call);
  if (!c) return false;
  if (mark) c->*mark = true;
  record_locked(kind);
  return true;
}

void FakeBackend::progress_locked() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (Stream* s : streams_) {
      while (!s->queue.empty()) {
        Op& op = s->queue.front();
        if (op.collective && !op.comm->aborted) {  // an aborted comm's collectives were killed
          if (op.index != collectives_ran_ || op.index >= hold_from_) break;
          Call& call = calls_[op.call];
          if (!op.broadcast || op.comm->rank == call.root) {  // root, or all-reduce: this rank's data
            call.bytes.assign(op.send, op.send + op.bytes);
            if (op.recv != op.send && op.bytes > 0) std::memmove(op.recv, op.send, op.bytes);
          } else if (incoming_.empty() || incoming_.front().size() != op.bytes) {
            note_misuse_locked("broadcast " + std::to_string(op.index) + " of " + std::to_string(op.bytes) +
                               " bytes on rank " + std::to_string(op.comm->rank) + ": " +
                               (incoming_.empty()
                                    ? std::string("no incoming payload queued")
                                    : "the queued payload has " + std::to_string(incoming_.front().size()) + " bytes"));
            if (!incoming_.empty()) incoming_.pop_front();
          } else {
            call.bytes = std::move(incoming_.front());
            incoming_.pop_front();
            if (op.bytes > 0) std::memcpy(op.recv, call.bytes.data(), op.bytes);
          }
          call.ran = true;
          ++collectives_ran_;
        } else if (op.collective) {
          ++collectives_ran_;
        } else if (op.bytes > 0) {
          std::memmove(op.dst, op.use_staged ? op.staged.data() : op.src, op.bytes);
        }
        s->queue.pop_front();
        ++s->ran;
        changed = true;
      }
    }
  }
  changed_.notify_all();
}

// --- Backend

Result<std::string> FakeBackend::version() {
  std::lock_guard lock(mutex_);
  return version_;
}

Result<UniqueId> FakeBackend::unique_id() {
  UniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<std::byte>(i * 7 + 3);
  return id;
}

Status FakeBackend::set_device(int device) {
  std::lock_guard lock(mutex_);
  Call call;
  call.kind = Call::Kind::kSetDevice;
  call.device = device;
  calls_.push_back(call);
  changed_.notify_all();
  if (set_device_error_) return make_error(ErrorCode::kUnavailable, *set_device_error_);
  return ok();
}

Result<CommHandle> FakeBackend::comm_init(int world_size, int rank, const UniqueId&) {
  std::lock_guard lock(mutex_);
  auto* c = new CommState{world_size, rank, hold_init_, false, false};
  comms_.insert(c);
  Call call;
  call.kind = Call::Kind::kInit;
  call.world_size = world_size;
  call.rank = rank;
  calls_.push_back(call);
  changed_.notify_all();
  return static_cast<CommHandle>(c);
}

Result<bool> FakeBackend::comm_poll(CommHandle comm) {
  std::lock_guard lock(mutex_);
  CommState* c = comm_locked(comm, "ncclCommGetAsyncError");
  if (!c) return make_error(ErrorCode::kInternal, "fake nccl: poll of a dead communicator");
  progress_locked();
  if (async_error_) return make_error(ErrorCode::kUnavailable, "ncclRemoteError: " + *async_error_);
  return !c->init_pending;
}

Status FakeBackend::broadcast(CommHandle comm, const void* send, void* recv, std::size_t count, int dtype, int root,
                              StreamHandle stream) {
  std::lock_guard lock(mutex_);
  Call call;
  call.kind = Call::Kind::kBroadcast;
  call.root = root;
  return enqueue_collective_locked("ncclBroadcast", std::move(call), comm, send, recv, count, dtype, stream);
}

Status FakeBackend::all_reduce_sum(CommHandle comm, const void* send, void* recv, std::size_t count, int dtype,
                                   StreamHandle stream) {
  std::lock_guard lock(mutex_);
  Call call;
  call.kind = Call::Kind::kAllReduce;
  return enqueue_collective_locked("ncclAllReduce", std::move(call), comm, send, recv, count, dtype, stream);
}

Status FakeBackend::enqueue_collective_locked(const char* name, Call call, CommHandle comm, const void* send,
                                              void* recv, std::size_t count, int dtype, StreamHandle stream) {
  CommState* c = comm_locked(comm, name);
  auto* s = static_cast<Stream*>(stream);
  if (!c) return make_error(ErrorCode::kInternal, std::string("fake nccl: ") + name + " on a dead communicator");
  if (!streams_.contains(s)) {
    note_misuse_locked(std::string(name) + " on an unknown stream");
    return make_error(ErrorCode::kInternal, "fake nccl: unknown stream");
  }
  if (c->init_pending) note_misuse_locked(std::string(name) + " before init finished");
  if (dtype_bytes(dtype) == 0) note_misuse_locked(std::string(name) + " with datatype " + std::to_string(dtype));
  call.count = count;
  call.dtype = dtype;
  call.in_place = send == recv;
  Op op;
  op.collective = true;
  op.broadcast = call.kind == Call::Kind::kBroadcast;
  op.index = collectives_issued_++;
  op.call = calls_.size();
  op.comm = c;
  op.send = static_cast<const std::byte*>(send);
  op.recv = static_cast<std::byte*>(recv);
  op.bytes = count * dtype_bytes(dtype);
  calls_.push_back(std::move(call));
  s->queue.push_back(std::move(op));
  ++s->enqueued;
  progress_locked();
  return ok();
}

Status FakeBackend::comm_finalize(CommHandle comm) {
  std::lock_guard lock(mutex_);
  if (!comm_call_locked(comm, "ncclCommFinalize", Call::Kind::kFinalize, nullptr))
    return make_error(ErrorCode::kInternal, "fake nccl: dead communicator");
  return ok();
}

Status FakeBackend::comm_destroy(CommHandle comm) {
  std::lock_guard lock(mutex_);
  if (!comm_call_locked(comm, "ncclCommDestroy", Call::Kind::kDestroy, &CommState::destroyed))
    return make_error(ErrorCode::kInternal, "fake nccl: dead communicator");
  return ok();
}

void FakeBackend::comm_abort(CommHandle comm) {
  std::lock_guard lock(mutex_);
  if (comm_call_locked(comm, "ncclCommAbort", Call::Kind::kAbort, &CommState::aborted))
    progress_locked();  // drops its collectives, so events behind them are reached
}

Result<StreamHandle> FakeBackend::stream_create() {
  std::lock_guard lock(mutex_);
  auto* s = new Stream;
  streams_.insert(s);
  return static_cast<StreamHandle>(s);
}

void FakeBackend::stream_destroy(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  auto* s = static_cast<Stream*>(stream);
  if (!streams_.erase(s)) {
    note_misuse_locked("cudaStreamDestroy of an unknown stream");
    return;
  }
  for (auto it = events_.begin(); it != events_.end(); ++it) {
    if (it->second.first == s) it->second.first = nullptr;  // recorded on a stream that is gone
  }
  delete s;
}

Result<EventHandle> FakeBackend::event_create() {
  std::lock_guard lock(mutex_);
  auto event = reinterpret_cast<EventHandle>(static_cast<std::uintptr_t>(next_event_++));
  events_[event] = {nullptr, 0};
  return event;
}

void FakeBackend::event_destroy(EventHandle event) {
  std::lock_guard lock(mutex_);
  if (!events_.erase(event)) note_misuse_locked("cudaEventDestroy of an unknown event");
}

Status FakeBackend::event_record(EventHandle event, StreamHandle stream) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  auto* s = static_cast<Stream*>(stream);
  if (it == events_.end() || !streams_.contains(s)) {
    note_misuse_locked("cudaEventRecord with an unknown event or stream");
    return make_error(ErrorCode::kInternal, "fake cuda: unknown event or stream");
  }
  it->second = {s, s->enqueued};
  return ok();
}

Result<bool> FakeBackend::event_done(EventHandle event) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    note_misuse_locked("cudaEventQuery of an unknown event");
    return make_error(ErrorCode::kInternal, "fake cuda: unknown event");
  }
  progress_locked();
  Stream* s = it->second.first;
  return s == nullptr || s->ran >= it->second.second;
}

Result<void*> FakeBackend::device_alloc(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto* p = new std::byte[bytes == 0 ? 1 : bytes]();
  allocations_[p] = bytes;
  return static_cast<void*>(p);
}

void FakeBackend::device_free(void* ptr) {
  std::lock_guard lock(mutex_);
  auto it = allocations_.find(static_cast<std::byte*>(ptr));
  if (it == allocations_.end()) {
    note_misuse_locked("free of a pointer the double did not allocate");
    return;
  }
  delete[] it->first;
  allocations_.erase(it);
}

Result<void*> FakeBackend::pinned_alloc(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto* p = new std::byte[bytes == 0 ? 1 : bytes]();
  allocations_[p] = bytes;
  pinned_.insert(p);
  return static_cast<void*>(p);
}

void FakeBackend::pinned_free(void* ptr) {
  {
    std::lock_guard lock(mutex_);
    pinned_.erase(static_cast<std::byte*>(ptr));
  }
  device_free(ptr);
}

Status FakeBackend::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, StreamHandle stream) {
  std::lock_guard lock(mutex_);
  auto* s = static_cast<Stream*>(stream);
  if (!streams_.contains(s)) {
    note_misuse_locked("cudaMemcpyAsync on an unknown stream");
    return make_error(ErrorCode::kInternal, "fake cuda: unknown stream");
  }
  auto in_pinned = [&](const void* p) {
    auto it = allocations_.upper_bound(static_cast<const std::byte*>(p));
    if (it == allocations_.begin()) return false;
    --it;
    return pinned_.contains(it->first) && owns_locked(p, bytes);
  };
  // Inside one of our buffers, a copy must stay inside it.
  for (const void* p : {static_cast<const void*>(dst), src}) {
    auto it = allocations_.upper_bound(static_cast<const std::byte*>(p));
    if (it != allocations_.begin()) {
      --it;
      const auto* b = static_cast<const std::byte*>(p);
      if (b >= it->first && b < it->first + std::max<std::size_t>(it->second, 1) && !owns_locked(p, bytes)) {
        note_misuse_locked("cudaMemcpyAsync of " + std::to_string(bytes) + " bytes runs past a buffer of " +
                           std::to_string(it->second));
        return make_error(ErrorCode::kInternal, "fake cuda: copy out of bounds");
      }
    }
  }
  Op op;
  op.dst = static_cast<std::byte*>(dst);
  op.src = static_cast<const std::byte*>(src);
  op.bytes = bytes;
  if (kind == CopyKind::kHostToDevice && !in_pinned(src)) {  // pageable: CUDA stages it before returning
    op.staged.assign(op.src, op.src + bytes);
    op.use_staged = true;
  }
  if (kind == CopyKind::kDeviceToHost && !in_pinned(dst)) {
    note_misuse_locked("cudaMemcpyAsync device-to-host into pageable memory (blocks the host; stage through pinned)");
  }
  s->queue.push_back(std::move(op));
  ++s->enqueued;
  progress_locked();
  return ok();
}

void FakeBackend::pause(std::chrono::microseconds max) {
  std::unique_lock lock(mutex_);
  progress_locked();
  changed_.wait_for(lock, max);
}

// --- ScopedBackend

ScopedBackend::ScopedBackend() : fake_(std::make_shared<FakeBackend>()) {
  std::shared_ptr<FakeBackend> fake = fake_;
  previous_ = set_backend_factory(
      [fake](const std::string&) -> Result<std::shared_ptr<Backend>> { return std::shared_ptr<Backend>(fake); });
}

ScopedBackend::~ScopedBackend() { set_backend_factory(std::move(previous_)); }

}  // namespace arlo::weight_sync::nccl::testing
