// arlo-worker: serves the built-in policy over HTTP (see worker_server.h for the routes).
//
//   arlo-worker --port 0 --init-seed 1            # v0 from a seeded initialisation (as arlo-trainer's v0)
//   arlo-worker --weights run/weights/v3/model.safetensors --weights-version 3
//   arlo-worker --config worker.yaml --port 8001  # flags override the YAML file
//
// Prints "listening on <bind>:<port>" on stdout once it accepts connections, so a parent process
// that passed --port 0 can read the port. SIGINT/SIGTERM stop it.
//
// YAML keys are the long flag names without dashes, '-' or '_' alike:
//   port: 0
//   bind: 127.0.0.1
//   model: {layers: 2, hidden: 64, heads: 4, intermediate: 256, context: 64}
//   threads: 1
//   weight_sync: {transport: tcp, address: "127.0.0.1:29500", shm_name: arlo-weights, dir: run/weights}
//   allow_weights_from: [/shared/weights, trainer-host]   # where /weights/prepare may point
//   token_file: /etc/arlo/token
//
// Token (common/auth.h): $ARLO_TOKEN, else the file of --token-file (or $ARLO_TOKEN_FILE). With one,
// every route but /health wants "Authorization: Bearer <token>"; binding a non-loopback address
// without one is refused.
#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "apps/arlo-worker/worker_server.h"
#include "common/auth.h"
#include "weight_sync/wire.h"
#include "common/log.h"
#include "reference/model.h"

namespace {

struct Flags {
  std::string config;
  std::string bind = "127.0.0.1";
  int port = 8000;
  std::string model_name = "arlo-policy";
  arlo::reference::ModelConfig model;
  int threads = 1;
  int max_batch = 64;
  std::uint64_t seed = 0;
  std::optional<std::uint64_t> init_seed;
  std::string weights;
  std::int64_t weights_version = 0;
  std::string weight_sync = "{}";  // this worker's weight-sync block (JSON)
  std::string log_level = "info";
  std::vector<std::string> allow_weights_from;
  std::string token_file;
};

// Applies a YAML file to the flags (before the command line, which wins).
arlo::Status apply_yaml(const std::string& path, Flags& f) {
  try {
    YAML::Node root = YAML::LoadFile(path);
    auto get = [&](const YAML::Node& n, const char* key, auto& out) {
      if (n && n[key]) out = n[key].as<std::decay_t<decltype(out)>>();
    };
    get(root, "bind", f.bind);
    get(root, "port", f.port);
    get(root, "model_name", f.model_name);
    get(root, "threads", f.threads);
    get(root, "max_batch", f.max_batch);
    get(root, "seed", f.seed);
    if (root["init_seed"]) f.init_seed = root["init_seed"].as<std::uint64_t>();
    get(root, "weights", f.weights);
    get(root, "weights_version", f.weights_version);
    get(root, "log_level", f.log_level);
    if (auto m = root["model"])
      for (const auto& shape : arlo::reference::kModelShapeFields) get(m, shape.name, f.model.*shape.field);
    get(root, "weight_sync", f.weight_sync);
    get(root, "allow_weights_from", f.allow_weights_from);
    get(root, "token_file", f.token_file);
  } catch (const std::exception& e) {
    return arlo::make_error(arlo::ErrorCode::kParse, "reading " + path + ": " + e.what());
  }
  return arlo::ok();
}

// The command line over the YAML file of --config (read first, so that flags override it). Returns
// the exit status when the program ends here: --help, a bad flag, a file that cannot be read.
std::optional<int> parse_flags(int argc, char** argv, Flags& f) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--config") f.config = argv[i + 1];
  if (!f.config.empty()) {
    if (auto st = apply_yaml(f.config, f); !st) {
      std::cerr << "arlo-worker: " << st.error().what() << "\n";
      return 2;
    }
  }
  CLI::App app{"arlo-worker: the built-in policy behind an OpenAI-compatible server"};
  std::int64_t init_seed_flag = -1;
  app.add_option("--config", f.config, "YAML file with the same keys as the flags");
  app.add_option("--bind", f.bind, "address to listen on");
  app.add_option("--port", f.port, "port to listen on (0 = any free port)");
  app.add_option("--model-name", f.model_name, "name reported in responses and /v1/models");
  for (const auto& shape : arlo::reference::kModelShapeFields)
    app.add_option(std::string("--") + shape.name, f.model.*shape.field);
  app.add_option("--threads", f.threads, "libtorch/OpenMP threads");
  app.add_option("--max-batch", f.max_batch, "most requests decoded together");
  app.add_option("--seed", f.seed, "seed of the sampling streams of requests without a seed");
  app.add_option("--init-seed", init_seed_flag, "serve v0 from a seeded initialisation (same as arlo-trainer's)");
  app.add_option("--weights", f.weights, "serve weights from this safetensors file");
  app.add_option("--weights-version", f.weights_version, "version of --weights");
  app.add_option("--weight-sync", f.weight_sync,
                 "this worker's weight-sync block, JSON (docs/weight-sync.md): timeouts, and in a chain "
                 "{\"transport\": \"tcp\", \"relay\": true, ...}; each /weights/prepare block goes over it");
  app.add_option("--allow-weights-from", f.allow_weights_from,
                 "a directory (absolute) or host[:port] that /weights/prepare may load from (repeatable; "
                 "without hosts: loopback only; without directories: only the dir of --weight-sync)");
  app.add_option("--token-file", f.token_file, "file holding the token (else $ARLO_TOKEN, $ARLO_TOKEN_FILE)");
  app.add_option("--log-level", f.log_level);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (init_seed_flag >= 0) f.init_seed = static_cast<std::uint64_t>(init_seed_flag);
  return std::nullopt;
}

// The worker's options from the flags: the model, the engine, this worker's weight-sync block and
// where /weights/prepare may load from. A block that is not a weight-sync block, or an
// --allow-weights-from entry that is neither an absolute directory nor host[:port], is refused.
arlo::Result<arlo::worker::WorkerOptions> worker_options(const Flags& f) {
  arlo::worker::WorkerOptions wo;
  wo.model_name = f.model_name;
  wo.model = f.model;
  wo.engine.max_batch = f.max_batch;
  wo.engine.threads = f.threads;
  wo.engine.seed = f.seed;
  const auto block = nlohmann::json::parse(f.weight_sync, nullptr, false);
  auto ws = block.is_discarded() ? arlo::Result<arlo::weight_sync::Options>(
                                       arlo::make_error(arlo::ErrorCode::kParse, "not valid JSON: " + f.weight_sync))
                                 : arlo::weight_sync::options_from_json(block);
  if (!ws) return std::unexpected(std::move(ws).error().with_context("--weight-sync"));
  wo.weight_sync = *ws;
  wo.own_block = block.is_object() ? block : nlohmann::json::object();
  wo.allow_weights_from = f.allow_weights_from;
  for (const auto& entry : wo.allow_weights_from) {
    if (entry.empty() || (entry.front() != '/' && entry.find('/') != std::string::npos))
      return arlo::make_error(arlo::ErrorCode::kInvalidArgument,
                              "--allow-weights-from '" + entry + "': give an absolute directory or host[:port]");
  }
  return wo;
}

// The token of the HTTP plane ("" for none). One read from --token-file is put in the environment
// too: the weight receiver and a chain relay take it from there (auth::process_token), or a tcp
// publisher would refuse this worker.
arlo::Result<std::string> worker_token(const Flags& f) {
  ARLO_ASSIGN_OR_RETURN(auto token, arlo::auth::resolve_token("", f.token_file));
  if (!token.empty() && ::setenv(std::string(arlo::auth::kTokenEnv).c_str(), token.c_str(), 1) != 0)
    return arlo::make_error(arlo::ErrorCode::kInternal, "setenv " + std::string(arlo::auth::kTokenEnv) + " failed");
  return token;
}

// The weights served before the first update: those of --weights (as --weights-version), a seeded
// initialisation (--init-seed, v0, as arlo-trainer's), or none until /weights/commit.
arlo::Status install_initial_weights(arlo::worker::WorkerServer& server, const Flags& f) {
  std::shared_ptr<arlo::reference::Model> initial;
  std::int64_t initial_version = 0;
  if (!f.weights.empty()) {
    ARLO_ASSIGN_OR_RETURN(initial, arlo::reference::Model::load(f.weights, f.model));
    if (!(initial->config() == f.model))
      return arlo::make_error(arlo::ErrorCode::kMismatch,
                              f.weights + " holds a model of another shape than the flags ask for");
    initial_version = f.weights_version;
  } else if (f.init_seed) {
    ARLO_ASSIGN_OR_RETURN(initial, arlo::reference::Model::init(f.model, *f.init_seed));
  }
  if (!initial) {
    ARLO_INFO("no weights yet: serving after the first /weights/prepare + /weights/commit");
    return arlo::ok();
  }
  ARLO_TRY(server.install(initial, initial_version));
  ARLO_INFO("serving v{} from {}", initial_version, f.weights.empty() ? "a seeded initialisation" : f.weights);
  return arlo::ok();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (auto exit_status = parse_flags(argc, argv, f)) return *exit_status;
  auto fail = [](const arlo::Error& e) {
    std::cerr << "arlo-worker: " << e.what() << "\n";
    return 2;
  };
  arlo::log::Options log_options;
  log_options.level = f.log_level;
  log_options.name = "worker";
  if (auto st = arlo::log::init(log_options); !st) return fail(st.error());
  f.model.vocab_size = 104;
  if (auto st = f.model.validate(); !st) return fail(st.error());
  arlo::reference::set_torch_threads(f.threads);
  auto wo = worker_options(f);
  if (!wo) return fail(wo.error());
  auto token = worker_token(f);
  if (!token) return fail(token.error());

  boost::asio::io_context io;
  arlo::http::ServerOptions ho;
  ho.bind = f.bind;
  ho.port = static_cast<std::uint16_t>(f.port);
  ho.server_name = "arlo-worker";
  ho.token = *token;
  arlo::worker::WorkerServer server(io, ho, *wo);
  if (auto st = install_initial_weights(server, f); !st) return fail(st.error());

  auto port = server.start();
  if (!port) {
    std::cerr << "arlo-worker: " << port.error().what() << "\n";
    return 1;
  }
  std::printf("listening on %s:%u\n", f.bind.c_str(), static_cast<unsigned>(*port));
  std::fflush(stdout);

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    ARLO_INFO("stopping");
    server.close();
    io.stop();
  });
  io.run();
  return 0;
}
