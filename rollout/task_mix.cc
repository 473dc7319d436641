#include "rollout/task_mix.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

namespace arlo::rollout {

TaskMix::TaskMix(std::shared_ptr<TaskStream> single)
    : sources_{{"", std::move(single), 1.0}}, served_(1, 0), single_(true) {}

Result<std::shared_ptr<TaskMix>> TaskMix::make(std::vector<Source> sources) {
  if (sources.empty()) return make_error(ErrorCode::kInvalidArgument, "task mix: no sources");
  std::set<std::string> names;
  for (const auto& s : sources) {
    if (!s.stream)
      return make_error(ErrorCode::kInvalidArgument, fmt::format("task mix: source '{}' has no tasks", s.name));
    if (!std::isfinite(s.ratio) || s.ratio <= 0)
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("task mix: source '{}' has ratio {}; it must be a positive number", s.name, s.ratio));
    if (!names.insert(s.name).second)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("task mix: two sources are named '{}'; give each its own name", s.name));
  }
  std::shared_ptr<TaskMix> mix(new TaskMix());
  mix->served_.assign(sources.size(), 0);
  mix->sources_ = std::move(sources);
  return mix;
}

int TaskMix::pick() const {
  double total_ratio = 0;
  std::uint64_t total_served = 0;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].stream->exhausted()) continue;
    total_ratio += sources_[i].ratio;
    total_served += served_[i];
  }
  int best = -1;
  double best_deficit = 0;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].stream->exhausted()) continue;
    // How far source i is below its exact share once one more task is served.
    const double deficit =
        static_cast<double>(total_served + 1) * sources_[i].ratio / total_ratio - static_cast<double>(served_[i]);
    if (best < 0 || deficit > best_deficit) {
      best = static_cast<int>(i);
      best_deficit = deficit;
    }
  }
  return best;
}

bool TaskMix::exhausted() const { return pick() < 0; }

Result<Task> TaskMix::next() {
  const int i = pick();
  if (i < 0) return make_error(ErrorCode::kNotFound, "task mix: every source has served all its epochs");
  ARLO_ASSIGN_OR_RETURN(Task task, sources_[i].stream->next());
  ++served_[i];
  if (!single_) task.env = sources_[i].name;
  return task;
}

Json TaskMix::cursor() const {
  if (single_) return sources_[0].stream->cursor();
  Json mix = Json::array();
  for (std::size_t i = 0; i < sources_.size(); ++i)
    mix.push_back({{"name", sources_[i].name},
                   {"ratio", sources_[i].ratio},
                   {"served", served_[i]},
                   {"stream", sources_[i].stream->cursor()}});
  return {{"mix", std::move(mix)}};
}

Status TaskMix::restore(const Json& c) {
  if (single_) return sources_[0].stream->restore(c);
  if (!c.is_object() || !c.contains("mix") || !c["mix"].is_array())
    return make_error(ErrorCode::kMismatch,
                      fmt::format("task cursor was not saved for a mix of {} sources (env.sources); resume with the "
                                  "sources it was saved with",
                                  sources_.size()));
  const Json& saved = c["mix"];
  if (saved.size() != sources_.size())
    return make_error(ErrorCode::kMismatch, fmt::format("task cursor was saved for {} sources, this run has {}",
                                                        saved.size(), sources_.size()));
  std::vector<std::uint64_t> served(sources_.size());
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    const Json& s = saved[i];
    if (!s.is_object() || !s.contains("name") || !s.contains("ratio") || !s.contains("served") ||
        !s.contains("stream") || !s["name"].is_string() || !s["ratio"].is_number() || !s["served"].is_number_unsigned())
      return make_error(ErrorCode::kParse, fmt::format("task cursor: mix entry {} is malformed", i));
    if (s["name"] != sources_[i].name || s["ratio"].get<double>() != sources_[i].ratio)
      return make_error(
          ErrorCode::kMismatch,
          fmt::format("task cursor: source {} was '{}' with ratio {}, this run has '{}' with ratio {}; "
                      "resume with the same env.sources",
                      i, s["name"].get<std::string>(), s["ratio"].get<double>(), sources_[i].name, sources_[i].ratio));
    served[i] = s["served"].get<std::uint64_t>();
  }
  // Every stream's own check before any of them moves: a mismatch leaves the mix as it was.
  std::vector<Json> before;
  for (const auto& s : sources_) before.push_back(s.stream->cursor());
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (auto st = sources_[i].stream->restore(saved[i]["stream"]); !st) {
      for (std::size_t k = 0; k < i; ++k) (void)sources_[k].stream->restore(before[k]);
      return std::unexpected(Error(st.error()).with_context(fmt::format("env.sources[{}] ({})", i, sources_[i].name)));
    }
  }
  served_ = std::move(served);
  return ok();
}

}  // namespace arlo::rollout
