// arlo-bench-dispatch: rollouts per second, orchestrator CPU time per rollout and event-loop lag
// p99 of the whole orchestrator loop (dispatcher, sinks, weight watcher, logger) against a
// trivially fast local completion server, at 256 and 4096 rollouts in flight; beside a Python
// asyncio + httpx client issuing the same requests to the same server in the same run.
//
// The orchestrator is wired as `arlo run` wires it: its loop on the main thread, the worker pool
// (rollout::InferencePool behind the RolloutInference adapter) on a network thread. "CPU per
// rollout" is the CPU time of both threads (CLOCK_THREAD_CPUTIME_ID): scheduling, HTTP client,
// JSON, accounting, batching; "lag" is that of the orchestrator's loop. The server runs on a third
// thread. The trainer accepts at once and publishes each version, so weight updates (admin calls
// the server answers at once) run through the watcher as in a real run. No thresholds asserted.
//
//   arlo-bench-dispatch [--rollouts N] [--inflight 256,4096] [--max-tokens T] [--gen-ms MS] [--no-python]
//
// --gen-ms makes the server wait that long before answering (simulated generation). With a free
// server (the default, 0) the client loop is the bottleneck by construction, so its event-loop lag
// is the time to work through a full queue of completions; with a realistic generation time the
// lag shows how responsive the loop stays while it holds thousands of requests.
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/http.h"
#include "common/async/io_thread.h"
#include "common/log.h"
#include "common/async/coro.h"
#include "session/adapters/rollout_adapters.h"
#include "orchestrator/orchestrator.h"
#include "rollout/advantages.h"
#include "testing/loop_fakes.h"
#include "testing/one_worker_inference.h"

namespace asio = boost::asio;
using namespace arlo;
using namespace arlo::orch;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The completion server: answers n completions of max_tokens tokens each, at once.
http::Response complete(const http::Request& req) {
  auto body = req.json();
  if (!body) return http::Response::error(400, body.error().what());
  const int n = body->value("n", 1);
  const int max_tokens = body->value("max_tokens", 16);
  nlohmann::json choices = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    std::vector<int> ids(static_cast<std::size_t>(max_tokens));
    std::vector<double> lps(static_cast<std::size_t>(max_tokens), -0.25);
    for (int t = 0; t < max_tokens; ++t) ids[static_cast<std::size_t>(t)] = (i + t) % 2 ? 1000 + t : 1;
    choices.push_back({{"index", i},
                       {"text", "x"},
                       {"token_ids", ids},
                       {"logprobs", {{"token_logprobs", lps}}},
                       {"finish_reason", "length"}});
  }
  return http::Response::json(
      200,
      {{"id", "cmpl"}, {"object", "text_completion"}, {"choices", choices}, {"prompt_token_ids", (*body)["prompt"]}});
}

// Task n: a seven-token prompt, the last token n's own.
Task synthetic_task(std::uint64_t n) {
  Task t;
  t.id = std::to_string(n);
  t.prompt_tokens = {101, 2023, 2003, 1037, 2460, 25732, static_cast<std::int32_t>(n % 30000)};
  return t;
}

// Parity reward, scored inline (the scoring cost of a real reward module is not what we measure).
class ParityScorer final : public ScorerPort {
 public:
  Awaitable<Result<ScoredGroup>> score(std::shared_ptr<const Task>,
                                       std::shared_ptr<const std::vector<Sample>> cs) override {
    ScoredGroup g;
    for (const auto& c : *cs)
      g.rewards.push_back(!c.completion_tokens.empty() && c.completion_tokens[0] == 1 ? 1.0 : 0.0);
    std::vector<rollout::SampleInput> in;
    for (double r : g.rewards) in.push_back({.reward = r});
    g.advantages = rollout::compute_advantages(in, {.filter_equal_reward_groups = false}).advantages;
    co_return g;
  }
};

class InstantTrainer final : public TrainerPort {
 public:
  explicit InstantTrainer(asio::io_context& io) : io_(io) {}
  Awaitable<Status> send(TrainBatch batch) override {
    const auto v = batch.step;
    asio::post(io_, [this, v] {
      if (cb_) cb_({v, {}});
    });
    co_return ok();
  }
  void on_version(std::function<void(VersionNotice)> cb) override { cb_ = std::move(cb); }

 private:
  asio::io_context& io_;
  std::function<void(VersionNotice)> cb_;
};

struct Figures {
  long rollouts = 0;
  long errors = 0;
  double wall_s = 0, cpu_s = 0, lag_p50_s = 0, lag_p99_s = 0;
  double per_s() const { return wall_s > 0 ? static_cast<double>(rollouts) / wall_s : 0; }
  double cpu_us_per_rollout() const { return rollouts ? cpu_s / static_cast<double>(rollouts) * 1e6 : 0; }
};

Figures run_orchestrator(std::uint16_t port, int inflight, long rollouts, int max_tokens) {
  asio::io_context io;
  RealClock clock(io.get_executor());
  IoThread network(kNetworkThreadNice);
  arlo::testing::OneWorkerInference worker(network, port, static_cast<std::size_t>(inflight));
  auto& pool = worker.pool;
  auto& inference = worker.inference;
  network.run_and_wait([&] { pool.start(); });
  orch::testing::NumberedTasks tasks(synthetic_task);
  ParityScorer scorer;
  InstantTrainer trainer(io);
  // One completion per request, exactly what the Python client sends.
  const Options opt = arlo::testing::free_server_loop_options(inflight, rollouts, max_tokens);
  Orchestrator orch(io, Ports{&inference, &tasks, &scorer, &trainer, &clock, nullptr, {}}, opt);
  LagProbe probe(clock, std::chrono::milliseconds(20));
  double network_cpu0 = 0, network_cpu1 = 0;
  network.run_and_wait([&] { network_cpu0 = thread_cpu_seconds(); });
  const double cpu0 = thread_cpu_seconds();
  const auto t0 = Clock_::now();
  if (auto st = arlo::testing::run_probed(io, orch, probe); !st) {
    ARLO_ERROR("bench: {}", st.error().what());
    std::exit(1);
  }
  Figures f;
  f.wall_s = std::chrono::duration<double>(Clock_::now() - t0).count();
  f.cpu_s = thread_cpu_seconds() - cpu0;
  network.run_and_wait([&] {
    network_cpu1 = thread_cpu_seconds();
    pool.stop();
  });
  network.stop();
  f.cpu_s += network_cpu1 - network_cpu0;
  f.rollouts = static_cast<long>(orch.ledger().completed_total());
  f.errors = static_cast<long>(orch.ledger().failed_total());
  auto w = probe.take();
  f.lag_p50_s = w.p50;
  f.lag_p99_s = w.p99;
  if (!orch.summary().ok) ARLO_WARN("bench: run reported: {}", orch.summary().error);
  return f;
}

std::optional<Figures> run_python(std::uint16_t port, int inflight, long rollouts, int max_tokens) {
  // Debian's interpreter carries python3-httpx; another python3 first on PATH may not.
  const char* python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const auto cmd =
      fmt::format("{} {} {} {} {} {}", python, ARLO_BENCH_DISPATCH_PY, port, inflight, rollouts, max_tokens);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) {
    ARLO_WARN("bench: python baseline failed ({}); is python3-httpx installed?", cmd);
    return std::nullopt;
  }
  try {
    const auto j = nlohmann::json::parse(out);
    Figures f;
    f.rollouts = j.at("rollouts").get<long>();
    f.errors = j.at("errors").get<long>();
    f.wall_s = j.at("wall_s").get<double>();
    f.cpu_s = j.at("cpu_s").get<double>();
    f.lag_p50_s = j.at("lag_p50_s").get<double>();
    f.lag_p99_s = j.at("lag_p99_s").get<double>();
    return f;
  } catch (const std::exception& e) {
    ARLO_WARN("bench: cannot read the python baseline's output: {}", e.what());
    return std::nullopt;
  }
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  long rollouts = 0;  // 0: per level, 16 x in-flight (at least 8192)
  std::vector<int> levels = {256, 4096};
  int max_tokens = 16;
  bool python = true;
  int gen_ms = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rollouts")
      rollouts = std::stol(val());
    else if (a == "--inflight")
      levels = parse_list(val());
    else if (a == "--max-tokens")
      max_tokens = std::stoi(val());
    else if (a == "--no-python")
      python = false;
    else if (a == "--gen-ms")
      gen_ms = std::stoi(val());
    else {
      std::fprintf(stderr,
                   "usage: arlo-bench-dispatch [--rollouts N] [--inflight 256,4096] [--max-tokens T] [--gen-ms MS] "
                   "[--no-python]\n");
      return 2;
    }
  }
  log::Options log_options;
  log_options.level = "warn";
  (void)log::init(log_options);
  (void)http::raise_open_file_limit();

  asio::io_context server_io;
  http::ServerOptions so;
  so.stop_grace = std::chrono::milliseconds(std::max(5000, 2 * gen_ms));
  http::Server server(server_io, so);
  server.route(
      http::Verb::post, "/v1/completions", [&server_io, gen_ms](http::Request req) -> asio::awaitable<http::Response> {
        if (gen_ms > 0) {  // simulated generation time: the loop is then not saturated by a free server
          // Spread over [0.5, 1.5] x gen_ms (fixed by the request's seed) so completions do not arrive
          // in lockstep waves, as generations of different lengths would not.
          auto body = req.json();
          const auto seed = body ? body->value("seed", std::uint64_t{0}) : 0;
          const double spread = 0.5 + static_cast<double>((seed * 0x9E3779B97F4A7C15ull) >> 11) / 9007199254740992.0;
          asio::steady_timer t(server_io, std::chrono::microseconds(static_cast<long>(gen_ms * 1000 * spread)));
          co_await t.async_wait(asio::use_awaitable);
        }
        co_return complete(req);
      });
  // What the pool's health checks and the arlo admin client call: answered at once.
  auto accept = [](http::Request) -> asio::awaitable<http::Response> {
    co_return http::Response::json(200, {{"ok", true}});
  };
  server.route(http::Verb::get, "/health", accept);
  for (const char* path : {"/pause", "/resume", "/weights/prepare", "/weights/commit"})
    server.route(http::Verb::post, path, accept);
  auto port = server.start();
  if (!port) {
    std::fprintf(stderr, "server: %s\n", port.error().what().c_str());
    return 1;
  }
  auto guard = asio::make_work_guard(server_io);
  // The server stands in for inference workers on other machines: on this shared CPU it yields to
  // the orchestrator's loop, as the network thread does.
  std::thread server_thread([&] {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kNetworkThreadNice);
    server_io.run();
  });

  std::printf(
      "arlo-bench-dispatch: whole orchestrator loop vs Python asyncio+httpx, same server, %d tokens per "
      "completion, server answers after %d ms\n",
      max_tokens, gen_ms);
  std::printf("%-9s %-8s %9s %12s %14s %12s %12s %7s\n", "inflight", "client", "rollouts", "rollouts/s",
              "cpu us/rollout", "lag p50 ms", "lag p99 ms", "errors");
  for (int level : levels) {
    const long n = rollouts > 0 ? rollouts : std::max<long>(8192, 16L * level);
    const auto c = run_orchestrator(*port, level, n, max_tokens);
    std::printf("%-9d %-8s %9ld %12.0f %14.1f %12.2f %12.2f %7ld\n", level, "arlo", c.rollouts, c.per_s(),
                c.cpu_us_per_rollout(), c.lag_p50_s * 1e3, c.lag_p99_s * 1e3, c.errors);
    if (!python) continue;
    const auto py = run_python(*port, level, n, max_tokens);
    if (!py) continue;
    std::printf("%-9d %-8s %9ld %12.0f %14.1f %12.2f %12.2f %7ld\n", level, "python", py->rollouts, py->per_s(),
                py->cpu_us_per_rollout(), py->lag_p50_s * 1e3, py->lag_p99_s * 1e3, py->errors);
    std::printf(
        "%-9d ratios: rollouts/s arlo/python %.2fx | CPU per rollout python/arlo %.1fx | lag p99 python/arlo "
        "%.1fx\n",
        level, c.per_s() / std::max(py->per_s(), 1e-9),
        py->cpu_us_per_rollout() / std::max(c.cpu_us_per_rollout(), 1e-9), py->lag_p99_s / std::max(c.lag_p99_s, 1e-9));
  }
  // Graceful stop on the server's own thread: simulated generations still running for requests
  // the orchestrator cancelled at its drain finish first (within the grace period).
  guard.reset();
  asio::co_spawn(server_io, server.stop(), asio::detached);
  server_thread.join();
  return 0;
}
