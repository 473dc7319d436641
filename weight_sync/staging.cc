// StagingPublisher (staging.h): stage() copies a version into a staging slot and returns; one
// background thread announces and publishes the newest staged version through the library's
// SenderTransport directly, so it can serve one version many times (late joiners) and keep the
// delta base itself.
//
// Slots: a fixed set of keep_last + 1 HostWeights snapshots (keep_last staged versions and the one
// stage() copies into) reused across versions. The first stage() maps and touches the whole set
// (the spare slots on threads of their own while it copies the version), so every later copy goes
// into pages already mapped: a plain memcpy into warm memory, never a first-touch page fault (a
// copy into untouched memory costs ~15x a warm one). A slot is in use while stage() copies into it
// (`copying`) or while a thread announces, writes or serves it (`users`); the newest staged version
// is `newest_`. A free slot that is not the newest is reused first; then the newest one if nobody
// took it yet (that version is superseded before anyone pulled it: dropped); otherwise a temporary
// extra slot (freed again once it is free), so stage() never waits for the publisher's threads.
//
// Two threads:
//  - the announcer takes the newest version when it is newer than the last one it took, computes
//    its checksum and, for a durable transport, writes it (one publish call) and announces it; for a
//    streaming one it announces it at once and hands it to the server;
//  - the server (streaming only) serves the newest announced version: publish(version) with a short
//    deadline, over and over; "no receiver" is the normal answer; each receiver that comes gets the
//    version (full, or a delta when it holds the base kept here); it moves to a newer version as
//    soon as the current attempt returns. A new version is announced while an attempt still waits.
// A held version (stage_held) is announced first (its receivers hold it already) and becomes the
// delta base; a durable transport still writes it, so a receiver that starts later finds it. The
// SenderState (delta base) belongs to the thread that calls the transport: the server for a
// streaming transport, the announcer for a durable one.
#include "weight_sync/staging.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "weight_sync/transport.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;

// How long one serve attempt waits for a receiver to come before the thread looks for a newer
// version (and for stop). Bounds how long a new version waits for the server (and so for its
// announcement) and the destructor's wait when no transfer runs.
constexpr auto kServePoll = 50ms;

struct Slot {
  std::unique_ptr<HostWeights> weights;
  Version version = 0;
  bool held = false;  // stage_held: its receivers hold it already
  bool copying = false;
  int users = 0;  // the publisher thread works on it
};

class StagingPublisherImpl final : public StagingPublisher {
 public:
  StagingPublisherImpl(const TransportDescriptor& d, std::unique_ptr<SenderTransport> t, SenderState state,
                       Announce announce)
      : name_(d.name),
        durable_(d.capabilities.durable),
        transport_(std::move(t)),
        endpoint_(transport_->endpoint()),
        state_(std::move(state)),
        announce_(std::move(announce)) {
    announcer_ = std::thread([this] { announce_loop(); });
    if (!durable_) server_ = std::thread([this] { serve_loop(); });
  }

  ~StagingPublisherImpl() override {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    announcer_.join();
    if (server_.joinable()) server_.join();
  }

  Result<StageReport> stage(Version version, const WeightSource& source) override {
    return stage_version(version, source, /*held=*/false);
  }
  Result<StageReport> stage_held(Version version, const WeightSource& source) override {
    return stage_version(version, source, /*held=*/true);
  }

  Status flush(Deadline deadline) override {
    std::unique_lock l(mu_);
    if (!reserved_) return ok();
    const Version want = *reserved_;
    auto settled = [&] { return (announced_ && *announced_ >= want) || (failed_ && failed_->first >= want); };
    cv_.wait_until(l, deadline, settled);
    if (announced_ && *announced_ >= want) return ok();
    if (failed_ && failed_->first >= want)
      return std::unexpected(
          Error(failed_->second)
              .with_context(fmt::format("weight_sync {}: version {} was not published", name_, failed_->first)));
    return make_error(
        ErrorCode::kTimeout,
        fmt::format("weight_sync {}: version {} was not published before the deadline (last announced: {})", name_,
                    want, announced_ ? std::to_string(*announced_) : "none"));
  }

  Status failure() const override {
    std::lock_guard l(mu_);
    if (!failed_) return ok();
    return std::unexpected(
        Error(failed_->second)
            .with_context(fmt::format("weight_sync {}: version {} was not published", name_, failed_->first)));
  }

  nlohmann::json endpoint() const override { return endpoint_; }

  std::optional<PublishReport> last_report() const override {
    std::lock_guard l(mu_);
    return last_report_;
  }

 private:
  Result<StageReport> stage_version(Version version, const WeightSource& source, bool held) {
    const auto t0 = Clock::now();
    // Every view first: a source that cannot be read changes nothing.
    const auto& specs = source.specs();
    std::vector<std::span<const std::byte>> views;
    views.reserve(specs.size());
    std::uint64_t bytes = 0;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      ARLO_ASSIGN_OR_RETURN(auto v, source.view(t));
      if (!v.device.is_cpu())
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("stage({}): tensor '{}' is on {}; staging copies host memory", version,
                                      specs[t].name, v.device.str()));
      if (v.bytes.size() != specs[t].nbytes())
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("stage({}): tensor '{}' has {} bytes, its spec says {}", version, specs[t].name,
                                      v.bytes.size(), specs[t].nbytes()));
      views.push_back(v.bytes);
      bytes += v.bytes.size();
    }
    Slot* slot = nullptr;
    std::vector<Slot*> spares;  // the first version: the rest of the set, touched while it copies
    {
      std::lock_guard l(mu_);
      if (reserved_ && version <= *reserved_)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("stage({}): versions must increase; last staged was {}", version, *reserved_));
      reserved_ = version;
      slot = claim_slot();
      spares = reserve_set();
    }
    std::vector<std::thread> touching;
    for (Slot* spare : spares) touching.emplace_back([spare, &specs] { touch(*spare, specs); });
    if (!slot->weights || slot->weights->specs() != specs) slot->weights = std::make_unique<HostWeights>(specs);
    for (std::size_t t = 0; t < views.size(); ++t)
      if (!views[t].empty()) std::memcpy(slot->weights->bytes(t).data(), views[t].data(), views[t].size());
    for (auto& t : touching) t.join();
    {
      std::lock_guard l(mu_);
      for (Slot* spare : spares) spare->copying = false;
      slot->copying = false;
      slot->version = version;
      slot->held = held;
      if (!newest_ || newest_->version < version) newest_ = slot;  // a concurrent stage of a newer one may have won
      trim();
    }
    cv_.notify_all();
    return StageReport{version, bytes, std::chrono::duration<double>(Clock::now() - t0).count()};
  }

  static bool is_free(const Slot& s) { return !s.copying && s.users == 0; }
  // The fixed set: keep_last staged versions and the one stage() copies into.
  std::size_t capacity() const { return state_.options.keep_last + 1; }

  // Under mu_: the first time, the slots that complete the set, marked copying (stage() touches
  // them); then none.
  std::vector<Slot*> reserve_set() {
    std::vector<Slot*> spares;
    if (set_reserved_) return spares;
    set_reserved_ = true;
    while (slots_.size() < capacity()) {
      slots_.push_back(std::make_unique<Slot>());
      spares.push_back(slots_.back().get());
      spares.back()->copying = true;
    }
    return spares;
  }

  // Maps `s`'s pages for `specs` and writes each once, so a later copy into it is a warm memcpy.
  static void touch(Slot& s, const std::vector<TensorSpec>& specs) {
    s.weights = std::make_unique<HostWeights>(specs);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      auto b = s.weights->bytes(t);
      if (!b.empty()) std::memset(b.data(), 0, b.size());
    }
  }

  // Under mu_: a slot stage() may overwrite, marked copying.
  Slot* claim_slot() {
    Slot* pick = nullptr;
    for (auto& s : slots_)
      if (is_free(*s) && s.get() != newest_) {
        pick = s.get();
        break;
      }
    if (!pick && slots_.empty()) {
      slots_.push_back(std::make_unique<Slot>());  // the first version's
      pick = slots_.back().get();
    }
    if (!pick && newest_ && is_free(*newest_)) {
      pick = newest_;  // superseded before the publisher thread took it: dropped, never sent
      ARLO_DEBUG("weight_sync {}: version {} superseded before it was published", name_, newest_->version);
      newest_ = nullptr;
    }
    if (!pick) {
      slots_.push_back(std::make_unique<Slot>());
      pick = slots_.back().get();
    }
    pick->copying = true;
    return pick;
  }

  // Under mu_: frees temporary slots beyond the fixed set.
  void trim() {
    for (auto it = slots_.begin(); it != slots_.end() && slots_.size() > capacity();) {
      if (is_free(**it) && it->get() != newest_)
        it = slots_.erase(it);
      else
        ++it;
    }
  }

  // The announcer thread.
  void announce_loop() {
    std::optional<Version> taken;
    std::unique_lock l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || (newest_ && (!taken || newest_->version > *taken)); });
      if (stop_) break;
      Slot* s = newest_;
      ++s->users;
      taken = s->version;
      l.unlock();
      const bool announced = publish_new(*s);
      l.lock();
      if (durable_ || !announced) --s->users;  // streaming: serving_ keeps the reference taken above
    }
    if (serving_) --serving_->users;
    serving_ = nullptr;
  }

  // Makes `s` the version the server serves (passing on the announcer's reference) and waits until
  // its attempts with older versions are over (or stop).
  void hand_to_server(Slot& s) {
    std::unique_lock l(mu_);
    if (serving_) --serving_->users;
    serving_ = &s;
    cv_.notify_all();
    cv_.wait(l, [&] { return stop_ || serving_ != &s || server_on_ == &s; });
  }

  // The server thread (streaming transports).
  void serve_loop() {
    Slot* based = nullptr;  // the held version last made the delta base
    std::unique_lock l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || serving_; });
      if (stop_) break;
      Slot* s = serving_;
      ++s->users;
      server_on_ = s;
      cv_.notify_all();
      if (s->held && based != s) {
        based = s;
        l.unlock();
        keep_base(*s);  // its receivers hold it already
        l.lock();
      }
      if (serve_pause_) {
        serve_pause_ = false;
        cv_.wait_for(l, kServePoll, [&] { return stop_ || serving_ != s; });
      } else {
        l.unlock();
        serve(*s);
        l.lock();
      }
      --s->users;
    }
  }

  Announcement announcement_of(const Slot& s, std::optional<std::uint64_t> checksum) const {
    Announcement a;
    a.version = s.version;
    a.transport = name_;
    a.endpoint = endpoint_;
    a.payload = state_.options.payload.kind;
    a.tensors = s.weights->specs().size();
    for (const auto& spec : s.weights->specs()) a.bytes += spec.nbytes();
    a.checksum = checksum;
    return a;
  }

  // A newly taken version: checksum, then (durable) written and announced, or (streaming)
  // announced. Runs on the announcer without mu_. False when it was not announced.
  bool publish_new(Slot& s) {
    auto sum = weights_checksum(*s.weights);
    if (!sum) {
      fail(s.version, sum.error());
      return false;
    }
    const Announcement a = announcement_of(s, *sum);
    if (s.held) announce(a);  // its receivers hold it already
    if (!durable_) {
      // Announced once the server serves it, so a receiver told of it never meets an older one.
      hand_to_server(s);
      if (!s.held) announce(a);
      return true;
    }
    // Written against the previous base (a held version too: then keep_base).
    auto r = transport_->publish(s.version, *s.weights, state_, Clock::now() + state_.options.timeout);
    if (!r) {
      ARLO_WARN("weight_sync {}: version {} not written: {}", name_, s.version, r.error().what());
      if (s.held) keep_base(s);
      fail(s.version, r.error());
      return s.held;
    }
    keep_base(s);
    {
      std::lock_guard l(mu_);
      last_report_ = *r;
    }
    if (!s.held) announce(a);
    return true;
  }

  // One attempt to serve `s` to the receivers that come (streaming). Runs without mu_.
  void serve(Slot& s) {
    auto r = transport_->publish(s.version, *s.weights, state_, Clock::now() + kServePoll);
    if (!r) {
      if (r.error().code() != ErrorCode::kUnavailable) {
        // Not the normal "nobody came": say so, and do not spin on it.
        ARLO_WARN_EVERY(10.0, "weight_sync {}: serving version {}: {}", name_, s.version, r.error().what());
        std::lock_guard l(mu_);
        serve_pause_ = true;
      }
      return;
    }
    bool delivered = false;
    for (const auto& p : r->peers) {
      if (p.ok)
        delivered = true;
      else
        ARLO_WARN("weight_sync {}: version {} not delivered to {}: {}", name_, s.version, p.peer, p.error);
    }
    if (delivered && state_.last_version != s.version) keep_base(s);
    std::lock_guard l(mu_);
    last_report_ = *r;
  }

  // What the receivers now hold: the base of the next delta.
  void keep_base(const Slot& s) {
    state_.last_version = s.version;
    if (state_.options.payload.kind != PayloadKind::kDelta) return;
    const auto& specs = s.weights->specs();
    if (!state_.base || state_.base->specs() != specs) state_.base = std::make_unique<HostWeights>(specs);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const auto src = s.weights->bytes(t);
      if (!src.empty()) std::memcpy(state_.base->bytes(t).data(), src.data(), src.size());
    }
  }

  void announce(const Announcement& a) {
    if (announce_) {
      if (auto st = announce_(a); !st) {
        ARLO_WARN("weight_sync {}: version {} not announced: {}", name_, a.version, st.error().what());
        fail(a.version, std::move(st).error().with_context(fmt::format("announcing version {}", a.version)));
        return;
      }
    }
    {
      std::lock_guard l(mu_);
      announced_ = a.version;
    }
    cv_.notify_all();
  }

  void fail(Version v, const Error& e) {
    {
      std::lock_guard l(mu_);
      failed_ = {v, e};
    }
    cv_.notify_all();
  }

  const std::string name_;
  const bool durable_;
  std::unique_ptr<SenderTransport> transport_;
  const nlohmann::json endpoint_;
  SenderState state_;  // the publisher thread's
  Announce announce_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  bool set_reserved_ = false;        // the first stage() made the fixed set of slots
  Slot* newest_ = nullptr;           // the newest staged version (complete)
  std::optional<Version> reserved_;  // the newest version stage() accepted (maybe still copying)
  std::optional<Version> announced_;
  std::optional<std::pair<Version, Error>> failed_;
  std::optional<PublishReport> last_report_;
  Slot* serving_ = nullptr;          // streaming: the newest version handed to the server (holds a users ref)
  const Slot* server_on_ = nullptr;  // the version of the server's current attempt
  bool serve_pause_ = false;         // the last serve attempt failed oddly: wait a poll before the next
  std::thread announcer_, server_;   // last: start after everything above exists
};

}  // namespace

Result<std::unique_ptr<StagingPublisher>> StagingPublisher::create(const Options& options, Announce announce) {
  ARLO_ASSIGN_OR_RETURN(auto side, make_sender(options));
  return std::unique_ptr<StagingPublisher>(new StagingPublisherImpl(*side.descriptor, std::move(side.transport),
                                                                    std::move(side.state), std::move(announce)));
}

}  // namespace arlo::weight_sync
