#include "weight_sync/transports/nccl/group.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include "weight_sync/transports/nccl/backend.h"

namespace arlo::weight_sync::nccl {
namespace {

std::mutex& factory_mutex() {
  static std::mutex m;
  return m;
}
BackendFactory& factory() {
  static BackendFactory f;
  return f;
}

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count());
}

}  // namespace

bool backend_built() {
#ifdef ARLO_NCCL_BACKEND
  return true;
#else
  return false;
#endif
}

BackendFactory set_backend_factory(BackendFactory f) {
  std::lock_guard lock(factory_mutex());
  return std::exchange(factory(), std::move(f));
}

Result<std::shared_ptr<Backend>> open_backend(const std::string& library_path) {
  BackendFactory f;
  {
    std::lock_guard lock(factory_mutex());
    f = factory();
  }
  if (f) return f(library_path);
#ifdef ARLO_NCCL_BACKEND
  return open_nccl_backend(library_path);
#else
  return make_error(ErrorCode::kUnavailable,
                    "nccl: arlo was built without NCCL (CMake found no CUDA toolkit with nccl.h and libnccl); "
                    "rebuild on a machine with CUDA and NCCL, or use another weight transport");
#endif
}

Result<std::string> library_version(const std::string& library_path) {
  ARLO_ASSIGN_OR_RETURN(auto backend, open_backend(library_path));
  return backend->version();
}

Result<UniqueId> new_unique_id(const std::string& library_path) {
  ARLO_ASSIGN_OR_RETURN(auto backend, open_backend(library_path));
  return with_context(backend->unique_id(), "nccl: minting the unique id (rank 0)");
}

// ---------------------------------------------------------------------------------------------

// A staging slot: one stream with its event, and the buffers one bucket needs. Bucket i uses slot
// i % slots; before a slot is reused its previous bucket must have completed (event reached).
struct SlotState {
  StreamHandle stream = nullptr;
  EventHandle event = nullptr;
  std::byte* device = nullptr;  // device buffer (capacity bytes) or null
  std::byte* pinned = nullptr;  // pinned host buffer (capacity bytes) or null
  std::uint64_t capacity = 0;
  // The bucket in flight on this slot.
  bool pending = false;
  std::size_t bucket = 0;
  Deadline deadline{};
  Clock::time_point issued{};
  std::function<void()> on_done;  // receiver: copies out of the pinned buffer into a host sink
};

class Group::Impl {
 public:
  Impl(GroupConfig c, std::shared_ptr<Backend> b) : config(std::move(c)), backend(std::move(b)) {}

  GroupConfig config;
  std::shared_ptr<Backend> backend;
  CommHandle comm = nullptr;
  bool ready = false;
  StreamHandle stream = nullptr;  // warm-up
  EventHandle event = nullptr;
  std::vector<SlotState> slots;

  std::mutex mutex;
  bool busy = false;                     // a call runs on the owning thread (guarded by mutex)
  bool comm_gone = false;                // aborted or destroyed (guarded by mutex)
  std::optional<std::string> abort_why;  // first reason (guarded by mutex)
  std::atomic<bool> abort_requested{false};
  std::atomic<bool> aborted{false};

  std::string who() const {
    return "nccl rank " + std::to_string(config.rank) + " of " + std::to_string(config.world_size) +
           " (cuda:" + std::to_string(config.device) + ")";
  }

  // ncclCommAbort once. Called with `mutex` held.
  void abort_locked(const std::string& why) {
    if (!abort_why) abort_why = why;
    abort_requested = true;
    aborted = true;
    if (!comm_gone && comm) {
      backend->comm_abort(comm);
      comm_gone = true;
    }
  }

  // The error of a call its caller cancelled (kCancelled, the communicator aborted). The caller
  // cancels when the group is killed, which first requests an abort with the reason (a member's
  // failure): that reason is the error, whichever of the two this call saw first.
  std::unexpected<Error> cancelled_error(const std::string& what) {
    std::optional<std::string> why;
    {
      std::lock_guard lock(mutex);
      if (abort_requested) why = abort_why;
    }
    if (why) return fail(ErrorCode::kCancelled, what + ": aborted: " + *why);
    return fail(ErrorCode::kCancelled, what + ": cancelled by the caller (a receiver failed); communicator aborted");
  }

  // Aborts the group and returns the error that says why.
  std::unexpected<Error> fail(ErrorCode code, const std::string& message) {
    std::lock_guard lock(mutex);
    abort_locked(message);
    return std::unexpected(Error(code, who() + ": " + message));
  }

  Status check_alive() {
    std::lock_guard lock(mutex);
    if (aborted) {
      return make_error(ErrorCode::kUnavailable, who() + ": the group was aborted earlier (" +
                                                     abort_why.value_or("unknown reason") +
                                                     "); make a new group on a new rendezvous port");
    }
    return ok();
  }

  // The poll loop behind every wait: `done` true ends it; an abort request, NCCL's async error,
  // cancellation or the deadline abort the group.
  Status wait_until(const std::function<Result<bool>()>& done, Deadline deadline, Clock::time_point since,
                    const std::string& what, const std::function<bool()>& cancelled) {
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      if (abort_requested) {
        std::string why;
        {
          std::lock_guard lock(mutex);
          why = abort_why.value_or("abort requested");
        }
        return fail(ErrorCode::kCancelled, what + ": aborted: " + why);
      }
      Result<bool> d = done();
      if (!d) return fail(ErrorCode::kUnavailable, what + ": " + d.error().what());
      if (*d) return ok();
      if (Result<bool> state = backend->comm_poll(comm); !state) {
        return fail(ErrorCode::kUnavailable, what + ": NCCL reported " + state.error().what());
      }
      if (cancelled && cancelled()) return cancelled_error(what);
      Clock::time_point now = Clock::now();
      if (now >= deadline) {
        return fail(ErrorCode::kTimeout, what + " did not finish by its deadline (" +
                                             std::to_string(ms_between(since, deadline)) +
                                             " ms); communicator aborted (make a new group on a new rendezvous port)");
      }
      backend->pause(std::min<std::chrono::microseconds>(
          pause, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) + std::chrono::microseconds(1)));
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(200));
    }
  }

  // After a call on a non-blocking comm: wait until it is no longer "in progress" before the next.
  Status settle(const std::string& what, Deadline deadline, const std::function<bool()>& cancelled) {
    return wait_until([&]() -> Result<bool> { return backend->comm_poll(comm); }, deadline, Clock::now(), what,
                      cancelled);
  }

  Status ensure_ready(Deadline deadline) {
    if (ready) return ok();
    Clock::time_point since = Clock::now();
    // comm_poll is both the "done" test and the error check here.
    ARLO_TRY(wait_until([&]() -> Result<bool> { return backend->comm_poll(comm); }, deadline, since,
                        "communicator init (world size " + std::to_string(config.world_size) + ")", {}));
    ready = true;
    return ok();
  }

  Status ensure_stream() {
    if (!stream) {
      ARLO_ASSIGN_OR_RETURN(stream, backend->stream_create());
    }
    if (!event) {
      ARLO_ASSIGN_OR_RETURN(event, backend->event_create());
    }
    return ok();
  }

  // `count` slots of at least `device_bytes` device and `pinned_bytes` pinned memory each.
  Status ensure_slots(std::size_t count, std::uint64_t device_bytes, std::uint64_t pinned_bytes) {
    if (slots.size() < count) slots.resize(count);
    for (std::size_t k = 0; k < count; ++k) {
      SlotState& s = slots[k];
      if (!s.stream) {
        ARLO_ASSIGN_OR_RETURN(s.stream, backend->stream_create());
      }
      if (!s.event) {
        ARLO_ASSIGN_OR_RETURN(s.event, backend->event_create());
      }
      const bool need_device = device_bytes > 0 || s.device, need_pinned = pinned_bytes > 0 || s.pinned;
      const std::uint64_t want = std::max(device_bytes, pinned_bytes);
      if (want <= s.capacity && need_device == (s.device != nullptr) && need_pinned == (s.pinned != nullptr)) continue;
      const std::uint64_t capacity = std::max(want, s.capacity);
      if (s.device) backend->device_free(s.device);
      if (s.pinned) backend->pinned_free(s.pinned);
      s.device = s.pinned = nullptr;
      s.capacity = 0;
      if (need_device) {
        auto d = backend->device_alloc(capacity);
        if (!d) return std::unexpected(std::move(d.error()).with_context(who() + ": staging buffer"));
        s.device = static_cast<std::byte*>(*d);
      }
      if (need_pinned) {
        auto p = backend->pinned_alloc(capacity);
        if (!p) return std::unexpected(std::move(p.error()).with_context(who() + ": pinned staging buffer"));
        s.pinned = static_cast<std::byte*>(*p);
      }
      s.capacity = capacity;
    }
    return ok();
  }

  // Waits for the bucket on slot `s` (if any) and runs its completion.
  Status reap(SlotState& s, const std::function<bool()>& cancelled, Clock::time_point& last_done) {
    if (!s.pending) return ok();
    ARLO_TRY(wait_until([&]() -> Result<bool> { return backend->event_done(s.event); }, s.deadline, s.issued,
                        "broadcast of bucket " + std::to_string(s.bucket), cancelled));
    s.pending = false;
    if (s.on_done) {
      s.on_done();
      s.on_done = nullptr;
    }
    last_done = Clock::now();
    return ok();
  }

  // The bucket on slot `s` is issued: its completion is the event recorded after it.
  Status issued(SlotState& s, std::size_t b, std::uint64_t bytes, TransferReport& report) {
    auto st = backend->event_record(s.event, s.stream);
    if (!st)
      return fail(ErrorCode::kUnavailable, "broadcast of bucket " + std::to_string(b) + ": " + st.error().what());
    s.pending = true;
    ++report.collectives;
    report.bytes += bytes;
    return ok();
  }

  // Waits for the buckets still in flight, in issue order.
  Result<TransferReport> drain(std::size_t buckets, std::size_t nslots, const std::function<bool()>& cancelled,
                               Clock::time_point first, Clock::time_point& last_done, TransferReport report) {
    for (std::size_t b = buckets < nslots ? 0 : buckets - nslots; b < buckets; ++b)
      ARLO_TRY(reap(slots[b % nslots], cancelled, last_done));
    report.seconds = std::chrono::duration<double>(last_done - first).count();
    return report;
  }

  // receive(): every destination up front, as the other subscribers do: a sink that refuses a
  // tensor refuses the version before any data moves. Each buffer must be exactly the tensor's size.
  Result<std::vector<std::span<std::byte>>> destinations(WeightSink& sink, const std::vector<TensorSpec>& specs,
                                                         const Layout& layout) {
    std::vector<std::span<std::byte>> dst;
    dst.reserve(specs.size());
    for (const TensorSpec& spec : specs) {
      auto buf = sink.buffer_for(spec);
      if (!buf) return std::unexpected(std::move(buf.error()).with_context(who() + ": receive: tensor " + spec.name));
      if (buf->size() != spec.nbytes()) {
        return make_error(ErrorCode::kMismatch, who() + ": receive: the sink's buffer for " + spec.name + " has " +
                                                    std::to_string(buf->size()) + " bytes, the tensor " +
                                                    std::to_string(spec.nbytes()));
      }
      if (!layout.packed) ARLO_TRY(with_context(nccl_data_type(spec.dtype), who() + ": tensor " + spec.name));
      dst.push_back(*buf);
    }
    return dst;
  }

  // receive(): copies bucket `b`, just broadcast into slot `s`'s staging buffer, out to its
  // destinations `dst[bucket.first ..]`, on the slot's stream (ordered after the broadcast). A host
  // sink gets it through the pinned buffer: the device-to-host copy is queued here and the last
  // step (pinned -> sink) runs as the slot's on_done once its event completed.
  Status copy_out(SlotState& s, std::size_t b, const Bucket& bucket, const std::vector<std::span<std::byte>>& dst,
                  bool host) {
    Status st = ok();
    if (host) {
      st = backend->copy_async(s.pinned, s.device, bucket.bytes, CopyKind::kDeviceToHost, s.stream);
      std::byte* pinned = s.pinned;
      std::vector<std::span<std::byte>> out(dst.begin() + static_cast<std::ptrdiff_t>(bucket.first),
                                            dst.begin() + static_cast<std::ptrdiff_t>(bucket.first + bucket.count));
      s.on_done = [pinned, out = std::move(out)] {
        std::uint64_t offset = 0;
        for (const auto& span : out) {
          if (!span.empty()) std::memcpy(span.data(), pinned + offset, span.size());
          offset += span.size();
        }
      };
    } else {
      std::uint64_t offset = 0;
      for (std::size_t i = bucket.first; st && i < bucket.first + bucket.count; ++i) {
        if (!dst[i].empty()) {
          st =
              backend->copy_async(dst[i].data(), s.device + offset, dst[i].size(), CopyKind::kDeviceToDevice, s.stream);
        }
        offset += dst[i].size();
      }
    }
    if (!st) return fail(ErrorCode::kUnavailable, "copying bucket " + std::to_string(b) + " out: " + st.error().what());
    return ok();
  }

  // Marks a call in flight on the owning thread; an abort() that arrived meanwhile (and found the
  // group busy) is carried out when the call ends.
  class Busy {
   public:
    explicit Busy(Impl& impl) : impl_(impl) {
      std::lock_guard lock(impl_.mutex);
      impl_.busy = true;
    }
    ~Busy() {
      std::lock_guard lock(impl_.mutex);
      impl_.busy = false;
      if (impl_.abort_requested && !impl_.comm_gone) impl_.abort_locked(impl_.abort_why.value_or("abort requested"));
    }

   private:
    Impl& impl_;
  };

  void release() {
    for (SlotState& s : slots) {
      if (s.event) backend->event_destroy(s.event);
      if (s.stream) backend->stream_destroy(s.stream);
      if (s.device) backend->device_free(s.device);
      if (s.pinned) backend->pinned_free(s.pinned);
    }
    slots.clear();
    if (event) backend->event_destroy(event);
    if (stream) backend->stream_destroy(stream);
    event = stream = nullptr;
  }
};

// ---------------------------------------------------------------------------------------------

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

const GroupConfig& Group::config() const { return impl_->config; }

Result<std::unique_ptr<Group>> Group::start(const GroupConfig& config, const UniqueId& id) {
  if (config.world_size < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "nccl group: world_size must be >= 1, got " + std::to_string(config.world_size));
  }
  if (config.rank < 0 || config.rank >= config.world_size) {
    return make_error(ErrorCode::kInvalidArgument, "nccl group: rank " + std::to_string(config.rank) + " outside [0, " +
                                                       std::to_string(config.world_size) + ")");
  }
  if (config.device < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "nccl group: device must be a CUDA ordinal >= 0, got " + std::to_string(config.device));
  }
  if (config.collective_timeout.count() <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "nccl group: collective_timeout must be > 0 ms");
  }
  ARLO_ASSIGN_OR_RETURN(auto backend, open_backend(config.library_path));
  auto impl = std::make_unique<Impl>(config, backend);
  const std::string who = impl->who();
  if (Status s = backend->set_device(config.device); !s) {
    return std::unexpected(std::move(s.error()).with_context(who));
  }
  auto comm = backend->comm_init(config.world_size, config.rank, id);
  if (!comm) return std::unexpected(std::move(comm.error()).with_context(who + ": init"));
  impl->comm = *comm;
  return std::unique_ptr<Group>(new Group(std::move(impl)));
}

Group::~Group() {
  Impl& g = *impl_;
  bool abort = false;
  {
    std::lock_guard lock(g.mutex);
    abort = !g.comm_gone && g.comm && !g.ready;  // an init still running cannot be finalized
    if (abort) g.abort_locked("group destroyed during init");
  }
  if (!g.comm_gone && g.comm) {
    // Finalize flushes what was issued; bounded, because a peer that went away can stall it.
    Deadline deadline = deadline_in(std::chrono::seconds(5));
    Status s = g.backend->comm_finalize(g.comm);
    if (s)
      s = g.wait_until([&]() -> Result<bool> { return g.backend->comm_poll(g.comm); }, deadline, Clock::now(),
                       "finalize", {});
    std::lock_guard lock(g.mutex);
    if (!g.comm_gone) {  // wait_until aborted it on failure
      if (s && g.backend->comm_destroy(g.comm)) {
        g.comm_gone = true;
      } else {
        g.abort_locked("finalize failed");
      }
    }
  }
  (void)g.backend->set_device(g.config.device);
  g.release();
}

Status Group::wait_ready(Deadline deadline) {
  Impl::Busy busy(*impl_);
  ARLO_TRY(impl_->check_alive());
  ARLO_TRY(impl_->backend->set_device(impl_->config.device));
  return impl_->ensure_ready(deadline);
}

Status Group::warmup(Deadline deadline) {
  Impl& g = *impl_;
  Impl::Busy busy(g);
  ARLO_TRY(g.check_alive());
  ARLO_TRY(g.backend->set_device(g.config.device));
  ARLO_TRY(g.ensure_ready(deadline));
  ARLO_TRY(g.ensure_stream());
  ARLO_TRY(g.ensure_slots(std::max<std::size_t>(g.slots.size(), 1), sizeof(float), 0));
  SlotState& s = g.slots[0];
  const float zero = 0.0f;  // vLLM's workers all-reduce torch.zeros(1)
  ARLO_TRY(g.backend->copy_async(s.device, &zero, sizeof zero, CopyKind::kHostToDevice, s.stream));
  Clock::time_point issued = Clock::now();
  Deadline d = std::min(deadline, issued + g.config.collective_timeout);
  if (Status st = g.backend->all_reduce_sum(g.comm, s.device, s.device, 1, kNcclFloat32, s.stream); !st) {
    return g.fail(ErrorCode::kUnavailable, "warm-up all-reduce: " + st.error().what());
  }
  ARLO_TRY(g.settle("warm-up all-reduce", d, {}));
  if (Status st = g.backend->event_record(s.event, s.stream); !st) {
    return g.fail(ErrorCode::kUnavailable, "warm-up all-reduce: " + st.error().what());
  }
  return g.wait_until([&]() -> Result<bool> { return g.backend->event_done(s.event); }, d, issued, "warm-up all-reduce",
                      {});
}

Result<TransferReport> Group::send(const WeightSource& source, const Layout& layout, Deadline deadline,
                                   const std::function<bool()>& cancelled) {
  Impl& g = *impl_;
  Impl::Busy busy(g);
  ARLO_TRY(g.check_alive());
  ARLO_TRY(validate(layout));
  if (g.config.rank != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      g.who() + ": send() is for rank 0 (the root of every broadcast); use receive()");
  }
  const std::vector<TensorSpec>& specs = source.specs();
  // Every view and dtype up front: once the first broadcast is out, an error must abort the group.
  std::vector<TensorView> views;
  views.reserve(specs.size());
  std::uint64_t largest_host = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto v = source.view(i);
    if (!v) return std::unexpected(std::move(v.error()).with_context(g.who() + ": send: tensor " + specs[i].name));
    if (v->bytes.size() != specs[i].nbytes()) {
      return make_error(ErrorCode::kMismatch, g.who() + ": send: tensor " + specs[i].name + " has " +
                                                  std::to_string(v->bytes.size()) + " bytes, its spec says " +
                                                  std::to_string(specs[i].nbytes()));
    }
    if (!v->device.is_cpu() && v->device.index != g.config.device) {
      return make_error(ErrorCode::kInvalidArgument, g.who() + ": send: tensor " + specs[i].name + " lives on " +
                                                         v->device.str() +
                                                         ", the group on cuda:" + std::to_string(g.config.device));
    }
    if (!layout.packed) ARLO_TRY(with_context(nccl_data_type(specs[i].dtype), g.who() + ": tensor " + specs[i].name));
    if (v->device.is_cpu()) largest_host = std::max(largest_host, specs[i].nbytes());
    views.push_back(*v);
  }
  const std::vector<Bucket> buckets = plan_buckets(specs, layout);
  ARLO_TRY(g.backend->set_device(g.config.device));
  ARLO_TRY(g.ensure_ready(deadline));
  const std::size_t nslots = static_cast<std::size_t>(layout.packed_num_buffers);
  if (layout.packed) {
    ARLO_TRY(g.ensure_slots(nslots, largest_bucket(buckets), largest_host > 0 ? largest_bucket(buckets) : 0));
  } else {
    ARLO_TRY(g.ensure_slots(nslots, largest_host, largest_host));
  }

  TransferReport report;
  Clock::time_point first = Clock::now(), last_done = first;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    SlotState& s = g.slots[b % nslots];
    ARLO_TRY(g.reap(s, cancelled, last_done));  // the slot's previous bucket is out: its buffers are free
    if (cancelled && cancelled()) return g.cancelled_error("send before bucket " + std::to_string(b));
    Status st = ok();
    const void* send_ptr = nullptr;
    std::size_t count = 0;
    int dtype = kNcclUint8;
    if (layout.packed) {
      std::uint64_t offset = 0;
      for (std::size_t i = bucket.first; st && i < bucket.first + bucket.count; ++i) {
        const TensorView& v = views[i];
        const std::size_t n = v.bytes.size();
        if (n == 0) continue;
        if (v.device.is_cpu()) {
          std::memcpy(s.pinned + offset, v.bytes.data(), n);
          st = g.backend->copy_async(s.device + offset, s.pinned + offset, n, CopyKind::kHostToDevice, s.stream);
        } else {
          st = g.backend->copy_async(s.device + offset, v.bytes.data(), n, CopyKind::kDeviceToDevice, s.stream);
        }
        offset += n;
      }
      send_ptr = s.device;
      count = bucket.bytes;
    } else {
      const TensorView& v = views[bucket.first];
      dtype = *nccl_data_type(specs[bucket.first].dtype);
      count = specs[bucket.first].numel();
      if (v.device.is_cpu()) {
        if (!v.bytes.empty()) {
          std::memcpy(s.pinned, v.bytes.data(), v.bytes.size());
          st = g.backend->copy_async(s.device, s.pinned, v.bytes.size(), CopyKind::kHostToDevice, s.stream);
        }
        send_ptr = s.device;
      } else {
        send_ptr = v.bytes.data();
      }
    }
    if (!st) return g.fail(ErrorCode::kUnavailable, "staging bucket " + std::to_string(b) + ": " + st.error().what());
    s.issued = Clock::now();
    s.deadline = std::min(deadline, s.issued + g.config.collective_timeout);
    s.bucket = b;
    // In place on the root (send == recv): NCCL does not write the root's buffer.
    st = g.backend->broadcast(g.comm, send_ptr, const_cast<void*>(send_ptr), count, dtype, 0, s.stream);
    if (!st)
      return g.fail(ErrorCode::kUnavailable, "broadcast of bucket " + std::to_string(b) + ": " + st.error().what());
    ARLO_TRY(g.settle("broadcast of bucket " + std::to_string(b), s.deadline, cancelled));
    ARLO_TRY(g.issued(s, b, bucket.bytes, report));
  }
  return g.drain(buckets.size(), nslots, cancelled, first, last_done, report);
}

Result<TransferReport> Group::receive(WeightSink& sink, const std::vector<TensorSpec>& specs, const Layout& layout,
                                      Deadline deadline, const std::function<bool()>& cancelled) {
  Impl& g = *impl_;
  Impl::Busy busy(g);
  ARLO_TRY(g.check_alive());
  ARLO_TRY(validate(layout));
  if (g.config.rank == 0) {
    return make_error(ErrorCode::kInvalidArgument, g.who() + ": receive() is for ranks > 0; rank 0 sends");
  }
  const Device where = sink.device();
  if (!where.is_cpu() && where.index != g.config.device) {
    return make_error(ErrorCode::kInvalidArgument, g.who() + ": receive: the sink's buffers live on " + where.str() +
                                                       ", the group on cuda:" + std::to_string(g.config.device));
  }
  const bool host = where.is_cpu();
  ARLO_ASSIGN_OR_RETURN(const std::vector<std::span<std::byte>> dst, g.destinations(sink, specs, layout));
  const std::vector<Bucket> buckets = plan_buckets(specs, layout);
  ARLO_TRY(g.backend->set_device(g.config.device));
  ARLO_TRY(g.ensure_ready(deadline));
  const std::size_t nslots = static_cast<std::size_t>(layout.packed_num_buffers);
  std::uint64_t largest_tensor = 0;
  for (const TensorSpec& spec : specs) largest_tensor = std::max(largest_tensor, spec.nbytes());
  if (layout.packed) {
    ARLO_TRY(g.ensure_slots(nslots, largest_bucket(buckets), host ? largest_bucket(buckets) : 0));
  } else if (host) {
    ARLO_TRY(g.ensure_slots(nslots, largest_tensor, largest_tensor));
  } else {
    ARLO_TRY(g.ensure_slots(nslots, 0, 0));
  }

  TransferReport report;
  Clock::time_point first = Clock::now(), last_done = first;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    SlotState& s = g.slots[b % nslots];
    ARLO_TRY(g.reap(s, cancelled, last_done));
    if (cancelled && cancelled()) {
      return g.fail(ErrorCode::kCancelled,
                    "receive cancelled by the caller before bucket " + std::to_string(b) + "; communicator aborted");
    }
    void* recv_ptr = nullptr;
    std::size_t count = 0;
    int dtype = kNcclUint8;
    if (layout.packed) {
      recv_ptr = s.device;
      count = bucket.bytes;
    } else {
      dtype = *nccl_data_type(specs[bucket.first].dtype);
      count = specs[bucket.first].numel();
      recv_ptr = host ? static_cast<void*>(s.device) : static_cast<void*>(dst[bucket.first].data());
    }
    s.issued = Clock::now();
    s.deadline = std::min(deadline, s.issued + g.config.collective_timeout);
    s.bucket = b;
    Status st = g.backend->broadcast(g.comm, recv_ptr, recv_ptr, count, dtype, 0, s.stream);
    if (!st)
      return g.fail(ErrorCode::kUnavailable, "broadcast of bucket " + std::to_string(b) + ": " + st.error().what());
    ARLO_TRY(g.settle("broadcast of bucket " + std::to_string(b), s.deadline, cancelled));
    if ((layout.packed || host) && bucket.bytes > 0) ARLO_TRY(g.copy_out(s, b, bucket, dst, host));
    ARLO_TRY(g.issued(s, b, bucket.bytes, report));
  }
  return g.drain(buckets.size(), nslots, cancelled, first, last_done, report);
}

void Group::abort(std::string why) {
  Impl& g = *impl_;
  std::lock_guard lock(g.mutex);
  if (!g.abort_why) g.abort_why = std::move(why);
  g.abort_requested = true;
  g.aborted = true;
  if (!g.busy) g.abort_locked(*g.abort_why);  // idle: at once; else the call in flight does it
}

bool Group::aborted() const { return impl_->aborted; }

}  // namespace arlo::weight_sync::nccl
