#include "session/config_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace arlo::session {

namespace {
orch::Duration seconds(double s) {
  return std::chrono::duration_cast<orch::Duration>(std::chrono::duration<double>(s));
}
}  // namespace

std::string source_name(const config::Config& item) {
  return item.string("name").empty() ? item.string("kind") : item.string("name");
}

Result<orch::Options> options_from_config(const config::Config& cfg) {
  orch::Options o;
  o.batch_size = static_cast<int>(cfg.integer("orchestrator.batch_size"));
  o.group_size = static_cast<int>(cfg.integer("orchestrator.group_size"));
  o.max_inflight = static_cast<int>(cfg.integer("orchestrator.max_inflight"));
  o.max_async_level = static_cast<int>(cfg.integer("orchestrator.max_async_level"));
  o.max_off_policy_steps = static_cast<int>(cfg.integer("orchestrator.max_off_policy_steps"));
  o.sft_warmup_steps = static_cast<int>(cfg.integer("orchestrator.sft_warmup_steps"));
  o.max_steps = cfg.integer("run.max_steps");
  o.queue_capacity = static_cast<int>(cfg.integer("orchestrator.queue_capacity"));
  o.filter_equal_reward_groups = cfg.boolean("orchestrator.filter_equal_reward_groups");
  o.max_filtered_groups_per_step = static_cast<int>(cfg.integer("orchestrator.max_filtered_groups_per_step"));
  if (auto mode = parse_pause_mode(cfg.string("orchestrator.weight_update_mode"))) o.update_mode = *mode;
  o.seed = static_cast<std::uint64_t>(cfg.integer("run.seed")) * 1000003u +
           static_cast<std::uint64_t>(cfg.integer("sampling.seed"));

  o.sampling.temperature = cfg.number("sampling.temperature");
  o.sampling.top_p = cfg.number("sampling.top_p");
  o.sampling.max_tokens = cfg.integer("sampling.max_tokens");
  o.sampling.stop = cfg.strings("sampling.stop");
  for (const auto& source : cfg.objects("env.sources")) {  // their sampling overrides (checked by the schema)
    const auto& over = source.map("sampling");
    if (!over.is_object() || over.empty()) continue;
    SamplingParams sp = o.sampling;
    sp.temperature = over.value("temperature", sp.temperature);
    sp.top_p = over.value("top_p", sp.top_p);
    sp.max_tokens = over.value("max_tokens", sp.max_tokens);
    sp.stop = over.value("stop", sp.stop);
    o.source_sampling[source_name(source)] = std::move(sp);
  }

  o.max_turns = static_cast<int>(cfg.integer("env.max_turns"));
  o.max_trajectory_tokens = cfg.integer("env.max_trajectory_tokens");
  o.env_timeout = seconds(cfg.number("env.step_timeout_s"));

  o.request_timeout = seconds(cfg.number("inference.request_timeout_s"));
  o.trainer_timeout = seconds(cfg.number("trainer.accept_timeout_s"));
  o.trainer_alarm = seconds(cfg.number("trainer.alarm_s"));
  o.trainer_silence_timeout = seconds(cfg.number("trainer.silence_timeout_s"));
  o.admin_timeout = seconds(cfg.number("inference.admin_timeout_s"));
  // A whole version move must fit in weight_sync.timeout_s; an update call carries it.
  o.admin_timeout = std::max(o.admin_timeout, seconds(cfg.number("weight_sync.timeout_s")));
  o.final_sync_timeout = seconds(cfg.number("weight_sync.timeout_s")) * 2;
  o.pause_all_first = cfg.string("weight_sync.topology") == "chain";  // who relays is known before any pulls

  const auto interval = cfg.integer("eval.interval");
  o.eval_interval = static_cast<int>(interval);
  o.eval_at_start = interval > 0;
  o.eval_at_end = interval > 0;
  o.eval_samples = static_cast<int>(cfg.integer("eval.k"));
  o.eval_pass_k.clear();
  for (const auto& k : cfg.strings("eval.pass_k"))
    o.eval_pass_k.push_back(std::atoi(k.c_str()));  // checked by the schema
  if (o.eval_pass_k.empty()) {
    o.eval_pass_k = {1};
    if (o.eval_samples > 1) o.eval_pass_k.push_back(o.eval_samples);
  }
  o.eval_correct_threshold = cfg.number("eval.correct_threshold");
  o.eval_sampling = o.sampling;
  o.eval_sampling.temperature = cfg.number("eval.temperature");

  o.log_interval_s = cfg.number("log.interval_s");
  o.progress = cfg.boolean("log.progress");
  o.step_line_interval_s = cfg.number("log.step_interval_s");
  o.rollouts_every = static_cast<int>(cfg.integer("log.rollouts_every"));
  o.run_name = cfg.string("run.name");
  o.run_dir = cfg.string("run.dir");
  o.ckpt_interval = static_cast<int>(cfg.integer("ckpt.interval"));
  o.status_bind = cfg.string("status.bind");
  o.status_port = static_cast<int>(cfg.integer("status.port"));
  o.status_linger = seconds(cfg.number("status.linger_s"));

  if (auto st = o.validate(); !st) {
    return std::unexpected(
        Error(st.error()).with_context(fmt::format("configuration ({})", cfg.where("orchestrator.batch_size"))));
  }
  return o;
}

}  // namespace arlo::session
