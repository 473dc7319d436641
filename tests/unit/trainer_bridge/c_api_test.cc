// The C ABI (libarlo_bridge.so) against a real orchestrator side, and publishing through a real
// weight_sync filesystem transport that a weight_sync subscriber then receives.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>

#include "tests/temp_dir.h"
#include "trainer_bridge/arlo_bridge.h"
#include "trainer_bridge/bridge.h"
#include "trainer_bridge/server_thread.h"
#include "weight_sync/weight_sync.h"
#include "weight_sync/wire.h"

namespace {

namespace fs = std::filesystem;
using namespace arlo::bridge;
using namespace std::chrono_literals;

TEST(CApi, BadConfigIsAnErrorWithAMessage) {
  arlo_bridge* b = nullptr;
  EXPECT_EQ(arlo_bridge_connect("{not json", &b), ARLO_PARSE);
  EXPECT_NE(std::strlen(arlo_bridge_last_error()), 0u);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(arlo_bridge_connect(R"({"transport":"dir","run_dirr":"/tmp/x"})", &b), ARLO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(arlo_bridge_last_error()).find("run_dirr"), std::string::npos);
  EXPECT_EQ(arlo_bridge_connect(R"({"transport":"pigeon"})", &b), ARLO_INVALID_ARGUMENT);
  EXPECT_EQ(arlo_bridge_connect(R"({"transport":"socket","port":"x"})", &b), ARLO_INVALID_ARGUMENT);
  EXPECT_EQ(arlo_bridge_next_batch(nullptr, 0, nullptr), ARLO_INVALID_ARGUMENT);
  EXPECT_EQ(arlo_bridge_abi_version(), ARLO_BRIDGE_ABI_VERSION);
}

// The socket config's "host" may be a name: resolved on every connection attempt; one that does
// not resolve is retried, and the wait for a batch names it and the config key it came from.
TEST(CApi, SocketHostNameThatDoesNotResolveIsNamedAndRetried) {
  arlo_bridge* b = nullptr;
  ASSERT_EQ(arlo_bridge_connect(R"({"transport":"socket","host":"no-such-host.invalid","port":9})", &b), ARLO_OK)
      << arlo_bridge_last_error();
  std::string error;
  // Generous: where DNS servers are configured but unreachable, a lookup takes their timeouts.
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  do {
    arlo_batch* batch = nullptr;
    ASSERT_EQ(arlo_bridge_next_batch(b, 200, &batch), ARLO_TIMEOUT) << arlo_bridge_last_error();  // not fatal: retried
    error = arlo_bridge_last_error();
  } while (error.find("does not resolve") == std::string::npos && std::chrono::steady_clock::now() < deadline);
  EXPECT_NE(error.find("'no-such-host.invalid' (from the \"host\" of the arlo_bridge_connect config) does not resolve"),
            std::string::npos)
      << error;
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
}

TEST(CApi, SocketHostLocalhostReachesTheOrchestrator) {
  ServerThread loop;
  ServerOptions o;
  o.transport = "socket";
  ASSERT_TRUE(loop.start(o));
  const std::uint16_t port = loop.port();
  ASSERT_NE(port, 0);
  arlo_bridge* b = nullptr;
  const std::string config = nlohmann::json{{"transport", "socket"}, {"host", "localhost"}, {"port", port}}.dump();
  ASSERT_EQ(arlo_bridge_connect(config.c_str(), &b), ARLO_OK) << arlo_bridge_last_error();
  std::vector<Sample> samples(1);
  samples[0].prompt_tokens = {1, 2, 3};
  samples[0].completion_tokens = {4, 5};
  samples[0].completion_logprobs = {-0.5f, -0.25f};
  samples[0].token_versions = {0, 0};
  auto packed = pack(1, samples, {.seq_len = 8});
  ASSERT_TRUE(packed) << packed.error().what();
  auto sent = loop.send_async(std::move(*packed));
  arlo_batch* batch = nullptr;
  ASSERT_EQ(arlo_bridge_next_batch(b, 20000, &batch), ARLO_OK) << arlo_bridge_last_error();
  EXPECT_EQ(batch->step, 1);
  EXPECT_EQ(arlo_bridge_ack(b, 1), ARLO_OK);
  arlo_batch_release(batch);
  EXPECT_TRUE(sent.get());
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
}

class CApiDir : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.run_dir = run_dir_.path();
    auto started = loop_.start(o, [this](BridgeServer& server) {
      server.on_version([this](VersionEvent v) {
        std::lock_guard lock(mu_);
        versions_.push_back(v);
        cv_.notify_all();
      });
    });
    ASSERT_TRUE(started) << started.error().what();
  }
  arlo_bridge* connect_c(const std::string& extra = "") {
    arlo_bridge* b = nullptr;
    const std::string cfg = R"({"transport":"dir","run_dir":")" + run_dir_.path().string() + "\"" + extra + "}";
    EXPECT_EQ(arlo_bridge_connect(cfg.c_str(), &b), ARLO_OK) << arlo_bridge_last_error();
    return b;
  }
  // A bridge that publishes through the filesystem transport into `weights`.
  arlo_bridge* connect_filesystem(const fs::path& weights) {
    return connect_c(R"(,"weight_sync":{"transport":"filesystem","dir":")" + weights.string() + "\"}");
  }
  // The announcement of `version` (or newer) the orchestrator side received, parsed.
  arlo::weight_sync::Announcement announced(std::int64_t version) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 20s, [&] { return !versions_.empty() && versions_.back().version >= version; }));
    if (versions_.empty()) return {};
    auto a = arlo::weight_sync::parse_announcement(versions_.back().info.value("weight_sync", nlohmann::json()));
    EXPECT_TRUE(a) << versions_.back().info.dump();
    return a ? *a : arlo::weight_sync::Announcement{};
  }
  // A worker-side subscriber pulls `a` from where it was announced and holds exactly these bytes,
  // with the announced checksum.
  void expect_receiver_gets(const arlo::weight_sync::Announcement& a, const std::vector<float>& w,
                            const std::vector<std::int64_t>& bias) {
    auto o = arlo::weight_sync::options_from_json(arlo::weight_sync::receiver_block(a));
    ASSERT_TRUE(o) << o.error().what();
    auto sub = arlo::weight_sync::Subscriber::create(*o);
    ASSERT_TRUE(sub) << sub.error().what();
    arlo::weight_sync::HostWeights sink({{"model.w.weight", arlo::safetensors::DType::F32, {2, 3}},
                                         {"model.b.bias", arlo::safetensors::DType::I64, {2}}});
    auto got = (*sub)->receive(sink, arlo::weight_sync::deadline_in(20000ms));
    ASSERT_TRUE(got) << got.error().what();
    EXPECT_EQ(got->version, a.version);
    EXPECT_EQ(std::memcmp(sink.bytes(0).data(), w.data(), 24), 0);
    EXPECT_EQ(std::memcmp(sink.bytes(1).data(), bias.data(), 16), 0);
    ASSERT_TRUE(a.checksum);
    EXPECT_EQ(*(*sub)->checksum(sink), *a.checksum);
  }

  arlo::test_files::TempDir run_dir_{"arlo_c_api"};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<VersionEvent> versions_;
  ServerThread loop_;  // last: destroyed first, its server with it, before what the callbacks use
};

TEST_F(CApiDir, BatchViewsAckAndAnnounce) {
  std::vector<Sample> samples(3);
  for (int i = 0; i < 3; ++i) {
    samples[i].prompt_tokens = {1, 2};
    samples[i].completion_tokens = {3, 4, 5};
    samples[i].completion_logprobs = {-0.1f, -0.2f, -0.3f};
    samples[i].token_versions = {0, 0, 0};
    samples[i].ce_weights = {1.0f, 1.0f, 0.0f};
  }
  auto step = pack(1, samples, {.seq_len = 16});
  ASSERT_TRUE(loop_.send(*step));
  arlo_bridge* b = connect_c();
  arlo_batch* batch = nullptr;
  ASSERT_EQ(arlo_bridge_next_batch(b, 10000, &batch), ARLO_OK) << arlo_bridge_last_error();
  EXPECT_EQ(batch->step, 1);
  EXPECT_EQ(batch->seq_len, 16);
  const arlo_tensor* ids = arlo_batch_tensor(batch, "input_ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, ARLO_I32);
  ASSERT_EQ(ids->ndim, 2);
  EXPECT_EQ(ids->shape[1], 16);
  const auto* data = static_cast<const std::int32_t*>(ids->data);
  EXPECT_EQ(std::vector<std::int32_t>(data, data + 5), (std::vector<std::int32_t>{1, 2, 3, 4, 5}));
  ASSERT_NE(arlo_batch_tensor(batch, "ce_weights"), nullptr);
  EXPECT_EQ(arlo_batch_tensor(batch, "nope"), nullptr);
  auto meta = nlohmann::json::parse(batch->metadata_json);
  EXPECT_EQ(meta["samples"], "3");
  EXPECT_EQ(arlo_bridge_ack(b, 1), ARLO_OK);
  EXPECT_EQ(arlo_bridge_last_acked_step(b), 1);
  EXPECT_EQ(arlo_bridge_announce(b, 1, R"({"where":"elsewhere"})"), ARLO_OK);
  EXPECT_EQ(arlo_bridge_announce(b, 2, "[1]"), ARLO_PARSE);
  arlo_batch* none = nullptr;
  EXPECT_EQ(arlo_bridge_next_batch(b, 10, &none), ARLO_TIMEOUT);
  EXPECT_NE(std::strlen(arlo_bridge_last_error()), 0u);
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
  // Views outlive the bridge until released.
  EXPECT_EQ(static_cast<const std::int32_t*>(arlo_batch_tensor(batch, "input_ids")->data)[0], 1);
  EXPECT_EQ(arlo_batch_release(batch), ARLO_OK);
  std::unique_lock lock(mu_);
  ASSERT_TRUE(cv_.wait_for(lock, 20s, [&] { return !versions_.empty(); }));
  EXPECT_EQ(versions_.back().version, 1);
  EXPECT_EQ(versions_.back().info["where"], "elsewhere");
}

TEST_F(CApiDir, PublishGoesThroughWeightSyncAndAnnounces) {
  const fs::path weights = run_dir_.path() / "weights";
  arlo_bridge* b = connect_filesystem(weights);
  std::vector<float> w1{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<std::int64_t> bias{7, 8};
  const std::int64_t s1[] = {2, 3}, s2[] = {2};
  arlo_tensor tensors[] = {{"model.w.weight", ARLO_F32, 2, s1, w1.data(), w1.size() * 4},
                           {"model.b.bias", ARLO_I64, 1, s2, bias.data(), bias.size() * 8}};
  ASSERT_EQ(arlo_bridge_publish(b, 1, tensors, 2, 30000), ARLO_OK) << arlo_bridge_last_error();
  // A wrong byte count is refused before anything moves.
  arlo_tensor bad = tensors[0];
  bad.nbytes = 5;
  EXPECT_EQ(arlo_bridge_publish(b, 2, &bad, 1, 30000), ARLO_INVALID_ARGUMENT);
  const auto a = announced(1);
  EXPECT_EQ(a.version, 1u);
  EXPECT_EQ(a.transport, "filesystem");
  EXPECT_EQ(a.endpoint.value("dir", ""), weights.string());
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
  expect_receiver_gets(a, w1, bias);
}

// The two tensors of the publish tests.
struct Weights {
  std::vector<float> w{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<std::int64_t> bias{7, 8};
  const std::int64_t s1[2] = {2, 3}, s2[1] = {2};
  arlo_tensor tensors[2] = {{"model.w.weight", ARLO_F32, 2, s1, w.data(), w.size() * 4},
                            {"model.b.bias", ARLO_I64, 1, s2, bias.data(), bias.size() * 8}};
};

// A version that cannot be written fails its publish with the reason, and every later one: the
// orchestrator would wait for it in vain (the C ABI used to return ok and let the trainer go on);
// closing `b` then fails too.
void expect_publish_fails_once_unwritable(arlo_bridge* b, const std::function<void()>& make_unwritable,
                                          const std::string& reason) {
  Weights t;
  ASSERT_EQ(arlo_bridge_publish(b, 1, t.tensors, 2, 30000), ARLO_OK) << arlo_bridge_last_error();
  make_unwritable();
  EXPECT_EQ(arlo_bridge_publish(b, 2, t.tensors, 2, 30000), ARLO_IO) << arlo_bridge_last_error();
  std::string error = arlo_bridge_last_error();
  EXPECT_NE(error.find("version 2 was not published"), std::string::npos) << error;
  EXPECT_NE(error.find(reason), std::string::npos) << error;
  // Not waited for, the failure comes with the next call; and it stays.
  EXPECT_EQ(arlo_bridge_publish(b, 3, t.tensors, 2, 0), ARLO_IO) << arlo_bridge_last_error();
  error = arlo_bridge_last_error();
  EXPECT_NE(error.find("version 2 was not published"), std::string::npos) << error;
  EXPECT_NE(error.find(reason), std::string::npos) << error;
  EXPECT_EQ(arlo_bridge_close(b), ARLO_IO) << "closed, but the last version was not published";
}

// The weights on a small tmpfs that the test fills after v1 (needs CAP_SYS_ADMIN, as the full-disk
// e2e test does; the next test fails the write without it).
TEST_F(CApiDir, PublishOnAFullDiskFailsWithTheReason) {
  const fs::path mnt = run_dir_.path() / "disk";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs at " << mnt << " (" << std::strerror(errno) << ")";
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  expect_publish_fails_once_unwritable(
      connect_filesystem(mnt / "weights"),
      [&] {
        std::FILE* f = std::fopen((mnt / "filler").c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::vector<char> block(4096, 'x');
        while (std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
        }
        std::fclose(f);
      },
      "No space left on device");
}

// A regular file where the weights directory was: no version directory can be made (not even by
// root, whom a read-only directory does not stop).
TEST_F(CApiDir, PublishToADirectoryThatCannotBeMadeFailsWithTheReason) {
  const fs::path weights = run_dir_.path() / "weights";
  expect_publish_fails_once_unwritable(
      connect_filesystem(weights),
      [&] {
        fs::rename(weights, run_dir_.path() / "weights.old");
        std::FILE* f = std::fopen(weights.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fclose(f);
      },
      "Not a directory");
}

// timeout_ms bounds the wait for the version to be written and announced: 64 MiB cannot be
// checksummed and written in 1 ms, so the call says so (ARLO_TIMEOUT); the version stays staged
// and is published later, and the next publish, given time, succeeds.
TEST_F(CApiDir, PublishHonoursItsTimeout) {
  const fs::path weights = run_dir_.path() / "weights";
  arlo_bridge* b = connect_filesystem(weights);
  std::vector<float> big(16u << 20, 0.5f);
  const std::int64_t shape[] = {static_cast<std::int64_t>(big.size())};
  arlo_tensor t{"model.w.weight", ARLO_F32, 1, shape, big.data(), big.size() * 4};
  EXPECT_EQ(arlo_bridge_publish(b, 1, &t, 1, 1), ARLO_TIMEOUT) << arlo_bridge_last_error();
  const std::string error = arlo_bridge_last_error();
  EXPECT_NE(error.find("version 1 was not published before the deadline"), std::string::npos) << error;
  EXPECT_EQ(announced(1).version, 1u);  // published all the same, later
  big[0] = 2.0f;
  EXPECT_EQ(arlo_bridge_publish(b, 2, &t, 1, -1), ARLO_OK) << arlo_bridge_last_error();
  EXPECT_TRUE(fs::exists(dir_layout::version_file(run_dir_.path(), 2))) << "returned before v2 was announced";
  EXPECT_TRUE(fs::exists(weights / "v2" / "STABLE")) << "returned before v2 was written";
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
}

// Streaming: publish returns once the tensors are staged, with nobody connected (it used to stream
// first and announce after, so it waited out its deadline for workers that connect only once
// announced); the announcement names the bound port, and a receiver pulls the version from there.
TEST_F(CApiDir, StreamingPublishReturnsBeforeAnyReceiverAndAnnouncesWhereItIs) {
  arlo_bridge* b = connect_c(R"(,"weight_sync":{"transport":"tcp","address":"127.0.0.1:0","expected_receivers":1})");
  std::vector<float> w1{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<std::int64_t> bias{7, 8};
  const std::int64_t s1[] = {2, 3}, s2[] = {2};
  arlo_tensor tensors[] = {{"model.w.weight", ARLO_F32, 2, s1, w1.data(), w1.size() * 4},
                           {"model.b.bias", ARLO_I64, 1, s2, bias.data(), bias.size() * 8}};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(arlo_bridge_publish(b, 1, tensors, 2, 600000), ARLO_OK) << arlo_bridge_last_error();
  // Far below the 600 s it was given (it would have waited all of it for a receiver).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);
  const auto a = announced(1);
  EXPECT_NE(a.endpoint.value("address", ""), "127.0.0.1:0") << "the bound port is announced";
  w1[0] = 99.0f;  // the caller's buffers may change once publish returned
  expect_receiver_gets(a, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}, bias);
  EXPECT_EQ(arlo_bridge_close(b), ARLO_OK);
}

}  // namespace
