#pragma once
// rollout::CollectiveSession over weight_sync's CollectiveControl: how `arlo run` lets vLLM and
// SGLang servers take part in a collective weight transfer (nccl) with the trainer's publisher.
//
// - group(): the first worker that needs a group gathers the others for up to `gather` (they ask at
//   once: the WeightWatcher updates every worker in parallel), then asks the publisher for one group
//   of everyone who came. A worker not in the current group (it rejoined) starts a new one with the
//   current members in it (their next call joins it; a transfer of the old group fails once, and
//   the WeightWatcher's retry joins the new one); the first worker after a failed transfer starts
//   one of whoever asks. A new trainer endpoint (a restarted trainer) drops the group.
// - receiving(): counts the worker in for the version and waits for the broadcast (`timeout`).
// - Every blocking control call runs on a thread of its own; the awaitables resume on the caller's
//   executor, so the event loop never blocks.
#include <chrono>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "rollout/admin.h"

namespace arlo::session::adapters {

struct CollectiveSessionOptions {
  std::size_t expected = 1;                   // workers that take part (a group forms once all asked)
  std::string flavor = "arlo";                // what the servers expect of the rendezvous: vllm | sglang | arlo
  std::chrono::milliseconds gather{2000};     // how long a forming group waits for the others
  std::chrono::milliseconds timeout{120000};  // each control call (a group's init, a version's broadcast)
};

// Thread-safety: every method may be called from any thread (the adapters' executors).
class TrainerCollective final : public rollout::CollectiveSession,
                                public std::enable_shared_from_this<TrainerCollective> {
 public:
  static std::shared_ptr<TrainerCollective> create(CollectiveSessionOptions options);
  ~TrainerCollective() override;

  // The trainer's newest announcement ({"weight_sync": {...}} as the bridge reports it, or the
  // announcement object itself): where its control store is.
  void announce(const nlohmann::json& announcement);

  boost::asio::awaitable<Result<nlohmann::json>> group(std::string worker, int world_size) override;
  boost::asio::awaitable<Result<nlohmann::json>> tensors() override;
  boost::asio::awaitable<Result<std::int64_t>> receiving(std::string worker, std::int64_t generation,
                                                         std::int64_t version) override;
  void failed(std::string worker, std::int64_t generation, std::string why) override;

 private:
  struct State;
  explicit TrainerCollective(CollectiveSessionOptions options);
  Result<nlohmann::json> group_blocking(const std::string& worker, int world_size);
  std::unique_ptr<State> st_;
};

}  // namespace arlo::session::adapters
