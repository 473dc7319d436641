#include "session/children.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

namespace arlo::session {

namespace fs = std::filesystem;

std::string find_binary(const std::string& name) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate :
         {dir / name, dir.parent_path() / name / name, dir.parent_path().parent_path() / "apps" / name / name})
      if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return name;
}

RunChildren::RunChildren()
    : launcher_([this](const std::string& name, const std::string& line) { on_line(name, line); }) {}

RunChildren::~RunChildren() { stop(); }

void RunChildren::on_line(const std::string& name, const std::string& line) {
  std::lock_guard lock(mu_);
  auto& tail = tails_[name];
  tail.push_back(line);
  if (tail.size() > kTailLines) tail.pop_front();
  std::fprintf(stdout, "[%s] %s\n", name.c_str(), line.c_str());
  std::fflush(stdout);
}

std::string RunChildren::tail(const std::string& name) const {
  std::lock_guard lock(mu_);
  std::string out;
  auto it = tails_.find(name);
  if (it == tails_.end() || it->second.empty()) return "  (no output)";
  for (const auto& line : it->second) out += fmt::format("  [{}] {}\n", name, line);
  if (!out.empty()) out.pop_back();
  return out;
}

Result<pid_t> RunChildren::spawn(const ChildSpec& spec) {
  if (stopped_)
    return make_error(ErrorCode::kCancelled, fmt::format("not starting {}: the run is stopping", spec.name));
  auto pid = launcher_.spawn(spec);
  if (!pid)
    return std::unexpected(
        Error(pid.error()).with_context(fmt::format("starting {} ({})", spec.name, spec.argv.at(0))));
  specs_.insert_or_assign(spec.name, spec);
  return *pid;
}

Result<pid_t> RunChildren::restart(const std::string& name, bool as_first_started) {
  auto it = specs_.find(name);
  if (it == specs_.end()) return make_error(ErrorCode::kNotFound, fmt::format("no child named {} to restart", name));
  ChildSpec spec = it->second;
  if (!as_first_started && !spec.restart_argv.empty()) spec.argv = spec.restart_argv;
  if (stopped_) return make_error(ErrorCode::kCancelled, fmt::format("not restarting {}: the run is stopping", name));
  auto pid = launcher_.spawn(spec);
  if (!pid)
    return std::unexpected(Error(pid.error()).with_context(fmt::format("restarting {} ({})", name, spec.argv.at(0))));
  return *pid;
}

void RunChildren::update_env(const std::string& name, const std::map<std::string, std::string>& env) {
  if (auto it = specs_.find(name); it != specs_.end())
    for (const auto& [key, value] : env) it->second.env.insert_or_assign(key, value);
}

std::optional<ChildExit> RunChildren::next_exit() {
  auto e = launcher_.exited();
  // Give the reader thread a moment to forward the child's last lines before they are quoted.
  if (e) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return e;
}

std::string RunChildren::describe(const ChildExit& e) const {
  return fmt::format("{}; its last lines:\n{}", e.describe(), tail(e.name));
}

void RunChildren::stop(std::chrono::milliseconds grace) {
  stopped_ = true;
  launcher_.stop(grace);
}

}  // namespace arlo::session
