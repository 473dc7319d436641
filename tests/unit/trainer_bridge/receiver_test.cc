// The receive side of the C ABI (arlo_receiver_*) against real weight_sync publishers: every
// transport, full and delta payloads, the checksum the trainer announces, and what a failed or
// reshaped receive leaves held.
#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "tests/temp_dir.h"
#include "tests/unit/weight_sync/test_util.h"
#include "trainer_bridge/arlo_bridge.h"
#include "weight_sync/wire.h"

namespace {

using namespace arlo::weight_sync;
using namespace arlo::weight_sync::testing;
using namespace std::chrono_literals;
using nlohmann::json;

struct Receiver {
  arlo_receiver* r = nullptr;
  explicit Receiver(const json& block) {
    EXPECT_EQ(arlo_receiver_open(block.dump().c_str(), &r), ARLO_OK) << arlo_bridge_last_error();
  }
  ~Receiver() { EXPECT_EQ(arlo_receiver_close(r), ARLO_OK); }
  json report() const { return json::parse(arlo_receiver_report(r)); }
};

// The receiver's tensors equal `want` (names, dtypes, shapes, bytes, in order).
void expect_holds(const Receiver& rx, const HostWeights& want) {
  const arlo_tensor* t = nullptr;
  std::size_t n = 0;
  ASSERT_EQ(arlo_receiver_tensors(rx.r, &t, &n), ARLO_OK);
  ASSERT_EQ(n, want.specs().size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto& spec = want.specs()[i];
    EXPECT_EQ(t[i].name, spec.name);
    EXPECT_EQ(t[i].dtype, static_cast<int32_t>(spec.dtype)) << spec.name;
    EXPECT_EQ(std::vector<int64_t>(t[i].shape, t[i].shape + t[i].ndim), spec.shape) << spec.name;
    ASSERT_EQ(t[i].nbytes, spec.nbytes()) << spec.name;
    EXPECT_EQ(std::memcmp(t[i].data, want.bytes(i).data(), t[i].nbytes), 0) << spec.name << " differs";
  }
}

class ReceiverOver : public ::testing::TestWithParam<std::string> {
 protected:
  arlo::test_files::TempDir dir{"arlo-rx"};
  Options publisher_options(PayloadKind payload = PayloadKind::kFull) {
    Options o;
    o.transport = GetParam();
    o.params = isolated_params(GetParam(), unique_name("arlo-rx"), dir.path() / "weights");
    o.payload.kind = payload;
    o.bucket_bytes = kTestBucket;
    o.timeout = 60s;
    return o;
  }
  // The block a worker gets: the transport and the publisher's endpoint (as an announcement says).
  static json block_for(const Publisher& pub, const std::string& transport) {
    json b = pub.endpoint();
    b["transport"] = transport;
    b["timeout_ms"] = 60000;
    return b;
  }
  // Publishes `w` as `v` while `rx` receives it.
  static void send(Publisher& pub, arlo::Version v, const HostWeights& w, Receiver& rx) {
    auto published = std::async(std::launch::async, [&] { return pub.publish(v, w, deadline_in(60s)); });
    int64_t got = -1;
    ASSERT_EQ(arlo_receiver_receive(rx.r, 60000, &got), ARLO_OK) << arlo_bridge_last_error();
    auto report = published.get();
    ASSERT_TRUE(report) << report.error().what();
    EXPECT_TRUE(report->all_ok());
    EXPECT_EQ(got, v);
    EXPECT_EQ(arlo_receiver_version(rx.r), v);
  }
};

TEST_P(ReceiverOver, FullThenDeltaArriveWholeWithTheTrainersChecksum) {
  auto pub = Publisher::create(publisher_options(PayloadKind::kDelta));
  ASSERT_TRUE(pub) << pub.error().what();
  Receiver rx(block_for(**pub, GetParam()));
  EXPECT_EQ(arlo_receiver_version(rx.r), -1);
  EXPECT_EQ(rx.report(), json::object());

  HostWeights w = filled(1);
  send(**pub, 1, w, rx);
  expect_holds(rx, w);
  EXPECT_EQ(rx.report()["checksum"], checksum_hex(*weights_checksum(w)));
  EXPECT_EQ(rx.report()["version"], 1);

  perturb(w, 0.01, 2);  // version 2 changes 1% of the elements: a delta on the wire
  send(**pub, 2, w, rx);
  expect_holds(rx, w);
  EXPECT_EQ(rx.report()["checksum"], checksum_hex(*weights_checksum(w)));
  EXPECT_EQ(rx.report()["payload"], "delta");
}

INSTANTIATE_TEST_SUITE_P(Transports, ReceiverOver, ::testing::Values("tcp", "shm", "filesystem"));

class ReceiverTcp : public ReceiverOver {};

// A receive that times out keeps the version held before it; a version whose tensors changed shape
// replaces it whole.
TEST_P(ReceiverTcp, AFailedReceiveKeepsTheVersionHeldAndAReshapedOneReplacesIt) {
  auto pub = Publisher::create(publisher_options());
  ASSERT_TRUE(pub) << pub.error().what();
  Receiver rx(block_for(**pub, GetParam()));
  HostWeights w = filled(3);
  send(**pub, 1, w, rx);

  EXPECT_NE(arlo_receiver_receive(rx.r, 200, nullptr), ARLO_OK);  // nothing is published
  EXPECT_NE(std::string(arlo_bridge_last_error()).find("arlo_receiver_receive"), std::string::npos)
      << arlo_bridge_last_error();
  EXPECT_EQ(arlo_receiver_version(rx.r), 1);
  expect_holds(rx, w);

  std::vector<TensorSpec> specs = w.specs();
  specs[0].shape = {17, 3};                                // reshaped
  specs.push_back({"model.new.f32", DType::F32, {4, 4}});  // added
  specs.erase(specs.begin() + 1);                          // removed
  HostWeights reshaped(specs);
  fill(reshaped, 4);
  send(**pub, 2, reshaped, rx);
  expect_holds(rx, reshaped);
}

INSTANTIATE_TEST_SUITE_P(Tcp, ReceiverTcp, ::testing::Values("tcp"));

TEST(Receiver, BadBlocksAreRefusedWithTheReason) {
  arlo_receiver* r = nullptr;
  EXPECT_EQ(arlo_receiver_open("{not json", &r), ARLO_PARSE);
  EXPECT_EQ(r, nullptr);
  EXPECT_EQ(arlo_receiver_open(R"({"transport": "tcp", "adress": "127.0.0.1:1"})", &r), ARLO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(arlo_bridge_last_error()).find("adress"), std::string::npos) << arlo_bridge_last_error();
  EXPECT_EQ(arlo_receiver_open(R"({"transport": "pigeon"})", &r), ARLO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(arlo_bridge_last_error()).find("pigeon"), std::string::npos) << arlo_bridge_last_error();
  EXPECT_EQ(arlo_receiver_open(nullptr, &r), ARLO_INVALID_ARGUMENT);
  EXPECT_EQ(arlo_receiver_receive(nullptr, 0, nullptr), ARLO_INVALID_ARGUMENT);
  EXPECT_EQ(arlo_receiver_version(nullptr), -1);
  EXPECT_EQ(arlo_receiver_close(nullptr), ARLO_OK);
}

}  // namespace
