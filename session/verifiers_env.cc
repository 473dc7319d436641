#include "session/verifiers_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "config/schema.h"
#include "rollout/environment.h"
#include "session/config_options.h"
#include "session/launch_plan.h"

#ifndef ARLO_VERIFIERS_SERVER_SCRIPT
#define ARLO_VERIFIERS_SERVER_SCRIPT "python/arlo_verifiers_server.py"
#endif

namespace arlo::session {

using json = nlohmann::json;

namespace {

constexpr const char* kKind = "verifiers";

// The verifiers kind's options `given`, checked and defaulted (verifiers_args too: {}), so two
// environments given the same compare equal.
Result<json> resolved_options(const json& given) {
  ARLO_ASSIGN_OR_RETURN(json options, rollout::resolve_environment_options(kKind, given));
  if (!options.contains("verifiers_args") || options["verifiers_args"].is_null())
    options["verifiers_args"] = json::object();
  return options;
}

// The verifiers kind's options as the env.verifiers_* keys give them (env.kind or eval.env_kind).
Result<json> env_keys_options(const config::Config& cfg) {
  ARLO_ASSIGN_OR_RETURN(const rollout::EnvironmentKind* k, rollout::find_environment_kind(kKind));
  json options = json::object();
  for (const auto& o : k->options)
    if (o.config_key && cfg.has("env." + o.key)) options[o.key] = config::option_value(cfg, "env." + o.key, o.type);
  return resolved_options(options);
}

// Eval's environment (eval.env_kind verifiers): the one of `out` with the same options, or its own.
Status add_eval_source(const config::Config& cfg, std::vector<VerifiersSource>& out) {
  ARLO_ASSIGN_OR_RETURN(json options, env_keys_options(cfg));
  for (auto& s : out) {
    if (s.options == options) {
      if (std::ranges::find(s.envs, kKind) == s.envs.end()) s.envs.push_back(kKind);
      return ok();
    }
    if (std::ranges::find(s.envs, kKind) != s.envs.end())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("eval.env_kind verifiers runs eval.env_path's tasks (env 'verifiers') on the "
                                    "environment of the env.verifiers_* keys ({}), but {} names its source "
                                    "'verifiers' with other options: give that source another name",
                                    cfg.where("eval.env_kind"), s.where));
  }
  out.push_back({{kKind}, VerifiersEnv::kChild, "env", std::move(options)});
  return ok();
}

}  // namespace

Result<std::vector<VerifiersSource>> verifiers_sources(const config::Config& cfg) {
  std::vector<VerifiersSource> out;
  const auto& items = cfg.objects("env.sources");
  if (items.empty() && cfg.string("env.kind") == kKind) {
    ARLO_ASSIGN_OR_RETURN(json options, env_keys_options(cfg));
    out.push_back({{kKind}, VerifiersEnv::kChild, "env", std::move(options)});
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].string("kind") != kKind) continue;
    const std::string where = fmt::format("env.sources[{}].options", i);
    auto options = resolved_options(items[i].map("options"));
    if (!options) return std::unexpected(Error(options.error()).with_context(where));
    const std::string name = source_name(items[i]);
    out.push_back({{name}, fmt::format("{}-{}", VerifiersEnv::kChild, name), where, std::move(*options)});
  }
  if (cfg.integer("eval.interval") > 0 && cfg.string("eval.env_kind") == kKind) ARLO_TRY(add_eval_source(cfg, out));
  return out;
}

Result<std::unique_ptr<VerifiersEnv>> VerifiersEnv::create(VerifiersSource source, std::string token) {
  std::unique_ptr<VerifiersEnv> v(new VerifiersEnv());
  const json& o = source.options;
  v->embedded_ = o.value("verifiers_launch", std::string("embedded")) != "external";
  v->address_ = o.value("verifiers_address", std::string());
  if (v->embedded_ && v->address_.empty()) {
    ARLO_ASSIGN_OR_RETURN(auto port, free_loopback_port());
    v->address_ = fmt::format("tcp://127.0.0.1:{}", port);
  }
  json env = o.value("verifiers_args", json::object());
  if (!env.is_object()) env = json::object();
  env["taskset"]["id"] = o.value("verifiers_env", std::string());
  if (!env.contains("agent") || !env["agent"].is_object() || !env["agent"].contains("runtime"))
    env["agent"]["runtime"] = {{"type", "subprocess"}};  // the harness runs on this machine
  v->env_config_ = std::move(env);
  v->concurrency_ = o.value("verifiers_concurrency", 0);
  v->start_timeout_s_ = o.value("verifiers_start_timeout_s", 120.0);
  v->python_path_ = o.value("verifiers_python_path", std::string());
  v->token_ = std::move(token);
  v->client_ = std::make_unique<adapters::VerifiersClient>(v->address_);
  v->source_ = std::move(source);
  return v;
}

std::optional<ChildSpec> VerifiersEnv::child() const {
  if (!embedded_) return std::nullopt;
  ChildSpec spec;
  spec.name = source_.child;
  spec.argv = {project_python(""), ARLO_VERIFIERS_SERVER_SCRIPT, "--address", address_, "--env", env_config_.dump()};
  if (concurrency_ > 0) spec.argv.insert(spec.argv.end(), {"--max-concurrent", std::to_string(concurrency_)});
  if (!python_path_.empty()) spec.argv.insert(spec.argv.end(), {"--path", python_path_});
  spec.env[kApiKeyVar] = token_.empty() ? "none" : token_;
  spec.env["PYTHONUNBUFFERED"] = "1";
  return spec;
}

Awaitable<Status> VerifiersEnv::wait_ready() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::llround(1000 * start_timeout_s_));
  // ZeroMQ queues the request until the server binds: one request waits for it.
  auto op = client_->health(deadline);
  Status st = co_await std::move(op);
  if (!st)
    co_return make_error(st.error().code(),
                         fmt::format("verifiers environment server at {} is not ready ({}.verifiers_start_timeout_s): "
                                     "{}",
                                     address_, source_.where, st.error().what()));
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
