// Conformance: every registered transport (weight_sync::transports(), not a list kept here) meets
// the same contract through Publisher / Subscriber / StagingPublisher, over real sockets, shared
// memory and files. Expectations follow the descriptor's capabilities (durable or streamed), never
// its name. A receiver killed mid-stream: tests/integration/weight_sync/kill_test.cc (every
// streaming transport).
#include <gtest/gtest.h>

#include <filesystem>
#include <future>

#include "testing/fault_injection.h"
#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/staging.h"
#include "weight_sync/transport.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using namespace testing;

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / testing::unique_name("arlo-ws-conf");
    shm_ = testing::unique_name("conf");
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const TransportDescriptor& descriptor() const { return *find_transport(GetParam()).value(); }
  bool durable() const { return descriptor().capabilities.durable; }

  Options publisher(PayloadKind kind = PayloadKind::kFull, std::size_t expected = 1) const {
    Options o;
    o.transport = GetParam();
    o.bucket_bytes = testing::kTestBucket;
    o.bucket_timeout = 10s;
    o.timeout = 60s;
    o.payload.kind = kind;
    o.expected_receivers = expected;
    o.params = testing::isolated_params(GetParam(), shm_, dir_);
    return o;
  }
  Options receiver(const nlohmann::json& endpoint, const std::string& name,
                   PayloadKind kind = PayloadKind::kFull) const {
    Options o;
    o.transport = GetParam();
    o.bucket_bytes = testing::kTestBucket;
    o.bucket_timeout = 10s;
    o.payload.kind = kind;
    o.peer_name = name;
    return testing::reaching(o, endpoint);
  }
  // A publisher of `kind` that expects `expected` receivers, and receiver `name` of it.
  Link connected(const std::string& name, PayloadKind kind = PayloadKind::kFull, std::size_t expected = 1) const {
    return connect(publisher(kind, expected), receiver(nlohmann::json::object(), name, kind));
  }

  std::filesystem::path dir_;
  std::string shm_;
};

TEST_P(Conformance, RoundTripPerPayload) {
  for (auto kind : {PayloadKind::kFull, PayloadKind::kCastBf16, PayloadKind::kCastFp8, PayloadKind::kDelta}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    shm_ = testing::unique_name("conf");
    dir_ = std::filesystem::temp_directory_path() / testing::unique_name("arlo-ws-conf");
    auto link = connected("w", kind);
    send_two_versions(link, 11, 0.01, 30s,
                      [&](Version v, const HostWeights& w, const HostWeights& sink, const Transfer& transfer) {
                        const auto& [report, r] = transfer;
                        ASSERT_TRUE(report) << report.error().what();
                        ASSERT_TRUE(r) << r.error().what();
                        EXPECT_TRUE(report->all_ok());
                        EXPECT_EQ(r->version, v);
                        EXPECT_TRUE(same_bytes(sink, expected_after(w, {kind, false, 0.25})));
                        if (kind == PayloadKind::kDelta && v == 2 && !durable()) {
                          EXPECT_EQ(r->payload, PayloadKind::kDelta);
                        }
                      });
    if (HasFatalFailure()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

// Two receivers expected, one comes: it is served without waiting out the deadline, and the one
// that never came is not a failure of the version.
TEST_P(Conformance, ReceiverThatNeverConnectsHoldsNobody) {
  auto [pub, sub] = connected("only", PayloadKind::kFull, 2);
  HostWeights w = filled(21);
  HostWeights sink(odd_specs());
  for (Version v : {1, 2}) {
    testing::perturb(w, 0.1, 20 + v);
    const auto t0 = Clock::now();
    auto [report, r] = publish_while_receiving(*pub, v, w, *sub, sink, 60s);
    ASSERT_TRUE(report) << report.error().what();
    ASSERT_TRUE(r) << r.error().what();
    EXPECT_LT(Clock::now() - t0, 20s) << "waited for the receiver that never came";
    EXPECT_TRUE(report->all_ok());
    EXPECT_TRUE(same_bytes(sink, w));
  }
}

// A receiver that starts after version 1 went out: a durable transport still has v1 for it; a
// streamed one serves it the next version (while the first receiver gets it too).
TEST_P(Conformance, LateJoiner) {
  auto [pub, first] = connected("first", PayloadKind::kFull, 2);
  HostWeights w = filled(31);
  HostWeights sink1(odd_specs());
  {
    auto [published, received] = publish_while_receiving(*pub, 1, w, *first, sink1, 30s);
    ASSERT_TRUE(published);
    ASSERT_TRUE(received);
  }
  auto late = Subscriber::create(receiver(pub->endpoint(), "late")).value();
  HostWeights sink2(odd_specs());
  if (durable()) {
    ASSERT_NO_FATAL_FAILURE(expect_receives(*late, sink2, 1, w));
  }
  testing::perturb(w, 0.2, 32);
  auto got1 = std::async(std::launch::async, [&] { return first->receive(sink1, deadline_in(30s)); });
  auto [report, r2] = publish_while_receiving(*pub, 2, w, *late, sink2, 30s);
  ASSERT_TRUE(report) << report.error().what();
  auto r1 = got1.get();
  ASSERT_TRUE(r1) << r1.error().what();
  ASSERT_TRUE(r2) << r2.error().what();
  EXPECT_EQ(r1->version, 2u);
  EXPECT_EQ(r2->version, 2u);
  EXPECT_TRUE(same_bytes(sink1, w));
  EXPECT_TRUE(same_bytes(sink2, w));
}

// Versions staged while nobody pulls: the receiver that comes gets the newest, never an older one.
TEST_P(Conformance, SupersededVersionIsNotReceived) {
  auto pub = StagingPublisher::create(publisher(), nullptr).value();
  HostWeights w(odd_specs());
  for (Version v = 1; v <= 3; ++v) {
    fill(w, 40 + v);
    ASSERT_TRUE(pub->stage(v, w));
  }
  ASSERT_TRUE(pub->flush(deadline_in(30s)));
  expect_new_receiver_gets(receiver(pub->endpoint(), "w"), 3, w);
}

// One byte flipped on the way (a publisher with faults::corrupt_bucket): the receiver ends with the
// right weights (the bucket came again) or with a clear error and its previous version; never wrong
// weights. A transport that shows its buckets to no tap (files) sends them intact.
TEST_P(Conformance, FlippedByteNeverYieldsWrongWeights) {
  auto pub = Publisher::create(publisher(), faults::corrupt_bucket(1)).value();
  auto sub = Subscriber::create(receiver(pub->endpoint(), "w")).value();
  auto sent = send_second_version(*pub, *sub, 51, 30s);
  const auto& r = sent.transfer.received;
  if (r) {
    EXPECT_EQ(r->version, 2u);
    EXPECT_TRUE(same_bytes(sent.sink, sent.v2));
    EXPECT_EQ(sub->version(), std::optional<Version>(2));
  } else {
    const std::string why = r.error().what();
    EXPECT_TRUE(why.find("checksum") != std::string::npos && why.find("bucket") != std::string::npos) << why;
    EXPECT_TRUE(same_bytes(sent.sink, sent.v1)) << why;
    EXPECT_EQ(sub->version(), std::optional<Version>(1));
  }
  ASSERT_TRUE(sent.transfer.published) << sent.transfer.published.error().what();
}

// The publisher goes away and a new one takes its endpoint: the receiver it served before gets the
// new one's version.
TEST_P(Conformance, PublisherRestartedWithTheSameEndpoint) {
  HostWeights w = filled(61);
  HostWeights sink(odd_specs());
  nlohmann::json endpoint;
  std::unique_ptr<Subscriber> sub;
  {
    auto pub = Publisher::create(publisher()).value();
    endpoint = pub->endpoint();
    sub = Subscriber::create(receiver(endpoint, "w")).value();
    auto [published, received] = publish_while_receiving(*pub, 1, w, *sub, sink, 30s);
    ASSERT_TRUE(published);
    ASSERT_TRUE(received);
  }
  Options again = publisher();
  for (const auto& [k, v] : endpoint.items()) again.params[k] = v;  // the same endpoint (tcp: the same port)
  auto pub = Publisher::create(again).value();
  EXPECT_EQ(pub->endpoint(), endpoint);
  testing::perturb(w, 0.3, 62);
  auto [report, r] = publish_while_receiving(*pub, 2, w, *sub, sink, 30s);
  ASSERT_TRUE(report) << report.error().what();
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_EQ(r->version, 2u);
  EXPECT_TRUE(same_bytes(sink, w));
}

// Collective transports (nccl) deliver only to a group the orchestrator forms; their contract is
// tested in tests/unit/nccl_transport.
std::vector<std::string> registered() {
  std::vector<std::string> out;
  for (const auto& d : transports())
    if (!d.capabilities.collective) out.push_back(d.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Registered, Conformance, ::testing::ValuesIn(registered()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace arlo::weight_sync
