#pragma once
// The admin plane of an inference server (DESIGN.md section 3) behind one interface, with one
// adapter per dialect:
//
//   operation          arlo                      vllm                                   sglang
//   pause(mode)        POST /pause?mode=M        POST /pause?mode=M                     POST /pause_generation {"mode": keep->"in_place", abort->"abort"} (wait: unsupported)
//   resume()           POST /resume              POST /resume                           POST /continue_generation {}
//   prepare(update)    POST /weights/prepare     [first time: POST /init_weight_transfer_engine {"init_info"}]
//                        {version, weight_sync,    POST /start_weight_update {"is_checkpoint_format"}
//                         manifest}                POST /update_weights {"update_info"}  [first time, distributed: POST /init_weights_update_group {...}]
//                                                                                         distributed: POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache, weight_version}
//                                                                                         from disk (extra.model_path): POST /update_weights_from_disk {model_path, load_format, flush_cache, weight_version}
//   commit(version)    POST /weights/commit      POST /finish_weight_update {}          (applied by the update call; nothing to send)
//   weights()          GET /weights              (version last committed through this adapter)  GET /get_weight_version
//
// Every call runs under `call_timeout` with `retry` on connection errors and 5xx. Calls that are
// safe to repeat (pause, resume, weights, and arlo's prepare/commit which are keyed by version)
// are retried; vllm/sglang weight-transfer calls are not (a repeated NCCL receive would hang).
// Threading: use on the io_context thread that owns the http::Client.
#include <boost/asio/awaitable.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/http.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

enum class AdminDialect { kArlo, kVllm, kSglang };
Result<AdminDialect> parse_admin_dialect(std::string_view name);  // arlo | vllm | sglang
std::string_view to_string(AdminDialect dialect);

enum class PauseMode { kKeep, kWait, kAbort };
std::string_view to_string(PauseMode mode);

// A weight update in which the server and the trainer's publisher enter one collective (NCCL).
// One session serves every worker of a run (arlo run: weight_sync's CollectiveControl over the
// trainer's rendezvous store); unit tests pass a fake. Adapters use it as:
//
//   once per generation: info = group(worker, world_size); POST the server's group init with it
//   per version:         POST the metadata request (tensors()) and, while it is in flight,
//                        receiving(worker, v); the publisher broadcasts once every member receives
//   on a failed call:    failed(worker, why): the publisher stops broadcasting (the group is
//                        aborted; the next group() is a new generation on a new port)
//
// Threading: awaitables complete on the caller's executor; calls for different workers run
// concurrently (a group forms only once every member asked, or its gather window passed).
class CollectiveSession {
 public:
  virtual ~CollectiveSession() = default;
  // Where `worker`, a server of `world_size` GPUs, joins: {"generation", "master_address",
  // "master_port", "rank_offset", "world_size" (the group's), "group_name", "packed",
  // "packed_buffer_size_bytes", "packed_num_buffers"}. The same generation until a transfer fails.
  virtual boost::asio::awaitable<Result<Json>> group(std::string worker, int world_size) = 0;
  // The tensors of every version, in broadcast order: [{"name", "dtype" (torch name: "bfloat16"),
  // "shape"}]. Fixed for the run.
  virtual boost::asio::awaitable<Result<Json>> tensors() = 0;
  // `worker` is receiving `version` in `generation`. Completes once the publisher's broadcast ended,
  // with the version it sent (`version`, or a newer one when `version` was no longer staged).
  virtual boost::asio::awaitable<Result<std::int64_t>> receiving(std::string worker, std::int64_t generation,
                                                                 std::int64_t version) = 0;
  // `worker`'s side failed (its update call was refused or failed): abort the transfer.
  virtual void failed(std::string worker, std::int64_t generation, std::string why) = 0;
};

struct WeightUpdate {
  std::int64_t version = 0;
  // Set when the transport is collective (the weight_sync descriptor says so); then weight_sync
  // and extra carry no endpoint.
  std::shared_ptr<CollectiveSession> collective;
  Json weight_sync = Json::object();      // the receiver's weight-sync block (weight_sync/wire.h)
  Json manifest = Json::object();         // weight_sync manifest (tensor names, dtypes, shapes, ...)
  // Dialect-specific extras:
  //   vllm:   "init_info" (object, sent once to /init_weight_transfer_engine),
  //           "update_info" (object; default built from the manifest: names, dtype_names, shapes),
  //           "is_checkpoint_format" (bool, default true)
  //   sglang: "group" ({master_address, master_port, rank_offset, world_size, group_name, backend},
  //           sent once to /init_weights_update_group), "model_path" and "load_format" (filesystem)
  Json extra = Json::object();
};

struct WeightsInfo {
  std::optional<std::int64_t> version;
  std::string checksum;  // "" when the server does not report one
};

struct AdminOptions {
  Duration call_timeout = std::chrono::seconds(30);
  Duration transfer_timeout = std::chrono::minutes(10);  // update_weights-style calls
  http::RetryPolicy retry{3, std::chrono::milliseconds(100), std::chrono::seconds(2)};
};

class AdminClient {
 public:
  virtual ~AdminClient() = default;
  virtual AdminDialect dialect() const = 0;
  virtual const std::string& url() const = 0;
  virtual boost::asio::awaitable<Status> pause(PauseMode mode) = 0;
  virtual boost::asio::awaitable<Status> resume() = 0;
  virtual boost::asio::awaitable<Status> prepare_weights(const WeightUpdate& update) = 0;
  virtual boost::asio::awaitable<Status> commit_weights(std::int64_t version) = 0;
  virtual boost::asio::awaitable<Result<WeightsInfo>> weights() = 0;
};

// `client` must outlive the adapter. base_url: "http://host:port".
std::unique_ptr<AdminClient> make_admin_client(AdminDialect dialect, http::Client& client, std::string base_url,
                                               AdminOptions options = {});

}  // namespace arlo::rollout
