// Group through the backend double: init, deadlines, aborts, and the bytes each layout puts on the
// wire. The double runs the "device" in host memory, so every byte the group moves is checked.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>

#include "weight_sync/transports/nccl/group.h"
#include "testing/nccl_fake_backend.h"

namespace arlo::weight_sync::nccl {
namespace {

using testing::Call;
using testing::ScopedBackend;
using namespace std::chrono_literals;

constexpr auto kGenerous = 20s;  // deadlines that must not expire on a loaded machine

GroupConfig config(int rank = 0, int world = 2) {
  return {
      .library_path = "fake-libnccl.so.2", .world_size = world, .rank = rank, .device = 0, .collective_timeout = 200ms};
}

std::vector<TensorSpec> specs() {
  return {{"embed", DType::BF16, {64, 9}}, {"q.weight", DType::F32, {33}}, {"scalar", DType::F32, {}},
          {"empty", DType::F16, {0, 4}},   {"big", DType::BF16, {700}},    {"i64", DType::I64, {5}},
          {"u8", DType::U8, {301}},        {"f8", DType::F8_E4M3, {17}},   {"last", DType::F16, {3, 3}}};
}

void fill(HostWeights& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    for (std::byte& b : w.bytes(t)) b = static_cast<std::byte>(rng());
  }
}

std::uint64_t payload_bytes(const HostWeights& w) {
  std::uint64_t n = 0;
  for (const TensorSpec& s : w.specs()) n += s.nbytes();
  return n;
}

// The bytes of tensors [first, first + count) concatenated.
std::vector<std::byte> concat(const HostWeights& w, const Bucket& b) {
  std::vector<std::byte> out;
  for (std::size_t i = b.first; i < b.first + b.count; ++i) {
    auto bytes = w.bytes(i);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

// A source whose odd-numbered tensors claim to live on cuda:0 (the double's device memory is host
// memory, so the group's device path runs on the same bytes).
class MixedSource final : public WeightSource {
 public:
  explicit MixedSource(const HostWeights& w) : w_(w) {}
  const std::vector<TensorSpec>& specs() const override { return w_.specs(); }
  Result<TensorView> view(std::size_t i) const override {
    auto v = w_.view(i);
    if (v && i % 2 == 1) v->device = Device::cuda(0);
    return v;
  }

 private:
  const HostWeights& w_;
};

// A sink on cuda:0 backed by host memory.
class DeviceSink final : public WeightSink {
 public:
  explicit DeviceSink(HostWeights& w) : w_(w) {}
  Result<std::span<std::byte>> buffer_for(const TensorSpec& spec) override { return w_.buffer_for(spec); }
  Status commit(Version v) override { return w_.commit(v); }
  Device device() const override { return Device::cuda(0); }

 private:
  HostWeights& w_;
};

// Expects `what` (an error's text) to say each of `parts`.
void expect_says(const std::string& what, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts)
    EXPECT_NE(what.find(part), std::string::npos) << "no \"" << part << "\" in: " << what;
}

std::size_t broadcasts(const std::vector<Call>& calls) {
  std::size_t n = 0;
  for (const Call& c : calls) n += c.kind == Call::Kind::kBroadcast;
  return n;
}

// Each test: the backend double, weights of specs() (zeros unless the test fills them) and `g`, the
// group under test once a test started it.
class NcclGroup : public ::testing::Test {
 protected:
  // A group started with `c` that is ready (null, and a test failure, where it did not get there).
  std::unique_ptr<Group> ready_group(GroupConfig c = config()) {
    auto started = Group::start(c, UniqueId{});
    EXPECT_TRUE(started) << started.error().what();
    if (!started) return nullptr;
    auto ready = (*started)->wait_ready(deadline_in(kGenerous));
    EXPECT_TRUE(ready) << ready.error().what();
    return std::move(*started);
  }
  // Makes `g` a ready group started with `c`; false where it is not.
  bool start_ready(GroupConfig c = config()) {
    g = ready_group(c);
    return g != nullptr;
  }
  // Makes `g` a ready group whose collectives are all held and time out only after 60 s, so that
  // only the send's deadline, a cancellation or an abort ends a send.
  bool start_ready_and_held() {
    fake->hold_collectives_from(0);
    GroupConfig c = config();
    c.collective_timeout = 60s;
    return start_ready(c);
  }
  // The double saw no misuse and holds no memory or handle (after the group was destroyed).
  void expect_clean() {
    EXPECT_TRUE(fake->misuse().empty()) << fake->misuse().front();
    EXPECT_EQ(fake->live_allocations(), 0u);
    EXPECT_EQ(fake->live_handles(), 0u);
  }
  void destroy_and_expect_clean() {
    g.reset();
    expect_clean();
  }
  void check_packed_send(bool mixed, int buffers);
  void check_receive(const Layout& layout, bool device_sink);

  ScopedBackend fake;
  HostWeights w{specs()};
  std::unique_ptr<Group> g;
};

TEST_F(NcclGroup, StartRefusesBadConfig) {
  EXPECT_FALSE(Group::start(config(2, 2), UniqueId{}));
  EXPECT_FALSE(Group::start(config(0, 0), UniqueId{}));
  GroupConfig c = config();
  c.collective_timeout = 0ms;
  EXPECT_FALSE(Group::start(c, UniqueId{}));
  EXPECT_EQ(fake->count(Call::Kind::kInit), 0u);
}

TEST_F(NcclGroup, InitPendingThenReadyAndCleanDestroy) {
  fake->hold_init();
  auto group = Group::start(config(), UniqueId{});
  ASSERT_TRUE(group) << group.error().what();
  auto calls = fake->calls();
  ASSERT_EQ(calls.size(), 2u);  // returns at once: set the device, then a non-blocking init
  EXPECT_EQ(calls[0].kind, Call::Kind::kSetDevice);
  EXPECT_EQ(calls[0].device, 0);
  EXPECT_EQ(calls[1].kind, Call::Kind::kInit);
  EXPECT_EQ(calls[1].world_size, 2);
  EXPECT_EQ(calls[1].rank, 0);
  std::thread peers([&] { fake->release_init(); });  // the peers join while wait_ready polls
  auto ready = (*group)->wait_ready(deadline_in(kGenerous));
  peers.join();
  ASSERT_TRUE(ready) << ready.error().what();
  EXPECT_FALSE((*group)->aborted());
  group->reset();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 0u);
  EXPECT_EQ(fake->count(Call::Kind::kFinalize), 1u);
  EXPECT_EQ(fake->count(Call::Kind::kDestroy), 1u);
  expect_clean();
}

TEST_F(NcclGroup, InitThatNeverCompletesAbortsAtTheDeadline) {
  fake->hold_init();
  auto group = Group::start(config(0, 3), UniqueId{});
  ASSERT_TRUE(group);
  auto started = Clock::now();
  auto ready = (*group)->wait_ready(deadline_in(200ms));
  ASSERT_FALSE(ready);
  EXPECT_GE(Clock::now() - started, 200ms);
  EXPECT_EQ(ready.error().code(), ErrorCode::kTimeout);
  expect_says(ready.error().what(), {"rank 0 of 3", "deadline", "init"});
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_TRUE((*group)->aborted());
  // Dead: every later call fails at once, without touching the communicator.
  auto again = (*group)->warmup(deadline_in(kGenerous));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(again.error().what().find("new rendezvous port"), std::string::npos) << again.error().what();
  group->reset();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_EQ(fake->count(Call::Kind::kFinalize), 0u);
  expect_clean();
}

TEST_F(NcclGroup, AsyncErrorDuringInitNamesRankWorldAndNcclsMessage) {
  fake->hold_init();
  fake->inject_async_error("peer 2 closed the bootstrap socket");
  auto group = Group::start(config(0, 3), UniqueId{});
  ASSERT_TRUE(group);
  auto ready = (*group)->wait_ready(deadline_in(kGenerous));
  ASSERT_FALSE(ready);
  EXPECT_EQ(ready.error().code(), ErrorCode::kUnavailable);
  expect_says(ready.error().what(), {"rank 0 of 3", "world size 3", "peer 2 closed the bootstrap socket"});
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
}

TEST_F(NcclGroup, DestroyedDuringInitAborts) {
  fake->hold_init();
  auto group = Group::start(config(), UniqueId{});
  ASSERT_TRUE(group);
  group->reset();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_EQ(fake->count(Call::Kind::kFinalize), 0u);
  expect_clean();
}

TEST_F(NcclGroup, SetDeviceFailureIsReported) {
  fake->fail_set_device("cuda: no usable GPU (cudaGetDeviceCount: no CUDA-capable device is detected)");
  auto group = Group::start(config(), UniqueId{});
  ASSERT_FALSE(group);
  expect_says(group.error().what(), {"no CUDA-capable device", "rank 0 of 2"});
  EXPECT_EQ(fake->count(Call::Kind::kInit), 0u);
}

TEST_F(NcclGroup, WarmupIsOneFloat32SumAllReduceOfZero) {
  ASSERT_TRUE(start_ready());
  ASSERT_TRUE(g->warmup(deadline_in(kGenerous)));
  auto reduces = fake->calls(Call::Kind::kAllReduce);
  ASSERT_EQ(reduces.size(), 1u);
  EXPECT_EQ(reduces[0].count, 1u);
  EXPECT_EQ(reduces[0].dtype, 7);  // ncclFloat32
  EXPECT_TRUE(reduces[0].ran);
  float value = 1.0f;
  ASSERT_EQ(reduces[0].bytes.size(), sizeof value);
  std::memcpy(&value, reduces[0].bytes.data(), sizeof value);
  EXPECT_EQ(value, 0.0f);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
  destroy_and_expect_clean();
}

TEST_F(NcclGroup, WarmupThatNeverCompletesAborts) {
  fake->hold_collectives_from(0);
  ASSERT_TRUE(start_ready());
  auto warm = g->warmup(deadline_in(kGenerous));  // the collective timeout (200 ms) bounds it
  ASSERT_FALSE(warm);
  EXPECT_EQ(warm.error().code(), ErrorCode::kTimeout);
  expect_says(warm.error().what(), {"warm-up", "200 ms"});
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
}

// Packed layout: exactly the planned uint8 broadcasts, in order, carrying the source's bytes; host
// and device tensors mixed.
void NcclGroup::check_packed_send(bool mixed, int buffers) {
  fill(w, 42);
  const Layout layout{.packed = true, .packed_buffer_bytes = 300, .packed_num_buffers = buffers};
  const auto plan = plan_buckets(w.specs(), layout);
  ASSERT_GE(plan.size(), 3u);
  ASSERT_TRUE(start_ready());
  MixedSource mixed_source(w);
  const WeightSource& source = mixed ? static_cast<const WeightSource&>(mixed_source) : w;
  auto report = g->send(source, layout, deadline_in(kGenerous));
  ASSERT_TRUE(report) << report.error().what();
  EXPECT_EQ(report->collectives, plan.size());
  EXPECT_EQ(report->bytes, payload_bytes(w));
  auto casts = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(casts.size(), plan.size());
  for (std::size_t b = 0; b < plan.size(); ++b) {
    SCOPED_TRACE("bucket " + std::to_string(b));
    EXPECT_EQ(casts[b].dtype, 1);  // ncclUint8
    EXPECT_EQ(casts[b].count, plan[b].bytes);
    EXPECT_EQ(casts[b].root, 0);
    EXPECT_TRUE(casts[b].ran);
    EXPECT_EQ(casts[b].bytes, concat(w, plan[b]));
  }
  g.reset();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 0u);
  expect_clean();
}

TEST_F(NcclGroup, SendPackedHostTensors) { check_packed_send(false, 2); }
TEST_F(NcclGroup, SendPackedMixedHostAndDeviceTensors) { check_packed_send(true, 2); }
TEST_F(NcclGroup, SendPackedOneBuffer) { check_packed_send(true, 1); }
TEST_F(NcclGroup, SendPackedThreeBuffers) { check_packed_send(false, 3); }

// A held bucket keeps its slot busy: the group must not refill that slot's pinned buffer before
// the bucket's event is reached (if it did, the held bucket would carry the next bucket's bytes).
TEST_F(NcclGroup, SendPackedDoesNotReuseABufferBeforeItsBroadcastRan) {
  fill(w, 7);
  const Layout layout{.packed = true, .packed_buffer_bytes = 300, .packed_num_buffers = 2};
  const auto plan = plan_buckets(w.specs(), layout);
  fake->hold_collectives_from(0);
  ASSERT_TRUE(start_ready());
  Result<TransferReport> report = make_error(ErrorCode::kInternal, "not run");
  std::thread sender([&] { report = g->send(w, layout, deadline_in(kGenerous)); });
  // Two slots: the first two buckets are issued, the third waits for slot 0.
  ASSERT_TRUE(fake->wait_for([](const auto& calls) { return broadcasts(calls) >= 2; }, kGenerous));
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 2u);
  fake->release_collectives();
  sender.join();
  ASSERT_TRUE(report) << report.error().what();
  auto casts = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(casts.size(), plan.size());
  for (std::size_t b = 0; b < plan.size(); ++b) EXPECT_EQ(casts[b].bytes, concat(w, plan[b])) << "bucket " << b;
}

TEST_F(NcclGroup, SendPerTensorIsOneBroadcastPerTensorInItsDtype) {
  fill(w, 3);
  ASSERT_TRUE(start_ready());
  MixedSource source(w);
  auto report = g->send(source, Layout{.packed = false}, deadline_in(kGenerous));
  ASSERT_TRUE(report) << report.error().what();
  auto casts = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(casts.size(), w.specs().size());
  EXPECT_EQ(report->collectives, w.specs().size());
  for (std::size_t i = 0; i < casts.size(); ++i) {
    const TensorSpec& spec = w.specs()[i];
    SCOPED_TRACE(spec.name);
    EXPECT_EQ(casts[i].dtype, *nccl_data_type(spec.dtype));
    EXPECT_EQ(casts[i].count, spec.numel());
    EXPECT_TRUE(casts[i].in_place);
    auto bytes = w.bytes(i);
    EXPECT_EQ(casts[i].bytes, std::vector<std::byte>(bytes.begin(), bytes.end()));
  }
  destroy_and_expect_clean();
}

TEST_F(NcclGroup, PerTensorRefusesADtypeWithoutNcclTypeBeforeAnyBroadcast) {
  HostWeights with_bool({{"a", DType::F32, {4}}, {"mask", DType::BOOL, {3}}});
  ASSERT_TRUE(start_ready());
  auto r = g->send(with_bool, Layout{.packed = false}, deadline_in(kGenerous));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("mask"), std::string::npos) << r.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
  EXPECT_FALSE(g->aborted());                                         // nothing was on the wire: the group stays usable
  EXPECT_TRUE(g->send(with_bool, Layout{}, deadline_in(kGenerous)));  // packed carries it as bytes
}

TEST_F(NcclGroup, CollectiveThatNeverCompletesAbortsAndTheGroupIsDead) {
  fill(w, 5);
  fake->hold_collectives_from(1);  // bucket 0 runs, bucket 1 never does
  ASSERT_TRUE(start_ready());
  const Layout layout{.packed = true, .packed_buffer_bytes = 300};
  auto started = Clock::now();
  auto r = g->send(w, layout, deadline_in(kGenerous));
  ASSERT_FALSE(r);
  EXPECT_GE(Clock::now() - started, 200ms);
  EXPECT_LT(Clock::now() - started, kGenerous);
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout);
  expect_says(r.error().what(), {"bucket 1", "200 ms"});
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_TRUE(g->aborted());
  const std::size_t issued = fake->count(Call::Kind::kBroadcast);
  auto again = g->send(w, layout, deadline_in(kGenerous));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(again.error().what().find("aborted earlier"), std::string::npos) << again.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), issued);
  destroy_and_expect_clean();
}

TEST_F(NcclGroup, OverallDeadlineBoundsEveryCollective) {
  ASSERT_TRUE(start_ready_and_held());
  auto r = g->send(w, Layout{}, deadline_in(200ms));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout);
  EXPECT_TRUE(g->aborted());
}

TEST_F(NcclGroup, AsyncErrorMidTransferAborts) {
  fake->hold_collectives_from(1);
  ASSERT_TRUE(start_ready());
  std::thread peer([&] {
    fake->wait_for([](const auto& c) { return c.size() > 0 && c.back().kind == Call::Kind::kBroadcast; }, kGenerous);
    fake->inject_async_error("remote process exited");
  });
  auto r = g->send(w, Layout{.packed = true, .packed_buffer_bytes = 300}, deadline_in(kGenerous));
  peer.join();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("remote process exited"), std::string::npos) << r.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
}

TEST_F(NcclGroup, CancelledDuringACollectiveAborts) {
  ASSERT_TRUE(start_ready_and_held());  // only cancellation can end this send
  std::atomic<bool> failed{false};
  std::thread http([&] {  // a receiver's HTTP call fails while both buffers are on the wire
    fake->wait_for([](const auto& calls) { return broadcasts(calls) >= 2; }, kGenerous);
    failed = true;
  });
  auto r = g->send(w, Layout{.packed = true, .packed_buffer_bytes = 300}, deadline_in(kGenerous),
                   [&] { return failed.load(); });
  http.join();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
  EXPECT_NE(r.error().what().find("cancelled"), std::string::npos) << r.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 2u);  // two buffers: the third bucket waits for the first
  EXPECT_TRUE(g->aborted());
}

TEST_F(NcclGroup, CancelledBetweenBucketsStopsIssuing) {
  ASSERT_TRUE(start_ready());
  auto r = g->send(w, Layout{.packed = true, .packed_buffer_bytes = 300}, deadline_in(kGenerous),
                   [&] { return fake->count(Call::Kind::kBroadcast) >= 2; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 2u);
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  destroy_and_expect_clean();
}

TEST_F(NcclGroup, AbortFromAnotherThreadWhileSendIsBlocked) {
  ASSERT_TRUE(start_ready_and_held());
  Result<TransferReport> r = make_error(ErrorCode::kInternal, "not run");
  std::thread sender([&] { r = g->send(w, Layout{.packed = true, .packed_buffer_bytes = 300}, deadline_in(60s)); });
  ASSERT_TRUE(
      fake->wait_for([](const auto& c) { return !c.empty() && c.back().kind == Call::Kind::kBroadcast; }, kGenerous));
  auto started = Clock::now();
  g->abort("vLLM /update_weights returned 500");
  g->abort("second reason is ignored");
  EXPECT_TRUE(g->aborted());
  sender.join();
  EXPECT_LT(Clock::now() - started, kGenerous);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
  EXPECT_NE(r.error().what().find("vLLM /update_weights returned 500"), std::string::npos) << r.error().what();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  g.reset();
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  expect_clean();
}

TEST_F(NcclGroup, AbortWhileIdleAbortsAtOnce) {
  ASSERT_TRUE(start_ready());
  g->abort("shutting down");
  EXPECT_EQ(fake->count(Call::Kind::kAbort), 1u);
  auto warm = g->warmup(deadline_in(kGenerous));
  ASSERT_FALSE(warm);
  EXPECT_NE(warm.error().what().find("shutting down"), std::string::npos);
}

// Receiver: what the root broadcasts (per the plan) lands in the sink's buffers.
void NcclGroup::check_receive(const Layout& layout, bool device_sink) {
  HostWeights sent(specs());
  fill(sent, 11);
  const auto plan = plan_buckets(sent.specs(), layout);
  for (const Bucket& b : plan) fake->push_incoming(concat(sent, b));
  ASSERT_TRUE(start_ready(config(1, 2)));
  HostWeights got(specs());
  DeviceSink device(got);
  WeightSink& sink = device_sink ? static_cast<WeightSink&>(device) : got;
  auto report = g->receive(sink, sent.specs(), layout, deadline_in(kGenerous));
  ASSERT_TRUE(report) << report.error().what();
  EXPECT_EQ(report->collectives, plan.size());
  EXPECT_EQ(report->bytes, payload_bytes(sent));
  for (std::size_t i = 0; i < sent.specs().size(); ++i) {
    auto a = sent.bytes(i), b = got.bytes(i);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << sent.specs()[i].name;
  }
  auto casts = fake->calls(Call::Kind::kBroadcast);
  ASSERT_EQ(casts.size(), plan.size());
  for (std::size_t b = 0; b < plan.size(); ++b) {
    EXPECT_EQ(casts[b].root, 0);
    if (layout.packed) {
      EXPECT_EQ(casts[b].dtype, 1);
      EXPECT_EQ(casts[b].count, plan[b].bytes);
    } else {
      EXPECT_EQ(casts[b].dtype, *nccl_data_type(sent.specs()[b].dtype));
      EXPECT_EQ(casts[b].count, sent.specs()[b].numel());
    }
  }
  destroy_and_expect_clean();
}

TEST_F(NcclGroup, ReceivePackedIntoHostSink) { check_receive({.packed = true, .packed_buffer_bytes = 300}, false); }
TEST_F(NcclGroup, ReceivePerTensorIntoHostSink) { check_receive({.packed = false}, false); }
TEST_F(NcclGroup, ReceivePackedIntoDeviceSink) { check_receive({.packed = true, .packed_buffer_bytes = 300}, true); }
TEST_F(NcclGroup, ReceivePerTensorIntoDeviceSink) { check_receive({.packed = false}, true); }

TEST_F(NcclGroup, ReceiveRefusesASinkThatLacksATensorBeforeAnyBroadcast) {
  ASSERT_TRUE(start_ready(config(1, 2)));
  HostWeights got({{"embed", DType::BF16, {64, 9}}});
  auto r = g->receive(got, specs(), Layout{}, deadline_in(kGenerous));
  ASSERT_FALSE(r);
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
  EXPECT_FALSE(g->aborted());
}

TEST_F(NcclGroup, RolesAreChecked) {
  auto root = ready_group();
  ASSERT_TRUE(root);
  EXPECT_FALSE(root->receive(w, w.specs(), Layout{}, deadline_in(kGenerous)));
  auto peer = ready_group(config(1, 2));
  ASSERT_TRUE(peer);
  EXPECT_FALSE(peer->send(w, Layout{}, deadline_in(kGenerous)));
  EXPECT_EQ(fake->count(Call::Kind::kBroadcast), 0u);
}

TEST_F(NcclGroup, LibraryFunctionsUseTheInstalledBackend) {
  fake->set_version("2.28.9");
  auto v = library_version("any");
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, "2.28.9");
  auto id = new_unique_id("any");
  ASSERT_TRUE(id);
  EXPECT_NE(*id, UniqueId{});
}

}  // namespace
}  // namespace arlo::weight_sync::nccl
