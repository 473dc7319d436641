#include "session/adapters/verifiers_client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <zmq.hpp>

#include <msgpuck.h>

#include "common/log.h"
#include "common/utf8.h"

namespace arlo::session::adapters {

using json = nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;

namespace verifiers_wire {

std::string pack(const json& payload) {
  const auto bytes = json::to_msgpack(payload);
  return {bytes.begin(), bytes.end()};
}

namespace {

// One msgpack value (already checked whole by mp_check) as json. Map keys that are integers become
// their decimal text (verifiers keys `links` and `routing_repairs` by node index); bin becomes json
// binary. `path` names the value in an error.
Result<json> decode_value(const char*& p, const std::string& path, int depth) {
  if (depth > 64) return make_error(ErrorCode::kParse, fmt::format("{}: nested deeper than 64 levels", path));
  switch (mp_typeof(*p)) {
    case MP_NIL: mp_decode_nil(&p); return json(nullptr);
    case MP_BOOL: return json(mp_decode_bool(&p));
    case MP_UINT: return json(static_cast<std::uint64_t>(mp_decode_uint(&p)));
    case MP_INT: return json(static_cast<std::int64_t>(mp_decode_int(&p)));
    case MP_FLOAT: return json(static_cast<double>(mp_decode_float(&p)));
    case MP_DOUBLE: return json(mp_decode_double(&p));
    case MP_STR: {
      std::uint32_t n = 0;
      const char* s = mp_decode_str(&p, &n);
      if (!valid_utf8({s, n})) return make_error(ErrorCode::kParse, fmt::format("{}: text that is not UTF-8", path));
      return json(std::string(s, n));
    }
    case MP_BIN: {
      std::uint32_t n = 0;
      const auto* b = reinterpret_cast<const std::uint8_t*>(mp_decode_bin(&p, &n));
      return json::binary(std::vector<std::uint8_t>(b, b + n));
    }
    case MP_ARRAY: {
      json out = json::array();
      for (std::uint32_t i = 0, n = mp_decode_array(&p); i < n; ++i) {
        ARLO_ASSIGN_OR_RETURN(auto v, decode_value(p, path + "[" + std::to_string(i) + "]", depth + 1));
        out.push_back(std::move(v));
      }
      return out;
    }
    case MP_MAP: {
      json out = json::object();
      for (std::uint32_t i = 0, n = mp_decode_map(&p); i < n; ++i) {
        std::string key;
        const auto type = mp_typeof(*p);
        if (type == MP_STR) {
          std::uint32_t len = 0;
          const char* k = mp_decode_str(&p, &len);
          key.assign(k, len);
          if (!valid_utf8(key))
            return make_error(ErrorCode::kParse, fmt::format("{}: key {} of a map is not UTF-8", path, i));
        } else if (type == MP_UINT) {
          key = std::to_string(mp_decode_uint(&p));
        } else if (type == MP_INT) {
          key = std::to_string(mp_decode_int(&p));
        } else {
          return make_error(ErrorCode::kParse,
                            fmt::format("{}: key {} of a map is neither text nor an integer", path, i));
        }
        ARLO_ASSIGN_OR_RETURN(auto v, decode_value(p, path + "." + key, depth + 1));
        out[key] = std::move(v);
      }
      return out;
    }
    case MP_EXT: break;
  }
  return make_error(ErrorCode::kParse,
                    fmt::format("{}: a msgpack extension type, which verifiers does not send", path));
}

}  // namespace

Result<json> unpack(std::string_view bytes, std::string_view what) {
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  const char* check = p;
  if (bytes.empty() || mp_check(&check, end) != 0)
    return make_error(ErrorCode::kParse, fmt::format("verifiers server: {} is not msgpack arlo can read ({} bytes): "
                                                     "truncated or malformed",
                                                     what, bytes.size()));
  if (check != end)
    return make_error(ErrorCode::kParse,
                      fmt::format("verifiers server: {} is not msgpack arlo can read ({} bytes): {} bytes after the "
                                  "value",
                                  what, bytes.size(), end - check));
  auto value = decode_value(p, std::string(what), 0);
  if (!value)
    return make_error(ErrorCode::kParse,
                      fmt::format("verifiers server: {} is not msgpack arlo can read: {}", what, value.error().what()));
  return value;
}

Status check_reply(const json& reply, std::string_view what) {
  if (!reply.is_object()) return make_error(ErrorCode::kParse, fmt::format("verifiers server: {} is not a map", what));
  const auto it = reply.find("success");
  if (it == reply.end() || !it->is_boolean())
    return make_error(ErrorCode::kParse, fmt::format("verifiers server: {} has no boolean 'success'", what));
  if (it->get<bool>()) return {};
  const auto err = reply.find("error");
  const std::string text = err != reply.end() && err->is_string() ? err->get<std::string>() : "(no 'error' text)";
  return make_error(ErrorCode::kUnavailable, fmt::format("verifiers server: {} failed: {}", what, text));
}

namespace {

Result<std::size_t> list_size(const json& delta, const char* field) {
  const auto it = delta.find(field);
  if (it == delta.end()) return std::size_t{0};
  if (!it->is_array())
    return make_error(ErrorCode::kParse, fmt::format("verifiers server: a delta's '{}' is not a list", field));
  return it->size();
}

// An error record's text: {"type", "message", ...} (verifiers' Error), else the record itself.
std::string error_text(const json& e) {
  if (e.is_object() && e.contains("message") && e["message"].is_string())
    return fmt::format("{}: {}", e.value("type", std::string("error")), e["message"].get<std::string>());
  return e.dump();
}

}  // namespace

Status EpisodeAssembly::apply(const json& delta) {
  if (!delta.is_object() || !delta.contains("trace") || !delta["trace"].is_string())
    return make_error(ErrorCode::kParse, "verifiers server: a delta has no string 'trace'");
  const std::string id = delta["trace"];
  auto it = std::find_if(traces_.begin(), traces_.end(), [&](const Trace& t) { return t.id == id; });
  if (delta.value("discard", false)) {  // a retried attempt's trace
    if (it != traces_.end()) traces_.erase(it);
    return {};
  }
  if (it == traces_.end()) {
    traces_.emplace_back();
    traces_.back().id = id;
    it = std::prev(traces_.end());
  }
  Trace& t = *it;
  auto nodes = list_size(delta, "nodes");
  auto calls = list_size(delta, "calls");
  auto errors = list_size(delta, "errors");
  if (!nodes || !calls || !errors)
    return std::unexpected(!nodes ? nodes.error() : !calls ? calls.error() : errors.error());
  t.nodes += *nodes;
  t.calls += *calls;
  for (const auto& c : delta.value("calls", json::array()))
    if (c.is_object() && c.contains("error") && !c["error"].is_null()) ++t.failed_calls;
  for (const auto& e : delta.value("errors", json::array())) t.errors.push_back(error_text(e));
  if (const auto set = delta.find("set"); set != delta.end()) {
    if (!set->is_object()) return make_error(ErrorCode::kParse, "verifiers server: a delta's 'set' is not a map");
    if (set->contains("rewards")) {
      if (!(*set)["rewards"].is_object())
        return make_error(ErrorCode::kParse, fmt::format("verifiers server: trace {}: 'rewards' is not a map", id));
      t.rewards = (*set)["rewards"];
    }
    if (set->contains("ok")) t.ok = (*set)["ok"].is_boolean() && (*set)["ok"].get<bool>();
  }
  return {};
}

namespace {

bool count_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0;
}

Result<double> trace_reward(const std::string& id, const json& rewards) {
  double sum = 0;
  for (const auto& [name, r] : rewards.items()) {
    if (r.is_null()) continue;  // scoring did not run
    if (!r.is_object() || !r.contains("score") || !r["score"].is_number())
      return make_error(ErrorCode::kParse,
                        fmt::format("verifiers server: trace {}: rewards.{} has no number 'score'", id, name));
    const double weight = r.contains("weight") && r["weight"].is_number() ? r["weight"].get<double>() : 1.0;
    sum += r["score"].get<double>() * weight;
  }
  return sum;
}

}  // namespace

Result<VerifiersEpisode> EpisodeAssembly::finish(const json& reply) const {
  if (auto st = check_reply(reply, "run reply"); !st) return std::unexpected(st.error());
  if (!reply.contains("head") || !reply["head"].is_object())
    return make_error(ErrorCode::kParse, "verifiers server: the run reply has no map 'head'");
  if (!reply.contains("traces") || !reply["traces"].is_array())
    return make_error(ErrorCode::kParse, "verifiers server: the run reply has no list 'traces'");
  VerifiersEpisode ep;
  ep.head = reply["head"];
  ep.ok = ep.head.value("ok", false);
  for (const auto& e : ep.head.value("errors", json::array())) ep.errors.push_back(error_text(e));
  for (const auto& summary : reply["traces"]) {
    if (!summary.is_object() || !summary.contains("id") || !summary["id"].is_string() ||
        !count_field(summary, "nodes") || !count_field(summary, "calls"))
      return make_error(ErrorCode::kParse, "verifiers server: a run reply's traces[] lacks 'id', 'nodes' or 'calls'");
    const std::string id = summary["id"];
    auto it = std::find_if(traces_.begin(), traces_.end(), [&](const Trace& t) { return t.id == id; });
    if (it == traces_.end())
      return make_error(ErrorCode::kMismatch, fmt::format("verifiers server: the episode is missing trace {}", id));
    if (it->nodes != summary["nodes"].get<std::size_t>() || it->calls != summary["calls"].get<std::size_t>())
      return make_error(
          ErrorCode::kMismatch,
          fmt::format("verifiers server: trace {} assembled {} nodes / {} calls, the server reports {} / {}", id,
                      it->nodes, it->calls, summary["nodes"].get<std::size_t>(), summary["calls"].get<std::size_t>()));
    auto reward = trace_reward(id, it->rewards);
    if (!reward) return std::unexpected(reward.error());
    ep.reward += *reward;
    ep.ok = ep.ok && it->ok;
    ep.nodes += it->nodes;
    ep.model_calls += it->calls;
    ep.failed_calls += it->failed_calls;
    ep.errors.insert(ep.errors.end(), it->errors.begin(), it->errors.end());
    ++ep.traces;
  }
  if (ep.traces == 0) ep.ok = false;
  return ep;
}

}  // namespace verifiers_wire

// ---------------------------------------------------------------------------------------------
// The socket's thread.

struct VerifiersClient::Impl {
  struct Pending {
    std::string method;
    SteadyTime deadline;
    std::function<Status(const json&)> on_delta;  // the socket's thread
    std::function<void(Result<json>)> on_reply;   // the socket's thread, or the failing caller's
  };
  struct Outgoing {
    std::string id, method, payload;
  };

  std::string address;
  int wake = -1;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  std::deque<Outgoing> outgoing;           // mu
  std::map<std::string, Pending> pending;  // mu
  VerifiersClientStats stats;              // mu
  std::uint64_t next_id = 0;               // mu
  std::uint64_t prefix = std::random_device{}();
  std::thread thread;

  explicit Impl(std::string a) : address(std::move(a)), wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    thread = std::thread([this] { loop(); });
  }
  ~Impl() {
    stop = true;
    poke();
    if (thread.joinable()) thread.join();
    if (wake >= 0) ::close(wake);
  }

  void poke() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake, &one, sizeof one);
  }

  // Queues a request; its callbacks run once (a reply, an error, or its deadline).
  void submit(std::string method, json payload, SteadyTime deadline, std::function<Status(const json&)> on_delta,
              std::function<void(Result<json>)> on_reply) {
    {
      std::lock_guard lock(mu);
      const std::string id = fmt::format("arlo{:08x}{:012x}", static_cast<std::uint32_t>(prefix), next_id++);
      if (method == "run") ++stats.runs;
      outgoing.push_back({id, method, verifiers_wire::pack(payload)});
      pending.emplace(id, Pending{std::move(method), deadline, std::move(on_delta), std::move(on_reply)});
    }
    poke();
  }

  // Takes every pending request out (optionally queueing a cancel for each run) and fails it.
  std::size_t fail_all(ErrorCode code, const std::string& reason, bool send_cancels) {
    std::map<std::string, Pending> taken;
    {
      std::lock_guard lock(mu);
      taken.swap(pending);
      for (const auto& [id, p] : taken)
        if (send_cancels && p.method == "run") {
          outgoing.push_back({fmt::format("{}c", id), "cancel", verifiers_wire::pack({{"request_id", id}})});
          ++stats.cancels;
        }
      if (code == ErrorCode::kUnavailable) stats.failed_in_flight += taken.size();
    }
    if (send_cancels) poke();
    for (auto& [id, p] : taken) p.on_reply(make_error(code, fmt::format("verifiers {} {}: {}", p.method, id, reason)));
    return taken.size();
  }

  void loop();
  void send_queued(zmq::socket_t& socket);
  void receive(zmq::socket_t& socket);
  void handle(std::vector<zmq::message_t>& frames);
  void expire();
  int poll_timeout_ms() const;
};

void VerifiersClient::Impl::send_queued(zmq::socket_t& socket) {
  std::deque<Outgoing> batch;
  {
    std::lock_guard lock(mu);
    batch.swap(outgoing);
  }
  for (auto& o : batch) {
    try {
      socket.send(zmq::buffer(o.id), zmq::send_flags::sndmore);
      socket.send(zmq::buffer(o.method), zmq::send_flags::sndmore);
      socket.send(zmq::buffer(o.payload), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      std::unique_lock lock(mu);
      auto it = pending.find(o.id);
      if (it == pending.end()) continue;
      auto p = std::move(it->second);
      pending.erase(it);
      lock.unlock();
      p.on_reply(
          make_error(ErrorCode::kIo, fmt::format("verifiers {}: sending to {}: {}", o.method, address, e.what())));
    }
  }
}

void VerifiersClient::Impl::handle(std::vector<zmq::message_t>& frames) {
  if (frames.size() != 3) {
    std::lock_guard lock(mu);
    ++stats.malformed;
    ARLO_WARN_EVERY(5.0, "verifiers server at {}: dropped a message of {} frames, expected 3 [request_id, kind, data]",
                    address, frames.size());
    return;
  }
  const std::string id = frames[0].to_string();
  const std::string kind = frames[1].to_string();
  std::string method;
  std::function<Status(const json&)> on_delta;
  {
    std::lock_guard lock(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return;  // a late answer to a request that expired or was failed: dropped
    method = it->second.method;
    on_delta = it->second.on_delta;
  }
  auto body =
      verifiers_wire::unpack(frames[2].to_string_view(), fmt::format("the {} {} of request {}", method, kind, id));
  Status st;
  if (kind != "delta" && kind != "reply")
    st = make_error(ErrorCode::kParse, fmt::format("verifiers server: frame 2 (kind) of request {} is '{}', expected "
                                                   "'delta' or 'reply'",
                                                   id, kind.substr(0, 32)));
  else if (!body)
    st = std::unexpected(body.error());
  else if (kind == "delta" && on_delta)
    st = on_delta(*body);
  if (st && kind == "delta") return;
  std::unique_lock lock(mu);
  auto it = pending.find(id);
  if (it == pending.end()) return;
  auto done = std::move(it->second);
  pending.erase(it);
  if (!st) ++stats.malformed;
  lock.unlock();
  done.on_reply(st ? std::move(body) : Result<json>(std::unexpected(st.error())));
}

void VerifiersClient::Impl::receive(zmq::socket_t& socket) {
  while (true) {
    std::vector<zmq::message_t> frames;
    zmq::message_t m;
    if (!socket.recv(m, zmq::recv_flags::dontwait)) return;
    frames.push_back(std::move(m));
    while (frames.back().more()) {
      zmq::message_t next;
      (void)socket.recv(next, zmq::recv_flags::none);
      frames.push_back(std::move(next));
    }
    handle(frames);
  }
}

void VerifiersClient::Impl::expire() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, Pending>> late;
  {
    std::lock_guard lock(mu);
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      if (it->second.method == "run") {
        outgoing.push_back({it->first + "c", "cancel", verifiers_wire::pack({{"request_id", it->first}})});
        ++stats.cancels;
      }
      late.emplace_back(it->first, std::move(it->second));
      it = pending.erase(it);
    }
  }
  for (auto& [id, p] : late)
    p.on_reply(make_error(ErrorCode::kTimeout,
                          fmt::format("verifiers {} {}: no reply from {} by its deadline", p.method, id, address)));
}

int VerifiersClient::Impl::poll_timeout_ms() const {
  std::lock_guard lock(mu);
  if (!outgoing.empty()) return 0;
  if (pending.empty()) return -1;
  auto first = pending.begin()->second.deadline;
  for (const auto& [id, p] : pending) first = std::min(first, p.deadline);
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - std::chrono::steady_clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
}

void VerifiersClient::Impl::loop() {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndhwm, 0);
  socket.set(zmq::sockopt::rcvhwm, 0);
  socket.connect(address);
  while (!stop) {
    send_queued(socket);
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(poll_timeout_ms()));
    if (items[1].revents & ZMQ_POLLIN) {
      std::uint64_t n = 0;
      [[maybe_unused]] auto r = ::read(wake, &n, sizeof n);
    }
    receive(socket);
    expire();
  }
  fail_all(ErrorCode::kCancelled, "the client closed", false);
}

// ---------------------------------------------------------------------------------------------

VerifiersClient::VerifiersClient(std::string address)
    : address_(std::move(address)), impl_(std::make_unique<Impl>(address_)) {}

VerifiersClient::~VerifiersClient() = default;

namespace {

// The submissions, outside the coroutines (GCC 12 mishandles temporaries and initializer lists in
// coroutine frames): each reply is posted to the caller's executor and sets its promise there.
void submit_run(VerifiersClient::Impl& impl, VerifiersRunRequest request, SteadyTime deadline,
                boost::asio::any_io_executor home, Promise<Result<VerifiersEpisode>> done);
void submit_health(VerifiersClient::Impl& impl, SteadyTime deadline, boost::asio::any_io_executor home,
                   Promise<Status> done);

}  // namespace

Awaitable<Result<VerifiersEpisode>> VerifiersClient::run(VerifiersRunRequest request, SteadyTime deadline) {
  boost::asio::any_io_executor home = co_await boost::asio::this_coro::executor;
  Promise<Result<VerifiersEpisode>> done(home);
  submit_run(*impl_, std::move(request), deadline, home, done);
  Result<VerifiersEpisode> result = co_await done.get();
  co_return result;
}

Awaitable<Status> VerifiersClient::health(SteadyTime deadline) {
  boost::asio::any_io_executor home = co_await boost::asio::this_coro::executor;
  Promise<Status> done(home);
  submit_health(*impl_, deadline, home, done);
  Status result = co_await done.get();
  co_return result;
}

namespace {

void submit_run(VerifiersClient::Impl& impl, VerifiersRunRequest request, SteadyTime deadline,
                boost::asio::any_io_executor home, Promise<Result<VerifiersEpisode>> done) {
  auto assembly = std::make_shared<verifiers_wire::EpisodeAssembly>();
  json payload = {{"task_data", std::move(request.task_data)},
                  {"client", std::move(request.client)},
                  {"model", std::move(request.model)},
                  {"sampling", std::move(request.sampling)}};
  impl.submit(
      "run", std::move(payload), deadline, [assembly](const json& delta) { return assembly->apply(delta); },
      [assembly, home, done](Result<json> reply) mutable {
        Result<VerifiersEpisode> out = reply ? assembly->finish(*reply) : std::unexpected(reply.error());
        boost::asio::post(home, [done, out = std::move(out)]() mutable { done.set(std::move(out)); });
      });
}

void submit_health(VerifiersClient::Impl& impl, SteadyTime deadline, boost::asio::any_io_executor home,
                   Promise<Status> done) {
  impl.submit("health", json::object(), deadline, nullptr, [home, done](Result<json> reply) mutable {
    Status out = reply ? verifiers_wire::check_reply(*reply, "health reply") : Status(std::unexpected(reply.error()));
    boost::asio::post(home, [done, out = std::move(out)]() mutable { done.set(std::move(out)); });
  });
}

}  // namespace

std::size_t VerifiersClient::fail_in_flight(std::string reason) {
  return impl_->fail_all(ErrorCode::kUnavailable, reason, false);
}

std::size_t VerifiersClient::cancel_all() { return impl_->fail_all(ErrorCode::kCancelled, "abandoned by arlo", true); }

std::size_t VerifiersClient::in_flight() const {
  std::lock_guard lock(impl_->mu);
  return impl_->pending.size();
}

VerifiersClientStats VerifiersClient::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace arlo::session::adapters
