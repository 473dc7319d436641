// The StagingSubscriber against a real StagingPublisher over tcp (loopback): an announced version
// pulled into the held buffers with the announced checksum, the same block keeping its connection
// (deltas apply), a new block starting from the version held, a failed pull keeping the version
// held before it, a caller's own sink, and a block that names no transport.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/staging.h"
#include "weight_sync/subscriber.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// A trainer's side: a staging publisher over tcp and the announcements it made, in order.
class Trainer {
 public:
  explicit Trainer(PayloadKind kind) {
    Options o;
    o.transport = "tcp";
    o.bucket_bytes = kTestBucket;
    o.bucket_timeout = 10s;
    o.timeout = 60s;
    o.payload.kind = kind;
    pub_ = StagingPublisher::create(o, [this](const Announcement& a) {
             std::lock_guard l(mu_);
             announced_.push_back(a);
             cv_.notify_all();
             return ok();
           }).value();
  }
  // Stages `w` as `v` and returns its announcement.
  Announcement stage(Version v, const HostWeights& w) {
    EXPECT_TRUE(pub_->stage(v, w));
    std::unique_lock l(mu_);
    EXPECT_TRUE(cv_.wait_until(l, Clock::now() + 30s, [&] { return !announced_.empty(); }));
    Announcement a = announced_.front();
    announced_.pop_front();
    return a;
  }

 private:
  std::unique_ptr<StagingPublisher> pub_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Announcement> announced_;
};

Options own_block() {
  Options o;
  o.peer_name = "worker-0";
  o.timeout = 60s;
  o.bucket_timeout = 10s;
  return o;
}

// What `held` holds equals `want`: names, dtypes, shapes and bytes, in the manifest's order.
void expect_holds(const HeldVersion& held, const HostWeights& want) {
  ASSERT_EQ(held.specs(), want.specs());
  for (std::size_t i = 0; i < want.specs().size(); ++i) {
    auto v = held.view(i);
    ASSERT_TRUE(v) << v.error().what();
    ASSERT_EQ(v->bytes.size(), want.bytes(i).size());
    EXPECT_EQ(std::memcmp(v->bytes.data(), want.bytes(i).data(), v->bytes.size()), 0) << want.specs()[i].name;
  }
}

// `sub` pulls the announced version as a delta over the one it holds, and then holds `w`.
void expect_pulls_delta(StagingSubscriber& sub, const Announcement& a, const HostWeights& w) {
  auto got = sub.pull(deadline_in(60s));
  ASSERT_TRUE(got) << got.error().what();
  EXPECT_EQ(got->report.version, a.version);
  EXPECT_EQ(got->report.payload, PayloadKind::kDelta);
  EXPECT_EQ(got->checksum, a.checksum);
  expect_holds(sub.held(), w);
}

TEST(StagingSubscriber, PullsAnAnnouncedVersionWithItsChecksumAndKeepsItsConnectionForDeltas) {
  Trainer trainer(PayloadKind::kDelta);
  StagingSubscriber sub(own_block());
  EXPECT_EQ(sub.version(), std::nullopt);
  HostWeights w = filled(1);
  const Announcement a1 = trainer.stage(1, w);
  auto o = sub.options_for(a1);
  ASSERT_TRUE(o) << o.error().what();
  EXPECT_EQ(o->peer_name, "worker-0");  // the own block under the announcement's transport and endpoint
  EXPECT_EQ(o->params["address"], a1.endpoint["address"]);
  ASSERT_TRUE(sub.use(*o));
  auto got = sub.pull(deadline_in(60s));
  ASSERT_TRUE(got) << got.error().what();
  EXPECT_EQ(got->report.version, 1);
  EXPECT_EQ(got->checksum, a1.checksum);
  EXPECT_EQ(sub.version(), 1);
  expect_holds(sub.held(), w);
  const auto report = to_json(*got);
  EXPECT_EQ(report["version"], 1);
  EXPECT_EQ(report["checksum"], checksum_hex(*a1.checksum));

  perturb(w, 0.01, 2);
  const Announcement a2 = trainer.stage(2, w);
  auto o2 = sub.options_for(a2);
  ASSERT_TRUE(o2);
  ASSERT_TRUE(sub.use(*o2));  // the same block: the same connection, which holds v1 as the delta base
  expect_pulls_delta(sub, a2, w);
}

TEST(StagingSubscriber, ANewBlockStartsFromTheVersionHeldSoItsFirstDeltaApplies) {
  Trainer trainer(PayloadKind::kDelta);
  StagingSubscriber sub(own_block());
  HostWeights w = filled(3);
  const Announcement a1 = trainer.stage(1, w);
  ASSERT_TRUE(sub.use(sub.options_for(a1).value()));
  ASSERT_TRUE(sub.pull(deadline_in(60s)));

  perturb(w, 0.01, 4);
  const Announcement a2 = trainer.stage(2, w);
  auto block = receiver_block(a2);
  block["timeout_ms"] = 30000;  // another block: a new transport subscriber
  ASSERT_TRUE(sub.use(sub.options_for(block).value()));
  expect_pulls_delta(sub, a2, w);  // told it holds v1
}

TEST(StagingSubscriber, AFailedPullKeepsTheVersionHeldBeforeIt) {
  Trainer trainer(PayloadKind::kFull);
  StagingSubscriber sub(own_block());
  HostWeights w = filled(5);
  ASSERT_TRUE(sub.use(sub.options_for(trainer.stage(1, w)).value()));
  ASSERT_TRUE(sub.pull(deadline_in(60s)));

  auto failed = sub.pull(deadline_in(200ms));  // v1 is held; nothing newer is staged
  ASSERT_FALSE(failed);
  EXPECT_EQ(sub.version(), 1);
  expect_holds(sub.held(), w);
}

TEST(StagingSubscriber, PullsIntoACallersSinkAndChecksumsWhatItHolds) {
  Trainer trainer(PayloadKind::kFull);
  StagingSubscriber sub(own_block());
  sub.assume_version(std::nullopt);
  HostWeights w = filled(6);
  const Announcement a = trainer.stage(1, w);
  ASSERT_TRUE(sub.use(sub.options_for(a).value()));
  HostWeights sink(w.specs());
  auto got = sub.pull(sink, deadline_in(60s));
  ASSERT_TRUE(got) << got.error().what();
  EXPECT_EQ(got->checksum, a.checksum);
  EXPECT_TRUE(same_bytes(sink, w));
  EXPECT_TRUE(sub.held().specs().empty());  // the held buffers were not used
}

TEST(StagingSubscriber, ABlockThatCannotBeUsedLeavesNothingToPullFrom) {
  StagingSubscriber sub(own_block());
  EXPECT_FALSE(sub.options_for(nlohmann::json{{"transport", "pigeon"}}));
  Options o = own_block();
  o.transport = "pigeon";
  EXPECT_FALSE(sub.use(o));
  auto got = sub.pull(deadline_in(10ms));
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ErrorCode::kUnavailable);
  EXPECT_EQ(sub.relay_endpoint(), nlohmann::json::object());
}

}  // namespace
}  // namespace arlo::weight_sync
