// The StagingPublisher over the real registered transports (loopback sockets, POSIX shm, files):
// stage() returns with nobody listening, announcements, receivers that never come, superseded
// versions, late joiners, deltas from a held base, flush. Expectations follow each descriptor's
// capabilities (durable or streamed), never its name.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/staging.h"
#include "weight_sync/transport.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// One staging publisher and the announcements it made. `hold(v)` makes the announce callback of
// version v wait until release() (the publisher thread is busy meanwhile), so a test can stage
// more versions while it is, without sleeps.
class Rig {
 public:
  explicit Rig(const std::string& transport, PayloadKind kind = PayloadKind::kFull, std::size_t expected = 1) {
    dir_ = std::filesystem::temp_directory_path() / testing::unique_name("arlo-ws-staging");
    options.transport = transport;
    options.bucket_bytes = testing::kTestBucket;
    options.bucket_timeout = 10s;
    options.timeout = 60s;
    options.payload.kind = kind;
    options.expected_receivers = expected;
    options.params = testing::isolated_params(transport, testing::unique_name("st"), dir_);
  }
  ~Rig() {
    pub.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void start() {
    pub = StagingPublisher::create(options, [this](const Announcement& a) {
            std::unique_lock l(mu_);
            announced_.push_back(a);
            cv_.notify_all();
            if (hold_ && *hold_ == a.version) cv_.wait_until(l, Clock::now() + 30s, [&] { return released_; });
            if (refuse_ && *refuse_ == a.version)
              return Status(make_error(ErrorCode::kIo, "writing the version notice: No space left on device"));
            return ok();
          }).value();
  }
  void hold(Version v) {
    std::lock_guard l(mu_);
    hold_ = v;
  }
  // The announcement of version v fails (its notice cannot be written).
  void refuse(Version v) {
    std::lock_guard l(mu_);
    refuse_ = v;
  }
  void release() {
    std::lock_guard l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // Waits until version v was announced (or 30 s).
  bool wait_announced(Version v) {
    std::unique_lock l(mu_);
    return cv_.wait_until(l, Clock::now() + 30s, [&] { return !announced_.empty() && announced_.back().version >= v; });
  }
  std::vector<Announcement> announced() {
    std::lock_guard l(mu_);
    return announced_;
  }
  // The publisher's report of version v, polled for (it lands just after the receiver is done).
  std::optional<PublishReport> report_of(Version v) const {
    const auto until = Clock::now() + 30s;
    while (Clock::now() < until) {
      auto r = pub->last_report();
      if (r && r->version >= v) return r;
      std::this_thread::sleep_for(5ms);
    }
    return pub->last_report();
  }

  // Receiver options that reach the publisher: its endpoint and nothing else of the publisher's.
  Options receiver(const std::string& name) const {
    Options r;
    r.transport = options.transport;
    r.bucket_bytes = options.bucket_bytes;
    r.bucket_timeout = options.bucket_timeout;
    r.payload = options.payload;
    r.peer_name = name;
    return testing::reaching(r, pub->endpoint());
  }
  bool durable() const { return find_transport(options.transport).value()->capabilities.durable; }
  const std::filesystem::path& dir() const { return dir_; }

  Options options;
  std::unique_ptr<StagingPublisher> pub;

 private:
  std::filesystem::path dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Announcement> announced_;
  std::optional<Version> hold_;
  std::optional<Version> refuse_;
  bool released_ = false;
};

std::uint64_t model_bytes(const HostWeights& w) {
  std::uint64_t n = 0;
  for (const auto& spec : w.specs()) n += spec.nbytes();
  return n;
}

// Collective transports (nccl) deliver only to a group the orchestrator forms (tests/unit/nccl_transport).
std::vector<std::string> all_transports() {
  std::vector<std::string> out;
  for (const auto& d : transports())
    if (!d.capabilities.collective) out.push_back(d.name);
  return out;
}

class StagingPublisherTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StagingPublisherTest, StageReturnsWithoutAnyReceiverAndAnnouncesWhatWasStaged) {
  Rig rig(GetParam());
  rig.start();
  HostWeights w(odd_specs());
  std::map<Version, std::uint64_t> sums;
  const auto t0 = Clock::now();
  for (Version v = 1; v <= 4; ++v) {
    fill(w, 100 + v);
    sums[v] = weights_checksum(w).value();
    auto staged = rig.pub->stage(v, w);
    ASSERT_TRUE(staged) << staged.error().what();
    EXPECT_EQ(staged->version, v);
    EXPECT_EQ(staged->bytes, model_bytes(w));
    EXPECT_GE(staged->copy_seconds, 0.0);
  }
  // Nobody listens: a stage that waited for receivers would take a bucket timeout (10 s) or more.
  EXPECT_LT(Clock::now() - t0, 5s);
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  const auto got = rig.announced();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().version, 4u);
  for (std::size_t k = 0; k < got.size(); ++k) {
    const auto& a = got[k];
    if (k > 0) {
      EXPECT_GT(a.version, got[k - 1].version) << "announcements in increasing version order";
    }
    EXPECT_EQ(a.transport, GetParam());
    EXPECT_EQ(a.endpoint, rig.pub->endpoint());
    EXPECT_EQ(a.payload, PayloadKind::kFull);
    EXPECT_EQ(a.tensors, odd_specs().size());
    EXPECT_EQ(a.bytes, model_bytes(w));
    ASSERT_TRUE(a.checksum.has_value());
    EXPECT_EQ(*a.checksum, sums.at(a.version)) << "version " << a.version;
    // The one wire form round-trips.
    auto back = parse_announcement(to_json(a));
    ASSERT_TRUE(back) << back.error().what();
    EXPECT_EQ(back->checksum, a.checksum);
  }
  // Versions must increase.
  auto again = rig.pub->stage(4, w);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().what().find("increase"), std::string::npos) << again.error().what();
}

TEST_P(StagingPublisherTest, SupersededVersionIsNeverSent) {
  Rig rig(GetParam());
  rig.options.keep_last = 8;  // room for every version: only "superseded" can keep one from going out
  rig.start();
  rig.hold(1);  // the publisher thread is busy announcing v1 while v2..v4 are staged
  HostWeights w = filled(1);
  ASSERT_TRUE(rig.pub->stage(1, w));
  ASSERT_TRUE(rig.wait_announced(1));
  for (Version v = 2; v <= 4; ++v) {
    fill(w, v);
    ASSERT_TRUE(rig.pub->stage(v, w));
  }
  rig.release();
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  std::vector<Version> versions;
  for (const auto& a : rig.announced()) versions.push_back(a.version);
  EXPECT_EQ(versions, (std::vector<Version>{1, 4}));

  ASSERT_NO_FATAL_FAILURE(expect_new_receiver_gets(rig.receiver("late"), 4, w));
  if (rig.durable()) {
    // Superseded versions were never written.
    EXPECT_FALSE(std::filesystem::exists(rig.dir() / "v2"));
    EXPECT_FALSE(std::filesystem::exists(rig.dir() / "v3"));
    EXPECT_TRUE(std::filesystem::exists(rig.dir() / "v4" / "STABLE"));
  }
  auto report = rig.report_of(4);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->version, 4u);
}

TEST_P(StagingPublisherTest, LateJoinerGetsTheNewestVersion) {
  Rig rig(GetParam());
  rig.start();
  HostWeights w(odd_specs());
  auto first = Subscriber::create(rig.receiver("first")).value();
  HostWeights sink1(odd_specs());
  for (Version v = 1; v <= 2; ++v) {
    fill(w, 200 + v);
    ASSERT_TRUE(rig.pub->stage(v, w));
    ASSERT_NO_FATAL_FAILURE(expect_receives(*first, sink1, v, w));
  }
  // A receiver that comes now, or one that restarted (a fresh subscriber), gets v2.
  for (const char* name : {"late", "first"}) {
    SCOPED_TRACE(name);
    ASSERT_NO_FATAL_FAILURE(expect_new_receiver_gets(rig.receiver(name), 2, w));
  }
}

TEST_P(StagingPublisherTest, DeltaFromTheHeldBaseAndFullForAReceiverWithout) {
  Rig rig(GetParam(), PayloadKind::kDelta);
  rig.start();
  HostWeights w = filled(300);
  // v0: every receiver starts from the same weights (a shared seed): announced, nothing moves.
  ASSERT_TRUE(rig.pub->stage_held(0, w));
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  ASSERT_EQ(rig.announced().size(), 1u);
  EXPECT_EQ(rig.announced()[0].version, 0u);
  EXPECT_EQ(rig.announced()[0].checksum, weights_checksum(w).value());

  auto sub = Subscriber::create(rig.receiver("holder")).value();
  HostWeights sink = copy_of(w);
  ASSERT_TRUE(sink.commit(0));
  sub->assume_version(0);
  testing::perturb(w, 0.01, 301);
  ASSERT_TRUE(rig.pub->stage(1, w));
  auto r = sub->receive(sink, deadline_in(30s));
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_EQ(r->version, 1u);
  EXPECT_TRUE(same_bytes(sink, w));
  if (!rig.durable()) {
    // Streamed: the delta itself went over the wire. (A durable transport writes shards for
    // anyone plus the delta payload; its receiver reads one or the other.)
    EXPECT_EQ(r->payload, PayloadKind::kDelta);
    EXPECT_LT(r->wire_bytes, w.total_bytes() / 5);
  }

  // A receiver holding nothing gets v1 in full.
  expect_new_receiver_gets(rig.receiver("fresh"), 1, w);
}

TEST_P(StagingPublisherTest, HeldVersionReachesAReceiverThatAsks) {
  Rig rig(GetParam());
  rig.start();
  HostWeights w = filled(400);
  ASSERT_TRUE(rig.pub->stage_held(0, w));
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  expect_new_receiver_gets(rig.receiver("new"), 0, w);
}

TEST_P(StagingPublisherTest, FlushWaitsForTheNewestAndSaysWhenItIsLate) {
  Rig rig(GetParam());
  rig.start();
  ASSERT_TRUE(rig.pub->flush(deadline_in(1s)));  // nothing staged
  rig.hold(1);
  HostWeights w = filled(500);
  ASSERT_TRUE(rig.pub->stage(1, w));
  ASSERT_TRUE(rig.wait_announced(1));
  ASSERT_TRUE(rig.pub->stage(2, w));
  auto late = rig.pub->flush(deadline_in(200ms));  // the thread is held in v1's announcement
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code(), ErrorCode::kTimeout);
  EXPECT_NE(late.error().what().find("version 2"), std::string::npos) << late.error().what();
  rig.release();
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  EXPECT_EQ(rig.announced().back().version, 2u);
}

// An announcement that fails leaves its version unpublished: flush() and failure() say so with the
// reason (a trainer stops on it: the orchestrator would wait for that version in vain).
TEST_P(StagingPublisherTest, AFailedAnnouncementIsAFailureToPublish) {
  Rig rig(GetParam());
  rig.refuse(2);
  rig.start();
  HostWeights w = filled(500);
  ASSERT_TRUE(rig.pub->stage(1, w));
  ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
  EXPECT_TRUE(rig.pub->failure());
  ASSERT_TRUE(rig.pub->stage(2, w));
  auto flushed = rig.pub->flush(deadline_in(30s));
  ASSERT_FALSE(flushed);
  EXPECT_NE(flushed.error().what().find("version 2 was not published"), std::string::npos) << flushed.error().what();
  EXPECT_NE(flushed.error().what().find("No space left on device"), std::string::npos) << flushed.error().what();
  auto failed = rig.pub->failure();
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
  EXPECT_NE(failed.error().what().find("announcing version 2"), std::string::npos) << failed.error().what();
}

INSTANTIATE_TEST_SUITE_P(Registered, StagingPublisherTest, ::testing::ValuesIn(all_transports()),
                         [](const auto& info) { return info.param; });

// Streaming transports: two receivers expected, only one ever comes; it gets every version.
TEST(StagingPublisherStreaming, ReceiverThatNeverComesHoldsNobody) {
  for (const auto& d : transports()) {
    if (d.capabilities.durable || d.capabilities.collective) continue;
    SCOPED_TRACE(d.name);
    Rig rig(d.name, PayloadKind::kFull, /*expected=*/2);
    rig.start();
    auto sub = Subscriber::create(rig.receiver("only")).value();
    HostWeights w(odd_specs());
    HostWeights sink(odd_specs());
    const auto t0 = Clock::now();
    for (Version v = 1; v <= 3; ++v) {
      fill(w, 600 + v);
      ASSERT_TRUE(rig.pub->stage(v, w));
      ASSERT_NO_FATAL_FAILURE(expect_receives(*sub, sink, v, w));
      auto report = rig.report_of(v);
      ASSERT_TRUE(report.has_value());
      EXPECT_EQ(report->version, v);
      for (const auto& p : report->peers) EXPECT_TRUE(p.ok) << p.peer << ": " << p.error;
    }
    // Waiting a bucket timeout (10 s) per version for the absent one would take 30 s.
    EXPECT_LT(Clock::now() - t0, 20s);
  }
}

// The destructor ends the publisher thread while a version is being served to nobody.
TEST(StagingPublisherLifecycle, DestroyedWhileServingReturnsPromptly) {
  for (const auto& d : transports()) {
    if (d.capabilities.collective) continue;  // needs a GPU library to start (tests/unit/nccl_transport)
    SCOPED_TRACE(d.name);
    Rig rig(d.name);
    rig.start();
    HostWeights w = filled(700);
    ASSERT_TRUE(rig.pub->stage(1, w));
    ASSERT_TRUE(rig.pub->flush(deadline_in(30s)));
    const auto t0 = Clock::now();
    rig.pub.reset();
    EXPECT_LT(Clock::now() - t0, 5s);
  }
}

}  // namespace
}  // namespace arlo::weight_sync
