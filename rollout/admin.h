#pragma once
// The admin plane of an inference server (docs/vllm.md, docs/sglang.md) behind one interface, with one
// adapter per dialect. What each call sends, per dialect (W = the adapter's url, the worker's name in
// the CollectiveSession; C = update.collective; v = update.version; v' = the version C sent):
//
// arlo (arlo-worker)
//   pause(mode)       POST /pause?mode=keep|abort|wait
//   prepare(update)   POST /weights/prepare {version, weight_sync, manifest}
//   commit(v)         POST /weights/commit
//   resume()          POST /resume
//   weights()         GET /weights
//
// vllm (its native weight-transfer API, >= 0.22)
//   pause(keep)       POST /pause?mode=keep&clear_cache=false (kept requests need their KV cache)
//   pause(abort|wait) POST /pause?mode=abort | /pause?mode=wait
//   prepare(update)   once: GET /version, GET /get_world_size; then
//     with C          per generation of C: POST /init_weight_transfer_engine {"init_info"} from
//                     C->group(W, world_size); POST /start_weight_update ({"is_checkpoint_format":
//                     true} up to 0.27, {} from 0.28); POST /update_weights {"update_info"} in flight
//                     while C->receiving(W, gen, v)
//     without C       arlo's transports through the "arlo" backend (python/arlo_vllm): once POST
//                     /init_weight_transfer_engine {}; POST /start_weight_update; POST /update_weights
//                     {version, weight_sync}; POST /collective_rpc arlo_weights (what the workers loaded)
//   commit(v)         POST /finish_weight_update {"weight_version": "v'"}
//   resume()          POST /resume; with verify_weights then POST /weight_checker
//                     {"action": "checksum" | "compare"}
//   weights()         GET /weight_info (else the version committed here); with the arlo backend
//                     also POST /collective_rpc arlo_weights (the loaded checksum)
//
// sglang
//   pause(keep)       POST /pause_generation {"mode": "in_place"} (flush_cache false)
//   pause(abort)      POST /pause_generation {"mode": "abort"} (nothing runs: flush_cache true)
//   pause(wait)       POST /pause_generation {"mode": "in_place"} (arlo drained its dispatcher first,
//                     so nothing runs: flush_cache true)
//   prepare(update)   once: GET /get_server_info (tp_size; /server_info where that is gone); then
//     with C          per generation of C: POST /init_weights_update_group {master_address,
//                     master_port, rank_offset, world_size, group_name, backend: "nccl"}; POST
//                     /update_weights_from_distributed {names, dtypes, shapes, group_name,
//                     flush_cache, weight_version: "v"} in flight while C->receiving(W, gen, v);
//                     when v' != v, POST /update_weight_version {"new_version": "v'"}
//     without C       POST /update_weights_from_disk {model_path, load_format, flush_cache,
//                     weight_version} (extra.model_path)
//   commit(v)         nothing to send (the update call applied it)
//   resume()          POST /continue_generation {}
//   weights()         GET /model_info (GET /get_weight_version where /model_info is 404)
//
// vLLM body shapes by the version GET /version reports (AdminOptions::server_version overrides;
// a dev build counts as its x.y.z): before 0.22 refused (no /start_weight_update); 0.22-0.27 init_info
// {master_address, master_port, rank_offset, world_size}, update_info adds packed,
// packed_buffer_size_bytes, packed_num_buffers; 0.28 moves those three into init_info; from 0.29,
// when C->group() carries nccl_unique_id_b64, init_info carries it instead of master_address/port.
//
// Every prepare asks C->group(W, ...) and joins when the generation is new (the first update, after a
// failure, or when another worker's rejoin formed a new group); SGLang first destroys its previous
// group (POST /destroy_weights_update_group), which holds a communicator on the server's GPUs.
// A failed init, start or metadata call calls C->failed(W, gen, why) (a failed receiving() needs no
// call). Every call runs under `call_timeout` (transfer calls: `transfer_timeout`) with `retry`
// on connection errors and 5xx. Calls that are safe to repeat (pause, resume, weights, probes, and
// arlo's prepare/commit which are keyed by version) are retried; vllm/sglang weight-transfer calls
// are not (a repeated NCCL receive would hang): the orchestrator caps those retries.
// Threading: use on the io_context thread that owns the http::Client.
#include <boost/asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http.h"
#include "common/option_spec.h"
#include "common/registry.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

// The server families arlo knows the quirks of: their admin calls (above) and how their
// OpenAI-compatible completions report token data (rollout/openai.h). A registered dialect
// (AdminDialectInfo) names the family its completions follow.
enum class AdminDialect { kArlo, kVllm, kSglang };
// The family of the registered dialect `name` (inference.kind); the error lists the registered names.
Result<AdminDialect> parse_admin_dialect(std::string_view name);
std::string_view to_string(AdminDialect dialect);

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
  // "packed_buffer_size_bytes", "packed_num_buffers"}, and optionally "nccl_unique_id_b64" (standard
  // base64 of the 128-byte id, for servers that take the id in the init request instead of reading
  // it from the store). The same generation until a transfer fails.
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
  Json weight_sync = Json::object();  // the receiver's weight-sync block (weight_sync/wire.h)
  Json manifest = Json::object();     // weight_sync manifest (tensor names, dtypes, shapes, ...)
  // Dialect-specific extras: sglang: "model_path" and "load_format" (a version on disk, without
  // `collective`).
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
  // vllm: the server's version as GET /version would report it ("0.28.0"); "" probes it.
  std::string server_version;
  // vllm: after each committed update, checksum every parameter (/weight_checker) on resume and fail
  // unless the server reports some; with a baseline ({name: sha256 hex}), fail unless it matches.
  bool verify_weights = false;
  Json verify_baseline = Json::object();
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

// What a dialect's servers can take from arlo. `arlo check-config` and `arlo run` refuse the
// weight_sync transports and topologies they cannot run with (session/server_support.h), and
// `arlo run` builds its updates and tasks by them (session/); nothing outside the dialect's entry
// knows a dialect by name.
struct ServerCapabilities {
  std::string title;              // the servers' name in messages ("vLLM")
  bool streams = false;           // receives arlo's own weight stream (tcp, shm: the receiver block)
  bool loads_durable = false;     // loads a version from its directory through the admin API
  bool relays = false;            // a worker can serve the next one (weight_sync.topology chain)
  bool host_memory = false;       // holds its weights in host memory (a device-only transport cannot reach them)
  bool joins_collective = false;  // its adapter joins a collective group (CollectiveSession)
  // A version on disk is named to it by its directory of shards (WeightUpdate::extra.model_path)
  // rather than by arlo's receiver block.
  bool takes_model_path = false;
  // Serves the policy of arlo's built-in character tokenizer: arlo sends it prompt token ids (and
  // can run the supervised warm-up); other servers get text and report their own tokenizer's ids.
  bool builtin_tokenizer = false;
};

// One registered admin dialect: one file under rollout/admin_dialects/ defining
// `AdminDialectInfo <name>_admin_dialect()` and one line in rollout/admin_dialects/registry.inc.
// inference.kind's allowed values and docs come from the registered dialects; so do what its
// servers can take (`arlo check-config`) and the adapter `arlo run` drives them with.
struct AdminDialectInfo {
  // What a config calls a name, in errors: "unknown inference.kind 'x': use ...".
  static constexpr const char* kWhat = "inference.kind";
  std::string name;  // the value of inference.kind
  std::string doc;   // a few words for docs/configuration.md ("" when the name says it)
  // The family its completions follow (rollout/openai.h) and its servers expect of a collective
  // group's rendezvous (weight_sync's nccl member flavor).
  AdminDialect completions = AdminDialect::kArlo;
  ServerCapabilities server;
  std::vector<OptionSpec> options;  // its own inference.* keys (none of the built-ins has any)
  // `client` must outlive the adapter. base_url: "http://host:port".
  std::function<std::unique_ptr<AdminClient>(http::Client& client, std::string base_url, AdminOptions options)> make;
};
// Every registered dialect, in registration order (rollout/admin_dialects/registry.inc).
const ExtensionRegistry<AdminDialectInfo>& admin_dialects();
// The dialect named `name`; the error lists the registered names.
inline Result<const AdminDialectInfo*> find_admin_dialect(std::string_view name) { return admin_dialects().find(name); }

// `client` must outlive the adapter. base_url: "http://host:port".
std::unique_ptr<AdminClient> make_admin_client(AdminDialect dialect, http::Client& client, std::string base_url,
                                               AdminOptions options = {});
// The registered dialect `dialect`'s adapter; nullptr when none has that name (find_admin_dialect says why).
std::unique_ptr<AdminClient> make_admin_client(std::string_view dialect, http::Client& client, std::string base_url,
                                               AdminOptions options = {});

}  // namespace arlo::rollout
