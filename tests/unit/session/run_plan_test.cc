// What `arlo run` would start, checked without starting it: worker and trainer argv agree on the
// model, seeds and weight_sync endpoint; each worker gets its own loopback port; the per-version
// update sent to workers names the same endpoint; tasks are tokenized as arlo-worker tokenizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "session/launch_plan.h"
#include "session/rollout_parts.h"
#include "reference/tokenizer.h"
#include "weight_sync/wire.h"
#include "tests/unit/session/session_test_util.h"

namespace arlo::session {
namespace {

using test::load;

std::string flag(const std::vector<std::string>& argv, const std::string& name) {
  auto it = std::find(argv.begin(), argv.end(), name);
  return it == argv.end() || it + 1 == argv.end() ? std::string("<missing>") : *(it + 1);
}

nlohmann::json block_flag(const std::vector<std::string>& argv) {
  return nlohmann::json::parse(flag(argv, "--weight-sync"));
}

// What the registered dialect `kind` (inference.kind) says its servers take.
const rollout::ServerCapabilities& servers(std::string_view kind) {
  auto d = rollout::find_admin_dialect(kind);
  if (!d) ADD_FAILURE() << d.error().what();
  return d ? (*d)->server : rollout::admin_dialects().front().server;
}

// What the bridge hands the orchestrator with a version: the trainer's announcement of it.
nlohmann::json announced(arlo::Version version, const std::string& transport, nlohmann::json endpoint) {
  weight_sync::Announcement a;
  a.version = version;
  a.transport = transport;
  a.endpoint = std::move(endpoint);
  return weight_sync::to_json(a);
}

TEST(ArloRunPlan, EmbeddedWorkersShareModelSeedAndTheTrainerBlock) {
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
    const auto own = block_flag(argv);
    EXPECT_EQ(own.value("transport", ""), "shm");
    EXPECT_EQ(own.value("peer_name", ""), plan->workers[i].first);
    EXPECT_FALSE(own.contains("relay"));
  }
  EXPECT_EQ(ports.size(), 3u);
  const auto trainer = trainer_spec(cfg, "/tmp/run", plan->weight_sync, 3, 0);
  EXPECT_EQ(flag(trainer.argv, "--seed"), "5");
  EXPECT_EQ(flag(trainer.argv, "--hidden"), "32");
  EXPECT_EQ(flag(trainer.argv, "--run-dir"), "/tmp/run");
  const auto block = block_flag(trainer.argv);
  EXPECT_EQ(block.value("transport", ""), "shm");
  EXPECT_EQ(block.value("expected_receivers", 0), 3);
  EXPECT_TRUE(weight_sync::options_from_json(block)) << block.dump();
  // The trainer announces where it is; every worker is sent there.
  const auto u =
      plan->weight_sync.describe(1, 7, servers("arlo"), announced(7, "shm", {{"shm_name", "arlo-weights-123"}}));
  EXPECT_EQ(u.version, 7);
  EXPECT_EQ(u.weight_sync.value("transport", ""), "shm");
  EXPECT_EQ(u.weight_sync.value("shm_name", ""), "arlo-weights-123");
  EXPECT_TRUE(weight_sync::options_from_json(u.weight_sync)) << u.weight_sync.dump();
}

TEST(ArloRunPlan, DurableUpdatesNameTheWeightsDirectory) {
  const auto cfg = load({"weight_sync.transport=filesystem", "weight_sync.dir=/tmp/run/w", "weight_sync.payload=cast"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_EQ(plan->weight_sync.weights_dir, "/tmp/run/w");
  const auto block = block_flag(trainer_spec(cfg, "/tmp/run", plan->weight_sync, 2, 0).argv);
  EXPECT_EQ(block.value("dir", ""), "/tmp/run/w");
  EXPECT_EQ(block.value("payload", ""), "bf16");
  const auto arlo = plan->weight_sync.describe(0, 3, servers("arlo"));
  EXPECT_EQ(arlo.weight_sync.value("dir", ""), "/tmp/run/w");
  EXPECT_FALSE(arlo.extra.contains("model_path"));  // arlo-worker reads the receiver block
  const auto sglang = plan->weight_sync.describe(0, 3, servers("sglang"));
  EXPECT_EQ(sglang.extra.value("model_path", ""), "/tmp/run/w/v3");
  const auto vllm =
      plan->weight_sync.describe(0, 4, servers("vllm"), announced(4, "filesystem", {{"dir", "/shared/weights"}}));
  EXPECT_EQ(vllm.weight_sync.value("dir", ""), "/shared/weights");  // through arlo's vLLM backend
  EXPECT_FALSE(vllm.extra.contains("model_path"));
}

TEST(ArloRunPlan, WhatTheTrainerAnnouncedWinsOverThePlan) {
  auto plan = plan_launch(load({"weight_sync.transport=tcp"}), "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto u =
      plan->weight_sync.describe(0, 2, servers("arlo"), announced(2, "tcp", {{"address", "10.1.2.3:29500"}}));
  EXPECT_EQ(u.weight_sync.value("address", ""), "10.1.2.3:29500");
  // A malformed announcement does not reach the workers: the planned block is used (for tcp the
  // publisher's configured listen address; port 0 there reaches nobody: the update fails at the
  // worker, naming the address).
  const auto bad = plan->weight_sync.describe(0, 2, servers("arlo"), {{"weight_sync", {{"version", 2}}}});
  EXPECT_EQ(bad.weight_sync.value("address", ""), "127.0.0.1:0") << bad.weight_sync.dump();
}

TEST(ArloRunPlan, TheTrainersPublisherListensWhereTheConfigSays) {
  const auto cfg =
      load({"weight_sync.transport=tcp", "weight_sync.address=0.0.0.0:29500", "weight_sync.advertise_host=10.1.2.3"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto block = block_flag(trainer_spec(cfg, "/tmp/run", plan->weight_sync, 2, 0).argv);
  EXPECT_EQ(block.value("address", ""), "0.0.0.0:29500");
  EXPECT_EQ(block.value("advertise_host", ""), "10.1.2.3");
}

// Workers on other hosts cannot reach a publisher on loopback: a trainer this run starts is not
// started with one (an external trainer brings its own block).
TEST(ArloRunPlan, ATrainerItStartsMustBeReachableFromWorkersElsewhere) {
  const std::string elsewhere = "inference.urls=[\"http://127.0.0.1:8000\", \"http://10.0.0.2:8000\"]";
  auto refused = plan_launch(load({"inference.launch=external", "weight_sync.transport=tcp", elsewhere}), "/tmp/run");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().what().find("10.0.0.2"), std::string::npos) << refused.error().what();
  EXPECT_NE(refused.error().what().find("weight_sync.advertise_host"), std::string::npos) << refused.error().what();
  EXPECT_TRUE(plan_launch(load({"inference.launch=external", "weight_sync.transport=tcp", elsewhere,
                                "weight_sync.address=0.0.0.0:29500", "weight_sync.advertise_host=10.0.0.1"}),
                          "/tmp/run"));
  EXPECT_TRUE(plan_launch(
      load({"inference.launch=external", "weight_sync.transport=tcp", elsewhere, "trainer.launch=external"}),
      "/tmp/run"));
  EXPECT_TRUE(plan_launch(
      load({"inference.launch=external", "weight_sync.transport=tcp", "inference.urls=[\"http://127.0.0.1:8000\"]"}),
      "/tmp/run"));
}

TEST(ArloRunPlan, ChainRoleSkipsWhatDoesNotReceive) {
  // Everyone receives: each pulls from the one before and relays unless last.
  EXPECT_FALSE(chain_role(0, {true, true, true}, false).upstream);
  EXPECT_TRUE(chain_role(0, {true, true, true}, false).relays);
  EXPECT_EQ(chain_role(2, {true, true, true}, false).upstream, 1u);
  EXPECT_FALSE(chain_role(2, {true, true, true}, false).relays);
  // The middle relay is out (dead, left out): worker 2 pulls from worker 0, which relays to it.
  EXPECT_EQ(chain_role(2, {true, false, true}, false).upstream, 0u);
  EXPECT_TRUE(chain_role(0, {true, false, true}, false).relays);
  EXPECT_FALSE(chain_role(1, {true, false, true}, false).relays);
  // The first is out: worker 1 pulls from the trainer; a worker that holds the version already
  // (a resync for a restarted one) neither serves nor pulls.
  EXPECT_FALSE(chain_role(1, {false, true, true}, false).upstream);
  EXPECT_FALSE(chain_role(2, {false, false, true}, false).upstream);
  EXPECT_FALSE(chain_role(0, {false, false, true}, false).relays);
  // Only the last is out: the one before it ends the chain.
  EXPECT_FALSE(chain_role(1, {true, true, false}, false).relays);
  // A retry (its relay died mid-transfer) pulls from the trainer and still serves the next.
  EXPECT_FALSE(chain_role(1, {true, true, true}, true).upstream);
  EXPECT_TRUE(chain_role(1, {true, true, true}, true).relays);
}

TEST(ArloRunPlan, ChainUpdatesFollowTheRound) {
  const auto cfg = load({"inference.num_workers=3", "weight_sync.transport=tcp", "weight_sync.topology=chain"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto w0 = block_flag(plan->worker_specs[0].argv);
  const auto info = announced(1, "tcp", {{"address", "127.0.0.1:4000"}});
  const std::vector<bool> middle_out = {true, false, true};
  const auto u0 = plan->weight_sync.describe(0, 1, servers("arlo"), info, chain_role(0, middle_out, false));
  EXPECT_TRUE(u0.weight_sync.value("relay", false));
  EXPECT_EQ(u0.weight_sync.value("relay_listen", ""), w0.value("relay_listen", "?"));
  const auto u2 = plan->weight_sync.describe(2, 1, servers("arlo"), info, chain_role(2, middle_out, false));
  EXPECT_EQ(u2.weight_sync.value("address", ""), w0.value("relay_listen", "?"));
  EXPECT_FALSE(u2.weight_sync.value("relay", true));
  const auto retry = plan->weight_sync.describe(2, 1, servers("arlo"), info, chain_role(2, middle_out, true));
  EXPECT_EQ(retry.weight_sync.value("address", ""), "127.0.0.1:4000");
}

TEST(ArloRunPlan, ExternalWorkersRelayOnTheirOwnHosts) {
  const auto cfg =
      load({"inference.launch=external", "weight_sync.transport=tcp", "weight_sync.topology=chain",
            "weight_sync.relay_port=29600", "weight_sync.address=10.0.0.1:0",
            "inference.urls=[\"http://10.0.0.2:8000/\", \"http://10.0.0.3:8000\", \"http://10.0.0.4:8000\"]"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto info = announced(1, "tcp", {{"address", "10.0.0.1:5000"}});
  const auto u0 = plan->weight_sync.describe(0, 1, servers("arlo"), info);
  EXPECT_EQ(u0.weight_sync.value("address", ""), "10.0.0.1:5000");
  EXPECT_TRUE(u0.weight_sync.value("relay", false));
  EXPECT_EQ(u0.weight_sync.value("relay_listen", ""), "10.0.0.2:29600");
  const auto u1 = plan->weight_sync.describe(1, 1, servers("arlo"), info);
  EXPECT_EQ(u1.weight_sync.value("address", ""), "10.0.0.2:29600");
  EXPECT_EQ(u1.weight_sync.value("relay_listen", ""), "10.0.0.3:29601");
  const auto u2 = plan->weight_sync.describe(2, 1, servers("arlo"), info);
  EXPECT_EQ(u2.weight_sync.value("address", ""), "10.0.0.3:29601");
  EXPECT_FALSE(u2.weight_sync.value("relay", true));
  EXPECT_FALSE(u2.weight_sync.contains("relay_listen"));
  // Without a relay port the chain cannot be planned; the error says what to set.
  auto no_port =
      plan_launch(load({"inference.launch=external", "weight_sync.transport=tcp", "weight_sync.topology=chain",
                        "weight_sync.address=10.0.0.1:0", "inference.urls=[\"http://10.0.0.2:8000\"]"}),
                  "/tmp/run");
  ASSERT_FALSE(no_port);
  EXPECT_NE(no_port.error().what().find("weight_sync.relay_port"), std::string::npos) << no_port.error().what();
}

TEST(ArloRunPlan, WeightSyncKnobsReachTheTrainer) {
  const auto cfg = load({"weight_sync.zstd=true", "weight_sync.bucket_mb=64", "weight_sync.keep_last=3",
                         "weight_sync.delta_density_threshold=0.1"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  const auto block = block_flag(trainer_spec(cfg, "/tmp/run", plan->weight_sync, 2, 0).argv);
  EXPECT_EQ(block.value("zstd", false), true);
  EXPECT_EQ(block.value("bucket_mb", 0), 64);
  EXPECT_EQ(block.value("keep_last", 0), 3);
  EXPECT_DOUBLE_EQ(block.value("delta_density_threshold", 0.0), 0.1);
  EXPECT_FALSE(block.contains("delta_dense_threshold"));
  auto o = weight_sync::options_from_json(block);
  ASSERT_TRUE(o) << o.error().what();
  EXPECT_EQ(o->bucket_bytes, 64ull << 20);
}

TEST(ArloRunPlan, ChainWorkersRelayEachToTheNext) {
  const auto cfg = load({"inference.num_workers=3", "weight_sync.transport=tcp", "weight_sync.topology=chain"});
  auto plan = plan_launch(cfg, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_EQ(block_flag(trainer_spec(cfg, "/tmp/run", plan->weight_sync, 3, 0).argv).value("expected_receivers", 0), 1);
  const auto w0 = block_flag(plan->worker_specs[0].argv), w1 = block_flag(plan->worker_specs[1].argv),
             w2 = block_flag(plan->worker_specs[2].argv);
  EXPECT_TRUE(w0.value("relay", false));
  EXPECT_TRUE(w1.value("relay", false));
  EXPECT_FALSE(w2.value("relay", false));  // the end of the chain
  const auto info = announced(1, "tcp", {{"address", "127.0.0.1:4000"}});
  EXPECT_EQ(plan->weight_sync.describe(0, 1, servers("arlo"), info).weight_sync.value("address", ""), "127.0.0.1:4000");
  EXPECT_EQ(plan->weight_sync.describe(1, 1, servers("arlo"), info).weight_sync.value("address", ""),
            w0.value("relay_listen", "?"));
  EXPECT_EQ(plan->weight_sync.describe(2, 1, servers("arlo"), info).weight_sync.value("address", ""),
            w1.value("relay_listen", "?"));
  auto not_relaying = plan_launch(load({"weight_sync.transport=shm", "weight_sync.topology=chain"}), "/tmp/run");
  ASSERT_FALSE(not_relaying);
  EXPECT_NE(not_relaying.error().what().find("weight_sync.topology"), std::string::npos) << not_relaying.error().what();
}

TEST(ArloRunPlan, ExternalUsesGivenUrls) {
  const auto ext = load({"inference.launch=external", "inference.urls=[\"http://10.0.0.1:8000/\"]"});
  auto plan = plan_launch(ext, "/tmp/run");
  ASSERT_TRUE(plan) << plan.error().what();
  EXPECT_TRUE(plan->worker_specs.empty());
  ASSERT_EQ(plan->workers.size(), 1u);
  EXPECT_EQ(plan->workers[0].second, "http://10.0.0.1:8000");
}

TEST(ArloRunPlan, TasksAreTokenizedLikeTheWorkerWithEosAfterTheAnswer) {
  arlo::Task t;
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
}  // namespace arlo::session
