#include "orchestrator/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/crash_point.h"
#include "common/file.h"
#include "common/log.h"

namespace arlo::orch {

namespace fs = std::filesystem;

namespace {

// A write of step `step`'s checkpoint that failed (`what`: which write) stops the run; the error
// says how to go on.
Error checkpoint_write_failed(const Error& e, std::string_view what, std::int64_t step) {
  return Error(e).with_context(
      fmt::format("checkpoint: {} of step {} (the run stops here; `arlo run --resume` continues from the last good "
                  "checkpoint once the disk has room)",
                  what, step));
}

Result<std::string> read_whole(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, fmt::format("opening {} {}", what, path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIo, fmt::format("reading {} {}", what, path.string()));
  return ss.str();
}

// step_<s>.json -> s; nullopt for any other name (temporary files included).
std::optional<std::int64_t> journal_step(const fs::path& p) {
  const auto name = p.filename().string();
  if (!name.starts_with("step_") || !name.ends_with(".json")) return std::nullopt;
  const auto digits = name.substr(5, name.size() - 10);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

std::vector<std::pair<std::int64_t, fs::path>> journal_files(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (auto s = journal_step(it->path())) out.emplace_back(*s, it->path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

fs::path checkpoint_path(const fs::path& run_dir) { return run_dir / "orchestrator" / "checkpoint.json"; }
fs::path journal_dir(const fs::path& run_dir) { return run_dir / "orchestrator" / "batches"; }

Status write_checkpoint(const fs::path& path, const CheckpointState& s) {
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["step"] = s.step;
  j["version"] = s.version;
  j["task_cursor"] = s.task_cursor;
  j["pending_tasks"] = nlohmann::json::array();
  for (const auto& t : s.pending_tasks) j["pending_tasks"].push_back(task_checkpoint_json(t));
  j["rng"] = s.rng;
  j["ledger"] = s.ledger;
  return write_file_atomically(path, j.dump(1) + "\n");
}

Result<std::optional<CheckpointState>> read_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<CheckpointState>{};
  ARLO_ASSIGN_OR_RETURN(auto text, read_whole(path, "checkpoint"));
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("format").get<int>() != kCheckpointFormat)
      return make_error(ErrorCode::kMismatch, fmt::format("checkpoint {}: format {} but this build reads {}",
                                                          path.string(), j.at("format").get<int>(), kCheckpointFormat));
    CheckpointState s;
    s.step = j.at("step").get<std::int64_t>();
    s.version = j.at("version").get<Version>();
    s.task_cursor = j.at("task_cursor");
    for (const auto& t : j.at("pending_tasks")) s.pending_tasks.push_back(task_from_checkpoint_json(t));
    s.rng = j.at("rng").get<std::string>();
    s.ledger = j.at("ledger");
    return std::optional<CheckpointState>(std::move(s));
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse,
                      fmt::format("checkpoint {}: {} (delete it to start over)", path.string(), e.what()));
  }
}

nlohmann::json to_json(const TrainBatch& b) {
  auto samples = nlohmann::json::array();
  for (const auto& s : b.samples) {
    nlohmann::json j = {{"prompt_tokens", s.prompt_tokens}, {"completion_tokens", s.completion_tokens},
                        {"logprobs", s.logprobs},           {"token_versions", s.token_versions()},
                        {"advantage", s.advantage},         {"reward", s.reward.value_or(0.0)},
                        {"supervised", s.supervised}};
    // A multi-turn sample's environment tokens and a masked sample stay out of the loss on resend.
    if (!s.loss_mask.empty()) j["loss_mask"] = s.loss_mask;
    if (s.fate == SampleFate::kMasked) j["masked"] = true;
    samples.push_back(std::move(j));
  }
  return {{"step", b.step}, {"samples", std::move(samples)}, {"metadata", b.metadata}};
}

Result<TrainBatch> train_batch_from_json(const nlohmann::json& j) {
  try {
    TrainBatch b;
    b.step = j.at("step").get<std::int64_t>();
    b.metadata = j.value("metadata", nlohmann::json::object());
    for (const auto& s : j.at("samples")) {
      Sample t;
      t.prompt_tokens = s.at("prompt_tokens").get<std::vector<std::int32_t>>();
      t.completion_tokens = s.at("completion_tokens").get<std::vector<std::int32_t>>();
      t.logprobs = s.at("logprobs").get<std::vector<float>>();
      t.version_spans = spans_of(s.at("token_versions").get<std::vector<std::int32_t>>());
      t.advantage = s.at("advantage").get<double>();
      t.reward = s.at("reward").get<double>();
      t.supervised = s.at("supervised").get<bool>();
      t.loss_mask = s.value("loss_mask", std::vector<std::uint8_t>{});
      if (s.value("masked", false)) t.fate = SampleFate::kMasked;
      b.samples.push_back(std::move(t));
    }
    return b;
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse, e.what());
  }
}

Status write_journal_batch(const fs::path& dir, const TrainBatch& batch) {
  return write_file_atomically(dir / fmt::format("step_{}.json", batch.step), to_json(batch).dump() + "\n");
}

Result<std::vector<TrainBatch>> read_journal(const fs::path& dir, std::int64_t up_to) {
  std::vector<TrainBatch> out;
  for (const auto& [step, path] : journal_files(dir)) {
    if (step > up_to) {  // cut after the checkpoint was written: it never left, it is cut again
      std::error_code ec;
      fs::remove(path, ec);
      continue;
    }
    ARLO_ASSIGN_OR_RETURN(auto text, read_whole(path, "journaled batch"));
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return make_error(ErrorCode::kParse, fmt::format("journaled batch {}: not valid JSON", path.string()));
    auto b = train_batch_from_json(j);
    if (!b) return std::unexpected(Error(b.error()).with_context(fmt::format("journaled batch {}", path.string())));
    if (b->step != step)
      return make_error(ErrorCode::kMismatch, fmt::format("journaled batch {} holds step {}", path.string(), b->step));
    out.push_back(std::move(*b));
  }
  return out;
}

void prune_journal(const fs::path& dir, std::int64_t step) {
  for (const auto& [s, path] : journal_files(dir)) {
    if (s > step) break;
    std::error_code ec;
    fs::remove(path, ec);
  }
}

Awaitable<Status> JournalingTrainer::send(TrainBatch batch) {
  const auto step = batch.step;
  crash_point("orchestrator.before_checkpoint", step);
  if (auto st = write_journal_batch(journal_dir(run_dir_), batch); !st)
    co_return std::unexpected(checkpoint_write_failed(st.error(), "journaling the batch", step));
  if (auto st = write_checkpoint(checkpoint_path(run_dir_), state_(step)); !st)
    co_return std::unexpected(checkpoint_write_failed(st.error(), "writing the checkpoint", step));
  crash_point("orchestrator.after_checkpoint", step);
  co_return co_await inner_.send(std::move(batch));
}

}  // namespace arlo::orch
