#pragma once
// The orchestrator's own checkpoint: what it needs to continue a run at the same step and the same
// data position. Written atomically (temp file, fsync, rename, fsync of the directory), so a crash
// leaves either the previous checkpoint or the new one, never a torn file.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "orchestrator/types.h"

namespace arlo::orch {

struct CheckpointState {
  std::int64_t step = 0;          // batches for steps 1..step were accepted by the trainer
  Version version = kNoVersion;   // the version workers served when it was written
  nlohmann::json task_cursor;     // TaskSource::cursor()
  std::vector<Task> pending_tasks;  // dispatched but not yet batched: re-dispatched first on resume
  std::string rng;                // dispatcher RNG state
  nlohmann::json ledger;          // Ledger::to_json()
};

inline constexpr int kCheckpointFormat = 1;

// <run_dir>/orchestrator/checkpoint.json
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir);
Status write_checkpoint(const std::filesystem::path& path, const CheckpointState& state);
// nullopt when no checkpoint exists; an error for one that cannot be read or parsed.
Result<std::optional<CheckpointState>> read_checkpoint(const std::filesystem::path& path);

}  // namespace arlo::orch
