// A fake inference server on a real loopback socket (common/http.h Server) for the tests: it serves
// the OpenAI-compatible completion routes, answering "echo:<prompt>" with token
// ids = the text's bytes, logprobs -0.5 per token and version spans [[version, 0]], records what it
// was asked, and has the failure knobs the rollout tests turn (an injected status, a slow or parked
// answer, a failing or slow health check, a crash).
//
// Its dialect says which server it plays. Every dialect serves GET /health and POST
// /v1/completions (and /v1/chat/completions, answered by a test's on_completion). kArlo adds
// arlo-worker's admin plane (pause, resume, /weights/prepare, /weights/commit, GET /weights;
// inference_server_fake_arlo.cc), kVllm vLLM's (pause and resume, the dev-mode weight-transfer
// routes with each release's field rules, /weight_info, /collective_rpc, /weight_checker;
// inference_server_fake_vllm.cc), kSglang SGLang's (pause and continue, the weight-update groups,
// updates from a group or from disk, the version routes; inference_server_fake_sglang.cc). Each
// models the server's rules: a request out of order is a violation, recorded, reported to
// on_violation and answered 400, where the real server would fail or assert (kArlo answers as
// arlo-worker does: 400 or 409 with its message). What couples an update to a test's rendezvous
// and broadcast is the test's: on_group_init, on_weights_request. Every request, of every route,
// is in one log (requests, request_bodies, targets) in arrival order.
//
// Single-threaded: everything runs on, and is read from, the io_context's thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http.h"

namespace arlo::testing {

using Json = nlohmann::json;

// The keys of a JSON object (none for anything else): what the fakes compare a body's fields by.
std::set<std::string> json_keys(const Json& j);

enum class Dialect { kOpenAI, kArlo, kVllm, kSglang };

struct InferenceServerOptions {
  std::uint16_t port = 0;  // 0: any free port
  Dialect dialect = Dialect::kOpenAI;
  // kVllm: what GET /version answers ("0.28.0", "0.30.0rc1.dev42+g0123abc"); its minor number
  // decides the weight-transfer routes' field rules.
  std::string vllm_version = "0.28.0";
  // kVllm: what GET /get_world_size answers; kSglang: the tp_size of GET /get_server_info.
  int world_size = 1;
  // kVllm: serves GET /weight_info (releases before it do not).
  bool weight_info = true;
};

class InferenceServerFake {
 public:
  // Listens on 127.0.0.1:`port` (0: any free port); throws when it cannot.
  explicit InferenceServerFake(boost::asio::io_context& io, std::uint16_t port = 0);
  InferenceServerFake(boost::asio::io_context& io, InferenceServerOptions options);
  ~InferenceServerFake();
  InferenceServerFake(const InferenceServerFake&) = delete;
  InferenceServerFake& operator=(const InferenceServerFake&) = delete;

  // Listens again (after close()), on `port`.
  void start(std::uint16_t port);
  // Simulates a crash: listener and every connection closed at once; parked requests are dropped.
  void close();
  // Parked completion requests go on (and later ones are not parked).
  void release_all();

  // The completion response to `body` (what an unparked, unfailed request gets).
  Json answer(const Json& body) const;

  std::uint16_t port() const { return port_; }
  std::string url() const;
  Dialect dialect() const { return options_.dialect; }

  // What it was asked: every request as "POST /path" in arrival order, and, parallel, its body
  // (null when empty or not JSON) and its target as sent (query included: "/pause?mode=keep").
  std::vector<std::string> requests;
  std::vector<Json> request_bodies;
  std::vector<std::string> targets;
  // The body of the `nth` (from 0) `request` ("POST /path"); null when there is none.
  Json body_of(const std::string& request, int nth = 0) const;
  int count(const std::string& request) const;

  // The completion routes: what they were asked.
  int received = 0;          // completion requests
  std::vector<Json> bodies;  // every completion request's body, in arrival order
  int answered = 0;
  int held = 0;
  int health_calls = 0;

  // Failure knobs.
  int fail_next = 0;         // the next this many requests, of any route, answer 503 (a transient failure)
  bool hold = false;         // park completion requests until release_all() or close()
  int fail_with_status = 0;  // completions answer this error status (0: none)
  int health_status = 200;   // what GET /health answers
  std::chrono::milliseconds health_delay{0};  // GET /health answers after this long
  std::chrono::milliseconds answer_delay{0};  // completions answer after this long
  std::int64_t version = 0;                   // the weights version the answers carry
  std::function<void()> on_held;              // called as each request is parked
  // The text of sample `index` of a completion request (unset: "echo:<prompt>").
  std::function<std::string(const Json& body, int index)> reply;
  // Answers both completion routes (its path given) once the knobs let a request through, in place
  // of answer(): a test's own response shapes. Unset: /v1/chat/completions answers 404.
  std::function<http::Response(const std::string& path, const Json& body)> on_completion;

  // The admin planes (kArlo, kVllm, kSglang).
  bool paused = false;
  std::string weight_version;           // the version the server reports, as it reports it
  std::vector<std::string> violations;  // requests out of the server's order, each described
  // Called with each violation as it is found (a test fails itself here).
  std::function<void(const std::string&)> on_violation;
  // Called as a collective group init (vLLM's /init_weight_transfer_engine with a rendezvous, with
  // its init_info; SGLang's /init_weights_update_group, with its body) passes the server's checks,
  // where its workers would join the rendezvous: a response it gives answers the init instead (the
  // group is not made). Unset: the group is made at once.
  std::function<std::optional<http::Response>(const Json& init)> on_group_init;
  // Called as a collective update's metadata request (vLLM's /update_weights without arlo's
  // backend, SGLang's /update_weights_from_distributed) is accepted, with its body; the request is
  // answered once the returned awaitable completes: with the response it gives (a failed broadcast),
  // or, given none, as a successful update. Unset: the update succeeds at once.
  std::function<boost::asio::awaitable<std::optional<http::Response>>(Json body)> on_weights_request;
  // Records a violation, reports it to on_violation and returns the 400 that answers it (hooks
  // call it too).
  http::Response violation(std::string what);

  // kArlo's knobs and state; `version` is the version it serves (committed updates move it).
  struct ArloState {
    std::string checksum = "5eed0000c0ffee00";  // what a commit and GET /weights report
    bool fail_transfer = false;                 // a prepared transfer fails: its commit answers 500
    std::optional<std::int64_t> preparing;      // the version prepared and not yet committed
  } arlo;

  // kVllm's knobs and records.
  struct VllmState {
    bool fail_update = false;       // /update_weights answers 500 (out of memory)
    bool fail_init = false;         // /init_weight_transfer_engine answers 500 (an NCCL error)
    bool refuse_unique_id = false;  // a release whose init_info has no nccl_unique_id_b64 field: 400
    bool arlo_backend = false;      // started with --weight-transfer-config '{"backend": "arlo"}'
    std::int64_t ahead = 0;         // arlo's backend received this many versions past the one asked for
    std::string loaded_checksum = "9cb6f9b675c9fd58";  // what its two workers' arlo_weights() report
    Json checksums = {{"model.embed_tokens.weight", "aa11"}, {"lm_head.weight", "bb22"}};  // /weight_checker's
    std::vector<std::string> pause_targets;  // each /pause's target, query included
    std::vector<Json> streamed;              // arlo's backend: each update's update_info
    std::vector<int> init_ports;             // each group init's master_port (0: joined by unique id)
  } vllm;

  // kSglang's knobs.
  struct SglangState {
    bool legacy = false;         // from before /model_info carried the version
    int running = 0;             // requests in the server's batch
    int dp_size = 1;             // what /get_server_info reports
    bool refuse_update = false;  // /update_weights_from_distributed answers {"success": false}
  } sglang;

 private:
  using Handler = std::function<boost::asio::awaitable<http::Response>(Json body, http::Request req)>;
  class ArloRoutes;    // inference_server_fake_arlo.cc
  class VllmRoutes;    // inference_server_fake_vllm.cc
  class SglangRoutes;  // inference_server_fake_sglang.cc

  // Serves `path`, logging each request before `handler` answers it.
  void on(http::Verb verb, const std::string& path, Handler handler);
  void serve_arlo();
  void serve_vllm();
  void serve_sglang();
  // The metadata request of a collective update: on_weights_request's answer, if it gives one.
  boost::asio::awaitable<std::optional<http::Response>> weights_request(Json body);
  // A group init past the server's checks: on_group_init's answer, if it gives one.
  std::optional<http::Response> group_init(const Json& init);

  boost::asio::awaitable<http::Response> health();
  boost::asio::awaitable<http::Response> complete(std::string path, http::Request req);
  boost::asio::awaitable<void> wait_released();

  boost::asio::io_context& io_;
  InferenceServerOptions options_;
  std::unique_ptr<http::Server> server_;
  // Closed servers are kept until this fake goes away: their connection coroutines may still be
  // queued on the io_context.
  std::vector<std::unique_ptr<http::Server>> graveyard_;
  std::uint16_t port_ = 0;
  bool closed_ = false;
  bool released_ = false;
  boost::asio::steady_timer release_;  // cancelled once released: parked handlers go on

  // kVllm's layerwise-reload session: the engine initialised, an update started (and fed).
  int vllm_minor_ = 0;
  bool engine_ready_ = false;
  bool in_update_ = false;
  bool updated_since_start_ = false;
  // kSglang's weight-update groups, by name.
  std::set<std::string> groups_;
};

}  // namespace arlo::testing
