#include "session/verifiers_env.h"

#include <fmt/format.h>

#include "common/log.h"
#include "session/launch_plan.h"

#ifndef ARLO_VERIFIERS_SERVER_SCRIPT
#define ARLO_VERIFIERS_SERVER_SCRIPT "python/arlo_verifiers_server.py"
#endif

namespace arlo::session {

using json = nlohmann::json;

bool VerifiersEnv::wanted(const config::Config& cfg) { return cfg.string("env.kind") == "verifiers"; }

Result<std::unique_ptr<VerifiersEnv>> VerifiersEnv::create(const config::Config& cfg, std::string token) {
  std::unique_ptr<VerifiersEnv> v(new VerifiersEnv());
  v->embedded_ = cfg.string("env.verifiers_launch") != "external";
  v->address_ = cfg.string("env.verifiers_address");
  if (v->embedded_ && v->address_.empty()) {
    ARLO_ASSIGN_OR_RETURN(auto port, free_loopback_port());
    v->address_ = fmt::format("tcp://127.0.0.1:{}", port);
  }
  json env = cfg.map("env.verifiers_args");
  if (!env.is_object()) env = json::object();
  env["taskset"]["id"] = cfg.string("env.verifiers_env");
  if (!env.contains("agent") || !env["agent"].is_object() || !env["agent"].contains("runtime"))
    env["agent"]["runtime"] = {{"type", "subprocess"}};  // the harness runs on this machine
  v->env_config_ = std::move(env);
  v->concurrency_ = static_cast<int>(cfg.integer("env.verifiers_concurrency"));
  v->python_path_ = cfg.string("env.verifiers_python_path");
  v->token_ = std::move(token);
  v->client_ = std::make_unique<adapters::VerifiersClient>(v->address_);
  return v;
}

std::optional<ChildSpec> VerifiersEnv::child() const {
  if (!embedded_) return std::nullopt;
  ChildSpec spec;
  spec.name = kChild;
  spec.argv = {project_python(""), ARLO_VERIFIERS_SERVER_SCRIPT, "--address", address_, "--env", env_config_.dump()};
  if (concurrency_ > 0) spec.argv.insert(spec.argv.end(), {"--max-concurrent", std::to_string(concurrency_)});
  if (!python_path_.empty()) spec.argv.insert(spec.argv.end(), {"--path", python_path_});
  spec.env[kApiKeyVar] = token_.empty() ? "none" : token_;
  spec.env["PYTHONUNBUFFERED"] = "1";
  return spec;
}

Awaitable<Status> VerifiersEnv::wait_ready(std::chrono::steady_clock::time_point deadline) {
  // ZeroMQ queues the request until the server binds: one request waits for it.
  auto op = client_->health(deadline);
  Status st = co_await std::move(op);
  if (!st)
    co_return make_error(st.error().code(),
                         fmt::format("verifiers environment server at {} is not ready (env.verifiers_start_timeout_s): "
                                     "{}",
                                     address_, st.error().what()));
  co_return ok();
}

adapters::VerifiersRunRequest verifiers_run_request(const json& job) {
  adapters::VerifiersRunRequest r;
  const json& task = job.value("task", json::object());
  if (task.contains("prompt") && task["prompt"].is_string())
    r.task_data["prompt"] = task["prompt"];
  else
    r.task_data["prompt"] = task.value("messages", json::array());
  if (task.contains("id") && task["id"].is_string()) r.task_data["id"] = task["id"];
  const json& info = task.value("info", json::object());
  if (info.is_object() && info.contains("verifiers") && info["verifiers"].is_object())
    r.task_data.update(info["verifiers"]);
  r.client = {{"type", "eval"},
              {"base_url", job.value("base_url", std::string())},
              {"api_key_var", VerifiersEnv::kApiKeyVar},
              {"headers", job.value("headers", json::object())}};
  r.model = "arlo-policy";  // the gateway serves the run's model whatever a call names
  r.sampling = job.value("sampling", json::object());
  return r;
}

namespace {

// An episode's reward, or why it has none.
Result<double> episode_reward(const adapters::VerifiersEpisode& ep, const std::string& trajectory) {
  if (ep.model_calls > 0 && ep.failed_calls == ep.model_calls)
    return make_error(ErrorCode::kUnavailable,
                      fmt::format("verifiers episode of trajectory {}: every model call failed ({} of them): {}",
                                  trajectory, ep.model_calls, ep.errors.empty() ? "" : ep.errors.front()));
  if (!ep.errors.empty())
    ARLO_WARN_EVERY(10.0, "verifiers episode of trajectory {} ended with {} error(s), reward {}: {}", trajectory,
                    ep.errors.size(), ep.reward, ep.errors.front());
  return ep.reward;
}

}  // namespace

Gateway::Program VerifiersEnv::program() {
  return [this](json job, std::chrono::steady_clock::time_point deadline) { return episode(std::move(job), deadline); };
}

Awaitable<Result<double>> VerifiersEnv::episode(json job, std::chrono::steady_clock::time_point deadline) {
  const std::string trajectory = job.value("trajectory", std::string());
  auto request = verifiers_run_request(job);
  auto op = client_->run(std::move(request), deadline);
  Result<adapters::VerifiersEpisode> ep = co_await std::move(op);
  if (!ep) co_return std::unexpected(ep.error());
  co_return episode_reward(*ep, trajectory);
}

std::size_t VerifiersEnv::server_died(const std::string& reason) { return client_->fail_in_flight(reason); }

}  // namespace arlo::session
