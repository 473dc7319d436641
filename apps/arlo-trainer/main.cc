// arlo-trainer: the built-in trainer (see trainer.h).
//
//   arlo-trainer --run-dir runs/x --weight-sync '{"transport": "filesystem", "dir": "runs/x/weights"}' --max-steps 100
//   arlo-trainer --run-dir runs/x --weight-sync '{"transport": "tcp", "address": "127.0.0.1:29500",
//   "expected_receivers": 2}'
//
// Logs loss, grad norm, mismatch KL, lr and step time per step (console and
// <run_dir>/trainer_metrics.jsonl). SIGINT/SIGTERM stop it after the current step.
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string_view>
#include <vector>

#include "apps/arlo-trainer/trainer.h"
#include "weight_sync/wire.h"
#include "common/log.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// Flags renamed to the names of the config keys they come from (trainer.is_*). The old spelling
// keeps working for one release: it sets the same option and is warned about, naming the new one.
struct RenamedFlag {
  std::string_view old_flag;
  std::string_view new_flag;
  std::string_view config_key;
};
// --tis-high and --mis-high were a bound per correction; the config has always given both
// trainer.is_high, and so does --is-high.
constexpr RenamedFlag kRenamedFlags[] = {
    {"--correction", "--is-correction", "trainer.is_correction"},
    {"--tis-high", "--is-high", "trainer.is_high"},
    {"--mis-low", "--is-low", "trainer.is_low"},
    {"--mis-high", "--is-high", "trainer.is_high"},
};

void add_renamed_flags(CLI::App& app, arlo::trainer::TrainerOptions& o) {
  app.add_option("--correction", o.is_correction, "deprecated: use --is-correction")->group("Deprecated");
  app.add_option("--tis-high", o.is_high, "deprecated: use --is-high")->group("Deprecated");
  app.add_option("--mis-low", o.is_low, "deprecated: use --is-low")->group("Deprecated");
  app.add_option("--mis-high", o.is_high, "deprecated: use --is-high")->group("Deprecated");
}

// The value given to a flag on the command line ("" when not given).
std::string given(const CLI::App& app, std::string_view flag) {
  const auto* opt = app.get_option(std::string(flag));
  return opt->count() > 0 ? opt->as<std::string>() : "";
}

// Two spellings of one flag with the same value: the same text, or the same number ("2", "2.0").
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}

// Spellings of one flag (its new one and its old ones: --is-high, --tis-high and --mis-high)
// given different values are refused: which one won would depend on CLI11's order, not the user's.
arlo::Status check_renamed_flags(const CLI::App& app) {
  for (const auto& r : kRenamedFlags) {
    const auto value = given(app, r.old_flag);
    if (value.empty()) continue;
    std::vector<std::string_view> others{r.new_flag};
    for (const auto& q : kRenamedFlags)
      if (q.new_flag == r.new_flag && q.old_flag != r.old_flag) others.push_back(q.old_flag);
    for (const auto other : others) {
      const auto other_value = given(app, other);
      if (!other_value.empty() && !same_value(value, other_value))
        return arlo::make_error(arlo::ErrorCode::kInvalidArgument,
                                fmt::format("{} {} and {} {} both set {} ({}): give {} once", r.old_flag, value, other,
                                            other_value, r.new_flag, r.config_key, r.new_flag));
    }
  }
  return arlo::ok();
}

// One warning per old spelling given, naming the flag to use instead.
void warn_renamed_flags(const CLI::App& app) {
  for (const auto& r : kRenamedFlags)
    if (!given(app, r.old_flag).empty())
      ARLO_WARN("{} is deprecated and goes in the next release: use {} (named as the config's {})", r.old_flag,
                r.new_flag, r.config_key);
}
}  // namespace

int main(int argc, char** argv) {
  arlo::trainer::TrainerOptions o;
  CLI::App app{"arlo-trainer: the built-in policy-gradient trainer"};
  std::string run_dir, ckpt_dir, log_level = "info";
  int batch_timeout_ms = 1000, idle_exit_ms = 0;
  app.add_option("--run-dir", run_dir, "run directory (batches arrive under rollouts/)")->required();
  app.add_option("--bridge", o.bridge_transport, "batch transport: dir | socket");
  app.add_option("--bridge-host", o.bridge_host,
                 "socket bridge: the orchestrator's IP address or host name (resolved on every connection attempt)");
  app.add_option("--bridge-port", o.bridge_port);
  app.add_option("--rank", o.rank);
  for (const auto& shape : arlo::reference::kModelShapeFields)
    app.add_option(std::string("--") + shape.name, o.model.*shape.field);
  app.add_option("--seed", o.seed, "initialisation seed of v0");
  app.add_option("--threads", o.threads, "libtorch/OpenMP threads");
  app.add_option("--lr", o.lr);
  app.add_option("--sft-lr", o.sft_lr, "learning rate on batches with ce_weights (0: --lr)");
  app.add_option("--warmup-steps", o.warmup_steps);
  app.add_option("--beta1", o.beta1);
  app.add_option("--beta2", o.beta2);
  app.add_option("--weight-decay", o.weight_decay);
  app.add_option("--max-grad-norm", o.max_grad_norm);
  app.add_option("--is-correction", o.is_correction,
                 "importance-sampling correction (trainer.is_correction): none | token_tis | seq_tis | token_mis");
  app.add_option("--is-low", o.is_low, "lower importance-ratio bound, token_mis (trainer.is_low)");
  app.add_option("--is-high", o.is_high,
                 "upper importance-ratio bound: the cap, or the top of token_mis's band (trainer.is_high)");
  add_renamed_flags(app, o);
  app.add_option("--ce-coef", o.ce_coef);
  app.add_option("--temperature", o.temperature, "sampling temperature of the rollouts");
  app.add_option("--max-steps", o.max_steps, "stop after this step (0 = run until stopped)");
  app.add_option("--batch-timeout-ms", batch_timeout_ms);
  app.add_option("--idle-exit-ms", idle_exit_ms, "exit after this long without a batch (0 = never)");
  app.add_option("--checkpoint-every", o.checkpoint_every);
  app.add_option("--checkpoint-dir", ckpt_dir);
  std::string weight_sync_block;
  app.add_option("--weight-sync", weight_sync_block,
                 "the weight-sync block, JSON (docs/weight-sync.md), e.g. "
                 "'{\"transport\": \"filesystem\", \"dir\": \"runs/x/weights\"}'")
      ->required();
  app.add_option("--log-level", log_level);
  CLI11_PARSE(app, argc, argv);
  if (auto st = check_renamed_flags(app); !st) {
    std::cerr << "arlo-trainer: " << st.error().what() << "\n";
    return 2;
  }

  arlo::log::Options log_options;
  log_options.level = log_level;
  log_options.name = "trainer";
  if (auto st = arlo::log::init(log_options); !st) {
    std::cerr << "arlo-trainer: " << st.error().what() << "\n";
    return 2;
  }
  warn_renamed_flags(app);
  o.run_dir = run_dir;
  o.checkpoint_dir = ckpt_dir;
  auto block = nlohmann::json::parse(weight_sync_block, nullptr, false);
  auto ws = block.is_discarded()
                ? arlo::Result<arlo::weight_sync::Options>(arlo::make_error(
                      arlo::ErrorCode::kParse, "--weight-sync is not valid JSON: " + weight_sync_block))
                : arlo::weight_sync::options_from_json(block);
  if (!ws) {
    std::cerr << "arlo-trainer: --weight-sync: " << ws.error().what() << "\n";
    return 2;
  }
  o.weight_sync = *ws;
  o.batch_timeout = std::chrono::milliseconds(batch_timeout_ms);
  o.idle_exit = std::chrono::milliseconds(idle_exit_ms);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto last = arlo::trainer::run_trainer(o, g_stop);
  if (!last) {
    std::cerr << "arlo-trainer: " << last.error().what() << "\n";
    return 1;
  }
  ARLO_INFO("stopped after step {}", *last);
  return 0;
}
