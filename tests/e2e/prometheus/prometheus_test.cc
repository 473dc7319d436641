// Debian's Prometheus server scrapes a running `arlo run`, all real processes on loopback: the
// quickstart shortened with --set (two arlo-worker processes, arlo-trainer, a supervised warm-up,
// then GRPO steps with evals), its status port picked by the test, and /usr/bin/prometheus with a
// generated config that scrapes it every second. Checked from the outside, as a user would:
//   - while the run goes, the test's own GETs of /metrics: valid text exposition (exposition.h) that
//     holds the documented names with numbers, per worker for the labelled ones;
//   - Prometheus parsed every scrape (its `up` series) and its query API returns the train reward
//     series with several samples, each a value the run wrote to metrics.jsonl;
//   - every metric the Grafana dashboard (deploy/grafana/arlo.json) queries exists in Prometheus,
//     and every panel's query returns data from the run;
//   - nothing the test started is left running afterwards, whatever failed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http.h"
#include "tests/e2e/prometheus/exposition.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using arlo::e2e::Exposition;
using arlo::e2e::parse_exposition;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr int kWorkers = 2;  // configs/quickstart.yaml's inference.num_workers

// The names the issue and docs/architecture.md promise on /metrics (RL steps and evals have run).
const std::vector<std::string> kRequired = {"arlo_train_reward_mean",
                                            "arlo_train_reward_exact_match_mean",
                                            "arlo_trainer_loss",
                                            "arlo_trainer_mismatch_kl",
                                            "arlo_trainer_grad_norm",
                                            "arlo_trainer_lr",
                                            "arlo_trainer_entropy",
                                            "arlo_trainer_clipped_fraction",
                                            "arlo_eval_arithmetic_pass_1",
                                            "arlo_weight_sync_seconds",
                                            "arlo_throughput_tokens_per_s",
                                            "arlo_rollouts_completed",
                                            "arlo_weight_sync_worker_seconds",
                                            "arlo_worker_version"};
// Those of kRequired with one series per worker, labelled worker="<admin url>".
const std::vector<std::string> kPerWorker = {"arlo_weight_sync_worker_seconds", "arlo_worker_version"};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail(const std::string& s, std::size_t n = 6000) { return s.size() > n ? s.substr(s.size() - n) : s; }

// A free TCP port on loopback (bound and released; the child binds it right after).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A child process with stdout and stderr in `log`. It dies with the test (PDEATHSIG); stop() and the
// destructor end it: SIGTERM, then SIGKILL if it has not exited within the grace period.
class Process {
 public:
  Process(const std::vector<std::string>& args, fs::path log)
      : log_(std::move(log)), pid_(arlo::e2e::spawn_logged(args, log_)) {}
  ~Process() { stop(30s); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // True while it has not exited (reaps it when it has).
  bool running() {
    if (exited_) return false;
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = status;
    }
    return !exited_;
  }
  // Waits until it exits or the deadline passes; true if it exited.
  bool wait_until(Clock::time_point deadline) {
    while (running() && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
    return !running();
  }
  // SIGTERM, then SIGKILL after `grace`; returns the wait status.
  int stop(std::chrono::seconds grace) {
    if (pid_ > 0 && running()) {
      ::kill(pid_, SIGTERM);
      if (!wait_until(Clock::now() + grace)) {
        ::kill(pid_, SIGKILL);
        int status = 0;
        ::waitpid(pid_, &status, 0);
        exited_ = true;
        status_ = status;
      }
    }
    return status_;
  }
  bool exited_ok() const { return exited_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }
  int status() const { return status_; }
  std::string output() const { return read_file(log_); }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
};

// One GET through arlo's HTTP client, no retries (the callers poll).
arlo::Result<arlo::http::Response> http_get(const std::string& url, std::chrono::seconds timeout = 10s) {
  boost::asio::io_context io;
  arlo::http::ClientOptions options;
  options.retry.max_attempts = 1;
  arlo::http::Client client(io, options);
  auto done = boost::asio::co_spawn(io, client.get(url, timeout), boost::asio::use_future);
  io.run();
  return done.get();
}

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// Prometheus' HTTP API: the "data" of a successful answer, or an error saying what came back.
class PrometheusApi {
 public:
  explicit PrometheusApi(int port) : base_("http://127.0.0.1:" + std::to_string(port)) {}
  const std::string& base() const { return base_; }

  std::expected<nlohmann::json, std::string> get(const std::string& path_and_query) const {
    auto r = http_get(base_ + path_and_query);
    if (!r) return std::unexpected(path_and_query + ": " + r.error().what());
    auto body = nlohmann::json::parse(r->body, nullptr, false);
    if (r->status != 200 || body.is_discarded() || body.value("status", "") != "success")
      return std::unexpected(path_and_query + ": HTTP " + std::to_string(r->status) + " " + tail(r->body, 2000));
    return body.at("data");
  }
  // An instant query at `at` (unix seconds).
  std::expected<nlohmann::json, std::string> query(const std::string& expr, double at) const {
    return get("/api/v1/query?query=" + url_encode(expr) + "&time=" + std::to_string(at));
  }
  std::expected<nlohmann::json, std::string> query_range(const std::string& expr, double start, double end,
                                                         double step) const {
    return get("/api/v1/query_range?query=" + url_encode(expr) + "&start=" + std::to_string(start) +
               "&end=" + std::to_string(end) + "&step=" + std::to_string(step));
  }

 private:
  std::string base_;
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// The raw samples (value per scrape) of every series a range-vector query `expr[window]` returns.
std::vector<double> raw_samples(const nlohmann::json& data) {
  std::vector<double> out;
  for (const auto& series : data.at("result"))
    for (const auto& v : series.at("values")) out.push_back(std::stod(v.at(1).get<std::string>()));
  return out;
}

// What the dashboard's queries name: plain metric names, and the regexes of __name__=~"..." matchers
// (each must match at least one name). Label values and label_replace arguments are string literals
// and are not names.
struct QueriedNames {
  std::set<std::string> names;
  std::set<std::string> regexes;
};

void collect_names(const std::string& expr, QueriedNames& out) {
  static const std::regex name_regex(R"re(__name__\s*=~\s*"((?:[^"\\]|\\.)*)")re");
  for (std::sregex_iterator it(expr.begin(), expr.end(), name_regex), end; it != end; ++it)
    out.regexes.insert((*it)[1].str());
  static const std::regex string_literal(R"re("(?:[^"\\]|\\.)*")re");
  const std::string code = std::regex_replace(expr, string_literal, "\"\"");
  static const std::regex identifier(R"(\barlo_[A-Za-z0-9_:]*)");
  for (std::sregex_iterator it(code.begin(), code.end(), identifier), end; it != end; ++it) out.names.insert(it->str());
}

// The dashboard's queries with Grafana's variables filled in for this run.
std::string fill_variables(std::string expr, const std::string& instance) {
  for (const auto& [var, value] : std::vector<std::pair<std::string, std::string>>{
           {"$__rate_interval", "5s"}, {"${instance}", instance}, {"$instance", instance}}) {
    for (std::size_t at; (at = expr.find(var)) != std::string::npos;) expr.replace(at, var.size(), value);
  }
  return expr;
}

// Every process whose command line mentions `dir` (what the test started keeps its files there).
std::vector<std::string> processes_mentioning(const fs::path& dir) {
  std::vector<std::string> out;
  const std::string self = std::to_string(::getpid());
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid == self) continue;
    std::string cmdline = read_file(entry.path() / "cmdline");
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(dir.string()) != std::string::npos) out.push_back(pid + ": " + cmdline);
  }
  return out;
}

// The parts of one scrape the test checks.
struct ScrapeFindings {
  std::set<std::string> missing;                         // of kRequired
  std::set<std::string> not_finite;                      // of kRequired: NaN or infinite
  std::map<std::string, std::set<std::string>> workers;  // labelled name -> worker label values
};

ScrapeFindings check_scrape(const Exposition& e) {
  ScrapeFindings f;
  for (const auto& name : kRequired) {
    const auto samples = e.named(name);
    if (samples.empty()) f.missing.insert(name);
    for (const auto& s : samples)
      if (!std::isfinite(s.value)) f.not_finite.insert(name);
  }
  for (const auto& name : kPerWorker)
    for (const auto& s : e.named(name))
      if (s.labels.contains("worker")) f.workers[name].insert(s.labels.at("worker"));
  return f;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

class PrometheusE2E : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = arlo::e2e::fresh_temp_dir("arlo_prometheus_e2e"); }
  void TearDown() override {
    // The processes were stopped when their owners went out of scope; their children (the workers
    // and the trainer) follow arlo by PDEATHSIG. Wait for every one of them to be gone.
    const auto deadline = Clock::now() + 60s;
    auto left = processes_mentioning(dir_);
    while (!left.empty() && Clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
      left = processes_mentioning(dir_);
    }
    std::string listing;
    for (const auto& p : left) listing += "\n  " + p;
    EXPECT_TRUE(left.empty()) << "processes left running:" << listing;
    if (!HasFailure())
      fs::remove_all(dir_);
    else
      std::printf("kept for inspection: %s\n", dir_.c_str());
  }

  void scrape_a_run();
  fs::path dir_;
};

TEST_F(PrometheusE2E, PrometheusScrapesARunningArloRun) { scrape_a_run(); }

void PrometheusE2E::scrape_a_run() {
  ASSERT_TRUE(fs::exists(kPrometheus)) << kPrometheus << " is missing: run scripts/bootstrap (make test runs it), "
                                       << "which installs Debian's prometheus package";
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ARLO_SOURCE_DIR is not set (ctest sets it)";
  const auto dashboard = nlohmann::json::parse(read_file(fs::path(src) / "deploy/grafana/arlo.json"), nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded()) << "deploy/grafana/arlo.json is not JSON";

  const int status_port = free_port();
  int prom_port = free_port();
  while (prom_port == status_port) prom_port = free_port();
  ASSERT_GT(status_port, 0);
  ASSERT_GT(prom_port, 0);
  const std::string instance = "127.0.0.1:" + std::to_string(status_port);

  {
    std::ofstream cfg(dir_ / "prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n  - job_name: arlo\n    metrics_path: /metrics\n"
        << "    static_configs:\n      - targets: ['" << instance << "']\n";
  }
  const double t_start = unix_now();
  Process prometheus({kPrometheus, "--config.file=" + (dir_ / "prometheus.yml").string(),
                      "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
                      "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
                     dir_ / "prometheus.log");
  const PrometheusApi api(prom_port);
  {
    const auto deadline = Clock::now() + 120s;
    bool ready = false;
    while (!ready && prometheus.running() && Clock::now() < deadline) {
      auto r = http_get(api.base() + "/-/ready", 5s);
      ready = r && r->status == 200;
      if (!ready) std::this_thread::sleep_for(200ms);
    }
    ASSERT_TRUE(ready) << "prometheus did not become ready within 120 s (status " << prometheus.status() << "):\n"
                       << tail(prometheus.output());
  }

  // The quickstart, shortened: 20 supervised steps, then 280 GRPO steps (long enough for a dozen
  // 1-second scrapes on an idle machine), an eval at the start of RL and every 50 steps, a pipeline
  // view every second.
  const fs::path run_dir = dir_ / "run";
  auto args = arlo::e2e::arlo_run_argv(
      ARLO_BINARY, std::string(src) + "/configs/quickstart.yaml",
      {"run.dir=" + run_dir.string(), "run.max_steps=300", "orchestrator.sft_warmup_steps=20", "eval.interval=50",
       "status.port=" + std::to_string(status_port), "log.interval_s=1", "log.progress=false"});
  args.push_back("--overwrite");
  Process arlo(args, dir_ / "arlo.log");

  // Our own scrapes, as often as they come back, until the run ends.
  int scrapes = 0;
  std::optional<ScrapeFindings> last;
  std::optional<ScrapeFindings> complete;   // the first scrape with every required name
  std::string invalid;                      // the first invalid exposition, with the reason
  std::optional<std::string> content_type;  // one that is not text/plain; version=0.0.4
  std::string last_text;                    // the last scrape, kept in the test's dir for inspection
  const auto run_deadline = Clock::now() + 480s;
  while (arlo.running() && Clock::now() < run_deadline) {
    auto r = http_get("http://" + instance + "/metrics", 5s);
    if (r && r->status == 200) {
      ++scrapes;
      if (!r->content_type.starts_with("text/plain") || r->content_type.find("version=0.0.4") == std::string::npos)
        content_type = r->content_type;
      last_text = r->body;
      auto e = parse_exposition(r->body);
      if (!e) {
        if (invalid.empty()) invalid = e.error() + "\n" + tail(r->body, 4000);
      } else {
        last = check_scrape(*e);
        if (!complete && last->missing.empty()) complete = last;
      }
    }
    std::this_thread::sleep_for(100ms);
  }
  std::ofstream(dir_ / "last_scrape.txt") << last_text;
  const bool finished = arlo.wait_until(run_deadline);
  ASSERT_TRUE(finished) << "arlo run did not finish within 480 s:\n" << tail(arlo.output());
  ASSERT_TRUE(arlo.exited_ok()) << "arlo run failed (status " << arlo.status() << "):\n" << tail(arlo.output());
  const double t_end = unix_now();
  std::printf("prometheus e2e: %d scrapes of /metrics during a %.1f s run\n", scrapes, t_end - t_start);

  EXPECT_FALSE(content_type.has_value()) << "/metrics answered with Content-Type '" << content_type.value_or("") << "'";
  EXPECT_TRUE(invalid.empty()) << "/metrics is not valid Prometheus text exposition: " << invalid;
  ASSERT_GE(scrapes, 3) << "/metrics answered too few times:\n" << tail(arlo.output());
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(complete.has_value()) << "no scrape held every documented name; missing at the last scrape: "
                                    << join(last->missing);
  // The labelled families carry one series per worker, named by its admin URL as summary.json does.
  const auto summary = nlohmann::json::parse(read_file(run_dir / "summary.json"), nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << "no summary.json in " << run_dir;
  std::set<std::string> worker_urls;
  for (const auto& [url, w] : summary.at("workers").items()) worker_urls.insert(url);
  EXPECT_EQ(worker_urls.size(), static_cast<std::size_t>(kWorkers)) << summary.at("workers").dump();
  EXPECT_TRUE(last->not_finite.empty()) << "not finite at the last scrape: " << join(last->not_finite);
  for (const auto& name : kPerWorker)
    EXPECT_EQ(last->workers.contains(name) ? last->workers.at(name) : std::set<std::string>{}, worker_urls)
        << name << "{worker=...}: one series per worker";

  // What the run wrote to metrics.jsonl as its train reward.
  std::vector<double> rewards;
  {
    std::ifstream in(run_dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("train/reward/mean")) rewards.push_back(j.at("train/reward/mean").get<double>());
    }
  }
  ASSERT_FALSE(rewards.empty()) << "no train/reward/mean in metrics.jsonl";
  auto written = [&](double v) {
    for (double r : rewards)
      if (std::abs(r - v) <= 1e-9 * std::max(1.0, std::abs(r))) return true;
    return false;
  };

  // Prometheus holds the reward series: several scrapes of it, each a value of metrics.jsonl.
  // (Raw samples of a range selector; the head block answers queries as soon as a scrape lands.)
  const std::string window = "[" + std::to_string(static_cast<int>(unix_now() - t_start) + 60) + "s]";
  std::vector<double> prom_rewards;
  {
    const auto deadline = Clock::now() + 60s;
    std::string last_error;
    while (Clock::now() < deadline) {
      auto data = api.query("arlo_train_reward_mean{job=\"arlo\"}" + window, unix_now());
      if (data) {
        prom_rewards = raw_samples(*data);
        if (prom_rewards.size() >= 3) break;
      } else {
        last_error = data.error();
      }
      std::this_thread::sleep_for(500ms);
    }
    ASSERT_GE(prom_rewards.size(), 3u) << "Prometheus holds " << prom_rewards.size()
                                       << " samples of arlo_train_reward_mean; " << last_error << "\n"
                                       << tail(prometheus.output());
  }
  std::set<double> distinct;
  for (double v : prom_rewards) {
    EXPECT_TRUE(v >= 0.0 && v <= 1.0) << v;
    EXPECT_TRUE(written(v)) << "Prometheus has arlo_train_reward_mean " << v << ", which metrics.jsonl never had";
    distinct.insert(v);
  }
  EXPECT_GE(distinct.size(), 2u) << "the reward series did not change between scrapes";
  std::printf(
      "prometheus e2e: %zu samples of arlo_train_reward_mean in Prometheus (%zu distinct), %zu steps "
      "with a reward in metrics.jsonl\n",
      prom_rewards.size(), distinct.size(), rewards.size());

  // Prometheus' own parser accepted arlo's exposition: `up` is 1 on several scrapes (a scrape whose
  // text it cannot parse sets it to 0, as does one that finds the status port closed).
  {
    auto up = api.query("up{job=\"arlo\"}" + window, unix_now());
    ASSERT_TRUE(up.has_value()) << up.error();
    const auto values = raw_samples(*up);
    const auto ok = std::count(values.begin(), values.end(), 1.0);
    EXPECT_GE(ok, 3) << "Prometheus scraped arlo successfully " << ok << " times";
  }

  // Every metric the dashboard queries exists in Prometheus, and every panel query returns data.
  auto names_data = api.get("/api/v1/label/__name__/values");
  ASSERT_TRUE(names_data.has_value()) << names_data.error();
  std::set<std::string> names;
  for (const auto& n : *names_data) names.insert(n.get<std::string>());
  std::set<std::string> missing_in_prometheus;
  for (const auto& name : kRequired)
    if (!names.contains(name)) missing_in_prometheus.insert(name);
  EXPECT_TRUE(missing_in_prometheus.empty()) << "not in Prometheus: " << join(missing_in_prometheus);

  QueriedNames queried;
  int panels = 0, queries = 0;
  ASSERT_TRUE(dashboard.contains("panels") && dashboard.at("panels").is_array());
  for (const auto& panel : dashboard.at("panels")) {
    const std::string type = panel.value("type", "");
    const std::string title = panel.value("title", "");
    if (type == "row") continue;
    ++panels;
    EXPECT_TRUE(type == "timeseries" || type == "stat") << title << ": type " << type;
    EXPECT_EQ(panel.value("/datasource/uid"_json_pointer, ""), "${datasource}") << title;
    ASSERT_TRUE(panel.contains("targets") && !panel.at("targets").empty()) << title;
    for (const auto& target : panel.at("targets")) {
      const std::string expr = target.at("expr").get<std::string>();
      ++queries;
      collect_names(expr, queried);
      auto data = api.query_range(fill_variables(expr, instance), t_start, t_end, 1.0);
      ASSERT_TRUE(data.has_value()) << title << ": " << data.error();
      EXPECT_FALSE(data->at("result").empty()) << title << ": no data for " << fill_variables(expr, instance);
    }
  }
  for (const auto& var : dashboard.at("/templating/list"_json_pointer)) {
    if (var.value("type", "") != "query") continue;
    collect_names(var.at("definition").get<std::string>(), queried);
  }
  std::set<std::string> unknown;
  for (const auto& name : queried.names)
    if (!names.contains(name)) unknown.insert(name);
  for (const auto& re : queried.regexes) {
    const std::regex r(re);
    if (std::none_of(names.begin(), names.end(), [&](const std::string& n) { return std::regex_match(n, r); }))
      unknown.insert("__name__=~\"" + re + "\"");
  }
  EXPECT_TRUE(unknown.empty()) << "the dashboard queries metrics Prometheus does not have: " << join(unknown);
  std::printf(
      "prometheus e2e: dashboard: %d panels, %d queries, %zu metric names and %zu name patterns; "
      "Prometheus has %zu names\n",
      panels, queries, queried.names.size(), queried.regexes.size(), names.size());

  const int prom_status = prometheus.stop(30s);
  EXPECT_TRUE(WIFEXITED(prom_status) && WEXITSTATUS(prom_status) == 0)
      << "prometheus did not stop cleanly on SIGTERM (status " << prom_status << "):\n"
      << tail(prometheus.output());
}

// The exposition reader catches what Prometheus would reject (so the scrape checks above can fail).
TEST(Exposition, AcceptsWellFormedText) {
  const std::string text =
      "# HELP arlo_a A.\n# TYPE arlo_a gauge\narlo_a 1.5\n"
      "# TYPE arlo_w gauge\narlo_w{worker=\"http://127.0.0.1:1\"} 3\narlo_w{worker=\"q\\\"x\"} NaN\n"
      "# TYPE arlo_h histogram\narlo_h_bucket{le=\"0.1\"} 1\narlo_h_bucket{le=\"+Inf\"} 2\narlo_h_sum 0.3\n"
      "arlo_h_count 2\n";
  auto e = parse_exposition(text);
  ASSERT_TRUE(e.has_value()) << e.error();
  EXPECT_EQ(e->named("arlo_w").size(), 2u);
  EXPECT_EQ(e->named("arlo_w")[1].labels.at("worker"), "q\"x");
  EXPECT_EQ(e->types.at("arlo_h"), "histogram");
}

TEST(Exposition, RejectsWhatPrometheusRejects) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"# TYPE arlo_a gauge\n# TYPE arlo_a gauge\narlo_a 1\n", "a second TYPE"},
      {"arlo_a 1\n# TYPE arlo_a gauge\n", "after its samples"},
      {"arlo_a 1\narlo_b 2\narlo_a{x=\"1\"} 3\n", "not contiguous"},
      {"arlo_a 1\narlo_a 2\n", "twice"},
      {"arlo_a one\n", "not a number"},
      {"arlo-a 1\n", "invalid metric name"},
      {"arlo_a{1x=\"v\"} 1\n", "invalid label name"},
      {"arlo_a{x=v} 1\n", "not quoted"},
      {"arlo_a 1", "line feed"},
      {"# TYPE arlo_a gauges\narlo_a 1\n", "unknown type"},
      {"# TYPE arlo_h histogram\narlo_h_bucket{le=\"1\"} 2\narlo_h_bucket{le=\"+Inf\"} 1\narlo_h_sum 1\narlo_h_count "
       "1\n",
       "cumulative"},
      {"# TYPE arlo_h histogram\narlo_h_bucket{le=\"+Inf\"} 2\narlo_h_sum 1\narlo_h_count 3\n", "differs from _count"},
  };
  for (const auto& [text, why] : cases) {
    auto e = parse_exposition(text);
    ASSERT_FALSE(e.has_value()) << "accepted:\n" << text;
    EXPECT_NE(e.error().find(why), std::string::npos) << e.error() << "\nfor:\n" << text;
  }
}

}  // namespace
