#include "apps/arlo/run_launch.h"

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "apps/arlo/run_children.h"

namespace arlo::cli {

namespace {

std::string payload_name(const config::Config& cfg) {
  const auto& p = cfg.string("weight_sync.payload");
  if (p == "cast") return cfg.string("weight_sync.cast_dtype") == "bf16" ? "bf16" : "fp8";
  return p;
}

std::vector<std::string> model_flags(const config::Config& cfg) {
  return {"--layers", std::to_string(cfg.integer("model.layers")), "--hidden", std::to_string(cfg.integer("model.hidden")),
          "--heads", std::to_string(cfg.integer("model.heads")), "--context", std::to_string(cfg.integer("model.context"))};
}

std::vector<std::string> ws_flags(const WeightSyncPlan& ws) {
  std::vector<std::string> f = {"--ws-transport", ws.transport, "--ws-timeout-ms", std::to_string(ws.timeout_ms)};
  if (ws.transport == "tcp") f.insert(f.end(), {"--ws-address", ws.address});
  if (ws.transport == "shm") f.insert(f.end(), {"--ws-shm-name", ws.shm_name});
  if (ws.transport == "filesystem") f.insert(f.end(), {"--ws-dir", ws.dir});
  return f;
}

void append(std::vector<std::string>& to, const std::vector<std::string>& more) { to.insert(to.end(), more.begin(), more.end()); }

std::string num(double v) { return fmt::format("{}", v); }

}  // namespace

rollout::WeightUpdate WeightSyncPlan::describe(std::int64_t version, rollout::AdminDialect dialect,
                                              const nlohmann::json& announced) const {
  auto pick = [&](const char* key, const std::string& planned) {
    auto it = announced.find(key);
    return it != announced.end() && it->is_string() && !it->get<std::string>().empty() ? it->get<std::string>() : planned;
  };
  const std::string weights_dir = pick("dir", dir);
  rollout::WeightUpdate u;
  u.version = version;
  u.transport = transport;
  if (dialect == rollout::AdminDialect::kArlo) {
    if (transport == "tcp") u.extra["address"] = pick("address", address);
    if (transport == "shm") u.extra["shm_name"] = pick("shm_name", shm_name);
    if (transport == "filesystem") u.extra["dir"] = weights_dir;
    u.extra["payload"] = pick("payload", payload);
    u.extra["timeout_ms"] = timeout_ms;
  } else if (transport == "filesystem") {
    // vLLM and SGLang load a version from its directory of Hugging Face-compatible shards.
    u.extra["model_path"] = fmt::format("{}/v{}", weights_dir, version);
  }
  return u;
}

nlohmann::json WeightSyncPlan::trainer_block(int num_workers) const {
  nlohmann::json b = {{"transport", transport}, {"payload", payload}, {"timeout_ms", timeout_ms}};
  if (transport == "tcp") b["address"] = address;
  if (transport == "shm") b["shm_name"] = shm_name;
  if (transport == "filesystem") b["dir"] = dir;
  if (transport == "tcp" || transport == "shm") b["expected_receivers"] = num_workers;
  return b;
}

Result<LaunchPlan> plan_launch(const config::Config& cfg, const std::string& run_dir) {
  LaunchPlan plan;
  auto& ws = plan.weight_sync;
  ws.transport = cfg.string("weight_sync.transport");
  ws.payload = payload_name(cfg);
  ws.timeout_ms = static_cast<std::int64_t>(cfg.number("weight_sync.timeout_s") * 1000.0);
  std::string dir = cfg.string("weight_sync.dir");
  ws.dir = std::filesystem::absolute(dir.empty() ? std::filesystem::path(run_dir) / "weights" : std::filesystem::path(dir)).string();
  ws.shm_name = fmt::format("arlo-weights-{}", ::getpid());
  const bool embedded = cfg.string("inference.launch") == "embedded";
  if (ws.transport == "tcp") {
    ARLO_ASSIGN_OR_RETURN(auto port, orch::free_loopback_port());
    ws.address = fmt::format("127.0.0.1:{}", port);
  }
  if (embedded && ws.transport == "tcp" && cfg.string("weight_sync.topology") == "chain")
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync.topology chain ({}): embedded arlo-workers do not relay to each other "
                                  "yet; use star (the trainer serves every worker)",
                                  cfg.where("weight_sync.topology")));
  if (embedded && ws.transport == "nccl")
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync.transport nccl ({}): arlo-worker receives over tcp, shm or filesystem; "
                                  "choose one of those for an embedded run",
                                  cfg.where("weight_sync.transport")));
  if (!embedded) {
    const auto& urls = cfg.strings("inference.urls");
    for (std::size_t i = 0; i < urls.size(); ++i) {
      std::string url = urls[i];
      while (!url.empty() && url.back() == '/') url.pop_back();
      plan.workers.emplace_back(fmt::format("worker-{}", i), url);
    }
    return plan;
  }
  const auto n = cfg.integer("inference.num_workers");
  const auto threads = std::to_string(cfg.integer("inference.threads"));
  for (std::int64_t i = 0; i < n; ++i) {
    ARLO_ASSIGN_OR_RETURN(auto port, orch::free_loopback_port());
    orch::ChildSpec spec;
    spec.name = fmt::format("worker-{}", i);
    spec.argv = {find_binary("arlo-worker"), "--bind", "127.0.0.1", "--port", std::to_string(port),
                 "--init-seed", std::to_string(cfg.integer("model.seed")), "--seed",
                 std::to_string(cfg.integer("run.seed") * 1000 + i), "--threads", threads, "--max-batch",
                 std::to_string(std::max<std::int64_t>(64, cfg.integer("orchestrator.max_inflight"))),
                 "--log-level", cfg.string("log.level")};
    append(spec.argv, model_flags(cfg));
    append(spec.argv, ws_flags(ws));
    spec.env = {{"OMP_NUM_THREADS", threads}, {"MKL_NUM_THREADS", threads}};
    plan.workers.emplace_back(spec.name, fmt::format("http://127.0.0.1:{}", port));
    plan.worker_specs.push_back(std::move(spec));
  }
  return plan;
}

// The trainer checkpoints with the orchestrator unless told otherwise: a resume needs both.
std::int64_t trainer_ckpt_interval(const config::Config& cfg) {
  const auto own = cfg.integer("trainer.ckpt_interval");
  return own > 0 ? own : cfg.integer("ckpt.interval");
}

orch::ChildSpec trainer_spec(const config::Config& cfg, const std::string& run_dir, const WeightSyncPlan& ws, int num_workers,
                             std::uint16_t bridge_port) {
  orch::ChildSpec spec;
  spec.name = "trainer";
  const auto threads = std::to_string(cfg.integer("trainer.threads"));
  spec.argv = {find_binary("arlo-trainer"), "--run-dir", run_dir, "--bridge", cfg.string("bridge.transport"),
               "--seed", std::to_string(cfg.integer("model.seed")), "--threads", threads,
               "--lr", num(cfg.number("trainer.lr")), "--sft-lr", num(cfg.number("trainer.sft_lr")),
               "--weight-decay", num(cfg.number("trainer.weight_decay")),
               "--beta1", num(cfg.number("trainer.beta1")), "--beta2", num(cfg.number("trainer.beta2")),
               "--max-grad-norm", num(cfg.number("trainer.max_grad_norm")),
               "--correction", cfg.string("trainer.is_correction"), "--tis-high", num(cfg.number("trainer.is_high")),
               "--mis-low", num(cfg.number("trainer.is_low")), "--mis-high", num(cfg.number("trainer.is_high")),
               "--temperature", num(cfg.number("sampling.temperature")),
               "--checkpoint-every", std::to_string(trainer_ckpt_interval(cfg)),
               "--ws-payload", ws.payload, "--ws-zstd", cfg.boolean("weight_sync.zstd") ? "true" : "false",
               "--ws-bucket-mb", std::to_string(cfg.integer("weight_sync.bucket_mb")),
               "--ws-delta-threshold", num(cfg.number("weight_sync.delta_density_threshold")),
               "--ws-keep-last", std::to_string(cfg.integer("weight_sync.keep_last")),
               "--log-level", cfg.string("log.level")};
  if (cfg.string("bridge.transport") == "socket")
    append(spec.argv, {"--bridge-host", "127.0.0.1", "--bridge-port", std::to_string(bridge_port)});
  append(spec.argv, model_flags(cfg));
  append(spec.argv, ws_flags(ws));
  // tcp star and shm: every worker joins every version the orchestrator moves.
  if (ws.transport == "tcp" || ws.transport == "shm")
    append(spec.argv, {"--ws-receivers", std::to_string(num_workers)});
  spec.env = {{"OMP_NUM_THREADS", threads}, {"MKL_NUM_THREADS", threads}};
  return spec;
}

}  // namespace arlo::cli
