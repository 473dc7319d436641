#include "session/rollout_parts.h"

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "reference/tokenizer.h"
#include "session/config_options.h"
#include "rollout/admin.h"
#include "rollout/environment.h"

namespace arlo::session {

namespace {

// Environment kind `kind`'s own options, read from its env.* keys (the options it declares as config
// keys; make_task_source gives the others their defaults). Eval uses the same keys.
nlohmann::json environment_options(const config::Config& cfg, const rollout::EnvironmentKind& kind) {
  nlohmann::json options = nlohmann::json::object();
  for (const auto& o : kind.options) {
    const std::string key = "env." + o.key;
    if (o.config_key && cfg.has(key)) options[o.key] = config::option_value(cfg, key, o.type);
  }
  return options;
}

// A task source of the registered environment kind `kind` (env.kind, or eval.env_kind), built by
// its registry entry (rollout/environments/).
Result<std::shared_ptr<const rollout::TaskSet>> make_source(const config::Config& cfg, const std::string& kind,
                                                            std::uint64_t seed, std::size_t size,
                                                            const std::string& path) {
  ARLO_ASSIGN_OR_RETURN(const rollout::EnvironmentKind* k, rollout::find_environment_kind(kind));
  rollout::EnvironmentSpec spec;
  spec.seed = seed;
  spec.size = size;
  spec.path = path;
  spec.options = environment_options(cfg, *k);
  return rollout::make_task_source(k->name, spec);
}

// Adds kind `kind`'s multi-turn environment (nullptr for a single-turn kind) to `out` under its
// name, and under "" for the tasks of a dataset kind (their env is what each line says).
Status add_environment(const config::Config& cfg, const std::string& kind, const std::string& path,
                       std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>>& out) {
  ARLO_ASSIGN_OR_RETURN(const rollout::EnvironmentKind* k, rollout::find_environment_kind(kind));
  rollout::EnvironmentSpec spec;
  spec.path = path;
  spec.options = environment_options(cfg, *k);
  ARLO_ASSIGN_OR_RETURN(auto env, rollout::make_multi_turn_environment(k->name, spec));
  if (k->needs_path && !out.contains("")) out[""] = env;
  out[k->name] = std::move(env);
  return ok();
}

// The weighted sum of the reward modules `modules` (reward.modules, or an env.sources item's reward,
// named `list` in errors).
Result<std::shared_ptr<rollout::RewardModule>> make_weighted_modules(const config::Config& cfg,
                                                                     const std::vector<config::Config>& modules,
                                                                     const std::string& list) {
  std::vector<rollout::WeightedPart> parts;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const auto& m = modules[i];
    nlohmann::json spec = {{"kind", m.string("kind")},
                           {"path", m.string("path")},
                           {"url", m.string("url")},
                           {"pattern", m.string("pattern")}};
    if (!m.map("config").empty()) spec["config"] = m.map("config");
    if (m.string("kind") == "plugin") {  // where it runs; a call past reward.timeout_s kills its host
      spec["isolate"] = m.string("isolate");
      spec["timeout_s"] = cfg.number("reward.timeout_s");
    }
    auto module = rollout::make_reward_module(spec);
    if (!module)
      return std::unexpected(Error(module.error()).with_context(fmt::format("{}[{}] ({})", list, i, m.where("kind"))));
    parts.push_back({std::move(*module), m.number("weight")});
  }
  // Always the weighted sum, even of one module: it reports each module's reward as "<module>".
  return std::shared_ptr<rollout::RewardModule>(rollout::make_weighted("reward", std::move(parts)));
}

Result<std::shared_ptr<rollout::RewardModule>> make_reward(const config::Config& cfg) {
  return make_weighted_modules(cfg, cfg.objects("reward.modules"), "reward.modules");
}

// With env.sources: scores each task with its source's module, found by the task's env name (the
// mix names tasks by source): the source's own reward modules, else reward.modules. Each score gets
// the metrics source/<name>/share (1) and source/<name>/reward (the reward): averaged over a step's
// samples they are the share of the step's samples from that source and its rewards' sum over the
// step's sample count (its mean reward is reward / share). Thread-safe as its modules are.
class SourceRewards final : public rollout::RewardModule {
 public:
  SourceRewards(std::shared_ptr<rollout::RewardModule> fallback,
                std::map<std::string, std::shared_ptr<rollout::RewardModule>> by_source)
      : fallback_(std::move(fallback)), by_source_(std::move(by_source)) {}
  const std::string& name() const override { return fallback_->name(); }
  Result<rollout::Score> score(const Task& task, const rollout::Rollout& rollout) override {
    auto s = module(task).score(task, rollout);
    if (s) tag(task, *s);
    return s;
  }
  bool scores_groups() const override {
    if (fallback_->scores_groups()) return true;
    for (const auto& [_, m] : by_source_)
      if (m->scores_groups()) return true;
    return false;
  }
  Result<std::vector<rollout::Score>> score_group(const Task& task, std::span<const rollout::Rollout> group) override {
    auto scores = module(task).score_group(task, group);
    if (scores)
      for (auto& s : *scores) tag(task, s);
    return scores;
  }
  Status usable() const override {
    ARLO_TRY(fallback_->usable());
    for (const auto& [_, m] : by_source_) ARLO_TRY(m->usable());
    return ok();
  }

 private:
  rollout::RewardModule& module(const Task& task) const {
    auto own = by_source_.find(task.env);
    return own != by_source_.end() ? *own->second : *fallback_;
  }
  static void tag(const Task& task, rollout::Score& s) {
    s.metrics["source/" + task.env + "/share"] = 1.0;
    s.metrics["source/" + task.env + "/reward"] = s.reward;
  }

  std::shared_ptr<rollout::RewardModule> fallback_;
  std::map<std::string, std::shared_ptr<rollout::RewardModule>> by_source_;
};

// The run's reward module: reward.modules, routed per source with env.sources.
Result<std::shared_ptr<rollout::RewardModule>> make_run_reward(const config::Config& cfg) {
  ARLO_ASSIGN_OR_RETURN(auto fallback, make_reward(cfg));
  const auto& items = cfg.objects("env.sources");
  if (items.empty()) return fallback;
  std::map<std::string, std::shared_ptr<rollout::RewardModule>> by_source;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].objects("reward").empty()) continue;
    ARLO_ASSIGN_OR_RETURN(
        by_source[source_name(items[i])],
        make_weighted_modules(cfg, items[i].objects("reward"), fmt::format("env.sources[{}].reward", i)));
  }
  return std::shared_ptr<rollout::RewardModule>(
      std::make_shared<SourceRewards>(std::move(fallback), std::move(by_source)));
}

// The tasks of env.sources item `i`, generated or read with `seed` and `size`.
Result<std::shared_ptr<const rollout::TaskSet>> source_tasks(const config::Config& item, std::size_t i,
                                                             std::uint64_t seed, std::size_t size) {
  rollout::EnvironmentSpec spec;
  spec.seed = seed;
  spec.size = size;
  spec.path = item.string("path");
  spec.options = item.map("options");
  auto tasks = rollout::make_task_source(item.string("kind"), spec);
  if (!tasks)
    return std::unexpected(
        Error(tasks.error()).with_context(fmt::format("env.sources[{}] ({})", i, item.where("kind"))));
  return tasks;
}

// The training tasks: env.kind's stream alone, or the mix of env.sources.
Result<std::shared_ptr<rollout::TaskMix>> training_tasks(const config::Config& cfg) {
  rollout::TaskStream::Options so;
  so.shuffle = cfg.boolean("env.shuffle");
  const auto& items = cfg.objects("env.sources");
  if (items.empty()) {
    so.seed = static_cast<std::uint64_t>(cfg.integer("env.seed"));
    auto source = make_source(cfg, cfg.string("env.kind"), so.seed, static_cast<std::size_t>(cfg.integer("env.size")),
                              cfg.string("env.path"));
    if (!source)
      return std::unexpected(Error(source.error()).with_context(fmt::format("env ({})", cfg.where("env.kind"))));
    return std::make_shared<rollout::TaskMix>(std::make_shared<rollout::TaskStream>(*source, so));
  }
  std::vector<rollout::TaskMix::Source> sources;
  for (std::size_t i = 0; i < items.size(); ++i) {
    so.seed = static_cast<std::uint64_t>(items[i].integer("seed"));
    ARLO_ASSIGN_OR_RETURN(auto tasks,
                          source_tasks(items[i], i, so.seed, static_cast<std::size_t>(items[i].integer("size"))));
    sources.push_back(
        {source_name(items[i]), std::make_shared<rollout::TaskStream>(tasks, so), items[i].number("ratio")});
  }
  auto mix = rollout::TaskMix::make(std::move(sources));
  if (!mix)
    return std::unexpected(Error(mix.error()).with_context(fmt::format("env.sources ({})", cfg.where("env.sources"))));
  return mix;
}

// With env.sources: each source's multi-turn environment (nullptr for a single-turn kind) under its
// name, which its tasks carry as their env, made with the source's own options.
Status add_source_environments(const config::Config& cfg, RolloutParts& parts) {
  const auto& items = cfg.objects("env.sources");
  for (std::size_t i = 0; i < items.size(); ++i) {
    rollout::EnvironmentSpec spec;
    spec.path = items[i].string("path");
    spec.options = items[i].map("options");
    auto env = rollout::make_multi_turn_environment(items[i].string("kind"), spec);
    if (!env)
      return std::unexpected(
          Error(env.error()).with_context(fmt::format("env.sources[{}] ({})", i, items[i].where("kind"))));
    parts.environments[source_name(items[i])] = std::move(*env);
  }
  return ok();
}

// With env.sources and eval.env_kind same: eval.size tasks of each source (eval.seed), named by source.
Status add_source_eval_tasks(const config::Config& cfg, RolloutParts& parts) {
  const auto& items = cfg.objects("env.sources");
  const auto size = static_cast<std::size_t>(cfg.integer("eval.size"));
  const RunTasks preparer(parts.stream, parts.tokenize);
  for (std::size_t i = 0; i < items.size(); ++i) {
    ARLO_ASSIGN_OR_RETURN(auto tasks,
                          source_tasks(items[i], i, static_cast<std::uint64_t>(cfg.integer("eval.seed")), size));
    for (std::size_t k = 0; k < std::min(size, tasks->size()); ++k) {
      arlo::Task t = tasks->at(k);
      t.env = source_name(items[i]);
      parts.eval_tasks.push_back(preparer.prepare(std::move(t)));
    }
  }
  return ok();
}

}  // namespace

void tokenize_task(arlo::Task& task) {
  if (!task.messages.empty()) return;
  static const reference::Tokenizer tokenizer;
  task.prompt_tokens = tokenizer.encode_prompt(task.prompt_text());
  task.answer_tokens.clear();
  if (!task.answer.empty()) {
    task.answer_tokens = tokenizer.encode(task.answer);
    task.answer_tokens.push_back(reference::Tokenizer::kEos);
  }
}

bool uses_builtin_tokenizer(const config::Config& cfg) {
  auto dialect = rollout::find_admin_dialect(cfg.string("inference.kind"));
  return dialect && (*dialect)->server.builtin_tokenizer;
}

RunTasks::RunTasks(std::shared_ptr<rollout::TaskMix> mix, bool tokenize)
    : inner_(std::move(mix)), tokenize_(tokenize) {}

Result<arlo::Task> RunTasks::next() {
  ARLO_ASSIGN_OR_RETURN(auto task, inner_.next());
  if (tokenize_) tokenize_task(task);
  return task;
}

arlo::Task RunTasks::prepare(arlo::Task t) const {
  if (tokenize_) tokenize_task(t);
  return t;
}

Result<RolloutParts> build_rollout_parts(const config::Config& cfg) {
  RolloutParts parts;
  const auto env_kind = cfg.string("env.kind");
  ARLO_ASSIGN_OR_RETURN(parts.stream, training_tasks(cfg));
  parts.tokenize = uses_builtin_tokenizer(cfg);
  if (auto st = add_environment(cfg, env_kind, cfg.string("env.path"), parts.environments); !st)
    return std::unexpected(Error(st.error()).with_context(fmt::format("env ({})", cfg.where("env.kind"))));
  ARLO_TRY(add_source_environments(cfg, parts));
  // The warm-up trains on reference answers as token ids: arlo has them only in the built-in
  // tokenizer's vocabulary, which is not a vLLM or SGLang model's.
  if (!parts.tokenize && cfg.integer("orchestrator.sft_warmup_steps") > 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("orchestrator.sft_warmup_steps is {} ({}), but the supervised warm-up needs the "
                                  "reference answers as token ids, which arlo has only for arlo-worker; with "
                                  "inference.kind {} set orchestrator.sft_warmup_steps: 0 (warm the model up before "
                                  "serving it)",
                                  cfg.integer("orchestrator.sft_warmup_steps"),
                                  cfg.where("orchestrator.sft_warmup_steps"), cfg.string("inference.kind")));

  const bool source_eval = !cfg.objects("env.sources").empty() && cfg.string("eval.env_kind") == "same";
  if (cfg.integer("eval.interval") > 0 && source_eval) ARLO_TRY(add_source_eval_tasks(cfg, parts));
  if (cfg.integer("eval.interval") > 0 && !source_eval) {
    const auto eval_kind = cfg.string("eval.env_kind") == "same" ? env_kind : cfg.string("eval.env_kind");
    const auto eval_path = cfg.string("eval.env_kind") == "same" ? cfg.string("env.path") : cfg.string("eval.env_path");
    const auto size = static_cast<std::size_t>(cfg.integer("eval.size"));
    auto eval_source =
        make_source(cfg, eval_kind, static_cast<std::uint64_t>(cfg.integer("eval.seed")), size, eval_path);
    if (!eval_source)
      return std::unexpected(
          Error(eval_source.error()).with_context(fmt::format("eval ({})", cfg.where("eval.env_kind"))));
    if (auto st = add_environment(cfg, eval_kind, eval_path, parts.environments); !st)
      return std::unexpected(Error(st.error()).with_context(fmt::format("eval ({})", cfg.where("eval.env_kind"))));
    const RunTasks preparer(parts.stream, parts.tokenize);
    const auto n = std::min(size, (*eval_source)->size());
    for (std::size_t i = 0; i < n; ++i) parts.eval_tasks.push_back(preparer.prepare((*eval_source)->at(i)));
  }
  ARLO_ASSIGN_OR_RETURN(parts.reward, make_run_reward(cfg));
  return parts;
}

Result<std::shared_ptr<rollout::RewardModule>> build_reward(const config::Config& cfg) { return make_run_reward(cfg); }

}  // namespace arlo::session
