#include "session/rollout_log.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "common/file.h"
#include "common/log.h"

namespace arlo::session {

namespace {

// What a multi-turn trajectory adds to its sample's line (nothing for a single-turn sample); a split
// one (docs/environments.md, "When a trajectory splits") also its pieces' token counts, in order
// ("segments": prompt and completion tokens each; "tokens" and the model's and environment's token
// counts are then the whole trajectory's).
void add_trajectory(const Sample& c, nlohmann::json& sample) {
  if (!c.turns.empty()) sample["turns"] = to_json(c.turns);
  std::size_t model = 0, masked = 0, tokens = 0;
  auto segments = nlohmann::json::array();
  const auto count = [&](const std::vector<std::uint8_t>& mask, std::size_t prompt, std::size_t completion) {
    const auto m = static_cast<std::size_t>(std::count(mask.begin(), mask.end(), 1));
    model += m;
    masked += mask.size() - m;
    tokens += completion;
    segments.push_back({{"prompt_tokens", prompt}, {"tokens", completion}});
  };
  for (const auto& seg : c.split_segments) count(seg.loss_mask, seg.prompt_tokens.size(), seg.completion_tokens.size());
  count(c.loss_mask, c.prompt_tokens.size(), c.completion_tokens.size());
  if (!c.split_segments.empty()) {
    sample["segments"] = std::move(segments);
    sample["tokens"] = tokens;
  }
  if (model + masked > 0) {
    sample["model_tokens"] = model;
    sample["env_tokens"] = masked;
  }
  if (!c.turn_versions.empty()) sample["turn_versions"] = c.turn_versions;
  if (c.env_reward) sample["env_reward"] = *c.env_reward;
}

nlohmann::json sample_json(const orch::Group& g, std::size_t i) {
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
  if (!c.worker.empty() && c.worker != g.worker) sample["worker"] = c.worker;
  add_trajectory(c, sample);
  return sample;
}

// `text` cut to at most `max_chars` bytes at a character boundary, "..." marking a cut.
std::string cut(const std::string& text, std::size_t max_chars) {
  if (text.size() <= max_chars) return text;
  std::size_t n = max_chars;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n) + "...";
}

}  // namespace

nlohmann::json rollout_record(const orch::Group& g) {
  auto samples = nlohmann::json::array();
  for (std::size_t i = 0; i < g.completions.size(); ++i) samples.push_back(sample_json(g, i));
  nlohmann::json rec = {{"step", g.target_step},
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
  if (g.task && g.task->is_chat()) rec["messages"] = to_json(g.task->messages);
  if (g.task && !(g.task->info.is_object() && g.task->info.empty())) rec["info"] = g.task->info;
  return rec;
}

nlohmann::json sample_row(const orch::Group& g, std::size_t i, std::size_t max_chars) {
  const auto& c = g.completions[i];
  nlohmann::json row = {{"step", g.target_step},
                        {"group", g.id},
                        {"sample", i},
                        {"version", c.oldest_version(g.dispatch_version)},
                        {"worker", c.worker.empty() ? g.worker : c.worker},
                        {"prompt", cut(g.task ? g.task->prompt_text() : std::string(), max_chars)},
                        {"completion", cut(c.text, max_chars)},
                        {"finish_reason", to_string(c.finish_reason)},
                        {"reward", nullptr}};
  if (i < g.scores.rewards.size()) row["reward"] = g.scores.rewards[i];
  if (!c.turns.empty()) {
    auto turns = nlohmann::json::array();
    for (const auto& t : c.turns) turns.push_back({{"role", t.role}, {"content", cut(t.content, max_chars)}});
    row["turns"] = std::move(turns);
  }
  return row;
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
  const std::size_t first = g.completions.size() > kRecentSamples ? g.completions.size() - kRecentSamples : 0;
  for (std::size_t i = first; i < g.completions.size(); ++i) recent_.push_back(sample_row(g, i, kRowChars));
  while (recent_.size() > kRecentSamples) recent_.pop_front();
  if (!file_ || g.id % static_cast<std::uint64_t>(every_) != 0) return;
  auto rec = rollout_record(g);
  rec["time"] = wall_time;
  const auto line = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    ARLO_WARN_EVERY(60.0, "rollouts.jsonl: a write failed (disk full?); samples are missing from it");
}

nlohmann::json RolloutLog::recent() const {
  auto out = nlohmann::json::array();
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) out.push_back(*it);
  return out;
}

namespace {

std::vector<ChatMessage> messages_from(const nlohmann::json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) {
    auto message = chat_message_from_json(m);
    if (!message) throw std::invalid_argument(message.error());
    out.push_back(std::move(*message));
  }
  return out;
}

Sample stored_sample(const nlohmann::json& s, const std::string& task_id, std::size_t index) {
  Sample c;
  c.task_id = task_id;
  c.sample_index = static_cast<int>(index);
  c.text = s.at("completion").get<std::string>();
  c.completion_tokens.assign(s.value("tokens", std::size_t{0}), 0);
  c.finish_reason = parse_finish_reason(s.value("finish_reason", std::string("unknown")));
  for (const auto& v : s.value("versions", nlohmann::json::array()))
    c.version_spans.push_back({v.at(0).get<Version>(), v.at(1).get<std::int64_t>()});
  c.worker = s.value("worker", std::string());
  if (s.contains("turns")) c.turns = messages_from(s.at("turns"));
  if (s.contains("turn_versions")) c.turn_versions = s.at("turn_versions").get<std::vector<Version>>();
  if (s.contains("env_reward") && !s.at("env_reward").is_null()) c.env_reward = s.at("env_reward").get<double>();
  return c;
}

}  // namespace

Result<StoredGroup> parse_rollout_record(const nlohmann::json& rec) {
  try {
    if (!rec.is_object()) return make_error(ErrorCode::kInvalidArgument, "not a JSON object");
    StoredGroup g;
    g.task.id = rec.at("task_id").get<std::string>();
    g.task.env = rec.value("env", std::string());
    if (rec.contains("messages")) {
      g.task.messages = messages_from(rec.at("messages"));
    } else {
      g.task.prompt = rec.at("prompt").get<std::string>();
    }
    g.task.answer = rec.value("answer", std::string());
    if (rec.contains("info")) g.task.info = rec.at("info");
    const auto& samples = rec.at("samples");
    if (!samples.is_array()) return make_error(ErrorCode::kInvalidArgument, "\"samples\": not an array");
    for (std::size_t i = 0; i < samples.size(); ++i) g.samples.push_back(stored_sample(samples[i], g.task.id, i));
    return g;
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("not a rollouts.jsonl group: {}", e.what()));
  }
}

}  // namespace arlo::session
