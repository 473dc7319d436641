#pragma once
// arlo-worker's HTTP surface over the generation engine.
//
// Data plane: POST /v1/completions, POST /v1/chat/completions, POST /tokenize (openai_api.h), GET /v1/models,
// GET /health (200 with the version held; 503 before the worker holds one), GET /metrics.
// Admin plane: POST /pause?mode=keep|wait|abort (answers once paused), POST /resume,
// POST /weights/prepare {version, weight_sync: the receiver's weight-sync block (weight_sync/wire.h),
// manifest?} (starts receiving that version through a weight_sync subscriber into a staging copy
// of the model, answers at once), POST /weights/commit {version?} (waits for the
// transfer, then installs it at the next token boundary; a failed transfer answers 500 naming the
// pull's reason, again to a retried commit, and the previous version keeps serving),
// GET /weights {version, checksum, preparing}. With
// http::ServerOptions::token set, every route but /health wants "Authorization: Bearer <token>"
// (401 otherwise); /weights/prepare loads only from the sources WorkerOptions allows (403 otherwise).
//
// The data plane is serving.cc, the admin plane admin_plane.cc (which sources an update may name:
// weight_sources.h), the state they share worker_impl.h, the route table worker_server.cc.
//
// Threads: handlers run on the io_context thread and never block: generation runs on the engine
// thread, weight transfers on a dedicated thread; both hand results back by posting to the
// io_context. All state below is owned by the io_context thread.
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/http.h"
#include "common/metrics.h"
#include "reference/engine.h"
#include "reference/model.h"
#include "weight_sync/weight_sync.h"

namespace arlo::worker {

struct WorkerOptions {
  std::string model_name = "arlo-policy";
  reference::ModelConfig model;
  reference::EngineOptions engine;
  weight_sync::Options weight_sync;  // this worker's block (--weight-sync); each update's block goes over it
  // The sources a /weights/prepare block may name (never just what a request says):
  // - the keys this worker's own block sets (`own_block`, as given) are pinned: a block naming
  //   another transport or another value for one of them is refused;
  // - a path option (filesystem's dir; any value holding a '/') must lie inside one of the directories of
  //   `allow_weights_from` (absolute paths) or be the one the own block names;
  // - an address option ("address", "*_address") must name a host of `allow_weights_from`
  //   ("host" or "host:port" entries) or of the own block; with no host listed, loopback only.
  // Refused blocks get 403 with the reason.
  nlohmann::json own_block = nlohmann::json::object();
  std::vector<std::string> allow_weights_from;
};

class WorkerServer {
 public:
  WorkerServer(boost::asio::io_context& io, http::ServerOptions http_options, WorkerOptions options);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Serves `model` as `version` from now on (weights loaded at start-up). Blocks until applied;
  // call before start() or from outside the io_context thread.
  Status install(std::shared_ptr<reference::Model> model, std::int64_t version);
  Result<std::uint16_t> start();
  void close();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace arlo::worker
