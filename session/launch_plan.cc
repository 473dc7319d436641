#include "session/launch_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "session/children.h"
#include "session/server_support.h"
#include "common/auth.h"
#include "common/log.h"
#include "session/adapters/collective_session.h"
#include "weight_sync/transport.h"
#include "weight_sync/wire.h"

namespace arlo::session {

namespace {

std::string payload_name(const config::Config& cfg) {
  const auto& p = cfg.string("weight_sync.payload");
  if (p == "cast") return cfg.string("weight_sync.cast_dtype") == "bf16" ? "bf16" : "fp8";
  return p;
}

void append(std::vector<std::string>& to, const std::vector<std::string>& more) {
  to.insert(to.end(), more.begin(), more.end());
}

std::string num(double v) { return fmt::format("{}", v); }

// The config numbers arlo-trainer takes as flags, each flag named as its key (flag_of).
constexpr std::string_view kTrainerNumberKeys[] = {"trainer.lr",     "trainer.sft_lr",  "trainer.weight_decay",
                                                   "trainer.beta1",  "trainer.beta2",   "trainer.max_grad_norm",
                                                   "trainer.is_low", "trainer.is_high", "sampling.temperature"};

// An arlo-trainer flag from the config key it comes from: trainer.sft_lr -> --sft-lr.
std::string flag_of(std::string_view key) {
  std::string flag = "--" + std::string(key.substr(key.find('.') + 1));
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// The host of a base URL ("http://10.0.0.5:8000" -> "10.0.0.5", "http://[::1]:80" -> "::1").
std::string url_host(std::string url) {
  if (const auto scheme = url.find("://"); scheme != std::string::npos) url.erase(0, scheme + 3);
  if (const auto path = url.find('/'); path != std::string::npos) url.erase(path);
  if (const auto at = url.rfind('@'); at != std::string::npos) url.erase(0, at + 1);
  return auth::host_of(url);
}

}  // namespace

ChainRole chain_role(std::size_t worker, const std::vector<bool>& receiving, bool retry) {
  ChainRole role;
  const bool receives = worker < receiving.size() && receiving[worker];
  for (std::size_t j = worker + 1; receives && j < receiving.size(); ++j)
    if (receiving[j]) {
      role.relays = true;
      break;
    }
  if (!receives || retry) return role;
  for (std::size_t j = worker; j-- > 0;)
    if (receiving[j]) {
      role.upstream = j;
      break;
    }
  return role;
}

rollout::WeightUpdate WeightSyncPlan::describe(std::size_t worker, std::int64_t version,
                                               const rollout::ServerCapabilities& server,
                                               const nlohmann::json& announced, std::optional<ChainRole> role) const {
  rollout::WeightUpdate u;
  u.version = version;
  if (collective) {
    if (!announced.empty()) collective->announce(announced);
    u.collective = collective;
    return u;
  }
  const std::string transport = block.value("transport", std::string());
  nlohmann::json endpoint = block;  // no announcement: the planned block names the endpoint
  if (!announced.empty()) {
    auto a = weight_sync::parse_announcement(announced);
    if (a)
      endpoint = a->endpoint;
    else
      ARLO_WARN("arlo run: the trainer's announcement of v{}: {}; using the planned endpoint", version,
                a.error().what());
  }
  ChainRole part;
  if (chain && worker < relays.size()) {
    part = role ? *role : chain_role(worker, std::vector<bool>(relays.size(), true), false);
    if (part.upstream && *part.upstream < relays.size()) endpoint = relays[*part.upstream].second;
  }
  auto d = weight_sync::find_transport(transport);
  nlohmann::json receiver = {{"transport", transport}, {"timeout_ms", block.value("timeout_ms", 120000)}};
  for (const auto& [k, v] : endpoint.items())
    if (d && (*d)->option(k)) receiver[k] = v;  // the endpoint's own keys only
  if (chain && worker < relays.size()) {
    receiver["relay"] = part.relays;
    if (part.relays)
      for (const auto& [k, v] : relays[worker].first.items()) receiver[k] = v;
  }
  u.weight_sync = receiver;
  // Such servers (vLLM, SGLang) load a version from its directory of Hugging Face-compatible shards.
  if (server.takes_model_path && d && (*d)->version_path) u.extra["model_path"] = (*d)->version_path(endpoint, version);
  return u;
}

nlohmann::json WeightSyncPlan::trainer_block(int num_workers) const {
  nlohmann::json b = block;
  b["expected_receivers"] = chain ? 1 : num_workers;
  return b;
}

namespace {

// weight_sync.* -> the block: the shared keys, then the chosen transport's config keys.
Result<nlohmann::json> block_from_config(const config::Config& cfg, const weight_sync::TransportDescriptor& d) {
  nlohmann::json b = {{"transport", d.name},
                      {"payload", payload_name(cfg)},
                      {"zstd", cfg.boolean("weight_sync.zstd")},
                      {"bucket_mb", cfg.integer("weight_sync.bucket_mb")},
                      {"delta_density_threshold", cfg.number("weight_sync.delta_density_threshold")},
                      {"keep_last", cfg.integer("weight_sync.keep_last")},
                      {"timeout_ms", static_cast<std::int64_t>(cfg.number("weight_sync.timeout_s") * 1000.0)},
                      {"gather_window_ms", cfg.integer("weight_sync.gather_window_ms")}};
  for (const auto& o : d.options) {
    if (!o.config_key) continue;
    nlohmann::json v = config::option_value(cfg, "weight_sync." + o.key, o.type);
    if (o.path && v.is_string() && v != "")  // a path: the same for every process
      v = std::filesystem::absolute(v.get<std::string>()).string();
    b[o.key] = std::move(v);
  }
  if (auto checked = weight_sync::options_from_json(b); !checked)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync ({}): {}", cfg.where("weight_sync.transport"), checked.error().what()));
  return b;
}

}  // namespace

namespace {

// weight_sync.* -> the plan's block, weights directory, topology and (for a collective transport)
// the session every update joins; fails for a chain over a transport that does not relay.
Result<WeightSyncPlan> plan_weight_sync(const config::Config& cfg, const std::string& run_dir,
                                        const weight_sync::TransportDescriptor& d) {
  WeightSyncPlan ws;
  const std::string dir = cfg.string("weight_sync.dir");
  ws.weights_dir =
      std::filesystem::absolute(dir.empty() ? std::filesystem::path(run_dir) / "weights" : std::filesystem::path(dir))
          .string();
  ARLO_ASSIGN_OR_RETURN(ws.block, block_from_config(cfg, d));
  ws.chain = cfg.string("weight_sync.topology") == "chain";
  if (ws.chain && !d.capabilities.relays)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync.topology chain ({}): the {} transport does not relay; use star or a "
                                  "transport that relays",
                                  cfg.where("weight_sync.topology"), d.name));
  const bool embedded = cfg.string("inference.launch") == "embedded";
  if (d.capabilities.collective) {
    adapters::CollectiveSessionOptions o;
    o.expected = embedded ? static_cast<std::size_t>(cfg.integer("inference.num_workers"))
                          : cfg.strings("inference.urls").size();
    ARLO_ASSIGN_OR_RETURN(const auto* dialect, rollout::find_admin_dialect(cfg.string("inference.kind")));
    o.flavor = rollout::to_string(dialect->completions);  // the family whose rendezvous its servers expect
    o.timeout = std::chrono::milliseconds(ws.block["timeout_ms"].get<std::int64_t>());
    ws.collective = adapters::TrainerCollective::create(o);
  }
  return ws;
}

// External workers (inference.urls): named worker-<i> on their URLs; in a chain, worker k relays on
// weight_sync.relay_port + k of its URL's host. Refuses a trainer's publisher that only this host
// can reach when a worker is elsewhere.
Status plan_external_workers(const config::Config& cfg, const weight_sync::TransportDescriptor& d, LaunchPlan& plan) {
  auto& ws = plan.weight_sync;
  const auto& urls = cfg.strings("inference.urls");
  // A trainer this run starts publishes with the block: workers elsewhere must reach it.
  if (cfg.string("trainer.launch") != "external" && d.local_only) {
    for (const auto& u : urls) {
      const std::string host = url_host(u);
      if (auth::is_loopback(host)) continue;
      if (const std::string why = d.local_only(ws.block); !why.empty())
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("weight_sync ({}): the trainer's publisher would be reachable from this host "
                                      "only, but inference.urls names a worker on {}: {}",
                                      cfg.where("weight_sync.transport"), host, why));
      break;
    }
  }
  const auto relay_port = cfg.integer("weight_sync.relay_port");
  if (ws.chain && relay_port == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync.topology chain ({}) with external workers needs weight_sync.relay_port: "
                                  "worker k of inference.urls relays to the next on port relay_port + k of its URL's "
                                  "host (e.g. --set weight_sync.relay_port=29600)",
                                  cfg.where("weight_sync.topology")));
  for (std::size_t i = 0; i < urls.size(); ++i) {
    std::string url = urls[i];
    while (!url.empty() && url.back() == '/') url.pop_back();
    plan.workers.emplace_back(fmt::format("worker-{}", i), url);
    if (!ws.chain) continue;
    const auto port = relay_port + static_cast<std::int64_t>(i);
    if (port > 65535)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("weight_sync.relay_port {} ({}): worker {} would relay on port {}, past 65535",
                                    relay_port, cfg.where("weight_sync.relay_port"), i, port));
    ws.relays.push_back(d.relay_at(url_host(url), static_cast<std::uint16_t>(port)));
  }
  return ok();
}

// The servers arlo starts (inference.launch embedded): server i is child <prefix>-i on a free
// loopback port, reached at http://127.0.0.1:<port>, with inference.threads; `make(i, port, spec)`
// gives it its command line (and the rest of its environment).
template <typename Make>
Status plan_embedded(const config::Config& cfg, const std::string& prefix, LaunchPlan& plan, Make make) {
  const auto threads = std::to_string(cfg.integer("inference.threads"));
  for (std::int64_t i = 0; i < cfg.integer("inference.num_workers"); ++i) {
    ARLO_ASSIGN_OR_RETURN(auto port, free_loopback_port());
    ChildSpec spec;
    spec.name = fmt::format("{}-{}", prefix, i);
    spec.env = {{"OMP_NUM_THREADS", threads}, {"MKL_NUM_THREADS", threads}};
    ARLO_TRY(make(i, port, spec));
    plan.workers.emplace_back(spec.name, fmt::format("http://127.0.0.1:{}", port));
    plan.worker_specs.push_back(std::move(spec));
  }
  return ok();
}

// Embedded workers: one arlo-worker child each (and, in a chain, a free relay port), seeded alike,
// with its own receiver block; a restart drops --init-seed.
Status plan_embedded_workers(const config::Config& cfg, const weight_sync::TransportDescriptor& d, LaunchPlan& plan) {
  auto& ws = plan.weight_sync;
  const auto n = cfg.integer("inference.num_workers");
  const auto threads = std::to_string(cfg.integer("inference.threads"));
  return plan_embedded(cfg, "worker", plan, [&](std::int64_t i, std::uint16_t port, ChildSpec& spec) -> Status {
    spec.argv = {find_binary("arlo-worker"),
                 "--bind",
                 "127.0.0.1",
                 "--port",
                 std::to_string(port),
                 "--init-seed",
                 std::to_string(cfg.integer("model.seed")),
                 "--seed",
                 std::to_string(cfg.integer("run.seed") * 1000 + i),
                 "--threads",
                 threads,
                 "--max-batch",
                 std::to_string(std::max<std::int64_t>(64, cfg.integer("orchestrator.max_inflight"))),
                 "--log-level",
                 cfg.string("log.level")};
    append(spec.argv, model_flags(cfg));
    nlohmann::json own = {{"transport", d.name}, {"peer_name", spec.name}, {"timeout_ms", ws.block["timeout_ms"]}};
    if (ws.chain && i + 1 < n) {  // relays to the next worker
      ARLO_ASSIGN_OR_RETURN(auto relay_port, free_loopback_port());
      auto relay = d.relay_at("127.0.0.1", relay_port);
      own["relay"] = true;
      for (const auto& [k, v] : relay.first.items()) own[k] = v;
      ws.relays.push_back(std::move(relay));
    } else if (ws.chain) {
      ws.relays.emplace_back(nlohmann::json::object(), nlohmann::json::object());  // the end: relays to nobody
    }
    for (const auto& o : d.options)  // a durable transport's directory: the one this worker may load from
      if (o.path && ws.block.contains(o.key) && ws.block[o.key] != "") own[o.key] = ws.block[o.key];
    append(spec.argv, {"--weight-sync", own.dump()});
    // A restarted worker starts with no weights (the seeded v0 is stale by then): it serves nothing
    // until the WeightWatcher syncs the current version to it.
    spec.restart_argv = spec.argv;
    const auto seed_flag = std::find(spec.restart_argv.begin(), spec.restart_argv.end(), "--init-seed");
    spec.restart_argv.erase(seed_flag, seed_flag + 2);
    return ok();
  });
}

// Embedded vLLM: one `vllm serve` (its OpenAI server module, from the project's Python) per worker,
// loading inference.model (else trainer.model), with arlo's weight-transfer backend and the
// dev-mode admin routes arlo's vllm dialect drives. A restart loads the model from disk again; the
// WeightWatcher then syncs the current version to it.
Status plan_embedded_vllm(const config::Config& cfg, LaunchPlan& plan) {
  const std::string model =
      cfg.string("inference.model").empty() ? cfg.string("trainer.model") : cfg.string("inference.model");
  return plan_embedded(cfg, "vllm", plan, [&](std::int64_t i, std::uint16_t port, ChildSpec& spec) -> Status {
    spec.argv = {project_python(""),
                 "-m",
                 "vllm.entrypoints.openai.api_server",
                 "--model",
                 model,
                 "--served-model-name",
                 std::filesystem::path(model).filename().string(),
                 "--host",
                 "127.0.0.1",
                 "--port",
                 std::to_string(port),
                 "--seed",
                 std::to_string(cfg.integer("run.seed") * 1000 + i),
                 "--weight-transfer-config",
                 R"({"backend": "arlo"})"};
    append(spec.argv, cfg.strings("inference.server_args"));
    spec.env.insert({{"VLLM_SERVER_DEV_MODE", "1"},
                     {"HF_HUB_OFFLINE", "1"},
                     {"VLLM_NO_USAGE_STATS", "1"},
                     {"DO_NOT_TRACK", "1"},
                     {"VLLM_CPU_KVCACHE_SPACE", "1"},
                     {"VLLM_CPU_OMP_THREADS_BIND", "nobind"}});
    spec.restart_argv = spec.argv;
    return ok();
  });
}

}  // namespace

Result<LaunchPlan> plan_launch(const config::Config& cfg, const std::string& run_dir) {
  ARLO_TRY(check_inference_support(cfg));
  ARLO_ASSIGN_OR_RETURN(const auto* d, weight_sync::find_transport(cfg.string("weight_sync.transport")));
  LaunchPlan plan;
  ARLO_ASSIGN_OR_RETURN(plan.weight_sync, plan_weight_sync(cfg, run_dir, *d));
  if (cfg.string("inference.launch") == "embedded" && cfg.string("inference.kind") == "vllm") {
    ARLO_TRY(plan_embedded_vllm(cfg, plan));
  } else if (cfg.string("inference.launch") == "embedded") {
    ARLO_TRY(plan_embedded_workers(cfg, *d, plan));
  } else {
    ARLO_TRY(plan_external_workers(cfg, *d, plan));
  }
  return plan;
}

std::string project_python(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("ARLO_PYTHON"); env && *env) return env;
  return ARLO_DEFAULT_PYTHON;
}

std::int64_t trainer_ckpt_interval(const config::Config& cfg) {
  const auto own = cfg.integer("trainer.ckpt_interval");
  return own > 0 ? own : cfg.integer("ckpt.interval");
}

ChildSpec trainer_spec(const config::Config& cfg, const std::string& run_dir, const WeightSyncPlan& ws, int num_workers,
                       std::uint16_t bridge_port) {
  ChildSpec spec;
  spec.name = "trainer";
  const auto threads = std::to_string(cfg.integer("trainer.threads"));
  spec.argv = {find_binary("arlo-trainer"), "--run-dir", run_dir, "--threads", threads};
  append(spec.argv, {"--bridge", cfg.string("bridge.transport"), "--log-level", cfg.string("log.level")});
  append(spec.argv, {"--checkpoint-every", std::to_string(trainer_ckpt_interval(cfg)), "--weight-sync",
                     ws.trainer_block(num_workers).dump()});
  if (cfg.string("bridge.transport") == "socket")
    append(spec.argv, {"--bridge-host", "127.0.0.1", "--bridge-port", std::to_string(bridge_port)});
  append(spec.argv, trainer_settings_flags(cfg));
  spec.env = {{"OMP_NUM_THREADS", threads}, {"MKL_NUM_THREADS", threads}};
  return spec;
}

std::vector<std::string> model_flags(const config::Config& cfg) {
  return {"--layers",  std::to_string(cfg.integer("model.layers")),
          "--hidden",  std::to_string(cfg.integer("model.hidden")),
          "--heads",   std::to_string(cfg.integer("model.heads")),
          "--context", std::to_string(cfg.integer("model.context"))};
}

std::vector<std::string> trainer_settings_flags(const config::Config& cfg) {
  std::vector<std::string> flags = {"--seed", std::to_string(cfg.integer("model.seed")),
                                    flag_of("trainer.is_correction"), cfg.string("trainer.is_correction")};
  for (const auto key : kTrainerNumberKeys) append(flags, {flag_of(key), num(cfg.number(key))});
  append(flags, model_flags(cfg));
  return flags;
}

Result<std::string> run_token(const config::Config& cfg, const std::string& run_dir) {
  auto token = auth::resolve_token(cfg.string("security.token"), cfg.string("security.token_file"));
  if (!token) return std::unexpected(Error(token.error()).with_context(cfg.where("security.token_file")));
  // A generated token reaches only the parts this run starts: with external workers or an external
  // trainer there is none unless one is configured (they are then reachable on loopback only).
  const bool all_started_here =
      cfg.string("inference.launch") == "embedded" && cfg.string("trainer.launch") != "external";
  if (token->empty() && !all_started_here) return token;
  if (token->empty()) {
    ARLO_ASSIGN_OR_RETURN(*token, auth::generate_token());
    // For whoever reaches a plane by hand (curl on the status server): <run_dir>/token, owner-only.
    const auto path = std::filesystem::path(run_dir) / "token";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const std::string line = *token + "\n";
    if (fd < 0 || ::fchmod(fd, 0600) != 0 ||
        ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      if (fd >= 0) ::close(fd);
      return make_error(ErrorCode::kIo,
                        fmt::format("writing the run's token to {}: {}", path.string(), std::strerror(errno)));
    }
    ::close(fd);
  }
  // Every child inherits it (never in argv, where ps shows it).
  if (::setenv(std::string(auth::kTokenEnv).c_str(), token->c_str(), 1) != 0)
    return make_error(ErrorCode::kInternal, fmt::format("setenv {}: {}", auth::kTokenEnv, std::strerror(errno)));
  return token;
}

}  // namespace arlo::session
