#include "session/reporter.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/file.h"
#include "common/http.h"
#include "common/log.h"
#include "orchestrator/orchestrator.h"

namespace arlo::session {

namespace {

// The registry's counter of chat trajectories whose template did not extend them (a counter, not
// one of the records' gauges).
constexpr const char* kSplit = "multi_turn/split";

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double seconds(orch::Duration d) { return std::chrono::duration<double>(d).count(); }

// The unix time of a steady-clock instant (records carry unix seconds; the clock port is steady).
double wall_time_of(orch::TimePoint t, orch::TimePoint now) { return wall_time() - seconds(now - t); }

// An eval's figures as the records and summary.json name them: its step, "eval/<env>/avg@<n>" and
// "eval/<env>/pass@<k>".
nlohmann::json eval_json(const orch::EvalReport& r) {
  nlohmann::json e = {{"step", r.step}};
  for (const auto& [env, x] : r.envs) {
    e[fmt::format("eval/{}/avg@{}", env, r.samples_per_task)] = x.avg;
    for (const auto& [k, p] : x.pass_at) e[fmt::format("eval/{}/pass@{}", env, k)] = p;
  }
  return e;
}

// The reward figures of an RL step: "<module>" is the module's reward, "<module>/<metric>" its other
// figures, "reward/failed" the share of samples whose scoring failed.
void add_rl_figures(nlohmann::json& rec, const orch::StepReport& r) {
  rec["train/reward/mean"] = r.reward_mean;
  rec["train/reward/std"] = r.reward_std;
  rec["off_policy/mean"] = r.off_policy_mean;
  rec["off_policy/max"] = r.off_policy_max;
  rec["off_policy/histogram"] = r.off_policy_histogram;
  rec["train/reward/failed"] = 0.0;
  for (const auto& [k, v] : r.reward_metrics) {
    if (k == "reward/failed") {
      rec["train/reward/failed"] = v;
    } else {
      rec["train/reward/" + k + (k.find('/') == std::string::npos ? "/mean" : "")] = v;
    }
  }
}

}  // namespace

nlohmann::json summary_json(const orch::RunSummary& s) {
  nlohmann::json j = {{"ok", s.ok},
                      {"error", s.error},
                      {"steps", s.steps},
                      {"seconds", s.seconds},
                      {"train/reward/first5", s.reward_first5},
                      {"train/reward/last5", s.reward_last5},
                      {"ledger", s.ledger},
                      {"workers", s.workers},
                      {"trainer", s.trainer},
                      {"run_dir", s.run_dir}};
  if (s.eval_first) j["eval_first"] = eval_json(*s.eval_first);
  if (s.eval_last) j["eval_last"] = eval_json(*s.eval_last);
  return j;
}

Reporter::Reporter(boost::asio::io_context& io, Clock& clock, orch::Options options, metrics::Registry* registry)
    : io_(io),
      clock_(clock),
      opt_(std::move(options)),
      registry_(registry),
      pacer_(opt_.step_line_interval_s),
      closed_signal_(io.get_executor()) {
  tty_ = opt_.progress && ::isatty(STDOUT_FILENO) != 0;
}

Reporter::~Reporter() {
  if (status_) status_->close();
  if (metrics_file_) std::fclose(metrics_file_);
}

std::uint16_t Reporter::status_port() const { return status_ ? status_->port() : 0; }

Status Reporter::start(const orch::Orchestrator& orchestrator) {
  orch_ = &orchestrator;
  ARLO_TRY(open_files());
  return start_status_server();
}

void Reporter::on_start(const orch::StartObservation& s) {
  run_start_ = clock_.now();
  started_at_ = wall_time();
  for (const auto& w : s.workers) workers_[w].version = s.version;
  // /metrics is never empty: a scrape before the first record already sees the version served.
  if (registry_) registry_->gauge("policy/version").set(static_cast<double>(s.version));
  failed_at_last_line_ = s.failed;
  cancelled_at_last_line_ = s.cancelled;
}

Status Reporter::open_files() {
  if (opt_.run_dir.empty()) return ok();
  std::error_code ec;
  std::filesystem::create_directories(opt_.run_dir, ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("creating run dir {}: {}", opt_.run_dir, ec.message()));
  const auto path = std::filesystem::path(opt_.run_dir) / "metrics.jsonl";
  ARLO_TRY(drop_partial_last_line(path));  // a resume after a full disk or a kill mid-line
  metrics_file_ = std::fopen(path.c_str(), "a");
  if (!metrics_file_) return make_error(ErrorCode::kIo, fmt::format("opening {}", path.string()));
  return rollout_log_.open(opt_.run_dir, opt_.rollouts_every);
}

Status Reporter::start_status_server() {
  if (opt_.status_port < 0) return ok();
  http::ServerOptions so;
  so.bind = opt_.status_bind;
  so.port = static_cast<std::uint16_t>(opt_.status_port);
  so.token = opt_.status_token;
  status_ = std::make_unique<http::Server>(io_, so);
  add_status_routes();
  auto port = status_->start();
  if (!port) {
    status_.reset();
    return std::unexpected(
        Error(port.error())
            .with_context(fmt::format(
                "starting the status server on status.bind {} status.port {} (status.port 0 takes any free port)",
                opt_.status_bind, opt_.status_port)));
  }
  ARLO_INFO("status: http://{}:{}/ (live run page; /metrics for Prometheus)", opt_.status_bind, *port);
  return ok();
}

void Reporter::add_status_routes() {
  status_->route(http::Verb::get, "/metrics", [this](http::Request) -> Awaitable<http::Response> {
    co_return http::Response::text(200, registry_ ? registry_->prometheus() : std::string(),
                                   "text/plain; version=0.0.4; charset=utf-8");
  });
  status_->route(http::Verb::get, "/health", [this](http::Request) -> Awaitable<http::Response> {
    co_return http::Response::json(200, {{"step", orch_->step()},
                                         {"version", orch_->version()},
                                         {"finished", orch_->finished()},
                                         {"ledger", orch_->ledger().to_json()}});
  });
  status_->route(http::Verb::get, "/", [this](http::Request) -> Awaitable<http::Response> {
    if (page_.empty())
      co_return http::Response::text(200, "arlo status: /api/status, /api/records, /api/samples, /metrics, /health\n");
    co_return http::Response::text(200, std::string(page_), "text/html; charset=utf-8");
  });
  status_->route(http::Verb::get, "/api/status", [this](http::Request) -> Awaitable<http::Response> {
    co_return http::Response::json(200, status_json());
  });
  status_->route(http::Verb::get, "/api/samples", [this](http::Request) -> Awaitable<http::Response> {
    co_return http::Response::json(200, {{"samples", rollout_log_.recent()}});
  });
  status_->route(http::Verb::get, "/api/records", [this](http::Request req) -> Awaitable<http::Response> {
    const auto since = req.query_param("since").value_or("0");
    char* end = nullptr;
    const auto n = std::strtoull(since.c_str(), &end, 10);
    if (since.empty() || *end != '\0' || since[0] == '-')
      co_return http::Response::json(
          400, {{"error", "since: expected a record index (a non-negative integer), got '" + since + "'"}});
    co_return http::Response::text(200, records_.since(n), "application/json");
  });
}

nlohmann::json Reporter::status_json() const {
  auto workers = nlohmann::json::array();
  for (const auto& [w, st] : workers_) workers.push_back(st.to_json(w));
  const bool finished = orch_ && orch_->finished();
  return {{"run", opt_.run_name},
          {"run_dir", opt_.run_dir},
          {"max_steps", opt_.max_steps},
          {"sft_warmup_steps", opt_.sft_warmup_steps},
          {"step", orch_ ? orch_->step() : 0},
          {"version", orch_ ? orch_->version() : kNoVersion},
          {"finished", finished},
          {"ok", !finished || orch_->summary().ok},
          {"error", finished ? orch_->summary().error : std::string()},
          {"started_at", started_at_},
          {"ledger", orch_ ? orch_->ledger().to_json() : nlohmann::json::object()},
          {"workers", std::move(workers)}};
}

void Reporter::on_scored(const orch::Group& g) { rollout_log_.add(g, wall_time()); }

void Reporter::on_step(const orch::StepObservation& s) {
  const auto& r = s.report;
  nlohmann::json rec = {{"step", r.step},
                        {"time", wall_time()},
                        {"train/samples/trainable", r.samples},
                        {"train/samples/filtered", r.filtered_samples},
                        {"train/samples/stale", r.stale_samples},
                        {"rollouts/completed", s.completed},
                        {"rollouts/failed", s.failed},
                        {"rollouts/cancelled", s.cancelled},
                        {"weight_sync/seconds", s.last_sync_seconds},
                        {"throughput/tokens_per_s", s.tokens_per_s},
                        {"time/step_seconds", s.step_seconds},
                        {"time/wait_for_policy_seconds", s.wait_for_policy_seconds},
                        {"train/supervised", r.supervised}};
  // Where every sample went so far, for the monitors' ledger.
  rec["ledger/dispatched"] = s.ledger["dispatched"];
  rec["ledger/in_flight"] = s.ledger["in_flight"];
  for (const auto& [k, v] : s.ledger["dispositions"].items()) rec["ledger/" + k] = v;
  if (!r.supervised) add_rl_figures(rec, r);
  add_multi_turn_figures(rec, s);
  // The trainer's own figures, from the newest version it published, as it names them.
  for (const auto& [k, v] : last_trainer_metrics_.items())
    if (v.is_number()) rec["trainer/" + k] = v;
  emit("step", std::move(rec));
  if (opt_.console) print_step_line(s);
}

// A multi-turn run's figures (nothing in a single-turn run's records): model turns per trajectory
// ended since the previous step that ended one (turns_mean, absent while none ended), the samples an
// environment failed so far, the trajectories the environment ended early by its reason so far
// (multi_turn/ended/<reason>), and the splits so far: where a worker's template did not extend a chat
// trajectory (the registry's counter, which the environment adapter's callback increments:
// session/run_session.cc).
void Reporter::add_multi_turn_figures(nlohmann::json& rec, const orch::StepObservation& s) {
  if (s.model_turns == 0 && s.trajectories == 0 && s.env_failed == 0) return;
  if (s.trajectories > trajectories_at_last_step_) {
    rec["multi_turn/turns_mean"] = static_cast<double>(s.model_turns - model_turns_at_last_step_) /
                                   static_cast<double>(s.trajectories - trajectories_at_last_step_);
    model_turns_at_last_step_ = s.model_turns;
    trajectories_at_last_step_ = s.trajectories;
  }
  rec["multi_turn/env_failed"] = s.env_failed;
  for (const auto& [reason, n] : s.ended_because) rec["multi_turn/ended/" + reason] = n;
  if (registry_) {
    const auto counters = registry_->snapshot();
    const auto it = counters.find(kSplit);
    rec[kSplit] = it != counters.end() && it->is_number() ? static_cast<std::uint64_t>(it->get<double>()) : 0;
  }
}

// Errors and cancellations count since the previous printed line, so a paced console hides none.
void Reporter::print_step_line(const orch::StepObservation& s) {
  const auto& r = s.report;
  const bool phase_changed = r.step == opt_.sft_warmup_steps + 1 || r.step == 1;
  if (!pacer_.due(seconds(clock_.now() - run_start_), r.step, opt_.max_steps, phase_changed)) return;
  const auto errors = s.failed - failed_at_last_line_;
  const auto cancels = s.cancelled - cancelled_at_last_line_;
  failed_at_last_line_ = s.failed;
  cancelled_at_last_line_ = s.cancelled;
  const auto prefix =
      tty_ ? progress_prefix(r.step, opt_.max_steps, pacer_.eta_seconds(r.step, opt_.max_steps)) : std::string();
  if (r.supervised) {
    ARLO_INFO("{}step {}/{} | {:.2f} s/step | sft warm-up | samples {} | errors {} | cancelled {} | sync {:.0f} ms",
              prefix, r.step, opt_.max_steps, s.step_seconds, r.samples, errors, cancels, s.last_sync_seconds * 1e3);
    return;
  }
  ARLO_INFO(
      "{}step {}/{} | {:.2f} s/step | reward {:.3f} | trainable {} | off-policy {:.2f}/{:.0f} | errors {} | "
      "cancelled {} | sync {:.0f} ms | {:.0f} tok/s",
      prefix, r.step, opt_.max_steps, s.step_seconds, r.reward_mean, r.samples, r.off_policy_mean, r.off_policy_max,
      errors, cancels, s.last_sync_seconds * 1e3, s.tokens_per_s);
}

void Reporter::on_sync(const orch::SyncObservation& s) {
  const auto& r = s.report;
  auto workers = nlohmann::json::array();
  for (const auto& w : r.workers) {
    workers.push_back({{"worker", w.worker},
                       {"start", wall_time_of(w.start, s.at)},
                       {"pause_s", w.pause_s},
                       {"update_s", w.update_s},
                       {"resume_s", w.resume_s},
                       {"ok", w.ok()},
                       {"error", w.error}});
    auto& st = workers_[w.worker];
    st.healthy = w.ok();
    st.last_error = w.error;
    if (w.ok()) {
      st.version = r.version;
      ++st.syncs;
    } else {
      ++st.failures;
    }
    if (registry_) {
      registry_->gauge("weight_sync/worker_seconds", {{"worker", w.worker}}, "Seconds of the worker's last update.")
          .set(w.pause_s + w.update_s + w.resume_s);
      registry_->gauge("worker/version", {{"worker", w.worker}}, "The newest version the worker took.")
          .set(static_cast<double>(st.version));
    }
  }
  emit("weight_sync", {{"step", s.step},
                       {"time", wall_time()},
                       {"version", r.version},
                       {"applied", r.applied},
                       {"start", wall_time_of(r.start, s.at)},
                       {"weight_sync/seconds", r.seconds},
                       {"weight_sync/workers_failed", r.workers_failed},
                       {"workers", std::move(workers)}});
  if (!r.applied) return;
  last_trainer_metrics_ = r.trainer_metrics.is_object() ? r.trainer_metrics : nlohmann::json::object();
  ARLO_DEBUG("weight sync: v{} on {} workers in {:.0f} ms ({} failed)", r.version, r.workers.size(), r.seconds * 1e3,
             r.workers_failed);
  if (registry_) registry_->gauge("policy/version").set(static_cast<double>(r.version));
}

void Reporter::on_eval(const orch::EvalReport& r) {
  nlohmann::json rec = eval_json(r);
  rec["time"] = wall_time();
  rec["eval/seconds"] = r.seconds;
  std::string line = fmt::format("eval v{} ({:.1f} s):", r.step, r.seconds);
  for (const auto& [env, e] : r.envs) {
    line += fmt::format(" {} avg@{} {:.3f}", env, r.samples_per_task, e.avg);
    for (const auto& [k, p] : e.pass_at) line += fmt::format(" pass@{} {:.3f}", k, p);
    if (e.failed_groups) line += fmt::format(" ({} tasks failed)", e.failed_groups);
  }
  ARLO_INFO("{}", line);
  emit("eval", std::move(rec));
}

void Reporter::on_pipeline(const orch::PipelineView& v) {
  if (opt_.console) ARLO_INFO("{}", orch::format_pipeline_view(v));
  emit("pipeline", {{"step", v.step},
                    {"time", wall_time()},
                    {"pipeline/inflight", v.inflight},
                    {"pipeline/queued_groups", v.queued_groups},
                    {"pipeline/staleness", v.staleness},
                    {"throughput/tokens_per_s", v.tokens_per_s},
                    {"event_loop/lag_p50_seconds", v.lag.p50},
                    {"event_loop/lag_p99_seconds", v.lag.p99}});
}

void Reporter::emit(const char* kind, nlohmann::json rec) {
  rec["kind"] = kind;
  if (registry_) {
    for (const auto& [k, val] : rec.items())
      if (val.is_number() && k != "time" && k != "start" && k != "step" && k != "version" && k != kSplit)
        registry_->gauge(k).set(val.get<double>());
  }
  auto line = rec.dump();
  if (metrics_file_) {
    std::fwrite(line.data(), 1, line.size(), metrics_file_);
    std::fputc('\n', metrics_file_);
    std::fflush(metrics_file_);
  }
  records_.append(std::move(line));
}

void Reporter::log_summary(const orch::EndObservation& e) const {
  const auto& s = e.summary;
  ARLO_INFO(
      "summary: {} steps in {:.1f} s | train reward first 5 {:.3f} -> last 5 {:.3f} | rollouts {} dispatched, "
      "{} completed, {} failed, {} cancelled{}",
      s.steps, s.seconds, s.reward_first5, s.reward_last5, e.dispatched, e.completed, e.failed, e.cancelled,
      s.run_dir.empty() ? std::string() : " | run dir " + s.run_dir);
  if (s.eval_first && s.eval_last) {
    for (const auto& [env, last] : s.eval_last->envs) {
      auto first = s.eval_first->envs.find(env);
      for (const auto& [k, p] : last.pass_at)
        ARLO_INFO("summary: eval {} pass@{}: v{} {:.3f} -> v{} {:.3f}", env, k, s.eval_first->step,
                  first != s.eval_first->envs.end() ? first->second.pass_at.at(k) : 0.0, s.eval_last->step, p);
    }
  }
  if (!s.ok) ARLO_ERROR("summary: run failed: {}", s.error);
}

void Reporter::on_end(const orch::EndObservation& e) {
  log_summary(e);
  if (!opt_.run_dir.empty()) {
    if (auto st = write_file_atomically(std::filesystem::path(opt_.run_dir) / "summary.json",
                                        summary_json(e.summary).dump(2) + "\n");
        !st)
      ARLO_ERROR("writing summary: {}", st.error().what());
  }
  // Pages and scrapers read the end (finished, the last records) before the port closes.
  if (status_ && opt_.status_linger > orch::Duration::zero()) {
    linger_ = clock_.schedule(clock_.now() + opt_.status_linger, [this] { close(); });
  } else {
    close();
  }
}

void Reporter::close() {
  if (status_) status_->close();
  closed_ = true;
  closed_signal_.notify();
}

Awaitable<void> Reporter::wait_closed() {
  while (!closed_) co_await closed_signal_.wait();
}

}  // namespace arlo::session
