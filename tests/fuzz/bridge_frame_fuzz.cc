// libFuzzer target for bridge frames (trainer_bridge/socket_transport.cc), orchestrator side: the
// fuzzer's bytes are what trainers send ([u8 type][u64 LE length][payload]: HELLO, ACK, VERSION,
// HEARTBEAT) on up to three connections in turn (split at "\n--next--\n") to a real socket
// BridgeServer on loopback for two ranks, which holds one unacknowledged step to resend on HELLO.
//
// Properties checked:
//   - the server never crashes, throws or hangs, whatever the bytes: every connection ends with the
//     server closing it once the trainer's side is closed;
//   - its state stays coherent: versions only go up, an acked step is one it sent, at most the one
//     step it holds is pending, and the step still reads back from every image it resends.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <string>

#include "tests/fuzz/check.h"
#include "tests/fuzz/loopback.h"
#include "trainer_bridge/batch.h"
#include "trainer_bridge/bridge.h"

namespace {

namespace asio = boost::asio;
using namespace arlo::bridge;
using arlo::fuzz::check;

StepBatch one_step() {
  std::vector<Sample> samples(3);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    samples[i].prompt_tokens = {1, 5, 9, static_cast<std::int32_t>(10 + i)};
    samples[i].completion_tokens = {20, 21, 2};
    samples[i].completion_logprobs = {-0.5f, -1.0f, -0.25f};
    samples[i].token_versions = {0, 0, 1};
    samples[i].advantage = 0.5f - static_cast<float>(i);
  }
  auto step = pack(1, samples, {.seq_len = 16, .num_ranks = 2});
  check(step.has_value(), "pack a step");
  return std::move(*step);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  asio::io_context io;
  ServerOptions options;
  options.transport = "socket";
  options.num_ranks = 2;
  options.max_pending_batches = 2;
  options.heartbeat_interval = std::chrono::milliseconds(100);
  options.heartbeat_timeout = std::chrono::seconds(10);
  options.max_frame_bytes = 1 << 16;
  auto created = BridgeServer::create(io, options);
  check(created.has_value(), "create the server");
  auto& server = **created;
  std::int64_t last_version = -1;
  server.on_version([&](VersionEvent e) {
    check(e.version > last_version, "versions only go up");
    check(e.info.is_object(), "version info is an object");
    last_version = e.version;
  });
  server.on_ack([&](std::int64_t step) { check(step == 1, "only the step sent is acked"); });
  server.on_heartbeat([&](HeartbeatEvent e) { check(e.rank >= 0 && e.rank < 2, "heartbeat from a known rank"); });
  check(server.start().has_value(), "start the server");
  bool sent = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto s = co_await server.send(one_step());
        check(s.has_value(), "queue the step");
        sent = true;
      },
      asio::detached);
  while (!sent) io.run_one();

  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto pump = [&] { io.run_for(std::chrono::microseconds(200)); };
  // A refused trainer gets ERROR and is left to close (the server closes it at its heartbeat timeout).
  auto refused = [](const std::string& answer) {
    std::string_view rest = answer;
    while (rest.size() >= 9) {
      std::uint64_t n = 0;
      for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(rest[1 + i])) << (8 * i);
      if (rest.size() - 9 < n) return false;
      if (rest[0] == 7) return true;
      rest.remove_prefix(9 + n);
    }
    return false;
  };
  for (const auto bytes : arlo::fuzz::connections(input, 3)) {
    const std::string answer = arlo::fuzz::exchange("bridge_frame_fuzz", server.port(), bytes, pump, refused);
    // Whatever came back is whole frames of the server's: CHALLENGE, WELCOME, BATCH, HEARTBEAT or ERROR.
    std::string_view rest = answer;
    while (rest.size() >= 9) {
      const auto type = static_cast<std::uint8_t>(rest[0]);
      std::uint64_t n = 0;
      for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(rest[1 + i])) << (8 * i);
      check(type == 2 || type == 3 || type == 6 || type == 7 || type == 8, "the server sends its own frame types");
      if (rest.size() - 9 < n) break;  // cut by the close
      if (type == 3) check(BatchView::from_bytes(std::string(rest.substr(9, n))).has_value(), "a resent batch reads");
      rest.remove_prefix(9 + n);
    }
    check(server.latest_version() == last_version, "latest_version is the last one announced");
    check(server.pending() <= 1, "at most the one step sent is pending");
  }
  server.stop();
  io.poll();
  return 0;
}
