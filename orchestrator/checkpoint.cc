#include "orchestrator/checkpoint.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "common/file.h"

namespace arlo::orch {

std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir) {
  return run_dir / "orchestrator" / "checkpoint.json";
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
