// arlo-bench-client: how much CPU the rollout inference client spends per request.
//
// Starts a trivial OpenAI-compatible server in a child process (so its CPU is not counted), then for
// each concurrency level drives the same completion load twice:
//   arlo    InferencePool::submit on one io_context thread (JSON body built, POSTed, answer parsed)
//   python  asyncio + httpx in a child process (same body, same parsing), Debian's python3-httpx
// and prints requests/s and CPU microseconds per request for both, and the CPU ratio python/arlo.
//
//   arlo-bench-client [--concurrency 256,4096] [--requests 20000] [--python-requests 6000]
//                     [--python /usr/bin/python3] [--no-python]
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/http.h"
#include "common/log.h"
#include "rollout/inference_pool.h"

extern char** environ;

namespace {

namespace asio = boost::asio;
using arlo::rollout::Json;

double cpu_seconds_self() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// The trivial server: a fixed completion answer. Runs in a forked child until killed.
[[noreturn]] void serve(int port_fd) {
  asio::io_context io;
  arlo::http::ServerOptions o;
  o.idle_timeout = std::chrono::seconds(600);
  arlo::http::Server server(io, o);
  const std::string answer =
      Json{{"id", "cmpl-bench"},
           {"model", "bench"},
           {"choices", Json::array({{{"index", 0},
                                     {"text", "68"},
                                     {"token_ids", Json::array({54, 56})},
                                     {"logprobs", {{"token_logprobs", Json::array({-0.1, -0.2})}}},
                                     {"finish_reason", "stop"}}})},
           {"prompt_token_ids", Json::array({50, 51, 43, 52, 53, 61})}}
          .dump();
  server.route(arlo::http::Verb::post, "/v1/completions",
               [&](arlo::http::Request) -> asio::awaitable<arlo::http::Response> {
                 arlo::http::Response r;
                 r.body = answer;
                 co_return r;
               });
  server.route(arlo::http::Verb::get, "/health", [](arlo::http::Request) -> asio::awaitable<arlo::http::Response> {
    co_return arlo::http::Response::json(200, {{"status", "ok"}});
  });
  auto port = server.start();
  const int value = port ? *port : -1;
  if (write(port_fd, &value, sizeof(value)) != sizeof(value)) _exit(2);
  close(port_fd);
  if (!port) _exit(1);
  io.run();
  _exit(0);
}

struct RunResult {
  std::size_t requests = 0;
  std::size_t errors = 0;
  double wall_s = 0;
  double cpu_s = 0;
};

RunResult run_arlo(const std::string& url, std::size_t concurrency, std::size_t total) {
  asio::io_context io;
  arlo::rollout::PoolOptions o;
  o.client.max_idle_per_host = concurrency;  // keep every connection alive between requests
  o.client.retry.max_attempts = 1;
  o.max_attempts = 1;
  arlo::rollout::InferencePool pool(io, o);
  pool.add_worker(url);
  RunResult result;
  result.requests = total;
  asio::co_spawn(io, pool.check_all(), asio::detached);
  io.run();
  io.restart();
  std::size_t remaining = total;
  const double cpu0 = cpu_seconds_self();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t w = 0; w < concurrency; ++w) {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          while (remaining > 0) {
            --remaining;
            arlo::rollout::CompletionRequest req;
            req.prompt = "23+45=";
            req.sampling.max_tokens = 8;
            auto r = co_await pool.submit(std::move(req), std::chrono::seconds(120));
            if (!r || r->choices.empty() || r->choices[0].text.empty()) ++result.errors;
          }
        },
        asio::detached);
  }
  io.run();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.cpu_s = cpu_seconds_self() - cpu0;
  return result;
}

std::optional<RunResult> run_python(const std::string& python, const std::string& script, const std::string& url,
                                    std::size_t concurrency, std::size_t total) {
  int out[2];
  if (pipe(out) != 0) return std::nullopt;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<std::string> args = {
      python, script, "--url", url, "--concurrency", std::to_string(concurrency), "--requests", std::to_string(total)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    std::fprintf(stderr, "cannot start %s: %s\n", python.c_str(), std::strerror(rc));
    return std::nullopt;
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "python baseline failed (status %d): %s\n", status, text.c_str());
    return std::nullopt;
  }
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  RunResult r;
  r.requests = j.value("requests", 0u);
  r.errors = j.value("errors", 0u);
  r.wall_s = j.value("wall_s", 0.0);
  r.cpu_s = j.value("cpu_s", 0.0);  // load window only, measured inside the interpreter
  return r;
}

std::string default_script() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = exe.parent_path() / "arlo_bench_client_httpx.py";
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return "bench/rollout/httpx_client.py";
}

void print_row(const char* who, std::size_t concurrency, const RunResult& r) {
  std::printf("%-8s %6zu %9zu %7zu %11.0f %14.1f\n", who, concurrency, r.requests, r.errors,
              static_cast<double>(r.requests) / r.wall_s, 1e6 * r.cpu_s / static_cast<double>(r.requests));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"arlo-bench-client: rollout inference client CPU per request vs Python asyncio + httpx"};
  std::vector<std::size_t> levels = {256, 4096};
  std::size_t requests = 20000, python_requests = 6000;
  std::string python = "/usr/bin/python3", script = default_script();
  bool no_python = false;
  app.add_option("--concurrency", levels, "concurrent requests, one run per level")->delimiter(',');
  app.add_option("--requests", requests, "requests per level for the arlo client");
  app.add_option("--python-requests", python_requests, "requests per level for the Python baseline");
  app.add_option("--python", python, "Python interpreter with httpx (Debian: python3-httpx)");
  app.add_option("--script", script, "the baseline script (arlo_bench_client_httpx.py)");
  app.add_flag("--no-python", no_python, "skip the Python baseline");
  CLI11_PARSE(app, argc, argv);
  (void)arlo::log::init({.level = "warn", .file = std::nullopt, .name = "bench"});

  int port_pipe[2];
  if (pipe(port_pipe) != 0) return 1;
  const pid_t server_pid = fork();
  if (server_pid == 0) {
    close(port_pipe[0]);
    serve(port_pipe[1]);
  }
  close(port_pipe[1]);
  int port = -1;
  if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port) || port <= 0) {
    std::fprintf(stderr, "server did not start\n");
    return 1;
  }
  close(port_pipe[0]);
  const std::string url = fmt::format("http://127.0.0.1:{}", port);

  std::printf("client overhead against a trivial local completions server (%s); CPU is the client's only\n",
              url.c_str());
  std::printf("%-8s %6s %9s %7s %11s %14s\n", "client", "conc", "requests", "errors", "req/s", "cpu_us/req");
  int rc = 0;
  for (std::size_t c : levels) {
    const RunResult a = run_arlo(url, c, requests);
    print_row("arlo", c, a);
    if (a.errors) rc = 1;
    if (no_python) continue;
    auto p = run_python(python, script, url, c, python_requests);
    if (!p) {
      std::printf("%-8s %6zu   (baseline unavailable)\n", "python", c);
      continue;
    }
    print_row("python", c, *p);
    const double arlo_cpu = a.cpu_s / static_cast<double>(a.requests);
    const double py_cpu = p->cpu_s / static_cast<double>(p->requests);
    std::printf(
        "ratio    %6zu   python/arlo CPU per request = %.1fx (target >= 10x)   throughput arlo/python = %.1fx\n", c,
        py_cpu / arlo_cpu,
        (static_cast<double>(a.requests) / a.wall_s) / (static_cast<double>(p->requests) / p->wall_s));
  }
  kill(server_pid, SIGTERM);
  waitpid(server_pid, nullptr, 0);
  return rc;
}
