#include "orchestrator/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace arlo::orch {

namespace {
Status io_error(const std::string& what, const std::filesystem::path& p) {
  return make_error(ErrorCode::kIo, fmt::format("{} {}: {}", what, p.string(), std::strerror(errno)));
}
}  // namespace

std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir) {
  return run_dir / "orchestrator" / "checkpoint.json";
}

Status write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("creating {}: {}", path.parent_path().string(), ec.message()));
  const auto tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("opening", tmp);
  std::size_t done = 0;
  while (done < contents.size()) {
    const auto n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      auto e = io_error("writing", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return e;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    auto e = io_error("fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return e;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto e = io_error("renaming into", path);
    ::unlink(tmp.c_str());
    return e;
  }
  const int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return ok();
}

Status write_checkpoint(const std::filesystem::path& path, const CheckpointState& s) {
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["step"] = s.step;
  j["version"] = s.version;
  j["task_cursor"] = s.task_cursor;
  j["pending_tasks"] = nlohmann::json::array();
  for (const auto& t : s.pending_tasks) j["pending_tasks"].push_back(to_json(t));
  j["rng"] = s.rng;
  j["ledger"] = s.ledger;
  return write_file_atomically(path, j.dump(1) + "\n");
}

Result<std::optional<CheckpointState>> read_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<CheckpointState>{};
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kIo, fmt::format("opening checkpoint {}", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const auto j = nlohmann::json::parse(ss.str());
    if (j.at("format").get<int>() != kCheckpointFormat)
      return make_error(ErrorCode::kMismatch, fmt::format("checkpoint {}: format {} but this build reads {}",
                                                          path.string(), j.at("format").get<int>(), kCheckpointFormat));
    CheckpointState s;
    s.step = j.at("step").get<std::int64_t>();
    s.version = j.at("version").get<Version>();
    s.task_cursor = j.at("task_cursor");
    for (const auto& t : j.at("pending_tasks")) s.pending_tasks.push_back(task_from_json(t));
    s.rng = j.at("rng").get<std::string>();
    s.ledger = j.at("ledger");
    return std::optional<CheckpointState>(std::move(s));
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse, fmt::format("checkpoint {}: {} (delete it to start over)", path.string(), e.what()));
  }
}

}  // namespace arlo::orch
