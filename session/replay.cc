#include "session/replay.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/async/coro.h"
#include "common/file.h"
#include "session/rollout_log.h"

namespace arlo::session {

namespace fs = std::filesystem;

namespace {

// The lines of a rollouts.jsonl, each parsed (empty lines skipped). `fn(number, record, group)` is
// called per line; a line that is not a group is an error naming it, except a partial last line (no
// newline at its end: a run killed mid-write), which is skipped with a warning.
template <typename Fn>
Status for_each_group(const std::string& path, std::vector<std::string>* warnings, Fn&& fn) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kNotFound, fmt::format("{}: cannot be read (no such file?)", path));
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool partial = in.eof();  // the file ended before this line's newline
    auto rec = nlohmann::json::parse(line, nullptr, false);
    Result<StoredGroup> group =
        rec.is_discarded() ? Result<StoredGroup>(make_error(ErrorCode::kInvalidArgument, "not valid JSON (cut short?)"))
                           : parse_rollout_record(rec);
    if (!group && partial) {
      if (warnings)
        warnings->push_back(fmt::format("{}:{}: a partial last line (a run killed mid-write) skipped", path, number));
      break;
    }
    if (!group)
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}:{}: {}", path, number, group.error().what()));
    ARLO_TRY(fn(number, rec, std::move(*group)));
  }
  if (in.bad()) return make_error(ErrorCode::kIo, fmt::format("{}: a read failed after line {}", path, number));
  return ok();
}

Awaitable<void> score_into(rollout::RewardScorer& scorer, const Task& task, std::vector<rollout::Rollout>& samples,
                           Status& out) {
  out = co_await scorer.score_group(task, samples);
}

// Scores one group on `io` (this thread runs it until the group is scored).
Status score_now(boost::asio::io_context& io, rollout::RewardScorer& scorer, StoredGroup& g) {
  Status st = ok();
  bool done = false;
  boost::asio::co_spawn(io, score_into(scorer, g.task, g.samples, st), [&done](std::exception_ptr e) {
    done = true;
    if (e) std::rethrow_exception(e);
  });
  io.restart();
  while (!done) io.run_one();
  return st;
}

// The module rewards in a sample's scores ("<module>"; "<module>/<metric>" and "reward/failed" are
// not rewards).
void each_module(const nlohmann::json& scores, const std::function<void(const std::string&, double)>& add) {
  if (!scores.is_object()) return;
  for (const auto& [key, value] : scores.items())
    if (key.find('/') == std::string::npos && value.is_number()) add(key, value.get<double>());
}

// Adds one sample's old and new scores to the summary; returns its replay.jsonl line.
nlohmann::json compare(const nlohmann::json& stored, const rollout::Rollout& now, ReplaySummary& s) {
  const auto old_scores = stored.value("scores", nlohmann::json::object());
  const auto old_reward = stored.value("reward", nlohmann::json());
  if (old_reward.is_number()) {
    s.modules["reward"].old_sum += old_reward.get<double>();
    ++s.modules["reward"].old_n;
  }
  each_module(old_scores, [&](const std::string& m, double v) {
    s.modules[m].old_sum += v;
    ++s.modules[m].old_n;
  });
  const nlohmann::json new_scores(now.metrics);
  if (now.reward) {
    s.modules["reward"].new_sum += *now.reward;
    ++s.modules["reward"].new_n;
  }
  each_module(new_scores, [&](const std::string& m, double v) {
    s.modules[m].new_sum += v;
    ++s.modules[m].new_n;
  });
  if (!now.reward || now.metrics.contains("reward/failed")) ++s.failed;
  ++s.samples;
  return {{"old", {{"reward", old_reward}, {"scores", old_scores}}},
          {"new", {{"reward", now.reward ? nlohmann::json(*now.reward) : nlohmann::json()}, {"scores", new_scores}}}};
}

}  // namespace

Status write_run_config(const std::string& run_dir, const config::Config& cfg) {
  const auto path = fs::path(run_dir) / kRunConfigFile;
  ARLO_TRY(write_file_atomically(path, cfg.to_yaml()));
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, ec);
  return ok();
}

rollout::ScorerOptions replay_scorer_options(const config::Config& cfg) {
  rollout::ScorerOptions so;
  so.timeout =
      std::chrono::duration_cast<rollout::Duration>(std::chrono::duration<double>(cfg.number("reward.timeout_s")));
  if (auto p = rollout::parse_failure_policy(cfg.string("reward.on_failure"))) so.on_failure = *p;
  so.assign_value = cfg.number("reward.failure_value");
  return so;
}

Result<ReplaySummary> replay_rollouts(std::shared_ptr<rollout::RewardModule> module,
                                      const rollout::ScorerOptions& scorer_options, const ReplayOptions& options) {
  ReplaySummary s;
  std::size_t total = 0;  // first pass: every line is a group, before anything is scored or written
  ARLO_TRY(for_each_group(options.rollouts, &s.warnings, [&](std::size_t, const nlohmann::json&, const StoredGroup&) {
    ++total;
    return ok();
  }));
  const auto tmp = options.output + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  if (!out) return make_error(ErrorCode::kIo, fmt::format("{}: cannot be written", tmp));
  boost::asio::io_context io;
  rollout::RewardScorer scorer(io, std::move(module), scorer_options);
  auto scored =
      for_each_group(options.rollouts, nullptr, [&](std::size_t number, const nlohmann::json& rec, StoredGroup g) {
        if (auto st = score_now(io, scorer, g); !st)
          return Status(make_error(st.error().code(),
                                   fmt::format("{}:{}: scoring: {}", options.rollouts, number, st.error().what())));
        for (std::size_t i = 0; i < g.samples.size(); ++i) {
          auto line = compare(rec["samples"][i], g.samples[i], s);
          line.update({{"line", number},
                       {"group", rec.value("group", nlohmann::json())},
                       {"step", rec.value("step", nlohmann::json())},
                       {"task_id", g.task.id},
                       {"sample", i}});
          out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
        }
        ++s.groups;
        if (options.progress) options.progress(s.groups, total);
        return ok();
      });
  out.close();
  std::error_code ec;
  if (!scored) {
    fs::remove(tmp, ec);
    return std::unexpected(scored.error());
  }
  if (!out || (fs::rename(tmp, options.output, ec), ec))
    return make_error(ErrorCode::kIo, fmt::format("writing {}: {}", options.output, ec ? ec.message() : "failed"));
  return s;
}

std::string format_replay_summary(const ReplaySummary& s) {
  std::string text =
      fmt::format("replay: {} group(s), {} sample(s) scored again; {} failed now\n", s.groups, s.samples, s.failed);
  text += fmt::format("  {:<24} {:>10} {:>10} {:>10}  {}\n", "module", "old mean", "new mean", "change",
                      "samples (old/new)");
  auto row = [&](const std::string& name, const MeanChange& m) {
    auto mean = [](std::size_t n, double v) { return n ? fmt::format("{:.4f}", v) : std::string("-"); };
    const auto change = m.old_n && m.new_n ? fmt::format("{:+.4f}", m.new_mean() - m.old_mean()) : std::string("-");
    text += fmt::format("  {:<24} {:>10} {:>10} {:>10}  {}/{}\n", name, mean(m.old_n, m.old_mean()),
                        mean(m.new_n, m.new_mean()), change, m.old_n, m.new_n);
  };
  if (auto it = s.modules.find("reward"); it != s.modules.end()) row("reward (total)", it->second);
  for (const auto& [name, m] : s.modules)
    if (name != "reward") row(name, m);
  return text;
}

}  // namespace arlo::session
