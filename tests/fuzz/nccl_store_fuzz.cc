// libFuzzer target for the TCPStore request reader of the nccl transport's rendezvous store
// (weight_sync/transports/nccl/store_server.cc): the fuzzer's bytes are requests of torch's c10d TCPStore
// protocol (either dialect) sent on up to three connections in turn (split at "\n--next--\n") to a
// real StoreServer on loopback.
//
// Properties checked:
//   - the server never crashes, hangs or leaks: every connection ends with the server closing it
//     once the client's side is closed, and the server then counts no open connection;
//   - the store stays usable in-process after any input (set, get, add, wait).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/fuzz/loopback.h"
#include "weight_sync/transports/nccl/store.h"

namespace {

using arlo::weight_sync::nccl::StoreServer;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "nccl_store_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto started = StoreServer::start("127.0.0.1", 0);
  check(started.has_value(), "start the store");
  StoreServer& store = **started;
  store.set("/seeded", "42");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const auto bytes : arlo::fuzz::connections(input, 3)) {
    (void)arlo::fuzz::exchange("nccl_store_fuzz", store.port(), bytes);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store.connections() != 0) {
    check(std::chrono::steady_clock::now() < deadline, "every closed connection is released");
    std::this_thread::yield();
  }
  store.set("/after", "1");
  check(store.get("/after") == "1", "set then get in-process");
  const auto before = store.get("/fuzz-counter");
  const std::int64_t sum = store.add("/fuzz-counter", 2);
  check(before.has_value() || sum == 2, "add onto a missing key starts from 0");
  check(store.wait({"/after"}, std::chrono::steady_clock::now() + std::chrono::seconds(5)), "wait for a present key");
  return 0;
}
