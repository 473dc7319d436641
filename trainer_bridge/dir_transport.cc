// The `dir` transport (bridge.h has the layout): batches, acks, version notices and heartbeats are
// files under <run_dir>/rollouts/, each written to a temporary name and renamed into place, and
// both sides wait on inotify. The orchestrator side reads inotify through an Asio
// stream_descriptor on its event loop; the trainer side blocks in poll() on the inotify fd plus an
// eventfd that close() uses to wake it.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/file.h"
#include "common/log.h"
#include "trainer_bridge/internal.h"
#include "trainer_bridge/transports.h"

namespace arlo::bridge {

namespace fs = std::filesystem;

namespace dir_layout {
fs::path rollouts(const fs::path& run_dir) { return run_dir / "rollouts"; }
fs::path step_dir(const fs::path& run_dir, std::int64_t step) {
  return rollouts(run_dir) / fmt::format("step_{}", step);
}
fs::path batch_file(const fs::path& run_dir, std::int64_t step, int rank) {
  return step_dir(run_dir, step) / fmt::format("rank_{}.safetensors", rank);
}
fs::path ack_file(const fs::path& run_dir, std::int64_t step, int rank) {
  return rollouts(run_dir) / "acks" / fmt::format("step_{}.rank_{}", step, rank);
}
fs::path version_file(const fs::path& run_dir, std::int64_t version) {
  return rollouts(run_dir) / "versions" / fmt::format("v{}.json", version);
}
fs::path heartbeat_file(const fs::path& run_dir, int rank) {
  return rollouts(run_dir) / "heartbeats" / fmt::format("rank_{}.json", rank);
}
}  // namespace dir_layout

namespace internal {
namespace {

namespace asio = boost::asio;
using nlohmann::json;

// The highest step every rank acknowledged, kept by the orchestrator side so a restarted
// orchestrator (and a restarted trainer) knows what is done after the ack files are cleaned up.
fs::path watermark_file(const fs::path& run_dir) { return dir_layout::rollouts(run_dir) / "acked"; }

std::int64_t read_watermark(const fs::path& run_dir) {
  auto text = read_small_file(watermark_file(run_dir), 64);
  if (!text) return 0;
  auto v = parse_numbered(*text, "", "\n");
  if (!v) v = parse_numbered(*text, "", "");
  return v.value_or(0);
}

Status make_layout(const fs::path& run_dir) {
  std::error_code ec;
  for (const char* sub : {"acks", "versions", "heartbeats"}) {
    fs::create_directories(dir_layout::rollouts(run_dir) / sub, ec);
    if (ec) {
      return make_error(ErrorCode::kIo,
                        fmt::format("creating {}: {}", (dir_layout::rollouts(run_dir) / sub).string(), ec.message()));
    }
  }
  return ok();
}

// Steps present as step_<s> directories (complete: they appear by rename).
std::vector<std::int64_t> list_steps(const fs::path& run_dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir_layout::rollouts(run_dir), ec), end; !ec && it != end; it.increment(ec)) {
    if (auto s = parse_numbered(it->path().filename().string(), "step_", "")) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// ----------------------------------------------------------------------------------------------
// Orchestrator side.

struct DirServerState : ServerCore {
  DirServerState(asio::io_context& io, ServerOptions o) : ServerCore(io, std::move(o), "bridge dir"), stream(io) {}

  asio::posix::stream_descriptor stream;
  int wd_acks = -1, wd_versions = -1, wd_heartbeats = -1;

  void close_io() {
    boost::system::error_code ec;
    stream.close(ec);
  }

  const fs::path& run_dir() const { return opt.run_dir; }

  // Writes the step's rank files into a temporary directory and renames it into place.
  Status deliver(const StepBatch& batch) {
    const fs::path root = dir_layout::rollouts(run_dir());
    const fs::path tmp = root / fmt::format(".step_{}.tmp", batch.step);
    const fs::path final_dir = dir_layout::step_dir(run_dir(), batch.step);
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directory(tmp, ec);
    if (ec) return make_error(ErrorCode::kIo, fmt::format("bridge dir: creating {}: {}", tmp.string(), ec.message()));
    for (const RankBatch& rb : batch.ranks) {
      auto s = write_file(tmp / fmt::format("rank_{}.safetensors", rb.rank), rb, opt.fsync);
      if (!s) {
        fs::remove_all(tmp, ec);
        return std::unexpected(std::move(s.error()));
      }
    }
    fs::remove_all(final_dir, ec);  // a stale copy from before a crash; never one that is pending
    fs::rename(tmp, final_dir, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      return make_error(ErrorCode::kIo, fmt::format("bridge dir: publishing {}: {}", final_dir.string(), ec.message()));
    }
    pending.try_emplace(batch.step);
    return ok();
  }

  void scan_acks() {
    std::vector<fs::path> files;
    std::error_code ec;
    for (fs::directory_iterator it(dir_layout::rollouts(run_dir()) / "acks", ec), end; !ec && it != end;
         it.increment(ec)) {
      auto parsed = parse_ack_name(it->path().filename().string());
      if (!parsed) continue;
      auto [step, rank] = *parsed;
      if (rank >= opt.num_ranks) {
        ARLO_WARN_EVERY(10.0, "bridge dir: ack from rank {} but num_ranks is {}; ignored ({})", rank, opt.num_ranks,
                        it->path().string());
        continue;
      }
      rank_acked[rank] = std::max(rank_acked[rank], step);
      files.push_back(it->path());
    }
    const std::int64_t all = *std::min_element(rank_acked.begin(), rank_acked.end());
    if (all <= last_acked) return;
    last_acked = all;
    if (auto s = write_file_atomically(watermark_file(run_dir()), fmt::format("{}\n", all)); !s) {
      ARLO_WARN("bridge dir: {}", s.error().what());
    }
    std::vector<std::int64_t> done;
    while (!pending.empty() && pending.begin()->first <= all) {
      done.push_back(pending.begin()->first);
      pending.erase(pending.begin());
    }
    for (std::int64_t step : list_steps(run_dir())) {
      if (step <= all) fs::remove_all(dir_layout::step_dir(run_dir(), step), ec);
    }
    for (const auto& f : files) {
      if (auto parsed = parse_ack_name(f.filename().string()); parsed && parsed->first <= all) fs::remove(f, ec);
    }
    for (std::int64_t step : done) {
      if (ack_cb) asio::post(io, [cb = ack_cb, step] { cb(step); });
    }
    changed.notify();
  }

  void scan_versions() {
    std::vector<std::int64_t> versions;
    std::error_code ec;
    const fs::path dir = dir_layout::rollouts(run_dir()) / "versions";
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (auto v = parse_numbered(it->path().filename().string(), "v", ".json")) versions.push_back(*v);
    }
    std::sort(versions.begin(), versions.end());
    for (std::int64_t v : versions) {
      if (v <= latest_version) continue;
      VersionEvent event{v, json::object()};
      if (auto text = read_small_file(dir_layout::version_file(run_dir(), v))) {
        json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
        if (j.is_object()) {
          event.info = std::move(j);
        } else {
          ARLO_WARN("bridge dir: version marker {} is not a JSON object; reporting it without info",
                    dir_layout::version_file(run_dir(), v).string());
        }
      }
      latest_version = v;
      if (version_cb) asio::post(io, [cb = version_cb, event = std::move(event)] { cb(event); });
    }
    // Markers below the latest are history; keep the latest so a restart can report it again.
    for (std::int64_t v : versions) {
      if (v < latest_version) fs::remove(dir_layout::version_file(run_dir(), v), ec);
    }
    changed.notify();
  }

  void read_heartbeat(std::string_view name) {
    auto rank = parse_numbered(name, "rank_", ".json");
    if (!rank) return;
    auto text = read_small_file(dir / std::string(name));
    if (!text) return;  // replaced again meanwhile; the next event carries the newer one
    json j = json::parse(*text, nullptr, false);
    if (!j.is_object()) {
      ARLO_WARN_EVERY(10.0, "bridge dir: heartbeat {} is not a JSON object", name);
      return;
    }
    HeartbeatEvent event;
    event.rank = static_cast<int>(*rank);
    event.time_ms = j.value("time_ms", std::int64_t{0});
    event.last_acked_step = j.value("last_acked_step", std::int64_t{0});
    if (heartbeat_cb) asio::post(io, [cb = heartbeat_cb, event] { cb(event); });
  }
  fs::path dir;  // heartbeats directory

  static asio::awaitable<void> watch(std::shared_ptr<DirServerState> self) {
    std::vector<char> buf(64 * 1024);
    for (;;) {
      boost::system::error_code ec;
      const std::size_t n =
          co_await self->stream.async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
      if (self->stopped) co_return;
      if (ec) {
        ARLO_ERROR("bridge dir: inotify read failed ({}); acks and versions are no longer seen", ec.message());
        co_return;
      }
      bool acks = false, versions = false;
      for (std::size_t off = 0; off + sizeof(inotify_event) <= n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf.data() + off);
        const std::string_view name = ev->len > 0 ? std::string_view(ev->name) : std::string_view();
        if (ev->mask & IN_Q_OVERFLOW) acks = versions = true;
        if (ev->wd == self->wd_acks) acks = true;
        if (ev->wd == self->wd_versions) versions = true;
        if (ev->wd == self->wd_heartbeats && !name.empty()) self->read_heartbeat(name);
        off += sizeof(inotify_event) + ev->len;
      }
      if (acks) self->scan_acks();
      if (versions) self->scan_versions();
    }
  }
  // BridgeServer::start(); `self` is this state, for the coroutines it starts.
  static Status start(const std::shared_ptr<DirServerState>& self) {
    auto& st = *self;
    ARLO_TRY(make_layout(st.run_dir()));
    const fs::path root = dir_layout::rollouts(st.run_dir());
    st.dir = root / "heartbeats";
    const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return make_error(ErrorCode::kIo, fmt::format("bridge dir: inotify_init1: {}", std::strerror(errno)));
    st.stream.assign(fd);
    auto add = [&](const fs::path& p) -> Result<int> {
      const int wd = ::inotify_add_watch(fd, p.c_str(), IN_MOVED_TO);
      if (wd < 0)
        return make_error(ErrorCode::kIo, fmt::format("bridge dir: watching {}: {}", p.string(), std::strerror(errno)));
      return wd;
    };
    ARLO_ASSIGN_OR_RETURN(st.wd_acks, add(root / "acks"));
    ARLO_ASSIGN_OR_RETURN(st.wd_versions, add(root / "versions"));
    ARLO_ASSIGN_OR_RETURN(st.wd_heartbeats, add(root / "heartbeats"));

    // Pick up what a previous run left: the ack watermark, steps still waiting, leftovers.
    st.last_acked = read_watermark(st.run_dir());
    st.rank_acked.assign(static_cast<std::size_t>(st.opt.num_ranks), st.last_acked);
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.starts_with(".step_")) fs::remove_all(it->path(), ec);
    }
    for (std::int64_t step : list_steps(st.run_dir())) {
      if (step <= st.last_acked) {
        fs::remove_all(dir_layout::step_dir(st.run_dir(), step), ec);
      } else {
        st.pending.try_emplace(step);
      }
    }
    st.started = true;
    st.scan_acks();
    st.scan_versions();
    asio::co_spawn(st.io, DirServerState::watch(self), asio::detached);
    ARLO_INFO("bridge dir: serving {} rank(s) under {} ({} step(s) pending, last acked step {}, latest version {})",
              st.opt.num_ranks, root.string(), st.pending.size(), st.last_acked, st.latest_version);
    return ok();
  }

  std::uint16_t port() const { return 0; }
};

// ----------------------------------------------------------------------------------------------
// Trainer side.

class DirClient final : public BridgeClient {
 public:
  explicit DirClient(ClientOptions o) : opt_(std::move(o)) {}
  ~DirClient() override {
    close();
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status init() {
    ARLO_TRY(make_layout(opt_.run_dir));
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (inotify_fd_ < 0 || wake_fd_ < 0) {
      return make_error(ErrorCode::kIo, fmt::format("bridge dir client: inotify/eventfd: {}", std::strerror(errno)));
    }
    const fs::path root = dir_layout::rollouts(opt_.run_dir);
    // Step directories and the watermark both arrive by rename into rollouts/.
    if (::inotify_add_watch(inotify_fd_, root.c_str(), IN_MOVED_TO) < 0) {
      return make_error(ErrorCode::kIo,
                        fmt::format("bridge dir client: watching {}: {}", root.string(), std::strerror(errno)));
    }
    std::int64_t acked = std::max<std::int64_t>(0, read_watermark(opt_.run_dir));
    std::error_code ec;
    for (fs::directory_iterator it(root / "acks", ec), end; !ec && it != end; it.increment(ec)) {
      auto parsed = parse_ack_name(it->path().filename().string());
      if (parsed && parsed->second == opt_.rank) acked = std::max(acked, parsed->first);
    }
    last_acked_ = acked;
    if (opt_.start_after_step > last_acked_) ARLO_TRY(ack(opt_.start_after_step));
    return ok();
  }

  Result<BatchView> next_batch(Duration timeout) override {
    std::lock_guard wait_lock(wait_mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (closed_.load()) return make_error(ErrorCode::kCancelled, "bridge dir client: closed");
      drain_inotify();  // events up to here are covered by the scan below
      if (auto found = scan()) return std::move(*found);
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return make_error(ErrorCode::kTimeout,
                          fmt::format("bridge dir client: no batch for rank {} after step {} within the timeout",
                                      opt_.rank, last_acked_step()));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      const int timeout_ms = static_cast<int>(std::min<long long>(left + 1, 1 << 30));
      if (::poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
        return make_error(ErrorCode::kIo, fmt::format("bridge dir client: poll: {}", std::strerror(errno)));
      }
    }
  }

  Status ack(std::int64_t step) override {
    std::lock_guard lock(mu_);
    if (step <= last_acked_) return ok();
    ARLO_TRY(write_file_atomically(dir_layout::ack_file(opt_.run_dir, step, opt_.rank), ""));
    last_acked_ = step;
    // Our part of every acknowledged step is consumed: remove it (the orchestrator removes the
    // directories once every rank acked).
    std::error_code ec;
    for (std::int64_t s : list_steps(opt_.run_dir)) {
      if (s <= step) fs::remove(dir_layout::batch_file(opt_.run_dir, s, opt_.rank), ec);
    }
    return ok();
  }

  Status published(std::int64_t version, const nlohmann::json& info) override {
    if (version < 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("published: version {} < 0", version));
    nlohmann::json j = info.is_object() ? info : nlohmann::json::object();
    j["version"] = version;
    j["rank"] = opt_.rank;
    return write_file_atomically(dir_layout::version_file(opt_.run_dir, version), j.dump());
  }

  Status heartbeat() override {
    nlohmann::json j{{"rank", opt_.rank}, {"time_ms", wall_ms()}, {"last_acked_step", last_acked_step()}};
    return write_file_atomically(dir_layout::heartbeat_file(opt_.run_dir, opt_.rank), j.dump());
  }

  std::int64_t last_acked_step() const override {
    std::lock_guard lock(mu_);
    return last_acked_;
  }

  void close() override {
    if (closed_.exchange(true)) return;
    if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    }
  }

 private:
  void drain_inotify() {
    char buf[16 * 1024];
    while (::read(inotify_fd_, buf, sizeof buf) > 0) {
    }
  }

  // The lowest unacknowledged step for this rank, opened and validated; nullopt when none.
  std::optional<Result<BatchView>> scan() {
    std::int64_t acked;
    {
      std::lock_guard lock(mu_);
      last_acked_ = std::max(last_acked_, read_watermark(opt_.run_dir));
      acked = last_acked_;
    }
    for (std::int64_t step : list_steps(opt_.run_dir)) {
      if (step <= acked) continue;
      const fs::path file = dir_layout::batch_file(opt_.run_dir, step, opt_.rank);
      std::error_code ec;
      if (fs::exists(dir_layout::ack_file(opt_.run_dir, step, opt_.rank), ec)) {
        // Acked before a crash that came ahead of the clean-up.
        std::lock_guard lock(mu_);
        last_acked_ = std::max(last_acked_, step);
        fs::remove(file, ec);
        continue;
      }
      if (!fs::exists(file, ec)) continue;
      auto view = BatchView::open(file);
      if (view && (view->step() != step || view->rank() != opt_.rank)) {
        return Result<BatchView>(make_error(
            ErrorCode::kMismatch,
            fmt::format("bridge dir client: {} says step {} rank {}", file.string(), view->step(), view->rank())));
      }
      return view;
    }
    return std::nullopt;
  }

  ClientOptions opt_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> closed_{false};
  mutable std::mutex mu_;  // last_acked_
  std::mutex wait_mu_;     // one next_batch at a time
  std::int64_t last_acked_ = 0;
};

}  // namespace

Result<std::unique_ptr<BridgeServer>> make_dir_server(asio::io_context& io, ServerOptions options) {
  if (options.run_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "bridge dir: run_dir is empty");
  if (options.num_ranks < 1) return make_error(ErrorCode::kInvalidArgument, "bridge dir: num_ranks must be >= 1");
  if (options.max_pending_batches < 1)
    return make_error(ErrorCode::kInvalidArgument, "bridge dir: max_pending_batches must be >= 1");
  return std::unique_ptr<BridgeServer>(new Server<DirServerState>(io, std::move(options)));
}

Result<std::unique_ptr<BridgeClient>> make_dir_client(const ClientOptions& options) {
  if (options.run_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "bridge dir client: run_dir is empty");
  if (options.rank < 0) return make_error(ErrorCode::kInvalidArgument, "bridge dir client: rank must be >= 0");
  auto client = std::make_unique<DirClient>(options);
  ARLO_TRY(client->init());
  return std::unique_ptr<BridgeClient>(std::move(client));
}

}  // namespace internal
}  // namespace arlo::bridge
