#include "session/trainer_command.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

namespace arlo::session {

namespace {

// Where a trainer on this machine reaches the socket bridge: its bind address, loopback for a
// wildcard one.
std::string bridge_address(const config::Config& cfg, std::uint16_t port) {
  const auto& address = cfg.string("bridge.address");
  std::string host = address.substr(0, address.rfind(':'));
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  return fmt::format("{}:{}", host, port);
}

// trainer.launch hf: the reference trainer's command line from trainer.*.
std::vector<std::string> hf_trainer_argv(const config::Config& cfg, const std::string& run_dir) {
  const auto& correction = cfg.string("trainer.is_correction");
  std::vector<std::string> argv = {project_python(cfg.string("trainer.python")),
                                   ARLO_HF_TRAINER_SCRIPT,
                                   "--model",
                                   cfg.string("trainer.model"),
                                   "--correction",
                                   correction == "seq_tis" ? "sequence_tis" : correction,
                                   "--seed",
                                   std::to_string(cfg.integer("model.seed")),
                                   "--warmup-steps",
                                   std::to_string(cfg.integer("trainer.warmup_steps")),
                                   "--max-tokens-per-micro-batch",
                                   std::to_string(cfg.integer("trainer.max_tokens_per_micro_batch"))};
  for (const auto* key : {"lr", "sft_lr", "weight_decay", "max_grad_norm", "is_low", "is_high"}) {
    std::string flag = fmt::format("--{}", key);
    std::replace(flag.begin() + 2, flag.end(), '_', '-');
    argv.insert(argv.end(), {flag, fmt::format("{}", cfg.number(fmt::format("trainer.{}", key)))});
  }
  // One line per trained step, as the built-in trainer writes (rank 0 writes it).
  argv.insert(argv.end(), {"--metrics", (std::filesystem::path(run_dir) / "trainer_metrics.jsonl").string()});
  // Checkpointed before each step's ack, so a restarted rank trains no step twice and skips none.
  if (trainer_ckpt_interval(cfg) > 0)
    argv.insert(argv.end(), {"--checkpoint-dir", (std::filesystem::path(run_dir) / "trainer").string()});
  return argv;
}

}  // namespace

Result<std::vector<ChildSpec>> command_trainer_specs(const config::Config& cfg, const std::string& run_dir,
                                                     const WeightSyncPlan& ws, int num_workers,
                                                     std::uint16_t bridge_port) {
  const auto& transport = cfg.string("bridge.transport");
  const nlohmann::json model = {{"layers", cfg.integer("model.layers")},
                                {"hidden", cfg.integer("model.hidden")},
                                {"heads", cfg.integer("model.heads")},
                                {"context", cfg.integer("model.context")},
                                {"seed", cfg.integer("model.seed")}};
  const auto threads = std::to_string(cfg.integer("trainer.threads"));
  const auto num_ranks = cfg.integer("trainer.num_ranks");
  ARLO_ASSIGN_OR_RETURN(const auto master_port, free_loopback_port());  // the ranks' torch.distributed store
  std::vector<ChildSpec> specs;
  for (std::int64_t rank = 0; rank < num_ranks; ++rank) {
    ChildSpec spec;
    spec.name = num_ranks == 1 ? "trainer" : fmt::format("trainer-{}", rank);
    spec.argv = cfg.string("trainer.launch") == "hf" ? hf_trainer_argv(cfg, run_dir) : cfg.strings("trainer.command");
    spec.env = {{"ARLO_RUN_DIR", run_dir},
                {"ARLO_BRIDGE_TRANSPORT", transport},
                {"ARLO_BRIDGE_ADDRESS", transport == "socket" ? bridge_address(cfg, bridge_port) : std::string()},
                {"ARLO_WEIGHT_SYNC", ws.trainer_block(num_workers).dump()},
                {"ARLO_MODEL", model.dump()},
                {"ARLO_RANK", std::to_string(rank)},
                {"ARLO_NUM_RANKS", std::to_string(num_ranks)},
                {"RANK", std::to_string(rank)},
                {"LOCAL_RANK", std::to_string(rank)},
                {"WORLD_SIZE", std::to_string(num_ranks)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(master_port)},
                {"OMP_NUM_THREADS", threads},
                {"MKL_NUM_THREADS", threads}};
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace arlo::session
