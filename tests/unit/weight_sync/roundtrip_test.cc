// Round trips through the real transports (loopback sockets, POSIX shm, files), in one process
// with the publisher and each subscriber on their own threads.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <nlohmann/json.hpp>

#include "testing/fault_injection.h"
#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using namespace testing;

struct Case {
  std::string transport;
  PayloadKind kind;
  bool zstd;
  ApplyMode mode;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& c = info.param;
  return c.transport + "_" + std::string(to_string(c.kind)) + (c.zstd ? "_zstd" : "") +
         (c.mode == ApplyMode::kInPlace ? "_inplace" : "_staging");
}

class Channel {
 public:
  Channel(const std::string& transport, PayloadOptions payload, ApplyMode mode) {
    base_.transport = transport;
    base_.payload = payload;
    base_.bucket_bytes = testing::kTestBucket;
    base_.apply_mode = mode;
    base_.bucket_timeout = 10s;
    dir_ = std::filesystem::temp_directory_path() / unique_name("arlo-ws-rt");
    base_.params = testing::isolated_params(transport, unique_name("rt"), dir_);
    // Only waited for when a link fails; the receiver reconnects at once.
    if (find_transport(transport).value()->option("reconnect_window_ms")) base_.params["reconnect_window_ms"] = 20000;
  }
  ~Channel() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Options publisher_options() const { return base_; }
  Options subscriber_options(const nlohmann::json& endpoint, const std::string& name) const {
    Options o = testing::reaching(base_, endpoint);
    o.peer_name = name;
    return o;
  }
  // A publisher of publisher_options() (with `publisher_tap`) and receiver `name` of it.
  Link connect(const std::string& name, std::shared_ptr<BucketTap> publisher_tap = nullptr) const {
    return testing::connect(base_, subscriber_options(nlohmann::json::object(), name), std::move(publisher_tap));
  }
  Options base_;
  std::filesystem::path dir_;
};

class WeightSyncRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(WeightSyncRoundTrip, TwoVersionsArriveIntact) {
  const Case c = GetParam();
  PayloadOptions payload{c.kind, c.zstd, 0.25};
  Channel ch(c.transport, payload, c.mode);
  auto link = ch.connect("worker-0");
  auto sent = send_two_versions(
      link, 11, 0.01, 20s, [&](Version v, const HostWeights& w, const HostWeights& sink, const Transfer& transfer) {
        const auto& [report, r] = transfer;
        ASSERT_TRUE(report) << report.error().what();
        ASSERT_TRUE(r) << r.error().what();
        EXPECT_TRUE(report->all_ok()) << (report->peers.empty() ? "no peers" : report->peers[0].error);
        EXPECT_EQ(r->version, v);
        EXPECT_EQ(link.sub->version(), std::optional<Version>(v));
        EXPECT_EQ(sink.committed(), std::optional<Version>(v));
        EXPECT_TRUE(same_bytes(sink, expected_after(w, payload))) << "version " << v;
        if (c.kind == PayloadKind::kDelta) {
          EXPECT_EQ(r->payload, v == 1 ? PayloadKind::kFull : PayloadKind::kDelta);
          if (v == 2) {
            EXPECT_LT(r->wire_bytes, w.total_bytes() / 5);
          }
        }
      });
  if (HasFatalFailure()) return;
  // Checksum on demand agrees with the source for lossless payloads.
  if (c.kind == PayloadKind::kFull || c.kind == PayloadKind::kDelta) {
    EXPECT_EQ(link.sub->checksum(sent.sink).value(), weights_checksum(sent.w).value());
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (std::string t : {"tcp", "shm", "filesystem"})
    for (auto k : {PayloadKind::kFull, PayloadKind::kCastBf16, PayloadKind::kCastFp8, PayloadKind::kDelta})
      for (bool z : {false, true})
        for (auto mode : {ApplyMode::kStaging, ApplyMode::kInPlace}) {
          if (z && mode == ApplyMode::kInPlace && k != PayloadKind::kFull) continue;  // keep the matrix small
          out.push_back({t, k, z, mode});
        }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllTransportsAndPayloads, WeightSyncRoundTrip, ::testing::ValuesIn(all_cases()), case_name);

TEST(WeightSyncTcpTopology, StarAndChainDeliverToEveryReceiver) {
  for (bool chain : {false, true}) {
    Channel ch("tcp", {}, ApplyMode::kInPlace);
    Options po = ch.publisher_options();
    po.expected_receivers = chain ? 1 : 3;
    auto pub = Publisher::create(po).value();
    std::vector<std::unique_ptr<Subscriber>> subs;
    nlohmann::json upstream = pub->endpoint();
    for (int k = 0; k < 3; ++k) {
      Options so = ch.subscriber_options(upstream, "worker-" + std::to_string(k));
      if (chain && k < 2) {
        so.relay = true;
        so.params["relay_listen"] = "127.0.0.1:0";
      }
      subs.push_back(Subscriber::create(so).value());
      if (chain) upstream = subs.back()->relay_endpoint();
    }
    HostWeights w = filled(21);
    auto [report, received, sinks] = publish_to_all(*pub, 7, w, subs, 20s);
    ASSERT_TRUE(report) << report.error().what();
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(received[k]) << received[k].error().what();
      EXPECT_TRUE(same_bytes(sinks[k], w));
    }
    ASSERT_EQ(report->peers.size(), 3u);
    for (const auto& p : report->peers) EXPECT_TRUE(p.ok) << p.peer << ": " << p.error;
  }
}

// A receiver that connects and then goes dark (its HELLO never comes) holds no other: the live one is
// served while the dark one's handshake still waits, and the dark one is dropped. (Handshakes one
// after another held the live receiver for the dark one's whole handshake deadline.)
TEST(WeightSyncTcpFaults, AReceiverThatConnectsAndGoesDarkHoldsNoOther) {
  Channel ch("tcp", {}, ApplyMode::kStaging);
  Options po = ch.publisher_options();
  po.expected_receivers = 2;
  po.bucket_timeout = 60s;  // each handshake's deadline
  auto pub = Publisher::create(po).value();
  const std::string address = pub->endpoint().at("address").get<std::string>();
  const auto colon = address.rfind(':');
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket dark(io);  // connects first, then says nothing
  dark.connect({boost::asio::ip::make_address(address.substr(0, colon)),
                static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))});
  std::vector<std::unique_ptr<Subscriber>> subs;
  subs.push_back(Subscriber::create(ch.subscriber_options(pub->endpoint(), "worker-1")).value());
  HostWeights w = filled(5);
  auto [report, received, sinks] = publish_to_all(*pub, 1, w, subs, 20s);  // the live one waits 20 s at most
  ASSERT_TRUE(received[0]) << received[0].error().what();
  EXPECT_TRUE(same_bytes(sinks[0], w));
  ASSERT_TRUE(report) << report.error().what();
  ASSERT_EQ(report->peers.size(), 1u);
  EXPECT_TRUE(report->peers[0].ok) << report->peers[0].error;
}

TEST(WeightSyncTcpFaults, FlippedByteIsRetransmittedNeverApplied) {
  for (auto mode : {ApplyMode::kInPlace, ApplyMode::kStaging}) {
    Channel ch("tcp", {}, mode);
    auto [pub, sub] = ch.connect("w", faults::corrupt_bucket(1));
    HostWeights w = filled(31);
    HostWeights sink(odd_specs());
    auto [report, r] = publish_while_receiving(*pub, 1, w, *sub, sink, 20s);
    ASSERT_TRUE(r) << r.error().what();
    ASSERT_TRUE(report);
    EXPECT_GE(r->retried_buckets, 1u);
    EXPECT_TRUE(same_bytes(sink, w));
  }
}

// Chain with cut-through relays: the relay forwards bytes before it verified them, so a byte flipped
// on the first link reaches the second one too. Both must detect it and resume; both end intact.
TEST(WeightSyncTcpFaults, FlippedByteInAChainIsCaughtAtEveryHop) {
  Channel ch("tcp", {}, ApplyMode::kInPlace);
  auto pub = Publisher::create(ch.publisher_options(), faults::corrupt_bucket(1)).value();
  Options relay_o = ch.subscriber_options(pub->endpoint(), "relay");
  relay_o.relay = true;
  relay_o.params["relay_listen"] = "127.0.0.1:0";
  auto relay = Subscriber::create(relay_o).value();
  auto last = Subscriber::create(ch.subscriber_options(relay->relay_endpoint(), "last")).value();
  HostWeights w = filled(33);
  HostWeights sink_relay(odd_specs()), sink_last(odd_specs());
  auto got_relay = std::async(std::launch::async, [&] { return relay->receive(sink_relay, deadline_in(20s)); });
  auto got_last = std::async(std::launch::async, [&] { return last->receive(sink_last, deadline_in(20s)); });
  auto report = pub->publish(1, w, deadline_in(20s));
  auto r1 = got_relay.get();
  auto r2 = got_last.get();
  ASSERT_TRUE(r1) << r1.error().what();
  ASSERT_TRUE(r2) << r2.error().what();
  ASSERT_TRUE(report) << report.error().what();
  EXPECT_TRUE(report->all_ok());
  EXPECT_GE(r1->retried_buckets, 1u);
  EXPECT_TRUE(same_bytes(sink_relay, w));
  EXPECT_TRUE(same_bytes(sink_last, w));
}

// A publisher on every interface cannot announce 0.0.0.0: it announces advertise_host (where the
// workers reach its host) with the port it bound, and a receiver told that endpoint gets the version.
TEST(WeightSyncTcp, PublisherOnEveryInterfaceAnnouncesTheAdvertisedHost) {
  ::setenv("ARLO_TOKEN", "advertise-test-token", 1);  // off loopback a publisher needs the run's token
  Channel ch("tcp", {}, ApplyMode::kStaging);
  Options o = ch.publisher_options();
  o.params["address"] = "0.0.0.0:0";
  auto unannounceable = Publisher::create(o);
  ASSERT_FALSE(unannounceable);
  EXPECT_NE(unannounceable.error().what().find("weight_sync.advertise_host"), std::string::npos)
      << unannounceable.error().what();
  o.params["advertise_host"] = "127.0.0.1";
  auto pub = Publisher::create(o);
  ASSERT_TRUE(pub) << pub.error().what();
  const auto address = (*pub)->endpoint().value("address", "");
  EXPECT_TRUE(address.starts_with("127.0.0.1:")) << address;
  EXPECT_NE(address, "127.0.0.1:0");
  auto sub = Subscriber::create(ch.subscriber_options((*pub)->endpoint(), "w")).value();
  HostWeights w(odd_specs()), sink(odd_specs());
  fill(w, 5);
  auto [report, r] = publish_while_receiving(**pub, 1, w, *sub, sink, 20s);
  ::unsetenv("ARLO_TOKEN");
  ASSERT_TRUE(report) << report.error().what();
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_TRUE(same_bytes(sink, w));
}

TEST(WeightSyncShmFaults, FlippedByteIsReportedAndPreviousVersionKept) {
  Channel ch("shm", {}, ApplyMode::kStaging);
  auto [pub, sub] = ch.connect("w", faults::corrupt_bucket(1));
  auto sent = send_second_version(*pub, *sub, 41, 20s);
  const auto& [report, r] = sent.transfer;
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("bucket 1"), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("checksum"), std::string::npos) << r.error().what();
  ASSERT_TRUE(report);
  ASSERT_EQ(report->peers.size(), 1u);
  EXPECT_FALSE(report->peers[0].ok);
  EXPECT_NE(report->peers[0].error.find("bucket 1"), std::string::npos);
  EXPECT_TRUE(same_bytes(sent.sink, sent.v1));
  EXPECT_EQ(sub->version(), std::optional<Version>(1));
}

// shm in place with `full`: the ring by default, process_vm_readv on request, the bucket slots when
// either is switched off or the receiver stages. Each path delivers intact bytes and says which it took.
TEST(WeightSyncShmPaths, RingDirectReadAndSlotsEachDeliver) {
  struct PathCase {
    ApplyMode mode;
    bool direct_read;
    const char* expect;
  };
  for (const auto& pc :
       {PathCase{ApplyMode::kInPlace, false, "shm ring"}, PathCase{ApplyMode::kInPlace, true, "shm direct read"},
        PathCase{ApplyMode::kStaging, false, "shm slots"}, PathCase{ApplyMode::kStaging, true, "shm slots"}}) {
    Channel ch("shm", {}, pc.mode);
    ch.base_.params["direct_read"] = pc.direct_read;
    auto link = ch.connect("w");
    send_two_versions(link, 91, 0.3, 20s,
                      [&](Version v, const HostWeights& w, const HostWeights& sink, const Transfer& transfer) {
                        const auto& [report, r] = transfer;
                        ASSERT_TRUE(r) << pc.expect << ": " << r.error().what();
                        ASSERT_TRUE(report && report->all_ok()) << pc.expect;
                        EXPECT_EQ(r->path, pc.expect);
                        std::uint64_t model_bytes = 0;
                        for (const auto& spec : w.specs()) model_bytes += spec.nbytes();
                        EXPECT_EQ(r->wire_bytes, model_bytes) << pc.expect;  // full payload: every byte once
                        EXPECT_TRUE(same_bytes(sink, w)) << pc.expect << " version " << v;
                      });
    if (HasFatalFailure()) return;
  }
}

// In place, a bucket that does not verify is never committed: the sink is discarded and the
// subscriber holds no version, on the ring and on the direct-read path alike.
TEST(WeightSyncShmFaults, FlippedByteInPlaceDiscardsNeverCommits) {
  for (bool direct_read : {false, true}) {
    Channel ch("shm", {}, ApplyMode::kInPlace);
    ch.base_.params["direct_read"] = direct_read;
    auto [pub, sub] = ch.connect("w", faults::corrupt_bucket(1));
    auto sent = send_second_version(*pub, *sub, 43, 20s);
    const auto& [report, r] = sent.transfer;
    ASSERT_FALSE(r) << "direct_read " << direct_read;
    EXPECT_NE(r.error().what().find("bucket 1"), std::string::npos) << r.error().what();
    EXPECT_NE(r.error().what().find("checksum"), std::string::npos) << r.error().what();
    ASSERT_TRUE(report);
    ASSERT_EQ(report->peers.size(), 1u);
    EXPECT_FALSE(report->peers[0].ok);
    EXPECT_FALSE(sent.sink.committed().has_value());
    EXPECT_FALSE(sub->version().has_value());
  }
}

// Three receivers share one ring: the publisher waits for the slowest; all get every byte.
TEST(WeightSyncShmPaths, RingServesSeveralReceivers) {
  Channel ch("shm", {}, ApplyMode::kInPlace);
  Options po = ch.publisher_options();
  po.expected_receivers = 3;
  auto pub = Publisher::create(po).value();
  std::vector<std::unique_ptr<Subscriber>> subs;
  for (int k = 0; k < 3; ++k)
    subs.push_back(Subscriber::create(ch.subscriber_options(pub->endpoint(), "w" + std::to_string(k))).value());
  HostWeights w = filled(95);
  auto [report, received, sinks] = publish_to_all(*pub, 1, w, subs, 20s);
  ASSERT_TRUE(report) << report.error().what();
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(received[k]) << received[k].error().what();
    EXPECT_EQ(received[k]->path, "shm ring");
    EXPECT_TRUE(same_bytes(sinks[k], w));
  }
  EXPECT_TRUE(report->all_ok());
}

TEST(WeightSyncFilesystemFaults, FlippedByteInShardRefusedPreviousKept) {
  Channel ch("filesystem", {}, ApplyMode::kInPlace);
  auto [pub, sub] = ch.connect("w");
  HostWeights w = filled(51);
  HostWeights sink(odd_specs());
  ASSERT_TRUE(pub->publish(1, w, deadline_in(10s)));
  ASSERT_TRUE(sub->receive(sink, deadline_in(10s)));
  HostWeights v1 = copy_of(sink);
  testing::perturb(w, 0.5, 52);
  ASSERT_TRUE(pub->publish(2, w, deadline_in(10s)));
  const auto shard = ch.dir_ / "v2" / "model-00001-of-00002.safetensors";
  ASSERT_TRUE(std::filesystem::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(shard) - 100));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x5A;
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(shard) - 100));
    f.write(&c, 1);
  }
  auto r = sub->receive(sink, deadline_in(5s));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("checksum"), std::string::npos) << r.error().what();
  EXPECT_TRUE(same_bytes(sink, v1));
  EXPECT_EQ(sub->version(), std::optional<Version>(1));
}

// A manifest names shards by file; a name that leaves the version directory, or a tensor index the
// manifest lacks, is refused before any byte is read (the shard outside is a valid copy: without
// the check it would be applied).
TEST(WeightSyncFilesystemFaults, ManifestShardsOutsideTheVersionOrOutOfRangeAreRefused) {
  namespace fs = std::filesystem;
  Channel ch("filesystem", {}, ApplyMode::kInPlace);
  auto pub = Publisher::create(ch.publisher_options()).value();
  HostWeights w = filled(81);
  ASSERT_TRUE(pub->publish(1, w, deadline_in(10s)));
  const auto manifest = ch.dir_ / "v1" / "manifest.json";
  const auto original = nlohmann::json::parse(std::ifstream(manifest));
  fs::copy_file(ch.dir_ / "v1" / "model-00001-of-00002.safetensors", ch.dir_ / "outside.safetensors");
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
      {"not a plain file name", [](nlohmann::json& m) { m["shards"][0]["file"] = "../outside.safetensors"; }},
      {"not a plain file name",
       [&](nlohmann::json& m) { m["shards"][0]["file"] = (ch.dir_ / "outside.safetensors").string(); }},
      {"not one of the manifest's", [](nlohmann::json& m) { m["shards"][0]["tensors"].push_back(999); }},
      {"\"shards\" is missing", [](nlohmann::json& m) { m.erase("shards"); }},
      {"expected {", [](nlohmann::json& m) { m["shards"][0].erase("checksum"); }},
  };
  for (const auto& [expected, tamper] : cases) {
    auto m = original;
    tamper(m);
    std::ofstream(manifest, std::ios::trunc) << m.dump();
    auto sub = Subscriber::create(ch.subscriber_options(pub->endpoint(), "w")).value();
    HostWeights sink(odd_specs());
    auto r = sub->receive(sink, deadline_in(5s));
    ASSERT_FALSE(r) << expected;
    EXPECT_NE(r.error().what().find(expected), std::string::npos) << r.error().what();
    EXPECT_NE(r.error().what().find("manifest.json"), std::string::npos) << r.error().what();
    EXPECT_FALSE(sub->version().has_value());
  }
}

TEST(WeightSyncFilesystemLayout, HfShardsIndexManifestStableAndRetention) {
  Channel ch("filesystem", {}, ApplyMode::kInPlace);
  auto pub = Publisher::create(ch.publisher_options()).value();
  HostWeights w = filled(61);
  for (Version v = 1; v <= 4; ++v) ASSERT_TRUE(pub->publish(v, w, deadline_in(10s)));
  namespace fs = std::filesystem;
  EXPECT_FALSE(fs::exists(ch.dir_ / "v1"));
  EXPECT_FALSE(fs::exists(ch.dir_ / "v2"));
  for (const char* f : {"STABLE", "manifest.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                        "model-00002-of-00002.safetensors"})
    EXPECT_TRUE(fs::exists(ch.dir_ / "v4" / f)) << f;
  // Every shard is a valid safetensors file holding its tensors.
  auto file = safetensors::File::open(ch.dir_ / "v4" / "model-00001-of-00002.safetensors").value();
  EXPECT_TRUE(file.data("model.big.f32").has_value());
}

TEST(WeightSyncFilesystemLeases, LeasedVersionIsNeverRemoved) {
  Channel ch("filesystem", {}, ApplyMode::kInPlace);
  auto pub = Publisher::create(ch.publisher_options()).value();
  HostWeights w = filled(71);
  ASSERT_TRUE(pub->publish(1, w, deadline_in(10s)));
  // Hold a lease on v1 the way a reader does (flock on a file in .leases).
  const auto lease = ch.dir_ / "v1" / ".leases" / "test-holder";
  int fd = ::open(lease.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  for (Version v = 2; v <= 4; ++v) ASSERT_TRUE(pub->publish(v, w, deadline_in(10s)));
  EXPECT_TRUE(std::filesystem::exists(ch.dir_ / "v1" / "STABLE"));
  EXPECT_FALSE(std::filesystem::exists(ch.dir_ / "v2"));
  ::close(fd);  // lease released: the next publish retires v1
  ASSERT_TRUE(pub->publish(5, w, deadline_in(10s)));
  EXPECT_FALSE(std::filesystem::exists(ch.dir_ / "v1"));
}

class WeightSyncMismatch : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightSyncMismatch, ManifestRefusedBeforeAnyByteMoves) {
  Channel ch(GetParam(), {}, ApplyMode::kInPlace);
  auto [pub, sub] = ch.connect("w");
  HostWeights w = filled(81);
  auto other = odd_specs();
  other[2].shape = {130};  // one tensor differs
  HostWeights sink(other);
  auto [report, r] = publish_while_receiving(*pub, 1, w, *sub, sink, 10s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kMismatch) << r.error().what();
  EXPECT_NE(r.error().what().find("model.w.f16"), std::string::npos) << r.error().what();
  for (std::size_t t = 0; t < other.size(); ++t)
    for (auto b : sink.bytes(t)) ASSERT_EQ(b, std::byte{0});
  EXPECT_FALSE(sub->version().has_value());
  if (GetParam() != "filesystem") {
    ASSERT_TRUE(report) << report.error().what();
    ASSERT_FALSE(report->peers.empty());
    EXPECT_FALSE(report->peers[0].ok);
    EXPECT_NE(report->peers[0].error.find("refused"), std::string::npos) << report->peers[0].error;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransports, WeightSyncMismatch, ::testing::Values("tcp", "shm", "filesystem"));

TEST(WeightSyncRegistry, UnknownTransportIsAClearError) {
  Options o;
  o.transport = "carrier-pigeon";
  auto p = Publisher::create(o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what().find("known"), std::string::npos) << p.error().what();
}

}  // namespace
}  // namespace arlo::weight_sync
