// What `arlo run` would start, checked without starting it: worker and trainer argv agree on the
// model, seeds and weight_sync endpoint; each worker gets its own loopback port; the per-version
// update sent to workers names the same endpoint; tasks are tokenized as arlo-worker tokenizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "apps/arlo/run_launch.h"
#include "apps/arlo/run_parts.h"
#include "reference/tokenizer.h"

namespace arlo::cli {
namespace {

config::Config load(std::vector<std::string> overrides) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  auto c = config::load_string("run:\n  name: t\n", "<test>", o);
  EXPECT_TRUE(c) << c.error().what();
  return *c;
}

std::string flag(const std::vector<std::string>& argv, const std::string& name) {
  auto it = std::find(argv.begin(), argv.end(), name);
  return it == argv.end() || it + 1 == argv.end() ? std::string("<missing>") : *(it + 1);
}

TEST(ArloRunPlan, EmbeddedWorkersShareModelSeedAndEndpoint) {
  const auto cfg = load({"inference.num_workers=3", "model.seed=5", "model.hidden=32", "weight_sync.transport=shm"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  ASSERT_EQ(plan->worker_specs.size(), 3u);
  ASSERT_EQ(plan->workers.size(), 3u);
  std::set<std::string> ports;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& argv = plan->worker_specs[i].argv;
    EXPECT_EQ(plan->worker_specs[i].name, plan->workers[i].first);
    EXPECT_EQ(plan->workers[i].second, "http://127.0.0.1:" + flag(argv, "--port"));
    ports.insert(flag(argv, "--port"));
    EXPECT_EQ(flag(argv, "--init-seed"), "5");
    EXPECT_EQ(flag(argv, "--hidden"), "32");
    EXPECT_EQ(flag(argv, "--ws-transport"), "shm");
    EXPECT_EQ(flag(argv, "--ws-shm-name"), plan->weight_sync.shm_name);
  }
  EXPECT_EQ(ports.size(), 3u);
  const auto trainer = trainer_spec(cfg, "/tmp/run", plan->weight_sync, 3, 0);
  EXPECT_EQ(flag(trainer.argv, "--seed"), "5");
  EXPECT_EQ(flag(trainer.argv, "--hidden"), "32");
  EXPECT_EQ(flag(trainer.argv, "--run-dir"), "/tmp/run");
  EXPECT_EQ(flag(trainer.argv, "--ws-shm-name"), plan->weight_sync.shm_name);
  EXPECT_EQ(flag(trainer.argv, "--ws-receivers"), "3");
  const auto u = plan->weight_sync.describe(7, rollout::AdminDialect::kArlo);
  EXPECT_EQ(u.version, 7);
  EXPECT_EQ(u.transport, "shm");
  EXPECT_EQ(u.extra.value("shm_name", ""), plan->weight_sync.shm_name);
}

TEST(ArloRunPlan, FilesystemUpdatesNameTheWeightsDirectory) {
  const auto cfg = load({"weight_sync.transport=filesystem", "weight_sync.dir=/tmp/run/w", "weight_sync.payload=cast"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_EQ(flag(plan->worker_specs.at(0).argv, "--ws-dir"), "/tmp/run/w");
  const auto arlo = plan->weight_sync.describe(3, rollout::AdminDialect::kArlo);
  EXPECT_EQ(arlo.extra.value("dir", ""), "/tmp/run/w");
  EXPECT_EQ(arlo.extra.value("payload", ""), "bf16");
  const auto sglang = plan->weight_sync.describe(3, rollout::AdminDialect::kSglang);
  EXPECT_EQ(sglang.extra.value("model_path", ""), "/tmp/run/w/v3");
}

TEST(ArloRunPlan, WhatTheTrainerAnnouncedWinsOverThePlan) {
  const auto cfg = load({"weight_sync.transport=tcp"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_EQ(plan->weight_sync.describe(2, rollout::AdminDialect::kArlo).extra.value("address", ""),
            plan->weight_sync.address);
  const nlohmann::json announced = {{"address", "10.1.2.3:29500"}, {"payload", "delta"}};
  const auto u = plan->weight_sync.describe(2, rollout::AdminDialect::kArlo, announced);
  EXPECT_EQ(u.extra.value("address", ""), "10.1.2.3:29500");
  EXPECT_EQ(u.extra.value("payload", ""), "delta");

  auto fs_plan = plan_launch(load({"weight_sync.transport=filesystem", "weight_sync.dir=/tmp/run/w"}), "/tmp/run");
  ASSERT_TRUE(fs_plan);
  const auto vllm = fs_plan->weight_sync.describe(4, rollout::AdminDialect::kVllm, {{"dir", "/shared/weights"}});
  EXPECT_EQ(vllm.extra.value("model_path", ""), "/shared/weights/v4");
}

TEST(ArloRunPlan, WeightSyncKnobsReachTheTrainerAndChainNeedsRelays) {
  const auto cfg = load({"weight_sync.zstd=true", "weight_sync.bucket_mb=64", "weight_sync.keep_last=3",
                         "weight_sync.delta_density_threshold=0.1"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto trainer = trainer_spec(cfg, "/tmp/run", plan->weight_sync, 2, 0);
  EXPECT_EQ(flag(trainer.argv, "--ws-zstd"), "true");
  EXPECT_EQ(flag(trainer.argv, "--ws-bucket-mb"), "64");
  EXPECT_EQ(flag(trainer.argv, "--ws-keep-last"), "3");
  EXPECT_EQ(flag(trainer.argv, "--ws-delta-threshold"), "0.1");
  auto chain = plan_launch(load({"weight_sync.transport=tcp", "weight_sync.topology=chain"}), "/tmp/run");
  ASSERT_FALSE(chain);
  EXPECT_NE(chain.error().what().find("weight_sync.topology"), std::string::npos) << chain.error().what();
}

TEST(ArloRunPlan, ExternalUsesGivenUrlsAndNcclNeedsExternal) {
  const auto ext = load({"inference.launch=external", "inference.urls=[\"http://10.0.0.1:8000/\"]"});
  auto plan = plan_launch(ext, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_TRUE(plan->worker_specs.empty());
  ASSERT_EQ(plan->workers.size(), 1u);
  EXPECT_EQ(plan->workers[0].second, "http://10.0.0.1:8000");
  EXPECT_FALSE(plan_launch(load({"weight_sync.transport=nccl"}), "/tmp/run"));
}

TEST(ArloRunPlan, TasksAreTokenizedLikeTheWorkerWithEosAfterTheAnswer) {
  orch::Task t;
  t.prompt = "23+45=";
  t.answer = "68";
  tokenize_task(t);
  const reference::Tokenizer tok;
  EXPECT_EQ(t.prompt_tokens, tok.encode_prompt("23+45="));
  auto want = tok.encode("68");
  want.push_back(reference::Tokenizer::kEos);
  EXPECT_EQ(t.answer_tokens, want);
}

TEST(ArloRunPlan, RolloutPartsBuildTheEvalSetFromEvalSeed) {
  const auto cfg = load({"eval.size=16", "eval.interval=5"});
  auto parts = build_rollout_parts(cfg);
  ASSERT_TRUE(parts) << parts.error().what();
  ASSERT_EQ(parts->eval_tasks.size(), 16u);
  for (const auto& t : parts->eval_tasks) {
    EXPECT_FALSE(t.prompt_tokens.empty());
    EXPECT_EQ(t.answer_tokens.back(), reference::Tokenizer::kEos);
  }
  EXPECT_TRUE(parts->reward != nullptr);
  EXPECT_TRUE(build_rollout_parts(load({"eval.interval=0"}))->eval_tasks.empty());
}

}  // namespace
}  // namespace arlo::cli
