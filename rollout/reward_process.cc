#include "rollout/reward_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "rollout/reward_plugin_loader.h"

extern char** environ;

namespace arlo::rollout {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---- frames --------------------------------------------------------------------------------------

Status write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, fmt::format("writing to the reward host: {}", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return ok();
}

Status write_frame(int fd, const Json& message) {
  const std::string body = message.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (body.size() > kMaxRewardFrameBytes)
    return make_error(
        ErrorCode::kResourceExhausted,
        fmt::format("reward host frame of {} bytes is over the {} byte limit", body.size(), kMaxRewardFrameBytes));
  std::string frame(4, '\0');
  const auto n = static_cast<std::uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += body;
  return write_all(fd, frame.data(), frame.size());
}

// Reads exactly n bytes; before `deadline` when given. kUnavailable on EOF.
Status read_exact(int fd, char* p, std::size_t n, std::optional<Clock::time_point> deadline) {
  while (n > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return make_error(ErrorCode::kTimeout, "no answer from the reward host in time");
      pollfd pfd{fd, POLLIN, 0};
      const int pr = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (pr < 0 && errno != EINTR) return make_error(ErrorCode::kIo, fmt::format("poll: {}", std::strerror(errno)));
      if (pr <= 0) continue;
    }
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return make_error(ErrorCode::kUnavailable, "the reward host closed its connection");
    if (r < 0) {
      if (errno == EINTR) continue;
      // A peer that dies with requests unread resets the connection: the same as closing it.
      if (errno == ECONNRESET) return make_error(ErrorCode::kUnavailable, "the reward host reset its connection");
      return make_error(ErrorCode::kIo, fmt::format("reading from the reward host: {}", std::strerror(errno)));
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return ok();
}

Result<Json> read_frame(int fd, std::optional<Clock::time_point> deadline = std::nullopt) {
  unsigned char len[4];
  ARLO_TRY(read_exact(fd, reinterpret_cast<char*>(len), 4, deadline));
  const std::uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<std::uint32_t>(len[3]) << 24);
  if (n > kMaxRewardFrameBytes)
    return make_error(ErrorCode::kParse,
                      fmt::format("reward host frame of {} bytes is over the {} byte limit", n, kMaxRewardFrameBytes));
  std::string body(n, '\0');
  ARLO_TRY(read_exact(fd, body.data(), n, deadline));
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("op") || !j["op"].is_string())
    return make_error(ErrorCode::kParse, "reward host frame is not a JSON object with an 'op'");
  return j;
}

Json number_to_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

Result<double> number_from_json(const Json& j, std::string_view what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return HUGE_VAL;
    if (s == "-inf") return -HUGE_VAL;
  }
  return make_error(ErrorCode::kParse, fmt::format("reward host: {} is not a number: {}", what, j.dump()));
}

ErrorCode code_from_string(std::string_view s) {
  for (ErrorCode c : {ErrorCode::kInvalidArgument, ErrorCode::kParse, ErrorCode::kNotFound, ErrorCode::kIo,
                      ErrorCode::kTimeout, ErrorCode::kCancelled, ErrorCode::kMismatch, ErrorCode::kUnavailable,
                      ErrorCode::kResourceExhausted, ErrorCode::kInternal})
    if (to_string(c) == s) return c;
  return ErrorCode::kInternal;
}

Error error_from_json(const Json& j) {
  return Error(code_from_string(j.value("code", "internal")), j.value("message", std::string("no message")));
}

Json error_to_json(const Error& e) { return {{"code", std::string(to_string(e.code()))}, {"message", e.what()}}; }

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return fmt::format("signal {} (SIG{}: {})", sig, abbrev ? abbrev : "?", ::strsignal(sig));
  }
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  return fmt::format("wait status {}", status);
}

// Reaps `pid`; kills it first when it has not exited within `grace` (it closed its end but lives).
int reap(pid_t pid, Duration grace) {
  int status = 0;
  const auto until = Clock::now() + grace;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// ---- the module side -----------------------------------------------------------------------------

// One host process at a time, restarted when it dies. Thread-safe: score() blocks the calling
// thread (a RewardScorer worker) until the answer, the host's death or the call timeout.
// Lock order: start_mu_ -> write_mu_ -> mu_. The reader thread takes only mu_.
class RewardHost {
 public:
  RewardHost(std::string path, std::string config, std::string program, RewardHostOptions options)
      : path_(std::move(path)), config_(std::move(config)), program_(std::move(program)), options_(options) {}
  ~RewardHost() { shutdown(); }

  // Starts the first host; returns the plugin's name (or the load error, as the host reported it).
  Result<std::string> start() {
    std::lock_guard start_lock(start_mu_);
    ARLO_TRY(spawn_locked());
    std::lock_guard lock(mu_);
    return plugin_name_;
  }

  Result<Score> score(const Task& task, const Rollout& r) {
    ARLO_TRY(ensure_running());
    Json request = {
        {"op", "score"},
        {"task", {{"id", task.id}, {"prompt", task.prompt_text()}, {"answer", task.answer}, {"info", task.info}}},
        {"rollout",
         {{"completion", r.text},
          {"tokens", r.completion_tokens},
          {"finish_reason", std::string(to_string(r.finish_reason))},
          {"sample_index", r.sample_index}}}};
    Pending pending;
    std::uint64_t id = 0;
    std::uint64_t generation = 0;
    {
      std::lock_guard write_lock(write_mu_);
      int fd = -1;
      {
        std::lock_guard lock(mu_);
        if (!alive_) return lost_error_locked("it was being restarted");
        id = next_id_++;
        generation = generation_;
        pending.generation = generation;
        pending_[id] = &pending;
        fd = fd_;
      }
      request["id"] = id;
      // A failed write means the host is gone: its reader reports that to this call.
      (void)write_frame(fd, request);
    }
    std::unique_lock lock(mu_);
    const auto deadline = Clock::now() + options_.call_timeout;
    cv_.wait_until(lock, deadline, [&] { return pending.result.has_value(); });
    pending_.erase(id);
    if (pending.result) return std::move(*pending.result);
    // Hung: kill the host (the reader then fails the other calls on it and the next call restarts it).
    const pid_t pid = pid_;
    if (alive_ && !dying_ && generation_ == generation) {
      kill_reason_ = fmt::format("killed: a call ran past the {} ms timeout", ms(options_.call_timeout));
      ::kill(pid_, SIGKILL);
      alive_ = false;  // the next call starts a new host (after this one's reader reported the death)
    }
    return make_error(
        ErrorCode::kTimeout,
        fmt::format("reward plugin '{}' did not answer within {} ms; its host process (pid {}) was killed "
                    "and is restarted",
                    plugin_name_, ms(options_.call_timeout), pid));
  }

  Status usable() const {
    std::lock_guard lock(mu_);
    if (gave_up_) return std::unexpected(*gave_up_);
    return ok();
  }

  const std::string& name() const { return plugin_name_; }

  void shutdown() {
    std::lock_guard start_lock(start_mu_);
    pid_t pid = -1;
    int fd = -1;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      if (alive_) pid = pid_;
      fd = fd_;
    }
    // EOF tells the host to exit; its reader reaps it (killing it after a grace period).
    if (pid > 0 && fd >= 0) ::shutdown(fd, SHUT_WR);
    if (reader_.joinable()) reader_.join();
    std::lock_guard write_lock(write_mu_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  struct Pending {
    std::uint64_t generation = 0;
    std::optional<Result<Score>> result;
  };

  static long long ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

  std::unexpected<Error> lost_error_locked(const std::string& why) const {
    return make_error(ErrorCode::kCancelled, fmt::format("reward plugin '{}': call lost: {}", plugin_name_, why));
  }

  Status ensure_running() {
    {
      std::lock_guard lock(mu_);
      if (gave_up_) return std::unexpected(*gave_up_);
      if (closed_) return lost_error_locked("the module is shutting down");
      if (alive_) return ok();
    }
    std::lock_guard start_lock(start_mu_);
    int deaths = 0;
    std::string last;
    {
      std::lock_guard lock(mu_);
      if (gave_up_) return std::unexpected(*gave_up_);
      if (closed_) return lost_error_locked("the module is shutting down");
      if (alive_) return ok();
      deaths = deaths_in_a_row_;
      last = last_death_;
    }
    if (deaths > options_.max_restarts) {
      std::lock_guard lock(mu_);
      gave_up_ = Error(ErrorCode::kResourceExhausted,
                       fmt::format("reward plugin '{}' ({}): its host process died {} times in a row (the bound is {} "
                                   "restarts); giving up. Last: {}",
                                   plugin_name_, path_, deaths, options_.max_restarts, last));
      ARLO_ERROR("{}", gave_up_->what());
      return std::unexpected(*gave_up_);
    }
    if (deaths > 0) {
      auto wait = options_.backoff;
      for (int i = 1; i < deaths && wait < options_.max_backoff; ++i) wait *= 2;
      std::this_thread::sleep_for(std::min(wait, options_.max_backoff));
    }
    auto st = spawn_locked();
    if (!st) {
      std::lock_guard lock(mu_);
      ++deaths_in_a_row_;
      last_death_ = st.error().what();
      return lost_error_locked("restarting its host failed: " + st.error().what());
    }
    return ok();
  }

  // Starts a host and loads the plugin in it. Caller holds start_mu_; no host is alive.
  Status spawn_locked() {
    if (reader_.joinable()) reader_.join();  // the previous host's reader has reported its death
    {
      std::lock_guard write_lock(write_mu_);
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    }
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return make_error(ErrorCode::kIo, fmt::format("reward host: socketpair: {}", std::strerror(errno)));
    if (sv[1] == 3) {  // dup2 onto itself would keep close-on-exec
      const int moved = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
      ::close(sv[1]);
      sv[1] = moved;
    }
    // A host that stops reading (SIGSTOP) must not block a writer past the call timeout.
    const auto send_ms = ms(options_.call_timeout);
    timeval tv{static_cast<time_t>(send_ms / 1000), static_cast<suseconds_t>((send_ms % 1000) * 1000)};
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 3);  // clears close-on-exec on fd 3
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::string fd_arg = "3";
    std::vector<char*> argv = {program_.data(), const_cast<char*>("--fd"), fd_arg.data(), nullptr};
    pid_t pid = -1;
    // posix_spawn reports a missing program through its result only where exec runs in the spawning
    // call (not under every runtime, e.g. valgrind): check first, so the error is always this one.
    const int rc = ::access(program_.c_str(), X_OK) != 0
                       ? errno
                       : ::posix_spawn(&pid, program_.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(sv[1]);
    if (rc != 0) {
      ::close(sv[0]);
      return make_error(ErrorCode::kNotFound, fmt::format("reward plugin {}: cannot start the reward host {}: {}",
                                                          path_, program_, std::strerror(rc)));
    }
    const int fd = sv[0];
    auto fail = [&](Error e) -> Status {
      ::close(fd);
      const int status = reap(pid, std::chrono::milliseconds(0));
      return std::unexpected(std::move(e).with_context(
          fmt::format("reward plugin {} (host pid {}, {})", path_, pid, describe_status(status))));
    };
    if (auto w = write_frame(fd, {{"op", "load"}, {"path", path_}, {"config", config_}}); !w) return fail(w.error());
    auto reply = read_frame(fd, Clock::now() + options_.start_timeout);
    if (!reply) {
      if (reply.error().code() == ErrorCode::kUnavailable) {
        const int status = reap(pid, std::chrono::seconds(2));
        ::close(fd);
        return make_error(ErrorCode::kUnavailable, fmt::format("reward plugin {}: its host process (pid {}) died while "
                                                               "loading it: {}",
                                                               path_, pid, describe_status(status)));
      }
      return fail(reply.error());
    }
    if ((*reply)["op"] == "load_failed") {
      Error e = error_from_json(*reply);
      ::close(fd);
      reap(pid, std::chrono::seconds(2));
      return std::unexpected(std::move(e));
    }
    if ((*reply)["op"] != "loaded") return fail(Error(ErrorCode::kParse, "reward host: expected 'loaded' first"));
    std::lock_guard write_lock(write_mu_);
    std::lock_guard lock(mu_);
    if (plugin_name_.empty()) plugin_name_ = reply->value("name", std::string("plugin"));
    fd_ = fd;
    pid_ = pid;
    alive_ = true;
    dying_ = false;
    kill_reason_.clear();
    ++generation_;
    reader_ = std::thread([this, fd, pid, generation = generation_] { read_replies(fd, pid, generation); });
    return ok();
  }

  void read_replies(int fd, pid_t pid, std::uint64_t generation) {
    std::string why;
    while (true) {
      auto frame = read_frame(fd);
      if (!frame) {
        if (frame.error().code() != ErrorCode::kUnavailable) why = "it sent a bad frame: " + frame.error().what();
        break;
      }
      const Json& j = *frame;
      const auto id = j.value("id", std::uint64_t{0});
      Result<Score> result = make_error(ErrorCode::kInternal, "unset");
      if (j["op"] == "scored") {
        Score s;
        auto reward = number_from_json(j.value("reward", Json()), "reward");
        if (!reward) {
          why = reward.error().what();
          break;
        }
        s.reward = *reward;
        bool bad = false;
        if (j.contains("metrics") && j["metrics"].is_object())
          for (const auto& [k, v] : j["metrics"].items()) {
            auto x = number_from_json(v, "metric " + k);
            if (!x) {
              why = x.error().what();
              bad = true;
              break;
            }
            s.metrics[k] = *x;
          }
        if (bad) break;
        result = std::move(s);
      } else if (j["op"] == "failed") {
        result = std::unexpected(error_from_json(j));
      } else {
        why = fmt::format("it sent an unexpected '{}' frame", j["op"].dump());
        break;
      }
      std::lock_guard lock(mu_);
      deaths_in_a_row_ = 0;  // an answer: the host works
      auto it = pending_.find(id);
      if (it != pending_.end() && it->second->generation == generation) {
        it->second->result = std::move(result);
        cv_.notify_all();
      }
    }
    // The host is gone, or talks nonsense: make sure it is dead, reap it, and fail what it held.
    {
      std::lock_guard lock(mu_);
      dying_ = true;
      alive_ = false;
      if (!why.empty()) ::kill(pid, SIGKILL);
    }
    const int status = reap(pid, std::chrono::seconds(2));
    std::lock_guard lock(mu_);
    alive_ = false;
    std::string death;
    if (closed_ && kill_reason_.empty() && why.empty()) {
      death = "the reward host was shut down";
    } else {
      ++deaths_in_a_row_;
      if (!kill_reason_.empty())
        death = fmt::format("reward plugin '{}' host (pid {}) {}", plugin_name_, pid, kill_reason_);
      else if (!why.empty())
        death = fmt::format("reward plugin '{}' host (pid {}) was killed: {}", plugin_name_, pid, why);
      else
        death = fmt::format("reward plugin '{}' crashed: {} (host pid {})", plugin_name_, describe_status(status), pid);
      last_death_ = death;
      ARLO_WARN("{}; {}", death,
                deaths_in_a_row_ > options_.max_restarts
                    ? fmt::format("{} deaths in a row: no more restarts", deaths_in_a_row_)
                    : fmt::format("restart {} of at most {} in a row", deaths_in_a_row_, options_.max_restarts));
    }
    for (auto& [pid_id, p] : pending_)
      if (p->generation == generation && !p->result)
        p->result = make_error(ErrorCode::kCancelled, death + "; the call was lost with it");
    cv_.notify_all();
  }

  const std::string path_;
  const std::string config_;
  std::string program_;
  const RewardHostOptions options_;

  std::mutex start_mu_;
  std::mutex write_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread reader_;
  // Under mu_ (fd_ also under write_mu_ when it changes):
  std::string plugin_name_;
  int fd_ = -1;
  pid_t pid_ = -1;
  bool alive_ = false;
  bool dying_ = false;  // the reader is reaping pid_: no more kill() on it
  bool closed_ = false;
  std::uint64_t generation_ = 0;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Pending*> pending_;
  std::string kill_reason_;
  int deaths_in_a_row_ = 0;
  std::string last_death_;
  std::optional<Error> gave_up_;
};

class RewardHostModule : public RewardModule {
 public:
  RewardHostModule(std::string name, std::shared_ptr<RewardHost> host)
      : name_(std::move(name)), host_(std::move(host)) {}
  // Calls still in flight hold the host; shutting it down now makes them return at once.
  ~RewardHostModule() override { host_->shutdown(); }
  const std::string& name() const override { return name_; }
  Result<Score> score(const Task& task, const Rollout& r) override {
    std::shared_ptr<RewardHost> host = host_;
    return host->score(task, r);
  }
  Status usable() const override { return host_->usable(); }

 private:
  std::string name_;
  std::shared_ptr<RewardHost> host_;
};

}  // namespace

Result<std::string> find_reward_host() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> looked;
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate :
         {dir / kRewardHostProgram, dir.parent_path() / kRewardHostProgram / kRewardHostProgram,
          dir.parent_path().parent_path() / "apps" / kRewardHostProgram / kRewardHostProgram}) {
      if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
      looked.push_back(candidate);
    }
  }
  std::string where;
  for (const auto& p : looked) where += (where.empty() ? "" : ", ") + p.string();
  return make_error(ErrorCode::kNotFound,
                    fmt::format("{} not found (looked at {}); build it with arlo, or set isolate: "
                                "none to load the plugin into arlo itself",
                                kRewardHostProgram, where.empty() ? "nothing: /proc/self/exe" : where));
}

Result<std::unique_ptr<RewardModule>> load_isolated_reward_plugin(const std::string& path, const std::string& config,
                                                                  std::optional<std::string> name,
                                                                  RewardHostOptions options) {
  std::string program = options.program;
  if (program.empty()) {
    auto found = find_reward_host();
    if (!found)
      return std::unexpected(
          std::move(found).error().with_context(fmt::format("reward plugin {} (isolate: process)", path)));
    program = *found;
  }
  auto host = std::make_shared<RewardHost>(path, config, program, options);
  ARLO_ASSIGN_OR_RETURN(std::string plugin_name, host->start());
  return std::unique_ptr<RewardModule>(std::make_unique<RewardHostModule>(name ? *name : plugin_name, std::move(host)));
}

// ---- the host side -------------------------------------------------------------------------------

namespace {

// One score request through the plugin, as its reply frame.
Json answer(RewardModule& plugin, const Json& request) {
  Json reply;
  try {
    Task task;
    const Json& t = request.at("task");
    task.id = t.value("id", std::string());
    task.prompt = t.value("prompt", std::string());
    task.answer = t.value("answer", std::string());
    task.info = t.contains("info") ? t["info"] : Json::object();
    Rollout r;
    const Json& ro = request.at("rollout");
    r.task_id = task.id;
    r.text = ro.value("completion", std::string());
    r.completion_tokens = ro.value("tokens", std::vector<std::int32_t>{});
    r.finish_reason = parse_finish_reason(ro.value("finish_reason", std::string("unknown")));
    r.sample_index = ro.value("sample_index", 0);
    auto s = plugin.score(task, r);
    if (s) {
      Json metrics = Json::object();
      for (const auto& [k, v] : s->metrics) metrics[k] = number_to_json(v);
      reply = {{"op", "scored"}, {"reward", number_to_json(s->reward)}, {"metrics", std::move(metrics)}};
    } else {
      reply = error_to_json(s.error());
      reply["op"] = "failed";
    }
  } catch (const std::exception& e) {
    reply = {{"op", "failed"}, {"code", "parse"}, {"message", std::string("reward host: bad request: ") + e.what()}};
  }
  reply["id"] = request.value("id", std::uint64_t{0});
  return reply;
}

}  // namespace

int serve_reward_host(int fd) {
  auto load = read_frame(fd);
  if (!load || (*load)["op"] != "load") return 2;
  auto module = load_reward_plugin(load->value("path", std::string()), load->value("config", std::string()));
  if (!module) {
    Json reply = error_to_json(module.error());
    reply["op"] = "load_failed";
    (void)write_frame(fd, reply);
    return 1;
  }
  std::shared_ptr<RewardModule> plugin = std::move(*module);
  if (!write_frame(fd, {{"op", "loaded"}, {"name", plugin->name()}})) return 1;
  // A pool of request threads that grows while every thread is busy (a hung call keeps its thread),
  // so concurrent requests run concurrently, as plugins expect. The threads are detached: a hung one
  // may outlive this function, so what they share lives on the heap.
  struct Shared {
    std::mutex mu;  // guards queue, idle, threads, stop
    std::condition_variable cv;
    std::deque<Json> queue;
    int idle = 0;
    int threads = 0;
    bool stop = false;
    std::atomic<int> in_flight{0};
    std::mutex write_mu;
  };
  auto shared = std::make_shared<Shared>();
  auto worker = [fd, shared](std::shared_ptr<RewardModule> module) {
    std::unique_lock lock(shared->mu);
    while (true) {
      ++shared->idle;
      shared->cv.wait(lock, [&] { return shared->stop || !shared->queue.empty(); });
      --shared->idle;
      if (shared->queue.empty()) break;  // stop
      Json request = std::move(shared->queue.front());
      shared->queue.pop_front();
      lock.unlock();
      Json reply = answer(*module, request);
      {
        std::lock_guard write_lock(shared->write_mu);
        (void)write_frame(fd, reply);
      }
      --shared->in_flight;
      lock.lock();
    }
    --shared->threads;
    module.reset();
    shared->cv.notify_all();
  };
  while (true) {
    auto request = read_frame(fd);
    if (!request) break;  // arlo closed the connection (or is gone): stop
    if ((*request)["op"] != "score") continue;
    ++shared->in_flight;
    std::lock_guard lock(shared->mu);
    shared->queue.push_back(std::move(*request));
    if (shared->idle == 0) {
      ++shared->threads;
      std::thread(worker, plugin).detach();
    }
    shared->cv.notify_one();
  }
  // Calls still running may hang forever: leave without waiting for them or destroying the plugin.
  if (shared->in_flight.load() != 0) ::_exit(0);
  {
    std::unique_lock lock(shared->mu);
    shared->stop = true;
    shared->cv.notify_all();
    if (!shared->cv.wait_for(lock, std::chrono::seconds(2), [&] { return shared->threads == 0; })) ::_exit(0);
  }
  plugin.reset();  // destroy() runs here: every call has returned
  return 0;
}

}  // namespace arlo::rollout
