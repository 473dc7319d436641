#pragma once
// TrainerPort over trainer_bridge's BridgeServer: packs each batch into rank batches of seq_len on
// the thread pool (off the loop), then hands it to the bridge, whose send() is the back-pressure.
// Version notices from the trainer are forwarded as they arrive (pushed, not polled).
//
// Call order: construct, Orchestrator::start() (registers on_version), then server.start().
#include <boost/asio/io_context.hpp>

#include "common/async/thread_pool.h"
#include "orchestrator/ports.h"
#include "trainer_bridge/batch.h"
#include "trainer_bridge/bridge.h"

namespace arlo::session::adapters {

class BridgeTrainer final : public orch::TrainerPort {
 public:
  BridgeTrainer(boost::asio::io_context& io, bridge::BridgeServer& server, ThreadPool& pool, bridge::PackOptions pack);
  Awaitable<Status> send(orch::TrainBatch batch) override;
  void on_version(std::function<void(orch::VersionNotice)> callback) override;
  // Each heartbeat and each version from the trainer (socket bridge: every second; dir bridge: the
  // heartbeat files a trainer writes, if it writes them).
  void on_alive(std::function<void()> callback) override;
  const bridge::PackReport& last_report() const { return last_; }

 private:
  boost::asio::io_context& io_;
  bridge::BridgeServer& server_;
  ThreadPool& pool_;
  bridge::PackOptions pack_;
  bridge::PackReport last_;
  std::function<void()> alive_;
};

}  // namespace arlo::session::adapters
