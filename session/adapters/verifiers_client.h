#pragma once
// The client side of verifiers' environment server (env.kind: verifiers; docs/environments.md,
// "verifiers environments"): a ZeroMQ DEALER speaking the server's protocol as verifiers 0.4 defines
// it (verifiers/v1/serve): each request is three frames [request_id, method, msgpack payload] with
// method "run", "cancel" or "health"; the server answers [request_id, "delta", msgpack] zero or more
// times (a run's traces as they grow) and then [request_id, "reply", msgpack] once. msgpack goes
// through nlohmann-json's codec (binary fields become json binary).
//
// What arlo keeps of an episode (VerifiersEpisode) is assembled from the deltas: per trace the
// number of message nodes and model calls (checked against the reply's trace summaries, as verifiers'
// own client does), its rewards, ok flag and errors. The tokens stay with the policy gateway, which
// recorded every model call the environment made (token-in/token-out); the episode gives the reward.
//
// Threading: one thread owns the socket (ZeroMQ sockets are not thread-safe); callers on any
// io_context hand it requests through a locked queue and an eventfd it polls beside the socket, and
// get their results by a post to their own executor, so nothing blocks the orchestrator's loop. A
// request's deadline is kept on that thread: past it the request fails with kTimeout and a run gets a
// "cancel" sent to the server. A malformed frame or message from the server fails only the request it
// names (or is counted and dropped when it names none), with an error naming the field.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "common/result.h"

namespace arlo::session::adapters {

// One finished episode, as arlo uses it.
struct VerifiersEpisode {
  double reward = 0;                // sum over the traces of each named reward's score x weight
  bool ok = false;                  // every trace completed without error
  std::size_t traces = 0;           // traces in the episode (one per agent run)
  std::size_t model_calls = 0;      // model calls the environment made (failed ones included)
  std::size_t failed_calls = 0;     // of which failed (their error is in `errors`)
  std::size_t nodes = 0;            // message nodes over all traces
  std::vector<std::string> errors;  // the episode's and its traces' error messages, in order
  nlohmann::json head;              // the reply's episode head (id, env, task, errors, ...)
};

// What one run request carries (verifiers' RunRequest).
struct VerifiersRunRequest {
  nlohmann::json task_data = nlohmann::json::object();  // the taskset's TaskData fields (prompt, ...)
  nlohmann::json client = nlohmann::json::object();     // ClientConfig: {"type": "eval", "base_url", ...}
  std::string model;
  nlohmann::json sampling = nlohmann::json::object();  // {"temperature", "top_p", "max_tokens"}
};

// The wire, without the socket: encoding requests and assembling what the server sends back.
namespace verifiers_wire {

std::string pack(const nlohmann::json& payload);
// msgpack bytes to json; a parse error names `what` (e.g. "run reply").
Result<nlohmann::json> unpack(std::string_view bytes, std::string_view what);

// A run's growing episode: apply each delta, then finish with the reply.
class EpisodeAssembly {
 public:
  Status apply(const nlohmann::json& delta);
  Result<VerifiersEpisode> finish(const nlohmann::json& reply) const;

 private:
  struct Trace {
    std::string id;
    std::size_t nodes = 0, calls = 0, failed_calls = 0;
    nlohmann::json rewards = nlohmann::json::object();
    bool ok = false;
    std::vector<std::string> errors;
  };
  std::vector<Trace> traces_;
};

// A reply's standing: {"success": true} passes; success false (or missing, or not a bool) is an error
// carrying the server's `error` text.
Status check_reply(const nlohmann::json& reply, std::string_view what);

}  // namespace verifiers_wire

struct VerifiersClientStats {
  std::uint64_t runs = 0;              // run requests sent
  std::uint64_t cancels = 0;           // cancel requests sent (deadline passed, or cancel_all)
  std::uint64_t malformed = 0;         // frames or messages from the server that could not be read
  std::uint64_t failed_in_flight = 0;  // requests failed by fail_in_flight (the server went away)
};

class VerifiersClient {
 public:
  // Connects (lazily, as ZeroMQ does) to `address` (tcp://host:port) and starts the socket's thread.
  explicit VerifiersClient(std::string address);
  ~VerifiersClient();  // fails what is in flight (kCancelled) and joins the thread
  VerifiersClient(const VerifiersClient&) = delete;
  VerifiersClient& operator=(const VerifiersClient&) = delete;

  // One episode. Past `deadline` it fails with kTimeout and the server is asked to cancel the run.
  Awaitable<Result<VerifiersEpisode>> run(VerifiersRunRequest request, std::chrono::steady_clock::time_point deadline);
  // Whether the server answers a health request before `deadline` (an error says why not).
  Awaitable<Status> health(std::chrono::steady_clock::time_point deadline);
  // Fails every request in flight with kUnavailable and `reason` (the server died; its runs are lost),
  // without cancels. Returns how many it failed.
  std::size_t fail_in_flight(std::string reason);
  // Sends "cancel" for every run in flight and fails them with kCancelled (arlo abandons them).
  std::size_t cancel_all();
  std::size_t in_flight() const;
  VerifiersClientStats stats() const;
  const std::string& address() const { return address_; }

  struct Impl;  // verifiers_client.cc

 private:
  std::string address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arlo::session::adapters
