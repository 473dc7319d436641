#include "trainer_bridge/server_thread.h"

#include <boost/asio/co_spawn.hpp>

namespace arlo::bridge {

ServerThread::ServerThread() : work_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}

ServerThread::~ServerThread() {
  stop();
  work_.reset();
  thread_.join();
}

Status ServerThread::start(const ServerOptions& options, const std::function<void(BridgeServer&)>& setup) {
  return run([&]() -> Status {
    if (server_) {
      return make_error(ErrorCode::kInvalidArgument, "ServerThread::start: a server runs already; stop() it first");
    }
    ARLO_ASSIGN_OR_RETURN(auto server, BridgeServer::create(io_, options));
    if (setup) setup(*server);
    ARLO_TRY(server->start());
    port_ = server->port();
    server_ = std::move(server);
    return ok();
  });
}

void ServerThread::stop() {
  run([this] {
    if (!server_) return;
    server_->stop();
    server_.reset();
  });
}

std::future<Status> ServerThread::send_async(StepBatch batch) {
  return boost::asio::co_spawn(io_, server_->send(std::move(batch)), boost::asio::use_future);
}

}  // namespace arlo::bridge
