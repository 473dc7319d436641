// arlo-bench-http: throughput and CPU cost per request of arlo::http::Client against
// arlo::http::Server over loopback, at several concurrency levels.
//
// The server runs on its own thread and io_context, the client on the main thread, so the CPU time
// of each side is measured separately (CLOCK_THREAD_CPUTIME_ID). Each request is a small JSON POST
// shaped like an inference call; the handler answers a fixed JSON body, so the figures are the
// HTTP layer's own cost. Baselines measured in the same run against the same server: Python's
// http.client (sequential, keep-alive) and, when importable, httpx.AsyncClient. No thresholds.
//
//   arlo-bench-http [--requests N] [--concurrency 1,64,1024,4096] [--python-requests N]
#include <time.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/http.h"
#include "common/log.h"

namespace asio = boost::asio;
using namespace arlo::http;

namespace {

double thread_cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

const std::string kRequestBody =
    R"({"model":"policy","prompt":[101,2023,2003,1037,2460,25732,2007,2070,19204,8909,2015],)"
    R"("max_tokens":128,"temperature":1.0,"top_p":1.0,"n":1,"seed":1234,"logprobs":1,)"
    R"("return_token_ids":true,"stop":["</answer>"]})";
const std::string kResponseBody =
    R"({"id":"cmpl-1","object":"text_completion","model":"policy","choices":[{"index":0,)"
    R"("text":"the answer is 42","token_ids":[1996,3437,2003,4413],"logprobs":{"token_logprobs":)"
    R"([-0.11,-0.52,-0.03,-1.2]},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":4}})";

struct RunResult {
  int concurrency = 0;
  long requests = 0;
  long errors = 0;
  double wall_s = 0;
  double client_cpu_s = 0;
};

// Issues `total` POSTs from `concurrency` coroutines on `io` (this thread) and measures them.
RunResult run_arlo(const std::string& url, long total, int concurrency) {
  asio::io_context io;
  ClientOptions options;
  options.max_idle_per_host = static_cast<std::size_t>(concurrency);
  Client client(io, options);
  RunResult result;
  result.concurrency = concurrency;

  auto run_batch = [&](long count, long& errors) {
    long issued = 0;
    int workers_left = concurrency;
    for (int w = 0; w < concurrency; ++w) {
      asio::co_spawn(
          io,
          [&]() -> asio::awaitable<void> {
            while (issued < count) {
              ++issued;
              ClientRequest req;
              req.method = Verb::post;
              req.url = url;
              req.body = kRequestBody;
              auto r = co_await client.request(std::move(req));
              if (!r || r->status != 200) ++errors;
            }
            --workers_left;
          },
          asio::detached);
    }
    io.restart();
    io.run();
    return workers_left == 0;
  };

  long warm_errors = 0;
  run_batch(std::max<long>(concurrency, 1000), warm_errors);  // opens the connections, warms caches
  const double cpu0 = thread_cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  const auto t0 = std::chrono::steady_clock::now();
  run_batch(total, result.errors);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.client_cpu_s = thread_cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  result.requests = total;
  result.errors += warm_errors;
  return result;
}

// Runs a Python client script; it prints "<cpu seconds> <requests> <errors>" for its measured loop.
std::optional<RunResult> run_python(const std::string& python, const std::string& script, const std::string& args,
                                    int concurrency) {
  const std::string cmd = fmt::format("{} -c '{}' {} 2>/dev/null", python, script, args);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return std::nullopt;
  char line[256] = {};
  const auto t0 = std::chrono::steady_clock::now();
  const bool got = std::fgets(line, sizeof line, pipe) != nullptr;
  const int rc = ::pclose(pipe);
  if (!got || rc != 0) return std::nullopt;
  RunResult r;
  r.concurrency = concurrency;
  std::istringstream in(line);
  double wall = 0;
  if (!(in >> r.client_cpu_s >> r.requests >> r.errors >> wall)) return std::nullopt;
  r.wall_s = wall > 0 ? wall : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Sequential keep-alive client from the standard library.
constexpr const char* kHttpClientScript = R"PY(
import http.client, sys, time
host, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
body = sys.argv[5].encode()
headers = {"content-type": "application/json"}
conn = http.client.HTTPConnection(host, port)
def one():
    conn.request("POST", path, body, headers)
    r = conn.getresponse(); r.read(); return r.status == 200
for _ in range(200): one()
errors = 0
t0, w0 = time.process_time(), time.perf_counter()
for _ in range(n):
    if not one(): errors += 1
print(time.process_time() - t0, n, errors, time.perf_counter() - w0)
)PY";

// httpx.AsyncClient with `c` concurrent tasks (the client the orchestrator replaces).
constexpr const char* kHttpxScript = R"PY(
import asyncio, sys, time
import httpx
url, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = sys.argv[4].encode()
headers = {"content-type": "application/json"}
async def main():
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        state = {"left": 0, "errors": 0}
        async def worker():
            while state["left"] > 0:
                state["left"] -= 1
                r = await client.post(url, content=body, headers=headers)
                if r.status_code != 200: state["errors"] += 1
        state["left"] = max(200, c)
        await asyncio.gather(*[worker() for _ in range(c)])
        state["left"] = n
        t0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(c)])
        print(time.process_time() - t0, n, state["errors"], time.perf_counter() - w0)
asyncio.run(main())
)PY";

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

void print_row(const std::string& name, const RunResult& r, double server_cpu_s) {
  const double n = static_cast<double>(std::max<long>(r.requests, 1));
  fmt::print("{:<28} {:>6} {:>9} {:>7} {:>11.0f} {:>13.2f} {:>13}\n", name, r.concurrency, r.requests, r.errors,
             static_cast<double>(r.requests) / r.wall_s, r.client_cpu_s / n * 1e6,
             server_cpu_s >= 0 ? fmt::format("{:.2f}", server_cpu_s / n * 1e6) : std::string("-"));
}

}  // namespace

int main(int argc, char** argv) {
  long requests = 50000;
  long python_requests = 2000;
  std::vector<int> concurrency = {1, 64, 1024, 4096};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--requests") {
      requests = std::atol(argv[i + 1]);
    } else if (flag == "--python-requests") {
      python_requests = std::atol(argv[i + 1]);
    } else if (flag == "--concurrency") {
      concurrency.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) concurrency.push_back(std::atoi(item.c_str()));
    } else {
      fmt::print(stderr,
                 "usage: arlo-bench-http [--requests N] [--concurrency 1,64,1024,4096] [--python-requests N]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    fmt::print(stderr, "usage: arlo-bench-http [--requests N] [--concurrency 1,64,1024,4096] [--python-requests N]\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  if (auto limit = raise_open_file_limit(); !limit) {
    fmt::print(stderr, "{}\n", limit.error().what());
  }

  // Server on its own thread.
  asio::io_context server_io;
  ServerOptions server_options;
  server_options.bind = "127.0.0.1";
  Server server(server_io, server_options);
  server.route(Verb::post, "/v1/completions", [](Request) -> asio::awaitable<Response> {
    Response r;
    r.body = kResponseBody;
    co_return r;
  });
  auto port = server.start();
  if (!port) {
    fmt::print(stderr, "{}\n", port.error().what());
    return 1;
  }
  auto work = asio::make_work_guard(server_io);
  clockid_t server_clock{};
  std::thread server_thread([&] { server_io.run(); });
  pthread_getcpuclockid(server_thread.native_handle(), &server_clock);
  const std::string path = "/v1/completions";
  const std::string url = fmt::format("http://127.0.0.1:{}{}", *port, path);

  fmt::print("arlo-bench-http: POST {} ({} B request, {} B response), loopback, one client thread, one server thread\n",
             path, kRequestBody.size(), kResponseBody.size());
  fmt::print("{:<28} {:>6} {:>9} {:>7} {:>11} {:>13} {:>13}\n", "client", "conc", "requests", "errors", "req/s",
             "client_us/req", "server_us/req");
  std::vector<RunResult> arlo_runs;
  for (int c : concurrency) {
    const double s0 = thread_cpu_seconds(server_clock);
    RunResult r = run_arlo(url, requests, c);
    const double server_cpu = thread_cpu_seconds(server_clock) - s0;  // includes the warm-up batch
    const double warm = static_cast<double>(std::max<long>(c, 1000));
    print_row("arlo::http::Client", r,
              server_cpu * static_cast<double>(r.requests) / (static_cast<double>(r.requests) + warm));
    arlo_runs.push_back(r);
  }

  auto arlo_at = [&](int c) -> const RunResult* {
    for (const auto& r : arlo_runs)
      if (r.concurrency == c) return &r;
    return nullptr;
  };
  auto ratio_line = [&](const std::string& name, const RunResult& py) {
    const RunResult* ours = arlo_at(py.concurrency);
    if (!ours) ours = &arlo_runs.front();
    const double py_us = py.client_cpu_s / static_cast<double>(py.requests) * 1e6;
    const double our_us = ours->client_cpu_s / static_cast<double>(ours->requests) * 1e6;
    fmt::print("  ratio {} / arlo client CPU per request (concurrency {} vs {}): {:.1f}x\n", name, py.concurrency,
               ours->concurrency, py_us / our_us);
  };

  // The system interpreter carries the Debian python3-httpx package; a pyenv/venv python3 first on
  // PATH may not.
  std::string python = "python3";
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    if (std::system(fmt::format("{} -c 'import httpx' >/dev/null 2>&1", candidate).c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  const auto stdlib =
      run_python(python, kHttpClientScript,
                 fmt::format("127.0.0.1 {} {} {} {}", *port, path, python_requests, shell_quote(kRequestBody)), 1);
  if (stdlib) {
    print_row("python http.client", *stdlib, -1);
  } else {
    fmt::print("python http.client baseline: skipped (python3 not runnable)\n");
  }
  // httpx at concurrency 1 (its cheapest path) and 64 (its connection pool under load).
  std::vector<RunResult> httpx_runs;
  for (const int c : {1, 64}) {
    auto r = run_python(python, kHttpxScript,
                        fmt::format("{} {} {} {}", url, python_requests, c, shell_quote(kRequestBody)), c);
    if (!r) {
      fmt::print("python httpx baseline: skipped (python3 -c 'import httpx' failed: install python3-httpx)\n");
      break;
    }
    print_row("python httpx.AsyncClient", *r, -1);
    httpx_runs.push_back(*r);
  }
  if (stdlib) ratio_line("python http.client", *stdlib);
  for (const auto& r : httpx_runs) ratio_line("httpx", r);

  server.close();
  work.reset();
  server_io.stop();
  server_thread.join();
  return 0;
}
