// The orchestrator side of the bridge as a small program, for tests that drive a trainer in another
// language: packs samples from a JSON-lines file into steps 1..N and serves them over the bridge,
// then waits until every step is acknowledged and version N is announced. Prints one line per event
// ("acked <s>", "version <v>", "port <p>") and exits 0 on success, 1 on error or after --timeout.
//
//   arlo_bridge_test_feeder --transport dir --run-dir R --samples S.jsonl --steps 3 --batch-size 8 --seq-len 64
//
// A sample line: {"prompt": [ids], "completion": [ids], "logprobs": [f], "versions": [v], "advantage": a}
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "trainer_bridge/bridge.h"

namespace asio = boost::asio;
using namespace arlo::bridge;

int main(int argc, char** argv) {
  ServerOptions o;
  std::string samples_path;
  int steps = 1, batch_size = 4, seq_len = 64, timeout_s = 120;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--transport")
      o.transport = v;
    else if (k == "--run-dir")
      o.run_dir = v;
    else if (k == "--samples")
      samples_path = v;
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--batch-size")
      batch_size = std::stoi(v);
    else if (k == "--seq-len")
      seq_len = std::stoi(v);
    else if (k == "--max-pending")
      o.max_pending_batches = std::stoul(v);
    else if (k == "--timeout")
      timeout_s = std::stoi(v);
    else {
      std::cerr << "unknown flag " << k << "\n";
      return 2;
    }
  }
  std::vector<Sample> samples;
  std::ifstream in(samples_path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
      std::cerr << "bad sample line\n";
      return 2;
    }
    Sample s;
    s.prompt_tokens = j.at("prompt").get<std::vector<std::int32_t>>();
    s.completion_tokens = j.at("completion").get<std::vector<std::int32_t>>();
    s.completion_logprobs = j.at("logprobs").get<std::vector<float>>();
    s.token_versions = j.at("versions").get<std::vector<std::int32_t>>();
    s.advantage = j.value("advantage", 0.0f);
    samples.push_back(std::move(s));
  }
  if (samples.empty()) {
    std::cerr << "no samples in " << samples_path << "\n";
    return 2;
  }

  asio::io_context io;
  auto server = BridgeServer::create(io, o);
  if (!server) {
    std::cerr << server.error().what() << "\n";
    return 1;
  }
  int rc = 1;
  bool all_acked = false;
  std::int64_t seen_version = -1;  // as reported to on_version (the events this program prints)
  auto finish_if_done = [&] {
    if (all_acked && seen_version >= steps) {
      rc = 0;
      io.stop();
    }
  };
  (*server)->on_ack([](std::int64_t s) {
    std::printf("acked %lld\n", static_cast<long long>(s));
    std::fflush(stdout);
  });
  (*server)->on_version([&](VersionEvent v) {
    std::printf("version %lld\n", static_cast<long long>(v.version));
    std::fflush(stdout);
    seen_version = std::max(seen_version, v.version);
    finish_if_done();
  });
  if (auto s = (*server)->start(); !s) {
    std::cerr << s.error().what() << "\n";
    return 1;
  }
  std::printf("port %u\n", (*server)->port());
  std::fflush(stdout);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        std::size_t next = 0;
        for (int step = 1; step <= steps; ++step) {
          std::vector<Sample> chosen;
          for (int i = 0; i < batch_size; ++i) chosen.push_back(samples[next++ % samples.size()]);
          auto packed = pack(step, chosen, {.seq_len = seq_len});
          if (!packed) {
            std::cerr << packed.error().what() << "\n";
            io.stop();
            co_return;
          }
          if (auto s = co_await (*server)->send(std::move(*packed)); !s) {
            std::cerr << s.error().what() << "\n";
            io.stop();
            co_return;
          }
        }
        if (auto s = co_await (*server)->wait_all_acked(std::chrono::seconds(timeout_s)); !s) {
          std::cerr << s.error().what() << "\n";
          io.stop();
          co_return;
        }
        all_acked = true;
        finish_if_done();
      },
      asio::detached);
  asio::steady_timer deadline(io, std::chrono::seconds(timeout_s));
  deadline.async_wait([&](boost::system::error_code ec) {
    if (!ec) {
      std::cerr << "timed out\n";
      io.stop();
    }
  });
  io.run();
  return rc;
}
