// check_inference_support: every combination of server kind, weight_sync transport, topology and
// update mode that cannot run is refused with the keys, the reason and an alternative; the example
// configs for vLLM and SGLang pass. Transports are picked by their descriptor's capabilities, as
// the code under test does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "session/server_support.h"
#include "weight_sync/transport.h"
#include "tests/unit/session/session_test_util.h"

namespace arlo::session {
namespace {

namespace ws = arlo::weight_sync;

bool has_device(const ws::Capabilities& c, ws::Device::Kind k) {
  for (auto d : c.devices)
    if (d == k) return true;
  return false;
}

// The first registered transport of each kind (empty: none in this build).
std::string first_transport(bool durable) {
  for (const auto& d : ws::transports())
    if (d.capabilities.durable == durable && !d.capabilities.collective) return d.name;
  return {};
}
std::string streaming() { return first_transport(false); }
std::string durable() { return first_transport(true); }
std::string collective() {
  for (const auto& d : ws::transports())
    if (d.capabilities.collective) return d.name;
  return {};
}

// Every registered streaming host transport (tcp and shm today).
std::vector<std::string> streaming_all() {
  std::vector<std::string> out;
  for (const auto& d : ws::transports())
    if (!d.capabilities.durable && !d.capabilities.collective) out.push_back(d.name);
  return out;
}

using test::load;

config::Config external(const std::string& kind, const std::string& transport, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"inference.launch=external", "inference.kind=" + kind,
                                "inference.urls=[http://127.0.0.1:8000]", "weight_sync.transport=" + transport};
  o.insert(o.end(), more.begin(), more.end());
  return load(std::move(o));
}

const BuildSupport kWithNccl{true};
const BuildSupport kWithoutNccl{false};

std::string refused(const config::Config& cfg, const BuildSupport& build = kWithNccl) {
  auto st = check_inference_support(cfg, build);
  EXPECT_FALSE(st) << "expected a refusal";
  if (st) return {};
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  return st.error().what();
}

void contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in:\n" << text;
}

std::string source_dir() {
  const char* s = std::getenv("ARLO_SOURCE_DIR");
  return s ? s : ".";
}

// this_build() says what CMake configured (ARLO_EXPECT_NCCL: ARLO_WITH_NCCL_ENABLED, set by the
// test's CMake line), so check-config refuses nccl exactly where the backend is missing.
TEST(ServerSupport, ThisBuildKnowsWhetherItHasNccl) { EXPECT_EQ(this_build().nccl, ARLO_EXPECT_NCCL != 0); }

TEST(ServerSupport, ArloWorkerTakesEveryHostTransport) {
  EXPECT_TRUE(check_inference_support(load({}), kWithNccl));
  for (const auto& d : ws::transports()) {
    // arlo-worker never joins a collective group (ArloWorkerDoesNotJoinACollectiveGroup, below).
    if (!has_device(d.capabilities, ws::Device::Kind::kCpu) || d.capabilities.collective) continue;
    auto st = check_inference_support(load({"weight_sync.transport=" + d.name}), kWithoutNccl);
    EXPECT_TRUE(st) << d.name << ": " << st.error().what();
  }
}

TEST(ServerSupport, SglangRefusesArloStreams) {
  ASSERT_FALSE(streaming_all().empty());
  for (const auto& t : streaming_all()) {
    const auto why = refused(external("sglang", t));
    contains(why, "weight_sync.transport " + t + " (--set weight_sync.transport=" + t + ")");
    contains(why, "inference.kind sglang");
    contains(why, "cannot receive arlo's own weight stream");
    if (!collective().empty()) contains(why, collective());  // the collective one
    contains(why, durable());                                // or from disk
  }
}

// vLLM takes every host transport through arlo's weight-transfer backend (python/arlo_vllm), and a
// chain of them; SGLang loads a durable version from its directory.
TEST(ServerSupport, VllmTakesEveryHostTransportAndSglangTheDurableOne) {
  for (const auto& d : ws::transports()) {
    if (!has_device(d.capabilities, ws::Device::Kind::kCpu) || d.capabilities.collective) continue;
    auto st = check_inference_support(external("vllm", d.name), kWithoutNccl);
    EXPECT_TRUE(st) << d.name << ": " << st.error().what();
  }
  EXPECT_TRUE(check_inference_support(external("vllm", streaming(), {"weight_sync.topology=chain"}), kWithoutNccl));
  EXPECT_TRUE(check_inference_support(external("sglang", durable()), kWithoutNccl));
}

TEST(ServerSupport, SglangAlternativeToAStreamIsTheDurableTransport) {
  const auto why = refused(external("sglang", streaming()), kWithoutNccl);
  contains(why, "use weight_sync.transport " + durable());
}

TEST(ServerSupport, CollectiveTransportNeedsNccl) {
  if (collective().empty()) GTEST_SKIP() << "no collective transport registered in this build";
  EXPECT_TRUE(check_inference_support(external("vllm", collective()), kWithNccl));
  EXPECT_TRUE(check_inference_support(external("sglang", collective()), kWithNccl));
  const auto why = refused(external("sglang", collective()), kWithoutNccl);
  contains(why, "built without NCCL");
  contains(why, "-DARLO_WITH_NCCL=ON");
  contains(why, "use weight_sync.transport " + durable());  // SGLang's alternative: load from disk
}

TEST(ServerSupport, ArloWorkerRefusesADeviceOnlyTransport) {
  for (const auto& d : ws::transports()) {
    if (has_device(d.capabilities, ws::Device::Kind::kCpu)) continue;
    const auto why = refused(external("arlo", d.name));
    contains(why, "arlo-worker holds its weights in host memory");
    contains(why, "use weight_sync.transport " + streaming());
    return;
  }
  GTEST_SKIP() << "every registered transport moves host memory";
}

TEST(ServerSupport, SglangDoesNotRelayAChain) {
  EXPECT_TRUE(
      check_inference_support(load({"weight_sync.transport=" + streaming(), "weight_sync.topology=chain"}), kWithNccl));
  for (const std::string kind : {"sglang"}) {
    const auto cfg = collective().empty() ? external(kind, durable(), {"weight_sync.topology=chain"})
                                          : external(kind, collective(), {"weight_sync.topology=chain"});
    const auto why = refused(cfg);
    contains(why, "weight_sync.topology chain (--set weight_sync.topology=chain)");
    contains(why, "do not relay");
    contains(why, "use topology star");
  }
}

TEST(ServerSupport, ArloWorkerDoesNotJoinACollectiveGroup) {
  if (collective().empty()) GTEST_SKIP() << "no collective transport registered in this build";
  const auto why = refused(external("arlo", collective()));
  contains(why, "weight_sync.transport " + collective());
  contains(why, "arlo-worker does not join a collective weight-transfer group");
  contains(why, "use weight_sync.transport " + streaming());
}

TEST(ServerSupport, EveryProblemIsReportedOnItsOwnLine) {
  const auto why = refused(external("sglang", streaming(), {"weight_sync.topology=chain"}));
  EXPECT_EQ(std::count(why.begin(), why.end(), '\n'), 1) << why;
  contains(why, "cannot receive arlo's own weight stream");
  contains(why, "do not relay");
}

// The example configs load and pass, as `arlo check-config` reads them.
TEST(ServerSupport, ExampleConfigsPass) {
  if (collective().empty()) GTEST_SKIP() << "no collective transport registered in this build";
  for (const std::string name : {"vllm-nccl.yaml", "sglang-nccl.yaml"}) {
    auto cfg = config::load_file(source_dir() + "/configs/" + name);
    ASSERT_TRUE(cfg) << name << ": " << cfg.error().what();
    auto st = check_inference_support(*cfg, kWithNccl);
    EXPECT_TRUE(st) << name << ": " << st.error().what();
    EXPECT_EQ(cfg->string("weight_sync.transport"), collective()) << name;
    EXPECT_EQ(cfg->string("trainer.launch"), "command") << name;
    // Without NCCL the same file is refused with the reason.
    auto without = check_inference_support(*cfg, kWithoutNccl);
    ASSERT_FALSE(without) << name;
    contains(without.error().what(), "built without NCCL");
  }
}

}  // namespace
}  // namespace arlo::session
