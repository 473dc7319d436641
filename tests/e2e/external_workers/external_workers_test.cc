// External arlo-workers under `arlo run` (inference.launch: external), started by the test as a
// user would, from another seed than the trainer's model: arlo waits until they answer /health
// (they start only after arlo said it waits), gives them the trainer's v0 before any rollout, and
// the run ends with every worker serving the trainer's final weights (its checksum).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tests/e2e/spawn.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(ExternalWorkersE2E, AreHealthWaitedGivenV0AndEndOnTheFinalVersion) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string config = std::string(src) + "/configs/quickstart.yaml";
  auto resolved = arlo::config::resolve_file(config, {});
  ASSERT_TRUE(resolved.config.has_value());
  const auto& cfg = *resolved.config;
  const fs::path run_dir = fs::temp_directory_path() / ("arlo-e2e-external-" + std::to_string(::getpid()));
  fs::remove_all(run_dir);
  fs::create_directories(run_dir.parent_path());
  const int ports[2] = {arlo::e2e::free_loopback_port(), arlo::e2e::free_loopback_port()};
  const std::string urls =
      "[\"http://127.0.0.1:" + std::to_string(ports[0]) + "\", \"http://127.0.0.1:" + std::to_string(ports[1]) + "\"]";
  const fs::path log = run_dir.string() + ".log";
  std::vector<std::string> args = {ARLO_BINARY, "run", config};
  const int steps = 8;
  for (const std::string& s :
       {"run.dir=" + run_dir.string(), std::string("log.progress=false"), std::string("status.port=0"),
        "run.max_steps=" + std::to_string(steps), std::string("orchestrator.sft_warmup_steps=4"),
        std::string("eval.interval=0"), std::string("weight_sync.transport=tcp"),
        std::string("inference.launch=external"), "inference.urls=" + urls})
    args.insert(args.end(), {"--set", s});
  const pid_t arlo = arlo::e2e::spawn_logged(args, log);
  ASSERT_GT(arlo, 0);
  ASSERT_TRUE(arlo::e2e::wait_for_text(log, "to answer /health", arlo, 60s)) << arlo::e2e::read_text(log);
  // The workers start now, from seed 7: their own v0 is not the trainer's (model.seed).
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> w = {ARLO_WORKER_BINARY,
                                  "--bind",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(ports[i]),
                                  "--init-seed",
                                  "7",
                                  "--seed",
                                  std::to_string(100 + i),
                                  "--threads",
                                  "1",
                                  "--layers",
                                  std::to_string(cfg.integer("model.layers")),
                                  "--hidden",
                                  std::to_string(cfg.integer("model.hidden")),
                                  "--heads",
                                  std::to_string(cfg.integer("model.heads")),
                                  "--context",
                                  std::to_string(cfg.integer("model.context")),
                                  "--weight-sync",
                                  R"({"transport": "tcp", "peer_name": "external-)" + std::to_string(i) + R"("})"};
    workers.push_back(arlo::e2e::spawn_logged(w, run_dir.string() + ".worker" + std::to_string(i) + ".log"));
    ASSERT_GT(workers.back(), 0);
  }
  int status = 0;
  ::waitpid(arlo, &status, 0);
  for (pid_t w : workers) {
    ::kill(w, SIGTERM);
    ::waitpid(w, nullptr, 0);
  }
  const std::string output = arlo::e2e::read_text(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << output.substr(output.size() > 6000 ? output.size() - 6000 : 0);
  // They were waited for, not tried and left out.
  EXPECT_NE(output.find("2 worker(s) healthy"), std::string::npos);
  EXPECT_EQ(output.find("left out of updates"), std::string::npos) << output;
  const auto summary = nlohmann::json::parse(arlo::e2e::read_text(run_dir / "summary.json"));
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), steps);
  const auto& trainer = summary.at("trainer");
  ASSERT_EQ(trainer.at("version").get<std::int64_t>(), steps) << summary.dump(2);
  ASSERT_EQ(summary.at("workers").size(), 2u) << summary.dump(2);
  for (const auto& [name, w] : summary.at("workers").items()) {
    EXPECT_EQ(w.at("version").get<std::int64_t>(), steps) << name;
    EXPECT_EQ(w.at("checksum"), trainer.at("checksum")) << name;  // the trainer's weights, not seed 7's
  }
  // v0 went to both workers before anything else.
  bool first_sync_seen = false;
  for (const auto& r : arlo::e2e::read_jsonl(run_dir / "metrics.jsonl")) {
    if (r.value("kind", "") != "weight_sync") continue;
    EXPECT_EQ(r.at("version").get<std::int64_t>(), 0) << r.dump();
    EXPECT_TRUE(r.value("applied", false)) << r.dump();
    int ok = 0;
    for (const auto& w : r.at("workers")) ok += w.value("ok", false);
    EXPECT_EQ(ok, 2) << r.dump();
    first_sync_seen = true;
    break;
  }
  EXPECT_TRUE(first_sync_seen);
  fs::remove_all(run_dir);
  fs::remove(log);
}

}  // namespace
