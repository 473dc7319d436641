// arlo-trainer: the built-in trainer (see trainer.h).
//
//   arlo-trainer --run-dir runs/x --weight-sync '{"transport": "filesystem", "dir": "runs/x/weights"}' --max-steps 100
//   arlo-trainer --run-dir runs/x --weight-sync '{"transport": "tcp", "address": "127.0.0.1:29500", "expected_receivers": 2}' 
//
// Logs loss, grad norm, mismatch KL, lr and step time per step (console and
// <run_dir>/trainer_metrics.jsonl). SIGINT/SIGTERM stop it after the current step.
#include <CLI/CLI.hpp>

#include <csignal>
#include <iostream>

#include "apps/arlo-trainer/trainer.h"
#include "weight_sync/wire.h"
#include "common/log.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  arlo::trainer::TrainerOptions o;
  CLI::App app{"arlo-trainer: the built-in policy-gradient trainer"};
  std::string run_dir, ckpt_dir, log_level = "info";
  int batch_timeout_ms = 1000, idle_exit_ms = 0;
  app.add_option("--run-dir", run_dir, "run directory (batches arrive under rollouts/)")->required();
  app.add_option("--bridge", o.bridge_transport, "batch transport: dir | socket");
  app.add_option("--bridge-host", o.bridge_host, "socket bridge: the orchestrator's IP address or host name (resolved on every connection attempt)");
  app.add_option("--bridge-port", o.bridge_port);
  app.add_option("--rank", o.rank);
  app.add_option("--layers", o.model.layers);
  app.add_option("--hidden", o.model.hidden);
  app.add_option("--heads", o.model.heads);
  app.add_option("--intermediate", o.model.intermediate);
  app.add_option("--context", o.model.context);
  app.add_option("--seed", o.seed, "initialisation seed of v0");
  app.add_option("--threads", o.threads, "libtorch/OpenMP threads");
  app.add_option("--lr", o.lr);
  app.add_option("--sft-lr", o.sft_lr, "learning rate on batches with ce_weights (0: --lr)");
  app.add_option("--warmup-steps", o.warmup_steps);
  app.add_option("--beta1", o.beta1);
  app.add_option("--beta2", o.beta2);
  app.add_option("--weight-decay", o.weight_decay);
  app.add_option("--max-grad-norm", o.max_grad_norm);
  app.add_option("--correction", o.correction, "none | token_tis | seq_tis | token_mis");
  app.add_option("--tis-high", o.tis_high);
  app.add_option("--mis-low", o.mis_low);
  app.add_option("--mis-high", o.mis_high);
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

  arlo::log::Options log_options;
  log_options.level = log_level;
  log_options.name = "trainer";
  if (auto st = arlo::log::init(log_options); !st) {
    std::cerr << "arlo-trainer: " << st.error().what() << "\n";
    return 2;
  }
  o.run_dir = run_dir;
  o.checkpoint_dir = ckpt_dir;
  auto block = nlohmann::json::parse(weight_sync_block, nullptr, false);
  auto ws = block.is_discarded() ? arlo::Result<arlo::weight_sync::Options>(arlo::make_error(
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
