#include "orchestrator/adapters/bridge_trainer.h"

#include <fmt/format.h>

namespace arlo::orch::adapters {

namespace {
// The checksum of the published weights in an announcement: in its weight-sync block, or at the top
// (arlo-trainer until the announcement has one form); "" when it has none.
std::string announced_checksum(const nlohmann::json& info) {
  auto checksum_in = [](const nlohmann::json& j) {
    auto it = j.find("checksum");
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto ws = info.find("weight_sync"); ws != info.end() && ws->is_object())
    if (auto c = checksum_in(*ws); !c.empty()) return c;
  return checksum_in(info);
}
}  // namespace

BridgeTrainer::BridgeTrainer(boost::asio::io_context& io, bridge::BridgeServer& server, ThreadPool& pool,
                             bridge::PackOptions pack)
    : io_(io), server_(server), pool_(pool), pack_(pack) {}

void BridgeTrainer::on_version(std::function<void(VersionNotice)> callback) {
  server_.on_version([this, cb = std::move(callback)](bridge::VersionEvent e) {
    if (e.info.is_object()) latest_info_ = e.info;
    // The announcement carries the step's trainer metrics under "metrics" (arlo-trainer:
    // loss, grad_norm, mismatch_kl, ...), beside where the weights are.
    VersionNotice notice{e.version};
    if (e.info.is_object() && e.info.contains("metrics") && e.info["metrics"].is_object()) notice.metrics = e.info["metrics"];
    if (e.info.is_object()) notice.checksum = announced_checksum(e.info);
    cb(std::move(notice));
  });
}

Awaitable<Status> BridgeTrainer::send(TrainBatch batch) {
  const auto step = batch.step;
  auto work = [batch = std::move(batch), opts = pack_]() -> Result<bridge::StepBatch> {
    std::vector<bridge::Sample> samples;
    samples.reserve(batch.samples.size());
    for (const auto& s : batch.samples) {
      bridge::Sample b;
      b.prompt_tokens = s.prompt_tokens;
      b.completion_tokens = s.completion_tokens;
      b.completion_logprobs = s.logprobs;
      b.token_versions = s.token_versions;
      b.advantage = static_cast<float>(s.advantage);
      if (s.supervised) b.ce_weights.assign(s.completion_tokens.size(), 1.0f);
      samples.push_back(std::move(b));
    }
    return bridge::pack(batch.step, samples, opts);
  };
  auto packed = co_await pool_.run(io_, std::move(work));
  if (!packed) co_return std::unexpected(Error(packed.error()).with_context(fmt::format("packing step {}", step)));
  last_ = packed->report;
  co_return co_await server_.send(std::move(*packed));
}

}  // namespace arlo::orch::adapters
