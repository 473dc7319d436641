#include "weight_sync/transports/tcp/server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "common/auth.h"
#include "common/log.h"
#include "weight_sync/transports/tcp/common.h"
#include "weight_sync/transports/tcp/side_by_side.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync::detail {
namespace {

// Sends bucket i: header, data, trailer checksum. The checksum comes from the feed when known;
// otherwise the first link to send the bucket computes it chunk by chunk while sending (each chunk
// hashed while hot in cache) and posts it for the other links, even when its own link fails
// midway; another link hashes the bucket itself rather than wait long for a stalled first one. A
// `tap` is shown a copy of each chunk once it was hashed, and that copy goes on the wire.
Status send_bucket(Conn& c, Version v, std::size_t i, const Parts& parts, Deadline deadline, BucketTap* tap,
                   Feed& feed) {
  FrameHeader h;
  h.type = static_cast<std::uint32_t>(Frame::kBucket);
  h.a = i;
  for (const auto& p : parts) h.b += p.size();
  const std::optional<std::uint64_t> known = feed.sum(i);
  const bool hashing = !known && feed.claim_sum(i);
  const bool cut_through = feed.cut_through();
  std::uint64_t sent = 0;
  const auto started = Clock::now();
  Status s = c.write({asio::buffer(&h, sizeof h)}, deadline);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  std::vector<std::byte> tmp;
  for (const auto& p : parts) {
    if (!s && !hashing) break;
    const std::size_t chunk = cut_through ? kCutChunk : kChunk;
    for (std::size_t off = 0; off < p.size(); off += chunk) {
      const std::size_t n = std::min(chunk, p.size() - off);
      const std::byte* data = p.data() + off;
      if (hashing) XXH3_64bits_update(&st, data, n);
      if (!s) {
        if (!hashing) break;
        continue;  // finish the checksum for the other links
      }
      if (cut_through) s = feed.wait_avail(i, sent + n, deadline);
      if (!s) break;
      if (tap) {
        tmp.assign(data, data + n);
        tap->sealed(v, i, tmp, nullptr);
        data = tmp.data();
      }
      s = c.write({asio::buffer(data, n)}, deadline);
      sent += n;
    }
  }
  if (hashing) feed.set_sum(i, XXH3_64bits_digest(&st));
  ARLO_TRY(s);
  std::uint64_t sum = 0;
  if (known) {
    sum = *known;
  } else if (hashing || cut_through) {
    ARLO_ASSIGN_OR_RETURN(sum, feed.wait_sum(i, deadline));  // ours, or the one upstream verified
  } else {
    // The link hashing this bucket is another receiver's, and that one may be stalled (its host
    // unreachable: a write that never completes). Waiting for it would stall this link too, so
    // wait at most as long as this link took to send the bucket, then hash it here.
    const auto grace = std::max<Clock::duration>(Clock::now() - started, std::chrono::milliseconds(20));
    auto theirs = feed.wait_sum(i, std::min(deadline, Clock::now() + grace));
    if (theirs) {
      sum = *theirs;
    } else {
      XXH3_64bits_reset(&st);
      for (const auto& p : parts) XXH3_64bits_update(&st, p.data(), p.size());
      sum = XXH3_64bits_digest(&st);
    }
  }
  return c.write({asio::buffer(&sum, sizeof sum)}, deadline);
}

}  // namespace

Result<std::unique_ptr<Server>> Server::listen(const std::string& address, const std::string& advertise_host,
                                               std::chrono::milliseconds reconnect_window,
                                               std::shared_ptr<BucketTap> tap) {
  auto s = std::unique_ptr<Server>(new Server());
  s->reconnect_window_ = reconnect_window;
  s->tap_ = std::move(tap);
  ARLO_ASSIGN_OR_RETURN(s->token_, auth::process_token());
  ARLO_TRY(auth::require_token_off_loopback("the tcp weight publisher", auth::host_of(address), s->token_));
  ARLO_ASSIGN_OR_RETURN(auto ep, detail::resolve(address));
  boost::system::error_code ec;
  s->acc_.open(ep.protocol(), ec);
  if (!ec) s->acc_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s->acc_.bind(ep, ec);
  if (!ec) s->acc_.listen(64, ec);
  if (ec) return make_error(ErrorCode::kIo, "listen on " + address + ": " + ec.message());
  const auto local = s->acc_.local_endpoint(ec);
  const std::string host = advertise_host.empty() ? local.address().to_string() : advertise_host;
  s->endpoint_ = (host.find(':') != std::string::npos && !host.starts_with('[') ? "[" + host + "]" : host) + ":" +
                 std::to_string(local.port());
  return s;
}

std::size_t Server::gather(std::size_t expected, std::optional<Version> version, Deadline deadline,
                           std::chrono::milliseconds hello_timeout, std::chrono::milliseconds window) {
  auto wants = [&](const Peer& p) { return !version || !p.hello.version || *p.hello.version < *version; };
  std::erase_if(pending_, [](const std::unique_ptr<Peer>& p) { return closed(*p->conn); });  // gave up waiting
  for (auto it = pending_.begin(); it != pending_.end() && peers_.size() < expected;) {
    if (wants(**it)) {
      peers_.push_back(std::move(*it));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  Deadline first = peers_.empty() ? Deadline{} : Clock::now();
  using Greeting = std::pair<std::unique_ptr<Conn>, Result<Hello>>;
  auto admit = [&](SideBySide<Greeting>::Call c) {
    auto& [conn, hello] = c.value;
    if (!hello) {
      ARLO_WARN("tcp publisher {}: {}", endpoint_,
                c.cut ? "dropped a receiver that connected but did not finish its handshake in time (a dark link?)"
                      : "refusing a receiver: " + hello.error().what());
      return;
    }
    auto p = std::make_unique<Peer>();
    p->hello = std::move(*hello);
    conn->peer = p->hello.peer.empty() ? "tcp peer" : p->hello.peer;
    p->conn = std::move(conn);
    if (!wants(*p) || peers_.size() >= expected) return keep_pending(std::move(p));
    if (peers_.empty()) first = Clock::now();
    peers_.push_back(std::move(p));
  };
  SideBySide<Greeting> greetings;
  while (true) {
    // Asked before the ended ones are taken: a handshake that ends in between is taken on the next
    // turn, never left waiting while accept() blocks until `until`.
    const bool handshaking = greetings.running();
    for (auto& c : greetings.finished()) admit(std::move(c));
    if (peers_.size() >= expected) break;
    const auto now = Clock::now();
    const Deadline until = peers_.empty() ? deadline : first + window;
    if (now >= until) break;
    // While handshakes run, look in on them every few milliseconds.
    auto c = accept(handshaking ? std::min(until, now + std::chrono::milliseconds(10)) : until);
    if (!c) continue;
    Conn& link = **c;
    greetings.start(link, [this, conn = std::move(*c), hello_timeout]() mutable {
      auto hello = handshake(*conn, Clock::now() + hello_timeout);
      return Greeting{std::move(conn), std::move(hello)};
    });
  }
  // A handshake under way when the window closed gets a moment more (a live receiver's takes
  // milliseconds, a loaded host's longer); one still waiting then is cut off.
  const Deadline grace = Clock::now() + std::min<std::chrono::milliseconds>(hello_timeout, kStragglerGrace);
  while (greetings.running() && Clock::now() < grace) greetings.wait(grace);
  for (auto& c : greetings.cut_off()) admit(std::move(c));
  return peers_.size();
}

void Server::offer(const Manifest& m, Deadline deadline) {
  const auto body = m.to_json();
  auto ask = [&](Peer& p) {
    auto s = p.conn->send_json(Frame::kManifest, body, deadline);
    nlohmann::json a;
    Result<FrameHeader> h = s ? p.conn->recv_frame(&a, deadline) : Result<FrameHeader>(std::unexpected(s.error()));
    auto answer = h && static_cast<Frame>(h->type) == Frame::kAnswer
                      ? detail::parse_answer(a, m.buckets.size())
                      : Result<Answer>(make_error(ErrorCode::kParse, "unexpected frame"));
    if (!answer) {
      p.error = "handshake for version " + std::to_string(m.version) +
                " failed: " + (h ? answer.error().what() : h.error().what());
      return;
    }
    p.answer = std::move(*answer);
  };
  const auto t0 = Clock::now();
  SideBySide<Peer*> asked;
  for (auto& p : peers_)
    if (p->error.empty() && p->answer.state != "refused")
      asked.start(*p->conn, [&ask, p = p.get()] {
        ask(*p);
        return p;
      });
  while (asked.running()) {
    const auto first = asked.first_end();
    const Deadline until = first ? std::min(deadline, *first + (*first - t0) + kStragglerGrace) : deadline;
    if (Clock::now() >= until) break;
    asked.wait(until);
  }
  for (auto& c : asked.cut_off())
    if (c.cut)
      c.value->error = "handshake for version " + std::to_string(m.version) +
                       " failed: no answer to the manifest while the other receivers answered (a dark link?)";
}

void Server::stream(const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < peers_.size(); ++k) {
    Peer& p = *peers_[k];
    if (!p.error.empty() || p.answer.state != "accepted") continue;
    feed.add_consumer(static_cast<int>(k), p.answer.start);
    threads.emplace_back([&, k] { serve(static_cast<int>(k), m, feed, regen, o, deadline); });
  }
  std::thread acceptor([&] { accept_resumes(m, o, stop); });
  for (auto& t : threads) t.join();
  stop = true;
  acceptor.join();
}

void Server::reset() {
  for (auto& p : peers_) p->conn->close();
  peers_.clear();
}

Result<Hello> Server::handshake(Conn& c, Deadline deadline) {
  ARLO_ASSIGN_OR_RETURN(auto challenge, auth::nonce());
  ARLO_TRY(c.send_json(Frame::kChallenge, {{"nonce", challenge}, {"token_required", !token_.empty()}}, deadline));
  nlohmann::json body;
  ARLO_ASSIGN_OR_RETURN(auto h, c.recv_frame(&body, deadline, detail::kMaxHandshakeBytes));
  if (static_cast<Frame>(h.type) != Frame::kHello || !body.is_object()) {
    c.close();
    return make_error(ErrorCode::kParse, "tcp " + endpoint_ + ": a connection did not start with HELLO");
  }
  auto parsed = detail::parse_hello(body);
  if (!parsed) {
    c.close();
    return std::unexpected(parsed.error());
  }
  Hello hello = std::move(*parsed);
  if (!token_.empty() && !auth::verify_proof(token_, kAuthContext, challenge, hello.proof)) {
    const std::string why = hello.proof.empty()
                                ? "authentication failed: this publisher requires the run's token and the receiver "
                                  "sent none (set $ARLO_TOKEN or $ARLO_TOKEN_FILE)"
                                : "authentication failed: the receiver's token is not this run's";
    ARLO_WARN_EVERY(5.0, "tcp {}: refusing receiver '{}': {}", endpoint_, hello.peer, why);
    (void)c.send_json(Frame::kRefused, {{"error", why}}, deadline);
    c.close();
    return make_error(ErrorCode::kInvalidArgument, why);
  }
  return hello;
}

Result<std::unique_ptr<Conn>> Server::accept(Deadline deadline) {
  auto c = std::make_unique<Conn>();
  const auto result = detail::run_with_deadline(
      acc_ctx_, [&](auto handler) { acc_.async_accept(c->sock, std::move(handler)); },
      [&] {
        boost::system::error_code ignored;
        acc_.cancel(ignored);
      },
      deadline);
  if (!result) return make_error(ErrorCode::kTimeout, "no connection");
  if (*result) return make_error(ErrorCode::kIo, "accept: " + result->message());
  c->tune();
  return c;
}

void Server::serve(int k, const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline) {
  Peer& p = *peers_[k];
  std::unique_ptr<std::byte[]> scratch;
  std::size_t i = p.answer.start;
  auto fail = [&](const std::string& why) {
    p.error = why;
    feed.remove_consumer(k);
  };
  while (true) {
    Status s = ok();
    if (i < m.buckets.size()) {
      auto parts = feed.get(i, std::min(deadline, Clock::now() + o.bucket_timeout));
      if (!parts && parts.error().code() == ErrorCode::kNotFound) parts = regen(i, scratch);
      if (!parts) return fail(vb(m.version, i) + ": " + parts.error().what());
      if (tap_) tap_->before(m.version, i);
      s = send_bucket(*p.conn, m.version, i, *parts, std::min(deadline, Clock::now() + o.bucket_timeout), tap_.get(),
                      feed);
      if (s) {
        for (const auto& part : *parts) p.wire_bytes += part.size();
        feed.advance(k, ++i);
        continue;
      }
    } else {
      nlohmann::json body;
      auto h = p.conn->recv_frame(&body, deadline);
      if (h && static_cast<Frame>(h->type) == Frame::kDone) {
        p.done = std::move(body);
        feed.remove_consumer(k);
        return;
      }
      s = h ? Status(make_error(ErrorCode::kParse, "unexpected frame instead of DONE"))
            : Status(std::unexpected(h.error()));
    }
    // The link failed: the receiver may reconnect and resume.
    const std::string why = s.error().what();
    if (s.error().code() == ErrorCode::kTimeout && i < m.buckets.size())
      return fail(vb(m.version, i) + ", peer " + p.conn->peer + ": " + why + " (deadline " +
                  std::to_string(o.bucket_timeout.count()) + " ms per bucket)");
    p.conn->close();
    std::unique_lock l(p.mu);
    p.waiting = true;
    const bool got = p.cv.wait_until(l, std::min(deadline, Clock::now() + reconnect_window_),
                                     [&] { return p.replacement != nullptr; });
    p.waiting = false;
    if (!got) {
      return fail(vb(m.version, std::min(i, m.buckets.size())) + ", peer " + p.hello.peer + ": " + why +
                  "; it did not reconnect within " + std::to_string(reconnect_window_.count()) + " ms");
    }
    p.conn = std::move(p.replacement);
    i = p.replacement_start;
    feed.advance(k, i);
  }
}

void Server::accept_resumes(const Manifest& m, const Options& o, std::atomic<bool>& stop) {
  while (!stop) {
    auto c = accept(Clock::now() + std::chrono::milliseconds(50));
    if (!c) continue;
    auto parsed = handshake(**c, Clock::now() + o.bucket_timeout);
    if (!parsed) continue;
    const Hello hello = std::move(*parsed);
    (*c)->peer = hello.peer;
    Peer* target = nullptr;
    if (hello.resume_version && *hello.resume_version == m.version)
      for (auto& p : peers_)
        if (p->hello.peer == hello.peer && p->answer.state == "accepted") target = p.get();
    if (!target) {
      // Someone for the next version: keep it.
      auto p = std::make_unique<Peer>();
      p->hello = hello;
      p->conn = std::move(*c);
      keep_pending(std::move(p));
      continue;
    }
    const Deadline dl = Clock::now() + o.bucket_timeout;
    nlohmann::json a;
    auto s = (*c)->send_json(Frame::kManifest, m.to_json(), dl);
    auto ah = s ? (*c)->recv_frame(&a, dl) : Result<FrameHeader>(std::unexpected(s.error()));
    auto answer = ah ? detail::parse_answer(a, m.buckets.size()) : Result<Answer>(std::unexpected(ah.error()));
    if (!answer || answer->state != "accepted") continue;
    std::lock_guard l(target->mu);
    target->replacement = std::move(*c);
    target->replacement_start = answer->start;
    target->cv.notify_all();
  }
}

bool Server::closed(Conn& c) {
  char b;
  const ssize_t n = ::recv(c.sock.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void Server::keep_pending(std::unique_ptr<Peer> p) {
  std::erase_if(pending_, [](const std::unique_ptr<Peer>& q) { return closed(*q->conn); });
  pending_.push_back(std::move(p));
}

void collect_reports(Server& server, const Manifest& m, std::vector<PeerReport>& out) {
  for (auto& p : server.peers()) {
    const std::string name = p->hello.peer.empty() ? "tcp peer" : p->hello.peer;
    if (p->answer.state == "refused") {
      out.push_back(
          {name, false, "refused the manifest of version " + std::to_string(m.version) + ": " + p->answer.error, 0});
      continue;
    }
    if (!p->error.empty() || p->done.is_null()) {
      out.push_back({name, false, p->error.empty() ? "no acknowledgement" : p->error, p->wire_bytes});
      continue;
    }
    for (const auto& r : p->done.value("peers", nlohmann::json::array()))
      out.push_back(
          {r.value("peer", name), r.value("ok", false), r.value("error", ""), r.value("wire_bytes", std::uint64_t{0})});
  }
}

}  // namespace arlo::weight_sync::detail
