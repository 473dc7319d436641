// arlo-bench-gateway: what the policy gateway (session/gateway.h) adds to a model call's latency,
// against calling the worker directly, side by side in one run.
//
// One real arlo-worker. An agent served in this process runs trajectories of --calls calls each, every
// call's prompt extending the last (its prompt and completion ids + a few more), and times each call.
// Rounds alternate between the two paths with the same prompts, seeds and sampling, so that a change
// in the machine's load falls on both:
//   direct:  the agent's HTTP client -> the worker's /v1/completions
//   gateway: the agent's HTTP client -> the gateway's /t/<id>/v1/completions -> the pool -> the worker
// Prints the median and p90 per path and the ratio of the medians (target: at most 1.05).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/async/io_thread.h"
#include "common/http.h"
#include "common/log.h"
#include "orchestrator/orchestrator.h"
#include "orchestrator/periodic_logger.h"
#include "rollout/inference_pool.h"
#include "session/adapters/agent_inference.h"
#include "session/adapters/rollout_adapters.h"
#include "session/gateway.h"
#include "testing/loop_fakes.h"
#include "testing/one_worker_inference.h"
#include "testing/process.h"

namespace {

namespace asio = boost::asio;
using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct Args {
  int rounds = 30;
  int calls = 3;
  int max_tokens = 12;
};

// One trajectory's calls through `base` (…/v1), timed; microseconds per call appended to `out`.
// The first prompt is `prompt`; each next one the ids the model saw and wrote, and "\n+\n" (token-in/token-out).
arlo::Awaitable<bool> trajectory(arlo::http::Client& client, std::string base, int calls, int max_tokens,
                                 std::uint64_t seed, std::vector<double>& out, json prompt = "12+34=") {
  for (int i = 0; i < calls; ++i) {
    arlo::http::ClientRequest r;
    r.method = arlo::http::Verb::post;
    r.url = base + "/completions";
    r.body = json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 1.0}, {"seed", seed + i}}.dump();
    const auto t0 = SteadyClock::now();
    auto op = client.request(std::move(r));
    auto a = co_await std::move(op);
    const auto us = std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count();
    if (!a || a->status != 200) {
      fmt::print(stderr, "call failed: {}\n", a ? a->body : a.error().what());
      co_return false;
    }
    out.push_back(us);
    auto j = json::parse(a->body);
    auto ids = j["prompt_token_ids"].get<std::vector<std::int32_t>>();
    for (auto id : j["choices"][0]["token_ids"]) ids.push_back(id.get<std::int32_t>());
    ids.insert(ids.end(), {8, 20, 8});  // arlo-worker's ids of '\n', '+', '\n'
    prompt = ids;
  }
  co_return true;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

template <typename T>
T run_until(asio::io_context& io, std::optional<T>& slot) {
  while (!slot) io.run_one();
  return *slot;
}

int bench(const Args& args, const std::string& worker_url) {
  asio::io_context io;
  arlo::rollout::InferencePool pool(io);
  pool.add_worker(worker_url);
  pool.start();
  arlo::http::Client client(io);
  std::vector<double> direct, gateway;
  // The in-process agent the gateway asks to run each trajectory.
  arlo::http::Server agent(io, arlo::http::ServerOptions{});
  agent.route(arlo::http::Verb::post, "/", [&](arlo::http::Request req) -> arlo::Awaitable<arlo::http::Response> {
    auto job = json::parse(req.body);
    auto op = trajectory(client, job["base_url"].get<std::string>(), args.calls, args.max_tokens,
                         job["task"]["info"]["seed"].get<std::uint64_t>(), gateway);
    const bool ok = co_await std::move(op);
    co_return arlo::http::Response::json(ok ? 200 : 500, {{"reward", 0.0}});
  });
  auto agent_port = agent.start();
  arlo::session::GatewayOptions go;
  go.agent_url = fmt::format("http://127.0.0.1:{}/", agent_port ? *agent_port : 0);
  arlo::session::Gateway gw(io, pool, go);
  if (!agent_port || !gw.start()) return 1;
  for (int round = 0; round < 2 * args.rounds; ++round) {
    const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(round / 2) * 100;
    if (round % 2 == 0) {
      std::optional<bool> done;
      asio::co_spawn(
          io,
          [&]() -> arlo::Awaitable<void> {
            auto op = trajectory(client, worker_url + "/v1", args.calls, args.max_tokens, seed, direct);
            done = co_await std::move(op);
          },
          asio::detached);
      if (!run_until(io, done)) return 1;
    } else {
      arlo::orch::GenerateRequest r;
      auto task = std::make_shared<arlo::Task>();
      task->id = "bench";
      task->prompt = "12+34=";
      task->info["seed"] = seed;
      r.task = task;
      r.n = 1;
      r.group_id = static_cast<std::uint64_t>(round);
      r.deadline = SteadyClock::now() + std::chrono::minutes(5);
      std::optional<arlo::Result<arlo::orch::GenerateResult>> out;
      asio::co_spawn(
          io,
          [&]() -> arlo::Awaitable<void> {
            auto op = gw.run(r);
            out = co_await std::move(op);
          },
          asio::detached);
      if (!run_until(io, out)) {
        fmt::print(stderr, "gateway round failed: {}\n", out->error().what());
        return 1;
      }
    }
  }
  gw.close();
  agent.close();
  pool.stop();
  const double d50 = percentile(direct, 0.5), g50 = percentile(gateway, 0.5);
  fmt::print("{:<9} {:>6} {:>12} {:>12}\n", "path", "calls", "median ms", "p90 ms");
  fmt::print("{:<9} {:>6} {:>12.3f} {:>12.3f}\n", "direct", direct.size(), d50 / 1000, percentile(direct, 0.9) / 1000);
  fmt::print("{:<9} {:>6} {:>12.3f} {:>12.3f}\n", "gateway", gateway.size(), g50 / 1000,
             percentile(gateway, 0.9) / 1000);
  fmt::print("gateway/direct median latency ratio: {:.3f} (target <= 1.05; added {:.3f} ms per call)\n", g50 / d50,
             (g50 - d50) / 1000);
  return 0;
}

// --lag: the event-loop lag p99 with --concurrency trajectories open at once through the gateway.
//
// Wired as `arlo run` wires a gateway run: the orchestrator's loop on this thread, the worker pool
// and the gateway on a network thread (nice 5). Outside both, in a child process (nice 5, as a
// remote machine would not compete, and holding the far ends of the sockets as it would): a free
// completion server (answers at once: what is measured is arlo's loops, not a model) and the agent
// program, which runs each trajectory as --calls calls through the gateway. Two runs against the
// same server: single-turn (the
// orchestrator calls the pool itself, one call per rollout, as `arlo bench dispatch` measures it)
// and gateway (each rollout is an agent trajectory). Lag is LagProbe's (20 ms period), on the
// orchestrator's loop (the one the target is about) and on the network thread (where the gateway
// runs). Target: the orchestrator loop's lag p99 under 10 ms.

struct LagArgs {
  int concurrency = 4096;
  long trajectories = 0;  // per run; 0: twice the concurrency
};

struct LoopFigures {
  long rollouts = 0, errors = 0;
  double wall_s = 0, lag_p50_s = 0, lag_p99_s = 0, network_p99_s = 0;
  std::uint64_t gateway_calls = 0;
};

// The free server's answer: n completions of max_tokens ids each, the prompt's ids echoed back.
arlo::http::Response free_completion(const arlo::http::Request& req) {
  auto body = req.json();
  if (!body || !body->contains("prompt") || !(*body)["prompt"].is_array())
    return arlo::http::Response::error(400, "token-id prompts only");
  const int n = body->value("n", 1);
  const auto tokens = static_cast<std::size_t>(body->value("max_tokens", 8));
  json choices = json::array();
  for (int i = 0; i < n; ++i) {
    std::vector<std::int32_t> ids(tokens);
    for (std::size_t t = 0; t < tokens; ++t)
      ids[t] = static_cast<std::int32_t>(1 + (t + static_cast<std::size_t>(i)) % 50);
    choices.push_back({{"index", i},
                       {"text", "y"},
                       {"token_ids", ids},
                       {"logprobs", {{"token_logprobs", std::vector<double>(tokens, -0.5)}}},
                       {"finish_reason", "length"}});
  }
  return arlo::http::Response::json(200, {{"choices", choices}, {"prompt_token_ids", (*body)["prompt"]}});
}

arlo::http::ClientOptions client_options(int concurrency) {
  arlo::http::ClientOptions o;
  o.max_idle_per_host = static_cast<std::size_t>(concurrency);
  return o;
}

// The free server and the agent program: run in a child process of their own (see start_outside).
class Outside {
 public:
  Outside(const Args& args, int concurrency)
      : server_(io_, arlo::http::ServerOptions{}),
        agent_(io_, arlo::http::ServerOptions{}),
        client_(io_, client_options(concurrency)) {
    server_.route(
        arlo::http::Verb::post, "/v1/completions",
        [](arlo::http::Request req) -> arlo::Awaitable<arlo::http::Response> { co_return free_completion(req); });
    auto yes = [](arlo::http::Request) -> arlo::Awaitable<arlo::http::Response> {
      co_return arlo::http::Response::json(200, {{"ok", true}});
    };
    server_.route(arlo::http::Verb::get, "/health", yes);
    for (const char* path : {"/pause", "/resume", "/weights/prepare", "/weights/commit"})
      server_.route(arlo::http::Verb::post, path, yes);
    agent_.route(
        arlo::http::Verb::post, "/", [this, &args](arlo::http::Request req) -> arlo::Awaitable<arlo::http::Response> {
          auto job = json::parse(req.body);
          const auto n = std::stoull(job["task"]["id"].get<std::string>());
          json prompt = {101, 2023, 2003, 1037, 2460, 25732, static_cast<std::int32_t>(n % 30000)};
          std::vector<double> times;
          auto op =
              trajectory(client_, job["base_url"].get<std::string>(), args.calls, args.max_tokens, n, times, prompt);
          const bool ok = co_await std::move(op);
          co_return arlo::http::Response::json(ok ? 200 : 500, {{"reward", static_cast<double>(n % 2)}});
        });
  }
  // The server's and the agent's ports; nullopt when either cannot bind.
  std::optional<std::pair<std::uint16_t, std::uint16_t>> bind() {
    auto s = server_.start();
    auto a = agent_.start();
    if (!s || !a) return std::nullopt;
    return std::pair{*s, *a};
  }
  void run() { io_.run(); }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_ = asio::make_work_guard(io_);
  arlo::http::Server server_;
  arlo::http::Server agent_;
  arlo::http::Client client_;
};

struct OutsideProcess {
  pid_t pid = -1;
  std::uint16_t server_port = 0, agent_port = 0;
};

// Forks the free server and the agent program into a child process (nice 5), as they would run
// apart from arlo: the far end of every socket (about 3 per trajectory in flight) lives there, not in
// the measured process's descriptor table, which then holds what `arlo run` would. Call before any
// thread starts. SIGTERM ends the child.
std::optional<OutsideProcess> start_outside(const Args& args, int concurrency) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  OutsideProcess out;
  out.pid = ::fork();
  if (out.pid == 0) {
    ::close(fds[0]);
    ::setpriority(PRIO_PROCESS, 0, arlo::kNetworkThreadNice);
    Outside outside(args, concurrency);
    const auto ports = outside.bind();
    const std::uint16_t p[2] = {ports ? ports->first : std::uint16_t{0}, ports ? ports->second : std::uint16_t{0}};
    const bool told = ::write(fds[1], p, sizeof p) == static_cast<ssize_t>(sizeof p);
    ::close(fds[1]);
    if (ports && told) outside.run();
    ::_exit(1);
  }
  ::close(fds[1]);
  std::uint16_t p[2] = {0, 0};
  const bool got = out.pid > 0 && ::read(fds[0], p, sizeof p) == static_cast<ssize_t>(sizeof p);
  ::close(fds[0]);
  out.server_port = p[0];
  out.agent_port = p[1];
  if (got && p[0] != 0 && p[1] != 0) return out;
  if (out.pid > 0) ::kill(out.pid, SIGTERM);
  return std::nullopt;
}

// Takes each batch at once and then says its version is out, with nothing to fetch: the workers'
// weight updates are admin calls the free server answers at once.
class PublishingTrainer final : public arlo::orch::TrainerPort {
 public:
  explicit PublishingTrainer(asio::io_context& io) : io_(io) {}
  arlo::Awaitable<arlo::Status> send(arlo::orch::TrainBatch batch) override {
    asio::post(io_, [this, step = batch.step] {
      if (published_) published_({step, {}});
    });
    co_return arlo::ok();
  }
  void on_version(std::function<void(arlo::orch::VersionNotice)> cb) override { published_ = std::move(cb); }

 private:
  asio::io_context& io_;
  std::function<void(arlo::orch::VersionNotice)> published_;
};

// One run of the whole orchestrator loop; through the gateway when `agent_port` is set.
LoopFigures run_loop(std::uint16_t server_port, std::optional<std::uint16_t> agent_port, int concurrency, long rollouts,
                     int max_tokens) {
  using namespace arlo;
  asio::io_context io;
  RealClock clock(io.get_executor());
  IoThread network(kNetworkThreadNice);
  arlo::testing::OneWorkerInference worker(network, server_port, static_cast<std::size_t>(concurrency));
  auto& pool = worker.pool;
  auto& inference = worker.inference;
  std::unique_ptr<session::Gateway> gateway;
  std::optional<session::adapters::AgentInference> agents;
  if (agent_port) {
    session::GatewayOptions go;
    go.agent_url = fmt::format("http://127.0.0.1:{}/", *agent_port);
    go.max_inflight = static_cast<std::size_t>(concurrency);
    gateway = std::make_unique<session::Gateway>(network.context(), pool, go);
    agents.emplace(inference, *gateway, network.executor());
  }
  std::unique_ptr<RealClock> network_clock;
  std::unique_ptr<orch::LagProbe> network_probe;
  arlo::Status started = arlo::ok();
  network.run_and_wait([&] {
    pool.start();
    if (gateway) {
      auto port = gateway->start();
      if (!port) started = std::unexpected(port.error());
    }
    network_clock = std::make_unique<RealClock>(network.executor());
    network_probe = std::make_unique<orch::LagProbe>(*network_clock, std::chrono::milliseconds(20));
    network_probe->start();
  });
  orch::testing::NumberedTasks tasks([](std::uint64_t n) {
    Task t;
    t.id = std::to_string(n);
    t.prompt_tokens = {101, 2023, 2003, 1037, 2460, 25732, static_cast<std::int32_t>(n % 30000)};
    return t;
  });
  orch::testing::FakeScorer scorer;
  PublishingTrainer trainer(io);
  orch::InferencePort* port = agents ? static_cast<orch::InferencePort*>(&*agents) : &inference;
  orch::Orchestrator orchestrator(io, orch::Ports{port, &tasks, &scorer, &trainer, &clock, nullptr, {}},
                                  arlo::testing::free_server_loop_options(concurrency, rollouts, max_tokens));
  orch::LagProbe probe(clock, std::chrono::milliseconds(20));
  LoopFigures f;
  const auto t0 = SteadyClock::now();
  if (auto st = started ? arlo::testing::run_probed(io, orchestrator, probe) : started; !st) {
    fmt::print(stderr, "bench: {}\n", st.error().what());
    std::exit(1);
  }
  f.wall_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  network.run_and_wait([&] {
    f.network_p99_s = network_probe->take().p99;
    network_probe->stop();
    if (gateway) {
      f.gateway_calls = gateway->stats().calls;
      gateway->close();
    }
    pool.stop();
  });
  network.stop();
  f.rollouts = static_cast<long>(orchestrator.ledger().completed_total());
  f.errors = static_cast<long>(orchestrator.ledger().failed_total());
  const auto w = probe.take();
  f.lag_p50_s = w.p50;
  f.lag_p99_s = w.p99;
  if (!orchestrator.summary().ok) fmt::print(stderr, "bench: the run reported: {}\n", orchestrator.summary().error);
  return f;
}

int lag_bench(const Args& args, const LagArgs& lag) {
  arlo::log::Options log_options;
  log_options.level = "warn";
  (void)arlo::http::raise_open_file_limit();  // before the fork: the child's limit too
  const auto outside = start_outside(args, lag.concurrency);
  if (!outside) {
    fmt::print(stderr, "bench: the free server and agent process did not start\n");
    return 1;
  }
  (void)arlo::log::init(log_options);
  const long n = lag.trajectories > 0 ? lag.trajectories : 2L * lag.concurrency;
  fmt::print(
      "arlo-bench-gateway --lag: {} rollouts in flight, {} per run, free local server, {} tokens per call; gateway "
      "trajectories make {} calls each\n",
      lag.concurrency, n, args.max_tokens, args.calls);
  fmt::print("{:<12} {:>9} {:>8} {:>10} {:>13} {:>13} {:>16} {:>7}\n", "mode", "rollouts", "wall s", "rollouts/s",
             "loop p50 ms", "loop p99 ms", "network p99 ms", "errors");
  auto row = [&](const char* mode, const LoopFigures& f) {
    fmt::print("{:<12} {:>9} {:>8.1f} {:>10.0f} {:>13.2f} {:>13.2f} {:>16.2f} {:>7}\n", mode, f.rollouts, f.wall_s,
               static_cast<double>(f.rollouts) / std::max(f.wall_s, 1e-9), f.lag_p50_s * 1e3, f.lag_p99_s * 1e3,
               f.network_p99_s * 1e3, f.errors);
  };
  const auto single = run_loop(outside->server_port, std::nullopt, lag.concurrency, n, args.max_tokens);
  row("single-turn", single);
  const auto through = run_loop(outside->server_port, outside->agent_port, lag.concurrency, n, args.max_tokens);
  row("gateway", through);
  ::kill(outside->pid, SIGTERM);
  ::waitpid(outside->pid, nullptr, 0);
  fmt::print("gateway model calls: {}\n", through.gateway_calls);
  // A run with failed rollouts (e.g. the open-file limit: every socket has both ends in this process)
  // did not hold the concurrency it claims: it does not pass.
  const bool pass = through.lag_p99_s < 0.010 && through.errors == 0 && single.errors == 0;
  fmt::print("orchestrator loop lag p99, gateway/single-turn: {:.2f}x ({:.2f} ms vs {:.2f} ms); target < 10 ms: {}\n",
             through.lag_p99_s / std::max(single.lag_p99_s, 1e-9), through.lag_p99_s * 1e3, single.lag_p99_s * 1e3,
             pass ? "PASS" : "FAIL");
  return pass ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"The policy gateway's added latency per model call against calling the worker directly."};
  app.add_option("--rounds", args.rounds, "trajectories per path");
  app.add_option("--calls", args.calls, "calls per trajectory");
  app.add_option("--max-tokens", args.max_tokens, "tokens per call");
  bool lag_mode = false;
  LagArgs lag;
  app.add_flag("--lag", lag_mode,
               "event-loop lag with --concurrency trajectories open at once (free server, no worker)");
  app.add_option("--concurrency", lag.concurrency, "--lag: rollouts (trajectories) in flight");
  app.add_option("--trajectories", lag.trajectories, "--lag: rollouts per run (0: twice --concurrency)");
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);
  if (lag_mode) return lag_bench(args, lag);
  const auto log = std::filesystem::temp_directory_path() / fmt::format("arlo-bench-gateway-{}.log", ::getpid());
  const pid_t worker = arlo::e2e::spawn_logged(
      {ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--log-level", "warn", "--init-seed", "1"}, log);
  int rc = 1;
  if (arlo::e2e::wait_for_text(log, "listening on ", worker, std::chrono::seconds(60))) {
    const auto text = arlo::e2e::read_text(log);
    const auto at = text.find("listening on ") + 13;
    const auto address = text.substr(at, text.find_first_of(" \n", at) - at);
    rc = bench(args, "http://" + address);
  } else {
    fmt::print(stderr, "arlo-worker did not start; its log: {}\n", log.string());
  }
  ::kill(worker, SIGTERM);
  ::waitpid(worker, nullptr, 0);
  std::filesystem::remove(log);
  return rc;
}
