// The nccl transport without a GPU: the trainer's StagingPublisher over the real control and
// rendezvous stores (loopback sockets), the orchestrator's CollectiveControl, arlo's own receiver,
// and the communicator's recording double (testing/nccl_fake_backend.h) in place of libnccl and the device.
// What the double sees is what libnccl would be asked: the init's rank and world size, the vLLM
// warm-up, the broadcasts in layout order with the staged bytes, the abort on a missed deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "tests/unit/nccl_transport/nccl_trainer.h"
#include "weight_sync/collective.h"
#include "weight_sync/staging.h"
#include "weight_sync/transport.h"
#include "weight_sync/transports/nccl/layout.h"
#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"
#include "testing/nccl_fake_backend.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using nccl::testing::Call;
using nccl::testing::ScopedBackend;

std::vector<TensorSpec> specs() {
  return {{"model.embed.weight", DType::BF16, {64, 33}},
          {"model.layers.0.w", DType::F32, {257}},
          {"model.layers.1.w", DType::F32, {3, 5}},
          {"model.norm.weight", DType::BF16, {33}}};
}

void fill(HostWeights& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t t = 0; t < w.specs().size(); ++t)
    for (auto& b : w.bytes(t)) b = static_cast<std::byte>(rng() & 0x3f);  // finite bf16/f32 patterns
}

std::vector<std::byte> concat(const HostWeights& w, std::size_t first, std::size_t count) {
  std::vector<std::byte> out;
  for (std::size_t t = first; t < first + count; ++t) {
    const auto b = w.bytes(t);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// Each test: the communicator's double, a trainer over nccl (a packed buffer of 1 MiB unless a
// test sets another) and the weights it stages.
class NcclTransport : public ::testing::Test {
 protected:
  NcclTransport() {
    t.options.bucket_timeout = 2s;
    t.options.params["packed_buffer_bytes"] = 1 << 20;
  }
  // Starts the trainer, stages version 0 of the weights filled from `seed` and connects `control`.
  void stage_and_connect(std::uint64_t seed) {
    t.start();
    fill(w, seed);
    ASSERT_TRUE(t.pub->stage(0, w));
    control = CollectiveControl::connect(t.announcement(0), deadline_in(5s)).value();
  }
  // Waits (5 s) until the double recorded `n` or more calls that `pred` holds for.
  bool recorded(const std::function<bool(const Call&)>& pred, std::ptrdiff_t n = 1) {
    return fake->wait_for(
        [&](const std::vector<Call>& calls) { return std::count_if(calls.begin(), calls.end(), pred) >= n; }, 5s);
  }
  // Options of arlo's own receiver that joins as group member `member`.
  Options receiver(const std::string& member) {
    Options o;
    o.transport = "nccl";
    o.params = {{"address", t.announcement(0).endpoint.at("address")}, {"member", member}};
    return o;
  }

  ScopedBackend fake;
  testing::NcclTrainer t{5s};
  HostWeights w{specs()};
  std::unique_ptr<CollectiveControl> control;
};

TEST_F(NcclTransport, GroupPublishesTheIdInEveryFormAndRank0Inits) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(1));
  const auto a = t.announcement(0);
  EXPECT_EQ(a.transport, "nccl");
  EXPECT_EQ(a.endpoint.at("nccl_version"), "2.28.9");
  auto group = control->open_group({{"w0", 2, "vllm"}, {"w1", 1, "vllm"}}, deadline_in(5s));
  ASSERT_TRUE(group) << group.error().what();
  ASSERT_EQ(group->join.size(), 2u);
  const auto& j0 = group->join.at("w0");
  const auto& j1 = group->join.at("w1");
  EXPECT_EQ(j0.at("rank_offset"), 1);
  EXPECT_EQ(j1.at("rank_offset"), 3);  // after w0's two ranks
  EXPECT_EQ(j0.at("world_size"), 4);
  EXPECT_EQ(j0.at("generation"), group->generation);
  EXPECT_TRUE(j0.at("warmup").get<bool>());
  EXPECT_TRUE(j0.at("packed").get<bool>());
  // The rendezvous store is a fresh one; the id is there as vLLM, SGLang and arlo read it.
  const auto port = j0.at("master_port").get<std::uint16_t>();
  EXPECT_NE(a.endpoint.at("address").get<std::string>(), "127.0.0.1:" + std::to_string(port));
  auto store = nccl::StoreClient::connect("127.0.0.1", port, deadline_in(5s)).value();
  auto id = nccl::unique_id_from_base64(j0.at("nccl_unique_id_b64").get<std::string>()).value();
  EXPECT_EQ(store->get(std::string(nccl::kVllmUniqueIdKey), deadline_in(5s)).value(), nccl::vllm_unique_id_pickle(id));
  const std::string raw(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  const auto name = j0.at("group_name").get<std::string>();
  EXPECT_EQ(name, fmt::format("weight_update_group-g{}", group->generation));  // torch refuses a name twice
  EXPECT_EQ(store->get(nccl::sglang_unique_id_key(name), deadline_in(5s)).value(), raw);
  EXPECT_EQ(store->get(fmt::format("/tcp://127.0.0.1:{}/{}//cuda//0", port, name), deadline_in(5s)).value(),
            raw);  // older SGLang's PrefixStore(init_method) form
  // Rank 0 of 4 started its (non-blocking) init.
  ASSERT_TRUE(recorded([](const Call& c) { return c.kind == Call::Kind::kInit; }));
  const auto inits = fake->calls(Call::Kind::kInit);
  ASSERT_EQ(inits.size(), 1u);
  EXPECT_EQ(inits[0].rank, 0);
  EXPECT_EQ(inits[0].world_size, 4);
  // vLLM's workers all-reduce inside their init route, before any update: rank 0 joins that at once.
  EXPECT_TRUE(recorded([](const Call& c) { return c.kind == Call::Kind::kAllReduce && c.ran; }));
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
}

TEST_F(NcclTransport, VllmGroupWarmsUpThenBroadcastsPackedBucketsOfTheStagedBytes) {
  t.options.params["packed_buffer_bytes"] = 4096;
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(2));
  auto group = control->open_group({{"w0", 1, "vllm"}}, deadline_in(5s)).value();
  auto tensors = control->tensors(deadline_in(5s)).value();
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors[0], (nlohmann::json{{"name", "model.embed.weight"}, {"dtype", "bfloat16"}, {"shape", {64, 33}}}));
  auto sent = control->receiving(group.generation, 0, deadline_in(10s));
  ASSERT_TRUE(sent) << sent.error().what();
  EXPECT_EQ(*sent, 0u);
  // The warm-up all-reduce comes first, then one uint8 broadcast per bucket of vLLM's rule.
  const auto calls = fake->calls();
  std::vector<Call> collectives;
  for (const auto& c : calls)
    if (c.kind == Call::Kind::kAllReduce || c.kind == Call::Kind::kBroadcast) collectives.push_back(c);
  const auto buckets = nccl::plan_buckets(specs(), {true, 4096, 2});
  ASSERT_EQ(collectives.size(), 1 + buckets.size());
  EXPECT_EQ(collectives[0].kind, Call::Kind::kAllReduce);
  EXPECT_EQ(collectives[0].count, 1u);
  EXPECT_EQ(collectives[0].dtype, nccl::kNcclFloat32);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& c = collectives[1 + b];
    EXPECT_EQ(c.kind, Call::Kind::kBroadcast);
    EXPECT_EQ(c.root, 0);
    EXPECT_EQ(c.dtype, nccl::kNcclUint8);
    EXPECT_EQ(c.count, buckets[b].bytes);
    EXPECT_EQ(c.bytes, concat(w, buckets[b].first, buckets[b].count)) << "bucket " << b;
  }
  EXPECT_TRUE(fake->misuse().empty());
}

TEST_F(NcclTransport, SglangGroupBroadcastsEachTensorWithoutWarmUp) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(3));
  auto group = control->open_group({{"w0", 2, "sglang"}}, deadline_in(5s)).value();
  EXPECT_FALSE(group.join.at("w0").at("packed").get<bool>());
  EXPECT_FALSE(group.join.at("w0").at("warmup").get<bool>());
  ASSERT_TRUE(control->receiving(group.generation, 0, deadline_in(10s)));
  const auto b = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(b.size(), specs().size());
  EXPECT_EQ(fake->count(Call::Kind::kAllReduce), 0u);
  for (std::size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].count, specs()[i].numel());
    EXPECT_EQ(b[i].dtype, nccl::nccl_data_type(specs()[i].dtype).value());
    EXPECT_EQ(b[i].bytes, concat(w, i, 1));
  }
}

TEST_F(NcclTransport, VllmAndSglangCannotShareAGroup) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(7));
  auto group = control->open_group({{"a", 1, "vllm"}, {"b", 1, "sglang"}}, deadline_in(5s));
  ASSERT_FALSE(group);
  EXPECT_NE(group.error().what().find("cannot share one group"), std::string::npos) << group.error().what();
}

// Every member of the group must be receiving before the broadcast starts; a superseded version
// is answered with the newest staged one.
TEST_F(NcclTransport, BroadcastWaitsForEveryMemberAndSendsTheNewestStaged) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(4));
  auto group = control->open_group({{"w0", 1, "sglang"}, {"w1", 1, "sglang"}}, deadline_in(5s)).value();
  fill(w, 5);
  ASSERT_TRUE(t.pub->stage(1, w));
  t.announcement(1);
  auto first =
      std::async(std::launch::async, [&] { return control->receiving(group.generation, 0, deadline_in(10s)); });
  EXPECT_EQ(first.wait_for(300ms), std::future_status::timeout);  // w1 is not receiving yet
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
  auto second = control->receiving(group.generation, 0, deadline_in(10s));
  ASSERT_TRUE(second) << second.error().what();
  EXPECT_EQ(*second, 1u);  // v0 was superseded by v1 before anyone came
  EXPECT_EQ(first.get().value(), 1u);
  const auto b = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(b.size(), specs().size());
  EXPECT_EQ(b[0].bytes, concat(w, 0, 1));  // v1's bytes
}

// Init that never completes: the transfer fails at its deadline, the communicator is aborted, the
// group is gone (later members are answered at once), and the next group is a new generation on a
// new rendezvous port.
TEST_F(NcclTransport, MissedInitDeadlineAbortsAndTheNextGroupIsNew) {
  fake->hold_init();
  t.options.timeout = 600ms;
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(8));
  auto group = control->open_group({{"w0", 1, "vllm"}}, deadline_in(5s)).value();
  auto sent = control->receiving(group.generation, 0, deadline_in(10s));
  ASSERT_FALSE(sent);
  EXPECT_NE(sent.error().what().find("not sent"), std::string::npos) << sent.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
  const auto t0 = Clock::now();
  auto again = control->receiving(group.generation, 0, deadline_in(10s));
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().what().find("gone"), std::string::npos) << again.error().what();
  EXPECT_LT(Clock::now() - t0, 5s);  // answered, not run into the deadline
  fake->release_init();
  auto next = control->open_group({{"w0", 1, "vllm"}}, deadline_in(5s)).value();
  EXPECT_GT(next.generation, group.generation);
  EXPECT_NE(next.join.at("w0").at("master_port"), group.join.at("w0").at("master_port"));
  auto ok = control->receiving(next.generation, 0, deadline_in(10s));
  ASSERT_TRUE(ok) << ok.error().what();
}

// A member's failure (its server refused the metadata call) aborts the broadcast in flight.
TEST_F(NcclTransport, AMemberAbortStopsTheBroadcastInFlight) {
  fake->hold_collectives_from(1);  // the first tensor goes, the second waits
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(9));
  auto group = control->open_group({{"w0", 1, "sglang"}}, deadline_in(5s)).value();
  auto sent = std::async(std::launch::async, [&] { return control->receiving(group.generation, 0, deadline_in(10s)); });
  ASSERT_TRUE(recorded([](const Call& c) { return c.kind == Call::Kind::kBroadcast; }, 2));
  ASSERT_TRUE(control->abort(group.generation, "w0: HTTP 500 from /update_weights_from_distributed", deadline_in(5s)));
  auto r = sent.get();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("HTTP 500"), std::string::npos) << r.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
}

// arlo's own receiver joins from its member key, checks the tensors against its sink before any
// collective, receives into it and verifies the checksum the publisher sent.
TEST_F(NcclTransport, ArloReceiverJoinsReceivesAndVerifies) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(6));
  auto group = control->open_group({{"gpu-worker", 1, "arlo"}}, deadline_in(5s)).value();
  Options ro = receiver("gpu-worker");
  ro.timeout = 5s;
  auto sub = Subscriber::create(ro).value();
  // The double's non-root broadcast delivers what a test queues: the bytes rank 0 sends.
  const auto buckets = nccl::plan_buckets(specs(), nccl::Layout{});
  for (const auto& b : buckets) fake->push_incoming(concat(w, b.first, b.count));
  HostWeights sink(specs());
  auto got = sub->receive(sink, deadline_in(10s));
  ASSERT_TRUE(got) << got.error().what();
  EXPECT_EQ(got->version, 0u);
  EXPECT_EQ(got->path, "nccl");
  for (std::size_t i = 0; i < specs().size(); ++i) EXPECT_EQ(concat(sink, i, 1), concat(w, i, 1));
  const auto inits = fake->calls(Call::Kind::kInit);
  ASSERT_EQ(inits.size(), 2u);  // rank 0 (the publisher) and rank 1 (the receiver)
  EXPECT_EQ(inits[1].rank, 1);
  EXPECT_EQ(inits[1].world_size, 2);
  // A sink that does not hold the tensors refuses before any collective.
  const auto collectives = fake->count(Call::Kind::kBroadcast);
  HostWeights wrong({{"model.other", DType::F32, {3}}});
  ASSERT_TRUE(t.pub->stage(1, w));
  auto refused = sub->receive(wrong, deadline_in(5s));
  ASSERT_FALSE(refused);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), collectives);
}

TEST_F(NcclTransport, AReceiverOnAnotherNcclVersionIsRefusedNamingBoth) {
  ASSERT_NO_FATAL_FAILURE(stage_and_connect(10));
  ASSERT_TRUE(control->open_group({{"gpu-worker", 1, "arlo"}}, deadline_in(5s)));
  fake->set_version("2.27.7");
  auto sub = Subscriber::create(receiver("gpu-worker")).value();
  HostWeights sink(specs());
  auto got = sub->receive(sink, deadline_in(5s));
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().what().find("2.28.9"), std::string::npos) << got.error().what();
  EXPECT_NE(got.error().what().find("2.27.7"), std::string::npos) << got.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kInit), 1u);  // only rank 0's
}

TEST_F(NcclTransport, PayloadsOtherThanFullAreRefused) {
  Options o;
  o.transport = "nccl";
  o.payload.kind = PayloadKind::kDelta;
  auto pub = StagingPublisher::create(o, {});
  ASSERT_FALSE(pub);
  EXPECT_NE(pub.error().what().find("payload full"), std::string::npos) << pub.error().what();
}

}  // namespace
}  // namespace arlo::weight_sync
