#include "rollout/environment.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>

namespace arlo::rollout {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t bound) {
  if (bound <= 1) return 0;
  // Rejection sampling removes modulo bias.
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t x;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

std::vector<std::size_t> seeded_permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::uint64_t state = seed;
  for (std::size_t i = n; i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(uniform_below(state, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

namespace {

class IndexedView : public TaskSet {
 public:
  IndexedView(std::string name, std::shared_ptr<const TaskSet> parent, std::vector<std::size_t> indices)
      : name_(std::move(name)), parent_(std::move(parent)), indices_(std::move(indices)) {}
  const std::string& name() const override { return name_; }
  std::size_t size() const override { return indices_.size(); }
  const Task& at(std::size_t index) const override { return parent_->at(indices_.at(index)); }

 private:
  std::string name_;
  std::shared_ptr<const TaskSet> parent_;
  std::vector<std::size_t> indices_;
};

}  // namespace

Result<std::shared_ptr<const TaskSet>> load_jsonl(const std::string& path, std::string name, std::size_t max_tasks) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kNotFound, fmt::format("{}: cannot open dataset file (check the path)", path));
  std::vector<Task> tasks;
  std::set<std::string> ids;
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return make_error(ErrorCode::kParse,
                        fmt::format("{}:{}: not valid JSON (each line must be one JSON object)", path, line_no));
    auto task = task_from_json(j);
    if (!task) return make_error(ErrorCode::kParse, fmt::format("{}:{}: {}", path, line_no, task.error().message()));
    if (task->id.empty()) task->id = fmt::format("{}-{}", name, line_no);
    if (!ids.insert(task->id).second)
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}:{}: duplicate id '{}'", path, line_no, task->id));
    task->env = name;
    tasks.push_back(std::move(*task));
    if (max_tasks > 0 && tasks.size() >= max_tasks) break;
  }
  if (in.bad()) return make_error(ErrorCode::kIo, fmt::format("{}: read error after line {}", path, line_no));
  if (tasks.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: dataset has no tasks", path));
  return std::shared_ptr<const TaskSet>(std::make_shared<VectorTaskSet>(std::move(name), std::move(tasks)));
}

std::shared_ptr<const TaskSet> generated_tasks(std::string env, std::size_t size,
                                               const std::function<void(Task&)>& fill) {
  std::vector<Task> tasks(size);
  for (std::size_t i = 0; i < size; ++i) {
    tasks[i].id = fmt::format("{}-{}", env, i);
    tasks[i].env = env;
    fill(tasks[i]);
  }
  return std::make_shared<VectorTaskSet>(std::move(env), std::move(tasks));
}

Result<SplitSources> split_eval(std::shared_ptr<const TaskSet> source, std::size_t eval_size, std::uint64_t seed) {
  if (!source) return make_error(ErrorCode::kInvalidArgument, "split_eval: no source");
  if (eval_size >= source->size())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("split_eval: eval_size {} must be smaller than the {} tasks of '{}'", eval_size,
                                  source->size(), source->name()));
  auto order = seeded_permutation(source->size(), seed ^ 0x6576616c73706c74ULL);
  std::vector<std::size_t> eval(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(eval_size));
  std::vector<std::size_t> train(order.begin() + static_cast<std::ptrdiff_t>(eval_size), order.end());
  // Keep each view in the source's order so a non-shuffled stream is predictable.
  std::sort(eval.begin(), eval.end());
  std::sort(train.begin(), train.end());
  SplitSources out;
  out.train = std::make_shared<IndexedView>(source->name(), source, std::move(train));
  out.eval = std::make_shared<IndexedView>(source->name(), source, std::move(eval));
  return out;
}

TaskStream::TaskStream(std::shared_ptr<const TaskSet> source, Options options)
    : source_(std::move(source)), options_(options) {
  build_order();
}

void TaskStream::build_order() {
  const std::size_t n = source_ ? source_->size() : 0;
  if (options_.shuffle) {
    order_ = seeded_permutation(n, options_.seed * 0x9e3779b97f4a7c15ULL + epoch_ + 1);
  } else {
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
  }
}

bool TaskStream::exhausted() const {
  if (!source_ || source_->size() == 0) return true;
  return options_.epochs && epoch_ >= *options_.epochs;
}

Result<Task> TaskStream::next() {
  if (exhausted())
    return make_error(ErrorCode::kNotFound, fmt::format("task stream '{}': all {} epochs served",
                                                        source_ ? source_->name() : "", options_.epochs.value_or(0)));
  Task t = source_->at(order_[index_]);
  ++served_;
  if (++index_ >= order_.size()) {
    index_ = 0;
    ++epoch_;
    build_order();
  }
  return t;
}

Json TaskStream::cursor() const {
  return {{"source", source_ ? source_->name() : ""},
          {"size", source_ ? source_->size() : 0},
          {"seed", options_.seed},
          {"shuffle", options_.shuffle},
          {"epoch", epoch_},
          {"index", index_},
          {"served", served_}};
}

Status TaskStream::restore(const Json& c) {
  try {
    if (!c.is_object()) return make_error(ErrorCode::kParse, "task cursor: expected a JSON object");
    const auto name = c.at("source").get<std::string>();
    const auto size = c.at("size").get<std::size_t>();
    const auto seed = c.at("seed").get<std::uint64_t>();
    const auto shuffle = c.at("shuffle").get<bool>();
    if (name != source_->name() || size != source_->size() || seed != options_.seed || shuffle != options_.shuffle)
      return make_error(
          ErrorCode::kMismatch,
          fmt::format("task cursor was saved for source '{}' ({} tasks, seed {}, shuffle {}) but this run "
                      "has '{}' ({} tasks, seed {}, shuffle {}); resume with the same dataset and seed",
                      name, size, seed, shuffle, source_->name(), source_->size(), options_.seed, options_.shuffle));
    const auto index = c.at("index").get<std::size_t>();
    if (index >= size) return make_error(ErrorCode::kParse, fmt::format("task cursor: index {} out of range", index));
    epoch_ = c.at("epoch").get<std::uint64_t>();
    served_ = c.at("served").get<std::uint64_t>();
    build_order();
    index_ = index;
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse, std::string("task cursor: ") + e.what());
  }
  return ok();
}

// The registered kinds: one function per kind (environments/<name>.cc), listed in
// environments/registry.inc.
const ExtensionRegistry<EnvironmentKind>& environment_kinds() {
  static const ExtensionRegistry<EnvironmentKind> kinds = {
#include "rollout/environments/registry.inc"
  };
  return kinds;
}

namespace {

// The kind named `kind` and `spec` with that kind's options checked and defaulted.
Result<std::pair<const EnvironmentKind*, EnvironmentSpec>> resolve_kind(std::string_view kind,
                                                                        const EnvironmentSpec& spec) {
  ARLO_ASSIGN_OR_RETURN(const EnvironmentKind* k, find_environment_kind(kind));
  const std::string who = fmt::format("environment '{}'", k->name);
  ARLO_ASSIGN_OR_RETURN(Json options, resolve_options(who, k->options, spec.options, {}));
  EnvironmentSpec resolved = spec;
  resolved.options = std::move(options);
  return std::pair{k, std::move(resolved)};
}

}  // namespace

Result<Json> resolve_environment_options(std::string_view kind, const Json& options) {
  EnvironmentSpec spec;
  spec.options = options;
  ARLO_ASSIGN_OR_RETURN(auto resolved, resolve_kind(kind, spec));
  return std::move(resolved.second.options);
}

Result<std::shared_ptr<const TaskSet>> make_task_source(std::string_view kind, const EnvironmentSpec& spec) {
  ARLO_ASSIGN_OR_RETURN(auto resolved, resolve_kind(kind, spec));
  return resolved.first->make(resolved.second);
}

Result<std::shared_ptr<MultiTurnEnvironment>> make_multi_turn_environment(std::string_view kind,
                                                                          const EnvironmentSpec& spec) {
  ARLO_ASSIGN_OR_RETURN(auto resolved, resolve_kind(kind, spec));
  if (!resolved.first->make_environment) return std::shared_ptr<MultiTurnEnvironment>();
  return resolved.first->make_environment(resolved.second);
}

}  // namespace arlo::rollout
