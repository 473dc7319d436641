// arlo-bench-bridge: how fast a packed batch goes from the orchestrator side to a trainer.
//
// One step of ~64k tokens (random prompt/completion lengths) packed into rows of --seq-len. For each
// transport, --reps steps go server.send -> client.next_batch (every byte read) -> ack, with the
// orchestrator on its own event-loop thread, so the figure covers encode, write, notify, map/receive,
// validate and read. Baselines with the same bytes in the same run: write+rename+read a file, and a
// raw loopback TCP blast. Prints MB/s and ratios; timings are reported, never asserted.
//
//   arlo-bench-bridge [--tokens 65536] [--seq-len 4096] [--reps 20] [--dir /tmp]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "common/log.h"
#include "trainer_bridge/bridge.h"
#include "trainer_bridge/server_thread.h"

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace arlo::bridge;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<Sample> make_samples(std::int64_t tokens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Sample> out;
  std::int64_t total = 0;
  while (total < tokens) {
    Sample s;
    const int p = std::uniform_int_distribution<int>(32, 256)(rng);
    const int c = std::uniform_int_distribution<int>(32, 768)(rng);
    for (int i = 0; i < p; ++i) s.prompt_tokens.push_back(static_cast<std::int32_t>(rng() % 150000));
    for (int i = 0; i < c; ++i) {
      s.completion_tokens.push_back(static_cast<std::int32_t>(rng() % 150000));
      s.completion_logprobs.push_back(-static_cast<float>(rng() % 1000) / 100.0f);
      s.token_versions.push_back(3);
    }
    s.advantage = 0.5f;
    total += p + c;
    out.push_back(std::move(s));
  }
  return out;
}

// Reads every element so the figure includes touching the data (a mapping is lazy).
std::uint64_t touch(const BatchView& b) {
  std::uint64_t sum = 0;
  for (const auto& t : b.tensors()) {
    for (std::size_t i = 0; i < t.bytes.size(); i += 8) {
      std::uint64_t v = 0;
      std::memcpy(&v, t.bytes.data() + i, std::min<std::size_t>(8, t.bytes.size() - i));
      sum += v;
    }
  }
  return sum;
}

struct Result_ {
  double seconds = 0;
  std::uint64_t bytes = 0;
  double mbps() const { return static_cast<double>(bytes) / 1e6 / seconds; }
};

Result_ run_transport(const std::string& transport, const fs::path& run_dir, const std::vector<StepBatch>& steps) {
  ServerThread loop;
  ServerOptions so;
  so.transport = transport;
  so.run_dir = run_dir;
  so.max_pending_batches = 2;
  if (auto s = loop.start(so); !s) {
    std::fprintf(stderr, "%s: %s\n", transport.c_str(), s.error().what().c_str());
    std::exit(1);
  }
  BridgeServer* server = loop.server();
  ClientOptions co;
  co.transport = transport;
  co.run_dir = run_dir;
  co.port = loop.port();
  auto client = std::move(*connect(co));
  // The orchestrator side sends every step as fast as back-pressure allows (max_pending_batches
  // = 2, so it writes step i+1 while the trainer reads step i); the trainer reads every byte and
  // acks. Step 1 warms up (connection, page cache); the clock runs from its ack to the last ack.
  auto producer = asio::co_spawn(
      loop.io(),
      [&]() -> asio::awaitable<arlo::Status> {
        for (const StepBatch& s : steps) {
          auto sent = co_await server->send(s);
          if (!sent) co_return sent;
        }
        co_return arlo::ok();
      },
      asio::use_future);
  Result_ r;
  std::uint64_t sink = 0;
  Clock::time_point t0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    auto b = client->next_batch(std::chrono::seconds(60));
    if (!b) {
      std::fprintf(stderr, "%s: step %zu failed: %s\n", transport.c_str(), i + 1, b.error().what().c_str());
      std::exit(1);
    }
    sink += touch(*b);
    if (i >= 1) r.bytes += b->raw().size();
    (void)client->ack(b->step());
    if (i == 0) t0 = Clock::now();
  }
  if (!producer.get()) std::exit(1);
  r.seconds = seconds_since(t0);
  client->close();
  loop.stop();
  if (sink == 42) std::puts("");  // keep the reads
  return r;
}

Result_ file_baseline(const fs::path& dir, const std::string& image, int reps) {
  std::vector<char> buf(image.size());
  Result_ r;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    const fs::path tmp = dir / ".base.tmp", final_path = dir / "base.bin";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (::write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size())) std::exit(1);
    ::close(fd);
    ::rename(tmp.c_str(), final_path.c_str());
    fd = ::open(final_path.c_str(), O_RDONLY);
    if (::read(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size())) std::exit(1);
    ::close(fd);
    ::unlink(final_path.c_str());
    r.bytes += image.size();
  }
  r.seconds = seconds_since(t0);
  return r;
}

Result_ socket_baseline(const std::string& image, int reps) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(ls, 1);
  socklen_t len = sizeof addr;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread receiver([&] {
    const int c = ::accept(ls, nullptr, nullptr);
    std::vector<char> buf(1 << 20);
    std::uint64_t want = static_cast<std::uint64_t>(image.size()) * static_cast<std::uint64_t>(reps), got = 0;
    while (got < want) {
      const ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      got += static_cast<std::uint64_t>(n);
    }
    const char ok = 1;
    (void)!::send(c, &ok, 1, 0);
    ::close(c);
  });
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::exit(1);
  const int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Result_ r;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    std::size_t off = 0;
    while (off < image.size()) {
      const ssize_t n = ::send(s, image.data() + off, image.size() - off, 0);
      if (n <= 0) std::exit(1);
      off += static_cast<std::size_t>(n);
    }
    r.bytes += image.size();
  }
  char ack = 0;
  (void)!::recv(s, &ack, 1, 0);
  r.seconds = seconds_since(t0);
  ::close(s);
  receiver.join();
  ::close(ls);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t tokens = 65536;
  int seq_len = 4096, reps = 20;
  fs::path base = fs::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--tokens")
      tokens = std::stoll(argv[i + 1]);
    else if (k == "--seq-len")
      seq_len = std::stoi(argv[i + 1]);
    else if (k == "--reps")
      reps = std::stoi(argv[i + 1]);
    else if (k == "--dir")
      base = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--tokens N] [--seq-len L] [--reps R] [--dir D]\n", argv[0]);
      return 2;
    }
  }
  arlo::log::Options log_options;
  log_options.level = "warn";
  (void)arlo::log::init(log_options);
  const fs::path run_dir = base / fmt::format("arlo-bench-bridge-{}", ::getpid());
  fs::create_directories(run_dir);

  const auto samples = make_samples(tokens, 7);
  auto t0 = Clock::now();
  auto packed = pack(1, samples, {.seq_len = seq_len});
  const double pack_s = seconds_since(t0);
  if (!packed) {
    std::fprintf(stderr, "%s\n", packed.error().what().c_str());
    return 1;
  }
  t0 = Clock::now();
  const std::string image = *encode(packed->ranks[0]);
  const double encode_s = seconds_since(t0);
  std::vector<StepBatch> steps;
  for (int i = 0; i <= reps; ++i) {
    StepBatch s = *packed;
    s.step = i + 1;
    for (auto& r : s.ranks) r.step = i + 1;
    steps.push_back(std::move(s));
  }

  std::printf("batch: %lld tokens in %zu samples, %d rows x %d, fill %.3f, %.2f MB encoded\n",
              static_cast<long long>(packed->report.tokens), samples.size(), packed->ranks[0].rows, seq_len,
              packed->report.fill, static_cast<double>(image.size()) / 1e6);
  std::printf("pack: %.2f ms (%.1f Mtokens/s)   encode: %.2f ms (%.0f MB/s)\n", pack_s * 1e3,
              static_cast<double>(packed->report.tokens) / pack_s / 1e6, encode_s * 1e3,
              static_cast<double>(image.size()) / 1e6 / encode_s);

  const Result_ file = file_baseline(run_dir, image, reps);
  const Result_ sock = socket_baseline(image, reps);
  const Result_ dir = run_transport("dir", run_dir / "dir_run", steps);
  const Result_ socket = run_transport("socket", run_dir / "socket_run", steps);
  fs::remove_all(run_dir);

  std::printf("%-34s %10s %12s %10s\n", "path (write+read, pipelined)", "MB/s", "ms/batch", "ratio");
  auto row = [&](const char* name, const Result_& r, const Result_& baseline) {
    std::printf("%-34s %10.0f %12.2f %10.2f\n", name, r.mbps(), r.seconds * 1e3 / reps, r.mbps() / baseline.mbps());
  };
  row("baseline: file write+rename+read", file, file);
  row("bridge dir (send->next_batch->ack)", dir, file);
  row("baseline: raw loopback socket", sock, sock);
  row("bridge socket (send->next->ack)", socket, sock);
  std::printf("ratio_vs_baseline dir=%.2f socket=%.2f\n", dir.mbps() / file.mbps(), socket.mbps() / sock.mbps());
  return 0;
}
