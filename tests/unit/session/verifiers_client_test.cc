// The verifiers environment-server client (session/adapters/verifiers_client.h): the msgpack wire
// and episode assembly without a socket, then the DEALER against a ROUTER this test serves (what
// verifiers' EnvServer does: [client, request_id, method, payload] in, [client, request_id, kind,
// data] out), with good answers, bad ones and none.
#include "session/adapters/verifiers_client.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <random>
#include <thread>
#include <zmq.hpp>

namespace arlo::session::adapters {
namespace {

using json = nlohmann::json;
namespace wire = verifiers_wire;

json delta(std::string trace, json fields) {
  fields["trace"] = std::move(trace);
  return fields;
}

TEST(VerifiersWire, PackAndUnpackRoundTripAndGarbageNamesWhatItWas) {
  const json j = {{"success", true}, {"n", 3}, {"bin", json::binary({1, 2, 3})}};
  auto back = wire::unpack(wire::pack(j), "x");
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, j);
  auto bad = wire::unpack("\xc1", "the run reply");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kParse);
  EXPECT_NE(bad.error().what().find("the run reply"), std::string::npos) << bad.error().what();
}

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  return out;
}

// Bytes as Python's msgpack packs them (verifiers' wire): a delta whose `links` and `routing_repairs`
// are keyed by node index (integer keys), a negative and a 64-bit integer, and bytes.
TEST(VerifiersWire, MapsWithIntegerKeysAreReadWithTheKeyAsText) {
  auto d =
      wire::unpack(from_hex("85a57472616365a27431a56c696e6b7381039181a26964a26e31af726f7574696e675f72657061697273810081"
                            "a464617461c4020102a36e6567fba3626967cf0000010000000000"),
                   "a delta");
  ASSERT_TRUE(d) << d.error().what();
  EXPECT_EQ((*d)["links"]["3"][0]["id"], "n1");
  EXPECT_EQ((*d)["routing_repairs"]["0"]["data"], json::binary({1, 2}));
  EXPECT_EQ((*d)["neg"], -5);
  EXPECT_EQ((*d)["big"], std::uint64_t{1} << 40);
  auto f = wire::unpack(from_hex("ca3fc00000"), "a float32");
  ASSERT_TRUE(f);
  EXPECT_EQ(*f, 1.5);
  wire::EpisodeAssembly a;
  EXPECT_TRUE(a.apply(*d));
}

TEST(VerifiersWire, TruncatedTrailingAndOddKeysAreRefusedNamingWhere) {
  const auto whole = wire::pack(json{{"success", true}, {"head", {{"ok", true}}}});
  auto cut = wire::unpack(whole.substr(0, whole.size() - 1), "the run reply");
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().what().find("truncated"), std::string::npos) << cut.error().what();
  auto extra = wire::unpack(whole + "\x01", "the run reply");
  ASSERT_FALSE(extra);
  EXPECT_NE(extra.error().what().find("1 bytes after the value"), std::string::npos) << extra.error().what();
  auto latin1 = wire::unpack(from_hex("81a161a1e9"), "a delta");  // {"a": "\xe9"}
  ASSERT_FALSE(latin1);
  EXPECT_NE(latin1.error().what().find("a delta.a: text that is not UTF-8"), std::string::npos)
      << latin1.error().what();
  auto odd = wire::unpack(from_hex("81a16181c301"), "a delta");  // {"a": {true: 1}}
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.error().what().find("a delta.a: key 0 of a map is neither text nor an integer"), std::string::npos)
      << odd.error().what();
}

// Seeded mutations of a real delta (bytes flipped, cut, inserted): each is read or refused as kParse,
// never a crash, and what is read packs and reads back to itself.
TEST(VerifiersWire, MutatedRepliesAreReadOrRefusedNeverCrash) {
  const std::string seed = from_hex(
      "85a57472616365a27431a56c696e6b7381039181a26964a26e31af726f7574696e675f726570616972"
      "73810081a464617461c4020102a36e6567fba3626967cf0000010000000000");
  std::mt19937 rng(20261205);
  int read = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b = seed;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n && !b.empty(); ++k) {
      const std::size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<char>(rng()); break;
        case 1: b.resize(at); break;
        default: b.insert(at, 1, static_cast<char>(rng())); break;
      }
    }
    auto v = wire::unpack(b, "a delta");
    if (!v) {
      ASSERT_EQ(v.error().code(), ErrorCode::kParse);
      continue;
    }
    ++read;
    auto back = wire::unpack(wire::pack(*v), "a delta");
    ASSERT_TRUE(back) << back.error().what();
    ASSERT_EQ(back->dump(), v->dump());  // dump: a NaN a mutation made equals itself
    wire::EpisodeAssembly a;
    (void)a.apply(*v);
  }
  EXPECT_GT(read, 0);
}

TEST(VerifiersWire, AnEpisodeIsAssembledFromItsDeltas) {
  wire::EpisodeAssembly a;
  ASSERT_TRUE(a.apply(delta("t1", {{"open", {{"id", "t1"}}}, {"set", {{"ok", false}}}})));
  ASSERT_TRUE(a.apply(delta("t1", {{"nodes", json::array({json::object(), json::object()})},
                                   {"calls", json::array({{{"error", nullptr}}})}})));
  ASSERT_TRUE(a.apply(delta(
      "t1", {{"nodes", json::array({json::object()})},
             {"calls", json::array({{{"error", {{"type", "ProviderError"}, {"message", "x"}}}}})},
             {"set",
              {{"ok", true},
               {"rewards", {{"a", {{"score", 0.5}, {"weight", 2.0}}}, {"b", {{"score", 0.25}}}, {"c", nullptr}}}}}})));
  ASSERT_TRUE(a.apply(delta("gone", {{"nodes", json::array({json::object()})}})));
  ASSERT_TRUE(a.apply(delta("gone", {{"discard", true}})));  // a retried attempt's trace
  const json reply = {{"success", true},
                      {"head", {{"id", "e"}, {"ok", true}, {"errors", json::array()}}},
                      {"traces", json::array({{{"id", "t1"}, {"nodes", 3}, {"calls", 2}}})}};
  auto ep = a.finish(reply);
  ASSERT_TRUE(ep) << ep.error().what();
  EXPECT_DOUBLE_EQ(ep->reward, 1.25);  // 0.5 x 2 + 0.25; an unscored reward counts nothing
  EXPECT_TRUE(ep->ok);
  EXPECT_EQ(ep->traces, 1U);
  EXPECT_EQ(ep->nodes, 3U);
  EXPECT_EQ(ep->model_calls, 2U);
  EXPECT_EQ(ep->failed_calls, 1U);

  json short_count = reply;
  short_count["traces"][0]["calls"] = 5;  // a delta was lost: a clear mismatch, as verifiers' client says
  auto bad = a.finish(short_count);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kMismatch);
  EXPECT_NE(bad.error().what().find("server reports 3 / 5"), std::string::npos) << bad.error().what();
}

TEST(VerifiersWire, BadRepliesAndDeltasNameTheField) {
  auto fails_with = [](const Status& st, std::string_view field) {
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().what().find(field), std::string::npos) << st.error().what();
  };
  wire::EpisodeAssembly a;
  fails_with(a.apply(json::array()), "'trace'");
  fails_with(a.apply(delta("t", {{"nodes", 3}})), "'nodes'");
  fails_with(a.apply(delta("t", {{"set", 3}})), "'set'");
  fails_with(a.apply(delta("t", {{"set", {{"rewards", 1}}}})), "'rewards'");
  ASSERT_TRUE(a.apply(delta("t", {{"set", {{"rewards", {{"r", {{"weight", 1}}}}}}}})));
  const json traces = json::array({{{"id", "t"}, {"nodes", 0}, {"calls", 0}}});
  auto finish_fails = [&](json reply, std::string_view field) {
    auto r = a.finish(reply);
    ASSERT_FALSE(r) << reply.dump();
    EXPECT_NE(r.error().what().find(field), std::string::npos) << r.error().what();
  };
  finish_fails({{"head", json::object()}}, "'success'");
  finish_fails({{"success", false}, {"error", "TaskError: boom"}}, "TaskError: boom");
  finish_fails({{"success", true}, {"traces", traces}}, "'head'");
  finish_fails({{"success", true}, {"head", json::object()}}, "'traces'");
  finish_fails({{"success", true}, {"head", json::object()}, {"traces", json::array({{{"id", "t"}}})}}, "'nodes'");
  finish_fails({{"success", true},
                {"head", json::object()},
                {"traces", json::array({{{"id", "u"}, {"nodes", 0}, {"calls", 0}}})}},
               "missing trace u");
  finish_fails({{"success", true}, {"head", json::object()}, {"traces", traces}}, "rewards.r has no number 'score'");
}

// A ROUTER on a free port, answering with what `answer` returns for each request (a list of
// [kind, data] frames pairs; frames sent as given), on its own thread.
class FakeServer {
 public:
  using Answer = std::function<std::vector<std::vector<std::string>>(const std::string& method, const json& payload)>;
  explicit FakeServer(Answer answer) : answer_(std::move(answer)), socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    address_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() {
    stop_ = true;
    thread_.join();
  }
  const std::string& address() const { return address_; }
  std::vector<std::string> methods() {
    std::lock_guard lock(mu_);
    return methods_;
  }

 private:
  void serve() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      do {
        zmq::message_t m;
        (void)socket_.recv(m);
        frames.push_back(std::move(m));
      } while (frames.back().more());
      const std::string method = frames[2].to_string();
      const json payload = json::from_msgpack(frames[3].to_string());
      {
        std::lock_guard lock(mu_);
        methods_.push_back(method);
      }
      for (const auto& out : answer_(method, payload)) {
        // [kind, data] goes out as [identity, request_id, kind, data]; anything else as given.
        const auto f = out.size() == 2 ? std::vector<std::string>{frames[1].to_string(), out[0], out[1]} : out;
        socket_.send(zmq::buffer(frames[0].to_string()), zmq::send_flags::sndmore);  // the client's identity
        for (std::size_t i = 0; i < f.size(); ++i)
          socket_.send(zmq::buffer(f[i]), i + 1 < f.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    }
  }
  Answer answer_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> methods_;
};

template <typename T>
T run_sync(boost::asio::io_context& io, Awaitable<T> op) {
  std::optional<T> out;
  io.restart();                                   // the last call's guard, gone, stopped it
  auto guard = boost::asio::make_work_guard(io);  // the reply comes from the client's thread
  boost::asio::co_spawn(
      io,
      [&]() -> Awaitable<void> {
        T v = co_await std::move(op);
        out.emplace(std::move(v));
      },
      boost::asio::detached);
  while (!out) io.run_one();
  return std::move(*out);
}

const auto kSoon = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(20); };

TEST(VerifiersClient, HealthRunAndTheRequestOnTheWire) {
  json seen_run;
  FakeServer server([&](const std::string& method, const json& payload) -> std::vector<std::vector<std::string>> {
    if (method == "health") return {{"reply", wire::pack({{"success", true}, {"error", nullptr}})}};
    seen_run = payload;
    return {{"delta", wire::pack(delta("t", {{"nodes", json::array({json::object()})},
                                             {"calls", json::array({json::object()})},
                                             {"set", {{"ok", true}, {"rewards", {{"r", {{"score", 1.0}}}}}}}}))},
            {"reply", wire::pack({{"success", true},
                                  {"head", {{"ok", true}}},
                                  {"traces", json::array({{{"id", "t"}, {"nodes", 1}, {"calls", 1}}})}})}};
  });
  boost::asio::io_context io;
  VerifiersClient client(server.address());
  auto ok = run_sync(io, client.health(kSoon()));
  ASSERT_TRUE(ok) << ok.error().what();
  VerifiersRunRequest req;
  req.task_data = {{"prompt", "hi"}};
  req.client = {{"type", "eval"}, {"base_url", "http://127.0.0.1:1/t/x/v1"}};
  req.model = "m";
  req.sampling = {{"max_tokens", 4}};
  auto ep = run_sync(io, client.run(req, kSoon()));
  ASSERT_TRUE(ep) << ep.error().what();
  EXPECT_DOUBLE_EQ(ep->reward, 1.0);
  EXPECT_EQ(ep->model_calls, 1U);
  EXPECT_EQ(seen_run["task_data"]["prompt"], "hi");
  EXPECT_EQ(seen_run["client"]["type"], "eval");
  EXPECT_EQ(seen_run["model"], "m");
  EXPECT_EQ(seen_run["sampling"]["max_tokens"], 4);
  EXPECT_EQ(client.in_flight(), 0U);
  EXPECT_EQ(client.stats().runs, 1U);
}

TEST(VerifiersClient, BadMessagesFailTheirRequestClearlyAndTheClientGoesOn) {
  int n = 0;
  FakeServer server([&](const std::string& method, const json&) -> std::vector<std::vector<std::string>> {
    if (method == "health") return {{"reply", wire::pack({{"success", true}})}};
    switch (n++) {
      case 0: return {{"reply", "\xc1 not msgpack"}};
      case 1: return {{"shout", wire::pack(json::object())}};
      case 2: return {{"delta", wire::pack({{"no_trace", 1}})}};
      case 3: return {{"reply", wire::pack({{"success", false}, {"error", "ValidationError: task_data.prompt"}})}};
      default: return {{"a", "b", "c", "d"}, {"reply", wire::pack({{"success", true}})}};  // 4 frames: dropped
    }
  });
  boost::asio::io_context io;
  VerifiersClient client(server.address());
  const std::vector<std::string> expected = {"not msgpack", "frame 2 (kind)", "'trace'", "task_data.prompt", "'head'"};
  for (const auto& what : expected) {
    auto ep = run_sync(io, client.run(VerifiersRunRequest{}, kSoon()));
    ASSERT_FALSE(ep) << what;
    EXPECT_NE(ep.error().what().find(what), std::string::npos) << ep.error().what();
  }
  EXPECT_GE(client.stats().malformed, 4U);
  auto ok = run_sync(io, client.health(kSoon()));  // still serving
  EXPECT_TRUE(ok) << ok.error().what();
}

TEST(VerifiersClient, ARunPastItsDeadlineIsCancelledOnTheServer) {
  FakeServer server([](const std::string& method, const json&) -> std::vector<std::vector<std::string>> {
    if (method == "health") return {{"reply", wire::pack({{"success", true}})}};
    return {};  // runs and cancels: no answer
  });
  boost::asio::io_context io;
  VerifiersClient client(server.address());
  auto ep = run_sync(
      io, client.run(VerifiersRunRequest{}, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
  ASSERT_FALSE(ep);
  EXPECT_EQ(ep.error().code(), ErrorCode::kTimeout);
  EXPECT_EQ(client.stats().cancels, 1U);
  // One socket keeps its order: once health is answered, the cancel (queued first) has arrived.
  auto ok = run_sync(io, client.health(kSoon()));
  ASSERT_TRUE(ok) << ok.error().what();
  EXPECT_EQ(server.methods(), (std::vector<std::string>{"run", "cancel", "health"}));
}

TEST(VerifiersClient, FailInFlightFailsWhatTheDeadServerHeld) {
  FakeServer server([](const std::string&, const json&) -> std::vector<std::vector<std::string>> { return {}; });
  boost::asio::io_context io;
  VerifiersClient client(server.address());
  std::optional<Result<VerifiersEpisode>> out;
  boost::asio::co_spawn(
      io,
      [&]() -> Awaitable<void> {
        auto op = client.run(VerifiersRunRequest{}, kSoon());
        auto v = co_await std::move(op);
        out.emplace(std::move(v));
      },
      boost::asio::detached);
  auto guard = boost::asio::make_work_guard(io);
  while (client.in_flight() == 0) io.run_one();  // the run is submitted once the coroutine starts
  EXPECT_EQ(client.fail_in_flight("the environment server died (SIGKILL)"), 1U);
  while (!out) io.run_one();
  ASSERT_TRUE(out && !*out);
  EXPECT_EQ(out->error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(out->error().what().find("SIGKILL"), std::string::npos) << out->error().what();
  EXPECT_EQ(client.stats().failed_in_flight, 1U);
}

}  // namespace
}  // namespace arlo::session::adapters
