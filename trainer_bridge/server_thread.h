#pragma once
// The orchestrator side of the bridge for a process that is not an event loop itself
// (arlo-bench-bridge, the bridge's tests): a BridgeServer on an io_context that runs on a thread of
// its own. BridgeServer is used on its loop only; this class hands calls over and waits for them.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "trainer_bridge/bridge.h"

namespace arlo::bridge {

class ServerThread {
 public:
  ServerThread();   // starts the loop's thread
  ~ServerThread();  // stop(), then ends the thread
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

  // On the loop: creates a server from `options`, runs `setup` on it (register callbacks there:
  // they run on the loop), and starts it. Fails with create()'s or start()'s error, or when a
  // server is running already.
  Status start(const ServerOptions& options, const std::function<void(BridgeServer&)>& setup = {});
  // On the loop: stops and destroys the server, and its in-memory state with it (as when an
  // orchestrator exits). Nothing when none runs.
  void stop();

  // Runs `f` on the loop and returns what it returns.
  template <typename F>
  auto run(F f) {
    return boost::asio::post(io_, boost::asio::use_future(std::move(f))).get();
  }
  // The server's send(batch), on the loop; the future holds its Status.
  std::future<Status> send_async(StepBatch batch);
  Status send(StepBatch batch) { return send_async(std::move(batch)).get(); }

  // The running server (null when none): call it through run(), or build its coroutines here and
  // run them on io().
  BridgeServer* server() const { return server_.get(); }
  boost::asio::io_context& io() { return io_; }
  // The port the last started server bound (socket; 0 for dir); kept after stop() so that a test
  // restarts the orchestrator side on the same port.
  std::uint16_t port() const { return port_; }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::unique_ptr<BridgeServer> server_;  // created, used and destroyed on the loop
  std::uint16_t port_ = 0;
};

}  // namespace arlo::bridge
