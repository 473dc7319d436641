#pragma once
// The orchestrator's own checkpoint and its batch journal: what it needs to continue a run at the
// same step and the same data position, and to give a trainer that lost steps the very batches it
// lost. The protocol between the two checkpoints is in docs/checkpoints.md; in short:
//
//   - At every batch cut, before the batch leaves, the orchestrator writes the batch to
//     <run_dir>/orchestrator/batches/step_<s>.json, then checkpoint.json with step s and the data
//     position after it (both atomically: temp file in the same directory, fsync, rename, fsync of
//     the directory). The trainer can never hold a step the orchestrator has not checkpointed.
//   - A trainer acknowledges step s only once a restart of its own would not need the batch again
//     (arlo-trainer: its checkpoint or its own copy of the batch). The trainer publishes version s
//     after acknowledging step s, so "version s published" lets the journal drop steps <= s.
//   - On resume the orchestrator re-sends every journaled step (<= its checkpoint's step), in
//     order and unchanged, then cuts the steps after its checkpoint from its data position. The
//     bridge and the trainer drop the ones the trainer already has (start_after_step), so no step
//     is trained twice in the final weights, none is skipped, and no task is batched twice.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/async/coro.h"
#include "orchestrator/ports.h"
#include "orchestrator/types.h"

namespace arlo::orch {

struct CheckpointState {
  std::int64_t step = 0;            // batches for steps 1..step were cut (and journaled)
  Version version = kNoVersion;     // the version workers served when it was written
  nlohmann::json task_cursor;       // TaskSource::cursor()
  std::vector<Task> pending_tasks;  // dispatched but not yet batched: re-dispatched first on resume
  std::string rng;                  // dispatcher RNG state
  nlohmann::json ledger;            // Ledger::to_json()
};

inline constexpr int kCheckpointFormat = 1;

// <run_dir>/orchestrator/checkpoint.json
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir);
Status write_checkpoint(const std::filesystem::path& path, const CheckpointState& state);
// nullopt when no checkpoint exists; an error for one that cannot be read or parsed.
Result<std::optional<CheckpointState>> read_checkpoint(const std::filesystem::path& path);

// The batch journal: <run_dir>/orchestrator/batches/step_<s>.json, one TrainBatch per file.
std::filesystem::path journal_dir(const std::filesystem::path& run_dir);
Status write_journal_batch(const std::filesystem::path& dir, const TrainBatch& batch);
// The journaled batches with step <= up_to, in step order; files of later steps (cut but never
// checkpointed, so never sent) are removed. An unreadable file is an error naming it.
Result<std::vector<TrainBatch>> read_journal(const std::filesystem::path& dir, std::int64_t up_to);
// Removes the journaled batches with step <= step (the trainer has them for good).
void prune_journal(const std::filesystem::path& dir, std::int64_t step);

nlohmann::json to_json(const TrainBatch& batch);
Result<TrainBatch> train_batch_from_json(const nlohmann::json& j);

// A TrainerPort in front of the real one: send(batch) first journals the batch and writes the
// checkpoint that `state` returns for it (the data position just after the cut), then forwards.
// A failed write fails the send (and so the run) before the trainer can see the batch.
class JournalingTrainer final : public TrainerPort {
 public:
  JournalingTrainer(TrainerPort& inner, std::filesystem::path run_dir,
                    std::function<CheckpointState(std::int64_t)> state)
      : inner_(inner), run_dir_(std::move(run_dir)), state_(std::move(state)) {}
  Awaitable<Status> send(TrainBatch batch) override;
  void on_version(std::function<void(VersionNotice)> callback) override { inner_.on_version(std::move(callback)); }
  // Re-sends a journaled batch as it is (resume); nothing is written.
  Awaitable<Status> resend(TrainBatch batch) { return inner_.send(std::move(batch)); }

 private:
  TrainerPort& inner_;
  std::filesystem::path run_dir_;
  std::function<CheckpointState(std::int64_t)> state_;
};

}  // namespace arlo::orch
