#include "session/rollout_log.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "common/file.h"
#include "common/log.h"

namespace arlo::session {

nlohmann::json rollout_record(const orch::Group& g) {
  auto samples = nlohmann::json::array();
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    const auto& c = g.completions[i];
    auto versions = nlohmann::json::array();
    for (const auto& s : c.version_spans) versions.push_back({s.version, s.first_token});
    nlohmann::json sample = {{"completion", c.text},
                             {"tokens", c.completion_tokens.size()},
                             {"finish_reason", to_string(c.finish_reason)},
                             {"versions", versions}};
    if (i < g.scores.rewards.size()) sample["reward"] = g.scores.rewards[i];
    if (i < g.scores.advantages.size()) sample["advantage"] = g.scores.advantages[i];
    if (i < g.scores.metrics.size()) sample["scores"] = g.scores.metrics[i];
    samples.push_back(std::move(sample));
  }
  return {{"step", g.target_step},
          {"group", g.id},
          {"env", g.task ? g.task->env : std::string()},
          {"task_id", g.task ? g.task->id : std::string()},
          {"prompt", g.task ? g.task->prompt_text() : std::string()},
          {"answer", g.task ? g.task->answer : std::string()},
          {"dispatch_version", g.dispatch_version},
          {"worker", g.worker},
          {"prompt_tokens", g.prompt_tokens.size()},
          {"seconds", std::chrono::duration<double>(g.finished_at - g.dispatched_at).count()},
          {"samples", std::move(samples)}};
}

RolloutLog::~RolloutLog() {
  if (file_) std::fclose(file_);
}

Status RolloutLog::open(const std::string& run_dir, int every) {
  if (run_dir.empty() || every <= 0) return ok();
  const auto path = std::filesystem::path(run_dir) / "rollouts.jsonl";
  ARLO_TRY(drop_partial_last_line(path));  // a resume after a kill mid-line
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) return make_error(ErrorCode::kIo, fmt::format("opening {}", path.string()));
  every_ = every;
  return ok();
}

void RolloutLog::add(const orch::Group& g, double wall_time) {
  if (!file_ || g.id % static_cast<std::uint64_t>(every_) != 0) return;
  auto rec = rollout_record(g);
  rec["time"] = wall_time;
  const auto line = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    ARLO_WARN_EVERY(60.0, "rollouts.jsonl: a write failed (disk full?); samples are missing from it");
}

}  // namespace arlo::session
