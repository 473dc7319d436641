// `arlo run configs/multi-turn.yaml` for a few steps through real processes (two arlo-worker, one
// arlo-trainer): the built-in policy on arithmetic_retry, where a wrong answer gets feedback and
// another try. Checked from the outside: the run ends ok, the ledger adds up, every step trained
// with every worker on the trainer's weights, and rollouts.jsonl (every scored group) shows
// trajectories of several turns whose tokens split exactly into the model's (loss mask 1) and the
// environment's (loss mask 0: as many as the environment's messages have characters, the built-in
// tokenizer's one id per character), one version per model turn, the environment's reward as the
// `env` module's score.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/run_checks.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;

TEST(MultiTurnE2E, TrajectoriesOfSeveralTurnsTrainWithTheEnvironmentsTokensMaskedOut) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const fs::path dir = arlo::e2e::fresh_temp_dir("arlo_multi_turn_e2e");
  const fs::path run_dir = dir / "run";
  const int steps = 6;
  auto args = arlo::e2e::arlo_run_argv(
      ARLO_BINARY, std::string(src) + "/configs/multi-turn.yaml",
      {"run.dir=" + run_dir.string(), "log.progress=false", "status.port=0", "run.max_steps=" + std::to_string(steps),
       "orchestrator.sft_warmup_steps=3", "orchestrator.batch_size=32", "eval.interval=0"});
  const auto run = arlo::e2e::run_to_end(args, dir / "run.log");
  ASSERT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << arlo::e2e::tail(run.output);
  const auto summary = nlohmann::json::parse(arlo::e2e::read_text(run_dir / "summary.json"));
  arlo::e2e::expect_every_step_trained(summary, run_dir, steps, 2);
  EXPECT_TRUE(summary.at("ledger").at("failed").empty()) << summary.dump(2);

  std::size_t samples = 0, several_turns = 0;
  for (const auto& group : arlo::e2e::read_jsonl(run_dir / "rollouts.jsonl")) {
    EXPECT_EQ(group.value("env", ""), "arithmetic_retry");
    for (const auto& s : group.at("samples")) {
      ++samples;
      std::size_t model_turns = 0, model_chars = 0, env_chars = 0;
      for (const auto& t : s.at("turns")) {
        const auto n = t.at("content").get<std::string>().size();
        if (t.at("role") == "assistant") {
          ++model_turns;
          model_chars += n;
        } else {
          EXPECT_EQ(t.at("role"), "user") << s.dump();
          env_chars += n;
        }
      }
      if (model_turns > 1) ++several_turns;
      ASSERT_GE(model_turns, 1u) << s.dump();
      EXPECT_LE(model_turns, 3u) << s.dump();  // env.max_turns and env.max_tries
      // The loss mask's zeros are the environment's tokens, its ones the model's (each model turn has
      // at least its text's tokens; its stop, <eos> and the special tokens an untrained policy emits
      // are not in its text).
      const auto env_tokens = s.at("env_tokens").get<std::size_t>();
      const auto model_tokens = s.at("model_tokens").get<std::size_t>();
      EXPECT_EQ(env_tokens, env_chars) << s.dump();
      EXPECT_GE(model_tokens, model_chars) << s.dump();
      EXPECT_EQ(s.at("tokens").get<std::size_t>(), env_tokens + model_tokens) << s.dump();
      EXPECT_EQ(s.at("turn_versions").size(), model_turns) << s.dump();
      ASSERT_TRUE(s.contains("env_reward")) << s.dump();
      EXPECT_DOUBLE_EQ(s.at("scores").at("env").get<double>(), s.at("env_reward").get<double>()) << s.dump();
    }
  }
  EXPECT_GT(samples, 0u);
  EXPECT_GT(several_turns, 0u) << "no trajectory had more than one model turn";
  std::printf("multi-turn e2e: %zu samples in rollouts.jsonl, %zu of several model turns\n", samples, several_turns);
  fs::remove_all(dir);
}

// An environment server over the HTTP protocol (examples/env_server/server.py under the project's
// Python) through `arlo run`: the run ends ok with every step trained; the server's reset and step
// answers are in the trajectories.
// With MALLOC_PERTURB_ freed memory is overwritten, so a use after free at the end of the run (the
// environment's HTTP client outliving the io_context its connections live on) crashes it here.
TEST(MultiTurnE2E, AnEnvironmentServerOverHttpThroughArloRun) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const fs::path dir = arlo::e2e::fresh_temp_dir("arlo_multi_turn_http_e2e");
  const fs::path server_log = dir / "server.log";
  const pid_t server =
      arlo::e2e::spawn_logged({ARLO_PYTHON_BINARY, ARLO_ENV_SERVER, "--port", "0", "--max-guesses", "3"}, server_log);
  ASSERT_GT(server, 0);
  struct StopServer {
    pid_t pid;
    ~StopServer() {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  } stop_server{server};
  ASSERT_TRUE(arlo::e2e::wait_for_text(server_log, "listening on port ", server, std::chrono::seconds(60)))
      << arlo::e2e::read_text(server_log);
  const std::string text = arlo::e2e::read_text(server_log);
  const int port = std::atoi(text.c_str() + text.find("port ") + 5);
  ASSERT_GT(port, 0) << text;
  {
    std::ofstream tasks(dir / "tasks.jsonl");
    for (int i = 0; i < 16; ++i) {
      std::string id = "t";
      id += std::to_string(i);
      tasks << nlohmann::json{{"id", id}, {"prompt", "guess: "}, {"info", {{"secret", 1 + i}}}} << "\n";
    }
  }
  const fs::path run_dir = dir / "run";
  const int steps = 3;
  auto args = arlo::e2e::arlo_run_argv(
      ARLO_BINARY, std::string(src) + "/configs/multi-turn.yaml",
      {"run.dir=" + run_dir.string(), "log.progress=false", "status.port=0", "run.max_steps=" + std::to_string(steps),
       "orchestrator.sft_warmup_steps=0", "orchestrator.batch_size=16", "eval.interval=0", "env.kind=http",
       "env.url=http://127.0.0.1:" + std::to_string(port), "env.path=" + (dir / "tasks.jsonl").string(),
       // The server's prompt is longer than arithmetic_retry's: a context for three guesses.
       "model.context=512", "orchestrator.seq_len=512", "env.max_trajectory_tokens=400"});
  ::setenv("MALLOC_PERTURB_", "165", 1);
  const auto run = arlo::e2e::run_to_end(args, dir / "run.log");
  ::unsetenv("MALLOC_PERTURB_");
  ASSERT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << arlo::e2e::tail(run.output);
  const auto summary = nlohmann::json::parse(arlo::e2e::read_text(run_dir / "summary.json"));
  arlo::e2e::expect_every_step_trained(summary, run_dir, steps, 2);
  // The server's reset gave each group its prompt, and its steps answered the model's guesses.
  std::size_t groups = 0, answered = 0;
  for (const auto& group : arlo::e2e::read_jsonl(run_dir / "rollouts.jsonl")) {
    ++groups;
    EXPECT_NE(group.at("messages").dump().find("I am thinking of a number"), std::string::npos) << group.dump();
    for (const auto& s : group.at("samples"))
      for (const auto& t : s.at("turns"))
        if (t.at("role") == "user" && t.at("content").get<std::string>().find("guess: ") != std::string::npos)
          ++answered;
  }
  EXPECT_GT(groups, 0u);
  EXPECT_GT(answered, 0u) << "no step of the environment server reached a trajectory";
  fs::remove_all(dir);
}

}  // namespace
