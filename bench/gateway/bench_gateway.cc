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
#include <sys/wait.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/http.h"
#include "rollout/inference_pool.h"
#include "session/gateway.h"
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
arlo::Awaitable<bool> trajectory(arlo::http::Client& client, std::string base, int calls, int max_tokens,
                                 std::uint64_t seed, std::vector<double>& out) {
  json prompt = "12+34=";  // then token ids: what the model saw and wrote, and "\n+\n" (token-in/token-out)
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

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"The policy gateway's added latency per model call against calling the worker directly."};
  app.add_option("--rounds", args.rounds, "trajectories per path");
  app.add_option("--calls", args.calls, "calls per trajectory");
  app.add_option("--max-tokens", args.max_tokens, "tokens per call");
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);
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
