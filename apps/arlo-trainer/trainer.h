#pragma once
// arlo-trainer's training loop (torch-free header): reads batches through trainer_bridge, applies
// the policy-gradient loss with AdamW, publishes every version through weight_sync, tells the
// orchestrator each version exists, and checkpoints so it can resume.
//
// Versions (docs/architecture.md, "Versions and staleness"): v0 is published at start (or v<s> when resuming at step
// s); after training on the batch of step s, version s is published. Versions go through weight_sync's StagingPublisher
// (weight_sync/staging.h): the next step only waits for the staging copy of the weights; the publisher announces each
// version (with the step's metrics) and serves it to the workers when the orchestrator tells them to pull it.
//
// Checkpoints: <checkpoint_dir>/step_<s>/{model.safetensors, optimizer.safetensors, state.json}
// and <checkpoint_dir>/latest holding "<s>" (written last, atomically). On start the latest
// checkpoint is loaded and steps up to it are acknowledged without training (exactly once).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "common/result.h"
#include "reference/model_config.h"
#include "weight_sync/weight_sync.h"

namespace arlo::trainer {

struct TrainerOptions {
  std::filesystem::path run_dir;
  std::string bridge_transport = "dir";  // dir | socket
  std::string bridge_host = "127.0.0.1";
  std::uint16_t bridge_port = 0;
  int rank = 0;

  reference::ModelConfig model;
  std::uint64_t seed = 0;  // initialisation seed (v0)
  int threads = 1;

  double lr = 3e-3;
  double sft_lr = 0.0;   // on supervised batches (those with ce_weights); 0: lr
  int warmup_steps = 0;  // linear warm-up of the learning rate
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.0, max_grad_norm = 1.0;
  // The importance-sampling correction and its bounds, named as the config's trainer.is_correction,
  // trainer.is_low and trainer.is_high (reference/loss.h).
  std::string is_correction = "token_tis";  // none | token_tis | seq_tis | token_mis
  double is_low = 0.5, is_high = 2.0, ce_coef = 1.0, temperature = 1.0;

  std::int64_t max_steps = 0;                     // stop after this step (0 = run until stopped)
  std::chrono::milliseconds batch_timeout{1000};  // one wait for a batch (then wait again)
  std::chrono::milliseconds idle_exit{0};         // exit after this long without a batch (0 = never)
  int checkpoint_every = 0;                       // steps between checkpoints (0 = none)
  std::filesystem::path checkpoint_dir;           // default <run_dir>/checkpoints/trainer

  weight_sync::Options weight_sync;  // the weight-sync block (--weight-sync)
};

// Runs until max_steps, idle_exit, or `stop` becomes true. Returns the last step trained.
Result<std::int64_t> run_trainer(const TrainerOptions& options, const std::atomic<bool>& stop);

}  // namespace arlo::trainer
