#include "session/adapters/bridge_trainer.h"

#include <fmt/format.h>

namespace arlo::session::adapters {

BridgeTrainer::BridgeTrainer(boost::asio::io_context& io, bridge::BridgeServer& server, ThreadPool& pool,
                             bridge::PackOptions pack)
    : io_(io), server_(server), pool_(pool), pack_(pack) {}

void BridgeTrainer::on_version(std::function<void(orch::VersionNotice)> callback) {
  server_.on_version([this, cb = std::move(callback)](bridge::VersionEvent e) {
    if (alive_) alive_();
    // The announcement carries where the weights are under "weight_sync" (weight_sync/wire.h) and
    // the step's trainer metrics under "metrics" (arlo-trainer: loss, grad_norm, mismatch_kl, ...).
    orch::VersionNotice notice{e.version};
    if (e.info.is_object() && e.info.contains("metrics") && e.info["metrics"].is_object())
      notice.metrics = e.info["metrics"];
    if (e.info.is_object() && e.info.contains("weight_sync") && e.info["weight_sync"].is_object())
      notice.weight_sync = e.info["weight_sync"];
    cb(std::move(notice));
  });
}

void BridgeTrainer::on_alive(std::function<void()> callback) {
  alive_ = std::move(callback);
  server_.on_heartbeat([this](bridge::HeartbeatEvent) {
    if (alive_) alive_();
  });
}

Awaitable<Status> BridgeTrainer::send(orch::TrainBatch batch) {
  const auto step = batch.step;
  // The samples are packed where they are: no copy into another type on the way.
  auto work = [batch = std::move(batch), opts = pack_]() -> Result<bridge::StepBatch> {
    return bridge::pack(batch.step, std::span<const Sample>(batch.samples), opts);
  };
  auto packed = co_await pool_.run(io_, std::move(work));
  if (!packed) co_return std::unexpected(Error(packed.error()).with_context(fmt::format("packing step {}", step)));
  last_ = packed->report;
  co_return co_await server_.send(std::move(*packed));
}

}  // namespace arlo::session::adapters
