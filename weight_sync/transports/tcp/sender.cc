// The tcp transport's publisher: gathers the receivers of a version on its Server, offers them the
// manifest (delta when every receiver holds the base, else full) and streams the encoded buckets,
// zero-copy from the source or double-buffered through the encoder.
#include <algorithm>
#include <atomic>
#include <thread>

#include "weight_sync/codec.h"
#include "weight_sync/transports/tcp/common.h"
#include "weight_sync/transports/tcp/sides.h"

namespace arlo::weight_sync::detail {
namespace {

// How long a transfer waits for the other expected receivers once the first one came.
std::chrono::milliseconds gather_window(const Options& o) { return std::min(o.bucket_timeout, o.gather_window); }

class TcpSender final : public SenderTransport {
 public:
  TcpSender(std::unique_ptr<Server> s, std::size_t expected) : server_(std::move(s)), expected_(expected) {}
  nlohmann::json endpoint() const override { return {{"address", server_->endpoint()}}; }

  Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                Deadline deadline) override {
    const auto t0 = Clock::now();
    const Options& o = state.options;
    const std::size_t got = server_->gather(expected_, version, deadline, o.bucket_timeout, gather_window(o));
    if (got == 0)
      return make_error(ErrorCode::kUnavailable, "tcp " + server_->endpoint() + ": no receiver connected for version " +
                                                     std::to_string(version) + " before the deadline");
    // Receivers came: the transfer has the whole version timeout, however briefly we waited for them.
    deadline = std::max(deadline, Clock::now() + o.timeout);
    PayloadOptions payload = o.payload;
    bool delta = payload.kind == PayloadKind::kDelta && state.base && state.last_version &&
                 state.base->specs() == source.specs();
    for (auto& p : server_->peers())
      if (!p->hello.version || *p->hello.version != state.last_version) delta = false;
    if (payload.kind == PayloadKind::kDelta && !delta) payload.kind = PayloadKind::kFull;

    Manifest m;
    for (int attempt = 0;; ++attempt) {
      ARLO_ASSIGN_OR_RETURN(m, Manifest::plan(source.specs(), o.bucket_bytes, payload));
      m.version = version;
      if (payload.kind == PayloadKind::kDelta) m.base_version = state.last_version;
      server_->offer(m, deadline);
      bool need_full = false;
      for (auto& p : server_->peers()) need_full |= p->error.empty() && p->answer.state == "need_full";
      if (!need_full) break;
      if (payload.kind != PayloadKind::kDelta || attempt > 0) {
        for (auto& p : server_->peers())
          if (p->answer.state == "need_full") p->error = "needs a full resync but none was possible";
        break;
      }
      payload.kind = PayloadKind::kFull;
    }
    ARLO_ASSIGN_OR_RETURN(auto enc, BucketEncoder::create(m, source, state.base.get()));
    const std::size_t n = m.buckets.size();
    PublishReport report;
    report.version = version;
    report.payload = m.payload.kind;
    report.raw_bytes = m.total_bytes;
    report.buckets = n;
    std::atomic<std::uint64_t> wire{0};
    if (enc.zero_copy()) {
      Feed feed(n, n);
      for (std::size_t i = 0; i < n; ++i) {
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));  // hashed while sent
        wire += b.wire_bytes;
        feed.put(i, std::move(b.parts));
      }
      server_->stream(
          m, feed,
          [](std::size_t i, auto&) -> Result<Parts> {
            return make_error(ErrorCode::kInternal, "bucket " + std::to_string(i) + " missing");
          },
          o, deadline);
    } else {
      // Double buffering: the encoder thread fills bucket i+1 while links send bucket i.
      const std::uint64_t cap = std::max<std::uint64_t>(enc.max_capacity(), 1);
      std::unique_ptr<std::byte[]> bufs[2] = {std::unique_ptr<std::byte[]>(new std::byte[cap]),
                                              std::unique_ptr<std::byte[]>(new std::byte[cap])};
      Feed feed(n, 2);
      std::thread encoder([&] {
        for (std::size_t i = 0; i < n; ++i) {
          if (auto s = feed.wait_room(i, deadline); !s) return feed.fail(s.error());
          auto b = enc.encode(i, {bufs[i % 2].get(), cap}, /*with_checksum=*/false);
          if (!b) return feed.fail(b.error());
          wire += b->wire_bytes;
          feed.put(i, std::move(b->parts));
        }
      });
      server_->stream(
          m, feed,
          [&](std::size_t i, std::unique_ptr<std::byte[]>& scratch) -> Result<Parts> {
            if (!scratch) scratch.reset(new std::byte[cap]);
            ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {scratch.get(), cap}, /*with_checksum=*/false));
            return b.parts;
          },
          o, deadline);
      feed.fail(Error(ErrorCode::kCancelled, "links finished"));
      encoder.join();
    }
    report.wire_bytes = wire;
    collect_reports(*server_, m, report.peers);
    server_->reset();
    report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return report;
  }

 private:
  std::unique_ptr<Server> server_;
  std::size_t expected_;
};

}  // namespace

std::unique_ptr<SenderTransport> make_tcp_sender(std::unique_ptr<Server> server, std::size_t expected) {
  return std::make_unique<TcpSender>(std::move(server), expected);
}

}  // namespace arlo::weight_sync::detail
