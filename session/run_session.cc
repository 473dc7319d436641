// RunSession (run_session.h): prepares a run from the configuration, then starts (embedded) or finds
// (external) the inference workers and the trainer, wires the orchestrator to them through its real
// adapters, runs the event loop until the run ends, and stops every child on the way out.
#include "session/run_session.h"

#include <sys/wait.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/async/coro.h"
#include "common/async/io_thread.h"
#include "common/async/thread_pool.h"
#include "common/auth.h"
#include "config/config.h"
#include "common/file.h"
#include "common/log.h"
#include "common/metrics.h"
#include "session/adapters/agent_inference.h"
#include "session/adapters/bridge_trainer.h"
#include "session/adapters/environment_adapter.h"
#include "session/adapters/rollout_adapters.h"
#include "session/config_options.h"
#include "session/gateway.h"
#include "orchestrator/orchestrator.h"
#include "rollout/reward_scorer.h"
#include "session/monitors.h"
#include "session/reporter.h"
#include "session/launch_plan.h"
#include "session/replay.h"
#include "session/rollout_parts.h"
#include "session/supervisor.h"
#include "session/verifiers_env.h"
#include "rollout/admin.h"
#include "session/trainer_command.h"
#include "web/assets.h"
#include "weight_sync/transport.h"

namespace arlo::session {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// The exit status arlo's programs give a usage or configuration error (apps/arlo/commands.h
// kExitBadConfig): a child that exits with it would fail the same way if restarted.
constexpr int kChildUsageError = 2;
// How long the monitors get at the end to log the last records and the summary.
constexpr auto kMonitorGrace = std::chrono::seconds(30);

rollout::Duration seconds(double s) {
  return std::chrono::duration_cast<rollout::Duration>(std::chrono::duration<double>(s));
}

// Everything one run needs, built from the configuration before the event loop starts.
struct Setup {
  config::Config cfg;
  orch::Options options;
  RolloutParts parts;
  LaunchPlan plan;
  std::string run_dir;  // absolute
};

// What a run leaves in its directory (and the weights directory): a new run must not mix with it.
constexpr const char* kRunEntries[] = {
    "orchestrator", "checkpoints", "rollouts",    "weights", "metrics.jsonl",  "trainer_metrics.jsonl",
    "summary.json", "monitors",    "tensorboard", "wandb",   "rollouts.jsonl", "supervision.jsonl"};

// Without --resume, a directory holding a previous run is refused (its trainer checkpoint and
// weights would silently be picked up), unless `overwrite` removes what the run left there.
Status claim_run_dir(const fs::path& run_dir, const fs::path& weights_dir, bool overwrite, const config::Config& cfg) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const char* name : kRunEntries)
    if (fs::exists(run_dir / name, ec)) found.push_back(run_dir / name);
  // A weights directory elsewhere (weight_sync.dir): its version directories.
  if (weights_dir.lexically_normal() != (run_dir / "weights").lexically_normal())
    for (fs::directory_iterator it(weights_dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().starts_with("v") && it->is_directory()) found.push_back(it->path());
  if (found.empty()) return ok();
  if (!overwrite)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("run.dir {} holds a previous run ({}{}; {}): pass --resume to continue it, "
                    "--overwrite to start over, or choose another run.dir",
                    run_dir.string(), found.front().string(),
                    found.size() > 1 ? fmt::format(" and {} more", found.size() - 1) : "", cfg.where("run.dir")));
  ARLO_WARN("arlo run: --overwrite: removing the previous run in {}", run_dir.string());
  for (const auto& p : found) {
    fs::remove_all(p, ec);
    if (ec) return make_error(ErrorCode::kIo, fmt::format("--overwrite: removing {}: {}", p.string(), ec.message()));
  }
  return ok();
}

Result<Setup> prepare(const config::Config& cfg, bool resume, bool overwrite) {
  Setup s{cfg, {}, {}, {}, {}};
  ARLO_ASSIGN_OR_RETURN(s.options, options_from_config(cfg));
  s.options.resume = resume;
  std::error_code ec;
  s.run_dir = fs::absolute(s.options.run_dir).lexically_normal().string();
  fs::create_directories(s.run_dir, ec);
  if (ec)
    return make_error(ErrorCode::kIo, fmt::format("creating the run directory {}: {} ({})", s.run_dir, ec.message(),
                                                  cfg.where("run.dir")));
  s.options.run_dir = s.run_dir;
  // With a streaming transport a version reaches the workers only through an update the
  // orchestrator asks for: start from no version, so v0 (announced by the trainer; seeded workers
  // already hold it) is confirmed with every worker before the first rollout.
  ARLO_ASSIGN_OR_RETURN(const auto* transport, weight_sync::find_transport(cfg.string("weight_sync.transport")));
  if (cfg.string("trainer.launch") == "embedded" && !transport->capabilities.durable)
    s.options.initial_version = arlo::kNoVersion;
  // Your own trainer (trainer.launch: command or external) publishes v0 from its own
  // initialisation, and external servers hold whatever they loaded: no rollout before the trainer's
  // v0 reached every worker.
  if (cfg.string("trainer.launch") != "embedded" || cfg.string("inference.launch") != "embedded")
    s.options.initial_version = arlo::kNoVersion;
  ARLO_ASSIGN_OR_RETURN(s.parts, build_rollout_parts(cfg));
  if (auto v = verifiers_sources(cfg); !v) return std::unexpected(v.error());  // a name clash: before anything starts
  ARLO_ASSIGN_OR_RETURN(s.plan, plan_launch(cfg, s.run_dir));
  if (!resume) ARLO_TRY(claim_run_dir(s.run_dir, s.plan.weight_sync.weights_dir, overwrite, cfg));
  ARLO_TRY(write_run_config(s.run_dir, cfg));                      // what `arlo replay` scores with
  ARLO_ASSIGN_OR_RETURN(s.plan.token, run_token(cfg, s.run_dir));  // the children inherit it ($ARLO_TOKEN)
  // The status page stays open on loopback (a local browser sends no token); elsewhere it is locked.
  if (!auth::is_loopback(s.options.status_bind)) s.options.status_token = s.plan.token;
  return s;
}

rollout::ScorerOptions scorer_options(const config::Config& cfg) {
  rollout::ScorerOptions so;
  so.timeout = seconds(cfg.number("reward.timeout_s"));
  if (auto p = rollout::parse_failure_policy(cfg.string("reward.on_failure"))) so.on_failure = *p;
  so.assign_value = cfg.number("reward.failure_value");
  return so;
}

rollout::AdvantageOptions advantage_options(const config::Config& cfg) {
  rollout::AdvantageOptions adv;
  if (auto k = rollout::parse_advantage_kind(cfg.string("orchestrator.advantage"))) adv.kind = *k;
  if (auto t = rollout::parse_truncation_policy(cfg.string("orchestrator.overlong"))) adv.truncated = *t;
  adv.length_penalty = cfg.number("orchestrator.length_penalty");
  adv.filter_equal_reward_groups = cfg.boolean("orchestrator.filter_equal_reward_groups");
  return adv;
}

bridge::ServerOptions bridge_options(const config::Config& cfg, const std::string& run_dir) {
  bridge::ServerOptions bo;
  bo.transport = cfg.string("bridge.transport");
  bo.run_dir = run_dir;
  bo.max_pending_batches = static_cast<std::size_t>(cfg.integer("bridge.max_pending_batches"));
  bo.num_ranks = static_cast<int>(cfg.integer("trainer.num_ranks"));
  if (bo.transport == "socket") {
    const auto& address = cfg.string("bridge.address");
    const auto colon = address.rfind(':');
    bo.bind = colon == std::string::npos ? address : address.substr(0, colon);
    if (colon != std::string::npos) bo.port = static_cast<std::uint16_t>(std::atoi(address.c_str() + colon + 1));
  }
  return bo;
}

}  // namespace

// The run on one event loop. Owns the children; execute() returns how the run ended.
class RunSession::Impl {
 public:
  Impl(Setup setup, orch::RunObserver* observer)
      : s_(std::move(setup)), observer_(observer), monitors_(io_, monitor_specs(s_.cfg, s_.run_dir)) {}

  const std::string& run_dir() const { return s_.run_dir; }

  // Starts the workers, builds the adapters in dependency order and runs the loop over them. The
  // network thread is stopped before the pool and its clients are destroyed, on every path.
  RunOutcome execute() {
    if (auto st = start_workers(); !st) return fail(st.error().what());
    auto found = rollout::find_admin_dialect(s_.cfg.string("inference.kind"));
    if (!found) return fail(found.error().what());
    const rollout::AdminDialectInfo& dialect = **found;
    // Requests to the workers live on their own thread (see IoThread); the loop only orchestrates.
    IoThread network(kNetworkThreadNice);
    rollout::InferencePool pool(network.context(), pool_options());
    std::unique_ptr<Gateway> gateway;  // destroyed after the network thread it serves on has stopped
    struct StopNetworkFirst {          // before the pool and its clients are destroyed, on every path
      IoThread& network;
      std::vector<std::unique_ptr<VerifiersEnv>>& verifiers;
      // The verifiers clients go before the network thread's context: their replies post to it.
      ~StopNetworkFirst() {
        network.stop();
        verifiers.clear();
      }
    } stop_network_first{network, verifiers_};
    auto admins = add_workers(pool, dialect);

    RunTasks tasks(s_.parts.stream, s_.parts.tokenize);
    rollout::RewardScorer reward(io_, s_.parts.reward, scorer_options(s_.cfg));
    adapters::RolloutScorer scorer(reward, advantage_options(s_.cfg));
    auto bo = bridge_options(s_.cfg, s_.run_dir);
    bo.token = s_.plan.token;
    auto server = bridge::BridgeServer::create(io_, bo);
    if (!server) return fail(server.error().what());
    ThreadPool pack_threads(1);
    bridge::PackOptions pack;
    pack.seq_len = static_cast<int>(s_.cfg.integer("orchestrator.seq_len"));
    pack.num_ranks = bo.num_ranks;
    adapters::BridgeTrainer trainer(io_, **server, pack_threads, pack);
    adapters::RolloutInference inference(pool, std::move(admins), update_describer(dialect.server), "",
                                         network.executor(), dialect.completions);
    std::optional<adapters::AgentInference> agents;  // agent tasks through the policy gateway
    if (auto st = start_gateway(network, pool, dialect.completions, gateway); !st) return fail(st.error().what());
    if (gateway) agents.emplace(inference, *gateway, network.executor());
    if (auto st = start_verifiers(network, gateway.get()); !st) return fail(st.error().what());
    inference_port_ = agents ? static_cast<orch::InferencePort*>(&*agents) : &inference;
    // Multi-turn tasks: what an environment adds is tokenized by the worker that served the trajectory.
    adapters::WorkerTokenizer env_tokenizer(pool.client(), network.executor());
    adapters::EnvironmentAdapter environment(s_.parts.environments, env_tokenizer);
    return run_loop(Adapters{network, pool, inference, tasks, scorer, trainer, **server, environment});
  }

 private:
  // What execute() built, for the loop that runs it.
  struct Adapters {
    IoThread& network;
    rollout::InferencePool& pool;
    adapters::RolloutInference& inference;
    RunTasks& tasks;
    adapters::RolloutScorer& scorer;
    adapters::BridgeTrainer& trainer;
    bridge::BridgeServer& server;
    adapters::EnvironmentAdapter& environment;
  };

  bool embedded_inference() const { return s_.cfg.string("inference.launch") == "embedded"; }
  bool embedded_trainer() const { return s_.cfg.string("trainer.launch") == "embedded"; }

  // Spawns the embedded workers, each supervised under its own RestartPolicy and probed on /health
  // (restarted with its restart_argv it answers 503 until updated: any answer counts then);
  // external ones are only probed. Fails on the first worker that cannot be started.
  Status start_workers() {
    std::map<std::string, std::string> urls(s_.plan.workers.begin(), s_.plan.workers.end());
    for (const auto& spec : s_.plan.worker_specs) {
      HealthCheck health;
      health.url = urls[spec.name];
      health.restarted_answers_any = true;
      ARLO_TRY(supervisor_.start(spec, Supervision{RestartLimits{}, health, {kChildUsageError}}));
    }
    for (const auto& [name, url] : s_.plan.workers) {
      HealthCheck health;
      health.url = url;
      if (!supervisor_.supervises(name)) supervisor_.watch(name, health);
    }
    if (!embedded_inference()) ARLO_INFO("arlo run: using {} external inference server(s)", s_.plan.workers.size());
    return ok();
  }

  // The worker pool's options from inference.*: health probing, failover, keep-alive connections
  // for every request in flight (none is re-opened per request), and the run's token.
  rollout::PoolOptions pool_options() const {
    rollout::PoolOptions po;
    po.health_timeout = seconds(s_.cfg.number("inference.health_timeout_s"));
    po.open_on_silence = s_.cfg.boolean("inference.failover_on_silence");
    po.client.max_idle_per_host =
        std::max<std::size_t>(po.client.max_idle_per_host, static_cast<std::size_t>(s_.options.max_inflight));
    po.client.token = s_.plan.token;  // workers (and vLLM's --api-key) want the run's token
    return po;
  }

  // Adds every planned worker to the pool and returns one admin client per worker, in plan order:
  // the adapter of `dialect` (inference.kind's registry entry, rollout/admin_dialects/).
  std::vector<std::unique_ptr<rollout::AdminClient>> add_workers(rollout::InferencePool& pool,
                                                                 const rollout::AdminDialectInfo& dialect) const {
    std::vector<std::unique_ptr<rollout::AdminClient>> admins;
    rollout::AdminOptions ao;
    ao.call_timeout = seconds(s_.cfg.number("inference.admin_timeout_s"));
    ao.transfer_timeout = seconds(s_.cfg.number("weight_sync.timeout_s"));
    for (const auto& [name, url] : s_.plan.workers) {
      pool.add_worker(url);
      admins.push_back(dialect.make(pool.client(), url, ao));
    }
    return admins;
  }

  // What each worker is sent to fetch a round's version (WeightSyncPlan::describe): where the
  // weights are is what the trainer announced with that version (an external trainer's own address
  // or directory) over what this run planned for an embedded one. A chain is routed per round,
  // around relays that are dead, left out or already hold the version (the round's receivers).
  adapters::RolloutInference::DescribeUpdate update_describer(const rollout::ServerCapabilities& server) {
    std::map<std::string, std::size_t> worker_index;  // admin url -> position in the plan
    for (std::size_t i = 0; i < s_.plan.workers.size(); ++i) worker_index[s_.plan.workers[i].second] = i;
    return [ws = s_.plan.weight_sync, server, worker_index, workers = s_.plan.workers](const std::string& worker,
                                                                                       const orch::WeightRound& round) {
      const auto it = worker_index.find(worker);
      const std::size_t k = it == worker_index.end() ? workers.size() : it->second;
      std::optional<ChainRole> role;
      if (ws.chain && k < workers.size()) {
        std::vector<bool> receiving;
        for (const auto& [name, url] : workers) receiving.push_back(round.receivers.count(url) > 0);
        role = chain_role(k, receiving, round.retry);
      }
      return ws.describe(k, round.version, server, round.weight_sync, role);
    };
  }

  // The orchestrator over the adapters, on this loop until the run ends; then the network thread
  // and the children stop, and the summary (or the first error) becomes the outcome.
  RunOutcome run_loop(const Adapters& a) {
    RealClock clock(io_.get_executor());
    metrics::Registry registry;
    Reporter reporter(io_, clock, s_.options, &registry);  // metrics.jsonl, console, status page, summary
    reporter.serve_page(web::run_page());
    reporter_ = &reporter;
    if (gateway_) a.network.run_and_wait([this, &registry] { gateway_->count_into(&registry); });
    ObserverList observers;  // the reporter, then the caller's (SessionOptions::observer)
    observers.add(&reporter);
    observers.add(observer_);
    const bool multi_turn =
        std::ranges::any_of(s_.parts.environments, [](const auto& e) { return e.second != nullptr; });
    a.environment.on_split([&registry] { registry.counter("multi_turn/split").inc(); });
    orch::Orchestrator orchestrator(io_,
                                    orch::Ports{inference_port_, &a.tasks, &a.scorer, &a.trainer, &clock,
                                                multi_turn ? &a.environment : nullptr, s_.parts.eval_tasks},
                                    s_.options, &observers);
    orchestrator_ = &orchestrator;  // for the supervision events (on_supervision)
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    watch_signals(signals, orchestrator);
    a.inference.on_unusable_server([this, &orchestrator](const Error& e) {
      if (error_.empty()) error_ = e.what();
      orchestrator.request_stop(e.what());
    });
    arlo::spawn(io_.get_executor(), drive(orchestrator, a.pool, a.network, a.server, signals));
    io_.run();
    a.network.stop();  // the network thread's work ends before anything it uses is destroyed
    supervisor_.stop();
    return outcome(orchestrator.summary());
  }

  // SIGINT/SIGTERM: a graceful stop (drain, final checkpoint, then the children); a second signal
  // stops the children at once.
  void watch_signals(asio::signal_set& signals, orch::Orchestrator& orchestrator) {
    signals.async_wait([this, &signals, &orchestrator](boost::system::error_code ec, int sig) {
      if (ec) return;
      ARLO_WARN("arlo run: signal {}: stopping (drain, final checkpoint, then the children)", sig);
      stop_reason_ = fmt::format("signal {}", sig);
      if (started_) {
        orchestrator.request_stop(stop_reason_);
      } else {
        finish_early("stopped by " + stop_reason_);
      }
      signals.async_wait([this](boost::system::error_code ec2, int) {
        if (!ec2) supervisor_.stop();
      });
    });
  }

  // Workers healthy, then the orchestrator, the bridge and the trainer, in that order (see the top
  // of this file); then waits for the end and stops everything.
  Awaitable<void> drive(orch::Orchestrator& orchestrator, rollout::InferencePool& pool, IoThread& network,
                        bridge::BridgeServer& server, asio::signal_set& signals) {
    if (auto st = start_monitors(); !st) {
      finish_early(st.error().what());
      co_return;
    }
    {  // embedded or external: every worker answers /health before anything is sent to it
      if (!embedded_inference())
        ARLO_INFO("arlo run: waiting for {} server(s) to answer /health", s_.plan.workers.size());
      std::vector<std::string> names;
      for (const auto& [name, url] : s_.plan.workers) names.push_back(name);
      auto st = co_await supervisor_.wait_healthy(
          names,
          clock_.now() + std::chrono::milliseconds(std::llround(1000 * s_.cfg.number("inference.start_timeout_s"))));
      if (!st) {
        finish_early(st.error().what());
        co_return;
      }
      ARLO_INFO("arlo run: {} worker(s) healthy", s_.plan.workers.size());
    }
    for (const auto& v : verifiers_) {  // each verifiers server answers its health request
      auto op = v->wait_ready();
      if (auto st = co_await std::move(op); !st) {
        finish_early(st.error().what());
        co_return;
      }
    }
    if (done_) co_return;
    asio::post(network.context(), [&pool] { pool.start(); });
    if (auto st = reporter_->start(orchestrator); !st) {  // run files and status port, before the loop
      finish_early(st.error().what());
      co_return;
    }
    if (auto st = orchestrator.start(); !st) {
      finish_early(st.error().what());
      co_return;
    }
    started_ = true;
    supervisor_.use_restart_argv(true);  // a worker restarted from now on starts without weights
    if (auto st = server.start(); !st) {
      error_ = st.error().what();
      orchestrator.request_stop(error_);
    }
    start_or_await_trainer(orchestrator, server);
    auto summary = co_await orchestrator.wait();
    co_await reporter_->wait_closed();  // the status port lingers after the end
    done_ = true;
    monitors_.finish(kMonitorGrace);
    if (!summary.ok && error_.empty()) error_ = summary.error;
    asio::post(network.context(), [&pool] { pool.stop(); });
    if (gateway_) asio::post(network.context(), [g = gateway_] { g->close(); });
    server.stop();
    supervisor_.stop();
    signals.cancel();
    io_.stop();
  }

  // The policy gateway when the config serves it (gateway.*), started on the network thread with the
  // run's token: agent programs reach the workers through it.
  Status start_gateway(IoThread& network, rollout::InferencePool& pool, rollout::AdminDialect server,
                       std::unique_ptr<Gateway>& gateway) {
    if (!gateway_enabled(s_.cfg)) return ok();
    GatewayOptions o = gateway_options(s_.cfg);
    o.token = s_.plan.token;
    o.server = server;
    gateway = std::make_unique<Gateway>(network.context(), pool, o);
    Result<std::uint16_t> port = 0;
    network.run_and_wait([&] { port = gateway->start(); });
    if (!port) return std::unexpected(port.error());
    gateway_ = gateway.get();
    ARLO_INFO("arlo run: policy gateway on {}/v1 (agent program: {})", gateway->url(),
              o.agent_url.empty() ? "none" : o.agent_url);
    return ok();
  }

  // The run's verifiers environments (session/verifiers_env.h: env.kind, each env.sources item of kind
  // verifiers, eval.env_kind): each embedded server as its own supervised child (restarted when it
  // dies; no /health of its own: drive() asks it over its protocol), and the gateway's program for
  // the envs it drives.
  Status start_verifiers(IoThread& network, Gateway* gateway) {
    ARLO_ASSIGN_OR_RETURN(auto sources, verifiers_sources(s_.cfg));
    if (sources.empty()) return ok();
    if (!gateway) return make_error(ErrorCode::kInternal, "verifiers environments run through the policy gateway");
    for (auto& source : sources) {
      ARLO_ASSIGN_OR_RETURN(auto v, VerifiersEnv::create(std::move(source), s_.plan.token));
      if (auto spec = v->child())
        ARLO_TRY(supervisor_.start(*spec, Supervision{RestartLimits{}, std::nullopt, {kChildUsageError}}));
      network.run_and_wait([&] {
        for (const auto& env : v->source().envs) gateway->set_program(env, v->program());
      });
      const auto& o = v->source().options;
      ARLO_INFO("arlo run: verifiers environment {} at {} ({}) for {}", o.value("verifiers_env", ""), v->address(),
                o.value("verifiers_launch", ""), fmt::join(v->source().envs, ", "));
      verifiers_.push_back(std::move(v));
    }
    return ok();
  }

  // The monitors, with the resolved configuration W&B records (monitors/config.yaml).
  Status start_monitors() {
    if (s_.cfg.strings("monitors.use").empty()) return ok();
    const auto path = fs::path(s_.run_dir) / "monitors" / "config.yaml";  // may hold security.token: 0600
    ARLO_TRY(write_file_atomically(path, s_.cfg.to_yaml()));
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, ec);
    return monitors_.start();
  }

  // How the command or hf trainer's ranks are supervised. A trainer that resumes from its checkpoint
  // is restarted under the RestartPolicy (exit code 2 is final): hf with checkpoints on
  // (trainer.ckpt_interval or ckpt.interval > 0: it checkpoints before each ack), a command trainer
  // when trainer.ckpt_interval > 0 says it does; else its exit stops the run. Several ranks are one
  // group: any rank's exit stops the others and starts them all again, with a fresh MASTER_PORT for
  // the new rendezvous.
  Supervision command_trainer_supervision(std::size_t ranks) const {
    Supervision sup;
    const bool hf = s_.cfg.string("trainer.launch") == "hf";
    if ((hf && trainer_ckpt_interval(s_.cfg) > 0) || (!hf && s_.cfg.integer("trainer.ckpt_interval") > 0)) {
      sup.restart = RestartLimits{};
      sup.final_exit_codes = {kChildUsageError};
    }
    if (ranks > 1) {
      sup.group = "trainer";
      sup.group_restart_env = [] {
        auto port = free_loopback_port();
        return port ? std::map<std::string, std::string>{{"MASTER_PORT", std::to_string(*port)}}
                    : std::map<std::string, std::string>{};
      };
    }
    return sup;
  }

  void start_or_await_trainer(orch::Orchestrator& orchestrator, bridge::BridgeServer& server) {
    if (!error_.empty()) return;
    if (const auto& launch = s_.cfg.string("trainer.launch"); launch == "command" || launch == "hf") {
      auto specs = command_trainer_specs(s_.cfg, s_.run_dir, s_.plan.weight_sync,
                                         static_cast<int>(s_.plan.workers.size()), server.port());
      if (specs && !specs->empty())
        ARLO_INFO("arlo run: starting the trainer command ({} rank(s)): {}", specs->size(),
                  fmt::join(specs->front().argv, " "));
      auto st = specs ? ok() : Status(std::unexpected(specs.error()));
      for (std::size_t r = 0; st && r < specs->size(); ++r)
        st = supervisor_.start((*specs)[r], command_trainer_supervision(specs->size()));
      if (!st) {
        error_ = st.error().what();
        orchestrator.request_stop(error_);
      }
      return;
    }
    if (!embedded_trainer()) {
      const auto& transport = s_.cfg.string("bridge.transport");
      ARLO_INFO("arlo run: waiting for a trainer on the bridge ({} transport, {})", transport,
                transport == "socket" ? fmt::format("port {}", server.port()) : s_.run_dir + "/rollouts");
      return;
    }
    const auto spec =
        trainer_spec(s_.cfg, s_.run_dir, s_.plan.weight_sync, static_cast<int>(s_.plan.workers.size()), server.port());
    if (auto st = supervisor_.start(spec, Supervision{RestartLimits{}, std::nullopt, {kChildUsageError}}); !st) {
      error_ = st.error().what();
      orchestrator.request_stop(error_);
    }
  }

  // The outcome of a run whose loop ended: the first error, else a stop by signal, else its end.
  RunOutcome outcome(const orch::RunSummary& summary) {
    if (!error_.empty()) return fail(error_);
    RunOutcome o;
    o.end = stop_reason_.empty() ? RunOutcome::End::kFinished : RunOutcome::End::kStopped;
    o.stop_reason = stop_reason_;
    o.steps = summary.steps;
    o.seconds = summary.seconds;
    return o;
  }

  // Supervision (session/supervisor.h): an embedded worker or the embedded trainer that dies is
  // started again after a backoff (RestartPolicy: at most 5 restarts within 10 minutes, waiting
  // 0.5 s, doubling to 10 s); the next death within that window, a usage error (exit code 2: a
  // restart would fail the same way) or the exit of any other child stops the run with an error
  // naming the child and its last lines. The run's log lines and actions, from the events.
  void on_supervision(const SupervisionEvent& e) {
    record(e);
    for (const auto& v : verifiers_)  // a verifiers server died: only its episodes in flight fail
      if (e.kind == SupervisionEventKind::kExited && e.name == v->source().child) {
        const auto lost = v->server_died(e.exit ? e.exit->describe() : e.name + " exited");
        ARLO_WARN("arlo run: the verifiers environment server died ({}); its {} episode(s) in flight fail their groups",
                  e.name, lost);
      }
    if (done_) return;
    switch (e.kind) {
      case SupervisionEventKind::kRestarting: {
        ARLO_WARN("arlo run: {}; restarting it in {:.1f} s (restart {} of {} within {} s); its last lines:\n{}",
                  e.group.empty() ? e.exit->describe() : e.reason, std::chrono::duration<double>(e.delay).count(),
                  e.attempt, e.max_restarts, std::chrono::duration_cast<std::chrono::seconds>(e.window).count(),
                  e.last_lines);
        // The end of the run waits (bounded) for a worker coming back.
        if (const auto url = worker_url(e.name); started_ && !url.empty()) orchestrator_->worker_restarting(url);
        break;
      }
      case SupervisionEventKind::kGaveUp: {
        const auto why = gave_up_why(e);
        stop_run(why);
        // A trainer that is not coming back never takes the batch in flight: give it up (the batch
        // journal keeps it for `arlo run --resume`), or the drain would wait for it.
        if (started_ && (e.name == "trainer" || e.name.starts_with("trainer-")))
          orchestrator_->train_sink().abandon(Error(ErrorCode::kUnavailable, why));
        break;
      }
      case SupervisionEventKind::kStarted:
        if (e.restarted && worker_url(e.name).empty()) ARLO_INFO("arlo run: {} restarted", e.name);
        break;
      case SupervisionEventKind::kHealthy:
        if (e.restarted && e.first_since_start) worker_back(e);
        break;
      case SupervisionEventKind::kUnhealthy:
        ARLO_WARN("arlo run: {} stopped answering /health ({} probes in a row): {}", e.name, e.failed_probes, e.reason);
        break;
      case SupervisionEventKind::kExited: break;
    }
  }

  // Each event as one line of <run dir>/supervision.jsonl (to_json; what the e2e tests read).
  void record(const SupervisionEvent& e) {
    if (!events_.is_open()) events_.open(fs::path(s_.run_dir) / "supervision.jsonl", std::ios::app);
    events_ << to_json(e).dump() << '\n';
    events_.flush();
  }

  static std::string gave_up_why(const SupervisionEvent& e) {
    const auto window_s = std::chrono::duration_cast<std::chrono::seconds>(e.window).count();
    switch (e.gave_up) {
      case GaveUpReason::kNotRestartable:
        return fmt::format("{}; its last lines:\n{}", e.exit->describe(), e.last_lines);
      case GaveUpReason::kFinalExitCode:
        return fmt::format("{} (a usage error: not restarted); its last lines:\n{}", e.exit->describe(), e.last_lines);
      case GaveUpReason::kPastTheBound:
        return fmt::format("{}, after {} restarts within {} s (the bound): not restarted again; its last lines:\n{}",
                           e.exit->describe(), e.max_restarts, window_s, e.last_lines);
      default: return e.reason;
    }
  }

  // The run stops with `why`: at once before the orchestrator started, else through it.
  void stop_run(const std::string& why) {
    ARLO_ERROR("arlo run: {}", why);
    if (!started_) {
      finish_early(why);
      return;
    }
    if (error_.empty()) error_ = why;
    orchestrator_->request_stop(why);
  }

  std::string worker_url(const std::string& name) const {
    for (const auto& [n, u] : s_.plan.workers)
      if (n == name) return u;
    return "";
  }

  // A restarted worker answers on its URL again. Once the orchestrator started, it came back with
  // its restart_argv (no weights: it answers /health 503 and serves nothing until updated) and the
  // WeightWatcher syncs the current version to it; before, it started as it first did (the seeded
  // v0 every worker holds then, which the start-up waits for). The trainer resumes from its own
  // checkpoint and the bridge delivers again every step it did not ack.
  void worker_back(const SupervisionEvent& e) {
    const auto url = worker_url(e.name);
    const double took = std::chrono::duration<double>(e.since_start).count();
    if (!started_) {
      ARLO_INFO("arlo run: {} restarted, answering at {} after {:.1f} s (before the run started)", e.name, url, took);
      return;
    }
    ARLO_INFO("arlo run: {} restarted, answering at {} after {:.1f} s; syncing the current version to it", e.name, url,
              took);
    orchestrator_->worker_restarted(url);
  }

  void finish_early(const std::string& why) {
    if (error_.empty()) error_ = why;
    done_ = true;
    supervisor_.stop();
    io_.stop();
  }

  RunOutcome fail(const std::string& why) {
    supervisor_.stop();
    RunOutcome o;
    o.error = why;
    return o;
  }

  // First, so destroyed last: what the run's parts bound to it (an http environment's client and
  // its idle connections, in s_.parts) must be gone before the io_context they were opened on.
  asio::io_context io_;
  Setup s_;
  orch::RunObserver* observer_;  // SessionOptions::observer (may be null)
  Monitors monitors_;
  orch::InferencePort* inference_port_ = nullptr;  // the pool's adapter, or the gateway's decorator of it
  Gateway* gateway_ = nullptr;                     // when gateway.enabled; lives on the network thread
  // The run's verifiers environments (start_verifiers): their clients and the gateway's programs,
  // while execute() runs (it ends them with the network thread). Before the supervisor, whose events
  // name their children.
  std::vector<std::unique_ptr<VerifiersEnv>> verifiers_;
  Reporter* reporter_ = nullptr;         // run_loop's, while it runs
  RealClock clock_{io_.get_executor()};  // the supervisor's
  Supervisor supervisor_{io_, clock_, [this](const SupervisionEvent& e) { on_supervision(e); }};
  orch::Orchestrator* orchestrator_ = nullptr;  // run_loop's, while it runs
  std::ofstream events_;                        // supervision.jsonl
  bool started_ = false;
  bool done_ = false;
  std::string error_;
  std::string stop_reason_;
};

Result<std::unique_ptr<RunSession>> RunSession::create(const config::Config& cfg, const SessionOptions& options) {
  ARLO_ASSIGN_OR_RETURN(auto setup, prepare(cfg, options.resume, options.overwrite));
  return std::unique_ptr<RunSession>(new RunSession(std::make_unique<Impl>(std::move(setup), options.observer)));
}

RunSession::RunSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RunSession::~RunSession() = default;

const std::string& RunSession::run_dir() const { return impl_->run_dir(); }

RunOutcome RunSession::run() { return impl_->execute(); }

}  // namespace arlo::session
