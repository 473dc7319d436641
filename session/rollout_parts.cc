#include "session/rollout_parts.h"

#include <fmt/format.h>

#include "reference/tokenizer.h"
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

Result<std::shared_ptr<rollout::RewardModule>> make_reward(const config::Config& cfg) {
  std::vector<rollout::WeightedPart> parts;
  const auto& modules = cfg.objects("reward.modules");
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
      return std::unexpected(
          Error(module.error()).with_context(fmt::format("reward.modules[{}] ({})", i, m.where("kind"))));
    parts.push_back({std::move(*module), m.number("weight")});
  }
  // Always the weighted sum, even of one module: it reports each module's reward as "<module>".
  return std::shared_ptr<rollout::RewardModule>(rollout::make_weighted("reward", std::move(parts)));
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

RunTasks::RunTasks(std::shared_ptr<rollout::TaskStream> stream, bool tokenize)
    : inner_(std::move(stream)), tokenize_(tokenize) {}

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
  auto source = make_source(cfg, env_kind, static_cast<std::uint64_t>(cfg.integer("env.seed")),
                            static_cast<std::size_t>(cfg.integer("env.size")), cfg.string("env.path"));
  if (!source)
    return std::unexpected(Error(source.error()).with_context(fmt::format("env ({})", cfg.where("env.kind"))));
  rollout::TaskStream::Options so;
  so.seed = static_cast<std::uint64_t>(cfg.integer("env.seed"));
  so.shuffle = cfg.boolean("env.shuffle");
  parts.stream = std::make_shared<rollout::TaskStream>(*source, so);
  parts.tokenize = uses_builtin_tokenizer(cfg);
  if (auto st = add_environment(cfg, env_kind, cfg.string("env.path"), parts.environments); !st)
    return std::unexpected(Error(st.error()).with_context(fmt::format("env ({})", cfg.where("env.kind"))));
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

  if (cfg.integer("eval.interval") > 0) {
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
  ARLO_ASSIGN_OR_RETURN(parts.reward, make_reward(cfg));
  return parts;
}

Result<std::shared_ptr<rollout::RewardModule>> build_reward(const config::Config& cfg) { return make_reward(cfg); }

}  // namespace arlo::session
