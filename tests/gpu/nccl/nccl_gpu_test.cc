// The real backend on a GPU: a 1-rank communicator (non-blocking init, warm-up, broadcasts from
// device and host memory in both layouts) and the deadline paths (an init whose peer never comes
// is aborted at its deadline; abort() from another thread). Skips when no CUDA device is usable.
// ARLO_NCCL_LIBRARY overrides the libnccl path (default: the CUDA install's).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "weight_sync/transports/nccl/backend.h"
#include "weight_sync/transports/nccl/group.h"

namespace arlo::weight_sync::nccl {
namespace {

using namespace std::chrono_literals;

std::string library() {
  const char* env = std::getenv("ARLO_NCCL_LIBRARY");
  return env && *env ? env : kDefaultLibraryPath;
}

// The real backend with device 0 selected, or a skip that says why not.
#define ARLO_REQUIRE_GPU(backend)                         \
  auto backend##_r = open_backend(library());             \
  ASSERT_TRUE(backend##_r) << backend##_r.error().what(); \
  std::shared_ptr<Backend> backend = *backend##_r;        \
  if (auto s = backend->set_device(0); !s) GTEST_SKIP() << "no usable CUDA device: " << s.error().what()

std::vector<TensorSpec> specs() {
  return {{"model.embed_tokens.weight", DType::BF16, {1024, 1031}},
          {"model.layers.0.input_layernorm.weight", DType::BF16, {1031}},
          {"model.layers.0.mlp.up_proj.weight", DType::F32, {777, 513}},
          {"scalar", DType::F32, {}},
          {"empty", DType::F16, {0}},
          {"model.norm.weight", DType::BF16, {4097}}};
}

// Every tensor in one device allocation, filled with seeded bytes; a WeightSource of cuda:0 views.
class DeviceWeights final : public WeightSource {
 public:
  DeviceWeights(Backend& backend, std::vector<TensorSpec> specs, std::uint64_t seed)
      : backend_(backend), specs_(std::move(specs)) {
    for (const TensorSpec& s : specs_) {
      offsets_.push_back(total_);
      total_ += s.nbytes();
    }
    host_.resize(total_);
    std::mt19937_64 rng(seed);
    for (std::byte& b : host_) b = static_cast<std::byte>(rng());
    auto d = backend_.device_alloc(total_);
    EXPECT_TRUE(d) << d.error().what();
    if (d) device_ = static_cast<std::byte*>(*d);
  }
  ~DeviceWeights() override {
    if (device_) backend_.device_free(device_);
  }
  bool ok() const { return device_ != nullptr; }
  // Uploads the seeded bytes (and waits).
  Status upload() { return transfer(CopyKind::kHostToDevice, host_.data()); }
  // Downloads into `out` (and waits).
  Status download(std::vector<std::byte>& out) {
    out.resize(total_);
    return transfer(CopyKind::kDeviceToHost, out.data());
  }
  const std::vector<std::byte>& host() const { return host_; }
  std::uint64_t total() const { return total_; }

  const std::vector<TensorSpec>& specs() const override { return specs_; }
  Result<TensorView> view(std::size_t i) const override {
    return TensorView{&specs_[i], {device_ + offsets_[i], specs_[i].nbytes()}, Device::cuda(0)};
  }

 private:
  Status transfer(CopyKind kind, std::byte* host) {
    ARLO_ASSIGN_OR_RETURN(void* pinned, backend_.pinned_alloc(total_));
    ARLO_ASSIGN_OR_RETURN(StreamHandle stream, backend_.stream_create());
    ARLO_ASSIGN_OR_RETURN(EventHandle event, backend_.event_create());
    if (kind == CopyKind::kHostToDevice) std::memcpy(pinned, host, total_);
    Status s = kind == CopyKind::kHostToDevice ? backend_.copy_async(device_, pinned, total_, kind, stream)
                                               : backend_.copy_async(pinned, device_, total_, kind, stream);
    if (s) s = backend_.event_record(event, stream);
    Deadline deadline = deadline_in(60s);
    while (s) {
      auto done = backend_.event_done(event);
      if (!done)
        s = std::unexpected(done.error());
      else if (*done)
        break;
      else if (Clock::now() > deadline)
        s = make_error(ErrorCode::kTimeout, "copy did not finish in 60 s");
      else
        backend_.pause(100us);
    }
    if (s && kind == CopyKind::kDeviceToHost) std::memcpy(host, pinned, total_);
    backend_.event_destroy(event);
    backend_.stream_destroy(stream);
    backend_.pinned_free(pinned);
    return s;
  }

  Backend& backend_;
  std::vector<TensorSpec> specs_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t total_ = 0;
  std::vector<std::byte> host_;
  std::byte* device_ = nullptr;
};

GroupConfig one_rank() {
  return {.library_path = library(), .world_size = 1, .rank = 0, .device = 0, .collective_timeout = 60s};
}

TEST(NcclGpu, OneRankInitWarmupAndBroadcastsInBothLayouts) {
  ARLO_REQUIRE_GPU(backend);
  auto version = library_version(library());
  ASSERT_TRUE(version) << version.error().what();
  std::printf("libnccl %s: %s\n", library().c_str(), version->c_str());
  auto id = new_unique_id(library());
  ASSERT_TRUE(id) << id.error().what();
  auto g = Group::start(one_rank(), *id);
  ASSERT_TRUE(g) << g.error().what();
  Group& group = **g;
  ASSERT_TRUE(group.wait_ready(deadline_in(120s)));
  auto warm = group.warmup(deadline_in(120s));
  ASSERT_TRUE(warm) << warm.error().what();

  DeviceWeights weights(*backend, specs(), 1234);
  ASSERT_TRUE(weights.ok());
  ASSERT_TRUE(weights.upload());
  std::uint64_t payload = 0;
  for (const TensorSpec& s : weights.specs()) payload += s.nbytes();
  for (const Layout& layout :
       {Layout{.packed = true, .packed_buffer_bytes = 1u << 20, .packed_num_buffers = 2},
        Layout{.packed = true, .packed_buffer_bytes = 1u << 30, .packed_num_buffers = 1}, Layout{.packed = false}}) {
    SCOPED_TRACE(layout.packed ? "packed " + std::to_string(layout.packed_buffer_bytes) : "per tensor");
    auto report = group.send(weights, layout, deadline_in(120s));
    ASSERT_TRUE(report) << report.error().what();
    EXPECT_EQ(report->collectives, plan_buckets(weights.specs(), layout).size());
    EXPECT_EQ(report->bytes, payload);
    std::printf("%s: %zu broadcasts, %llu bytes, %.3f ms\n", layout.packed ? "packed" : "per-tensor",
                report->collectives, static_cast<unsigned long long>(report->bytes), report->seconds * 1e3);
  }
  // The root's broadcasts are in place: its source is unchanged.
  std::vector<std::byte> back;
  ASSERT_TRUE(weights.download(back));
  EXPECT_TRUE(back == weights.host());

  // Host tensors are staged through pinned memory.
  HostWeights host(specs());
  for (std::size_t i = 0; i < host.specs().size(); ++i) {
    auto b = host.bytes(i);
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<std::byte>(k * 31 + i);
  }
  for (const Layout& layout : {Layout{.packed = true, .packed_buffer_bytes = 1u << 20}, Layout{.packed = false}}) {
    auto report = group.send(host, layout, deadline_in(120s));
    ASSERT_TRUE(report) << report.error().what();
    EXPECT_EQ(report->bytes, payload);
  }
  EXPECT_FALSE(group.aborted());
}

TEST(NcclGpu, InitWhosePeerNeverJoinsIsAbortedAtTheDeadlineAndANewGroupWorks) {
  ARLO_REQUIRE_GPU(backend);
  auto id = new_unique_id(library());
  ASSERT_TRUE(id) << id.error().what();
  GroupConfig two = one_rank();
  two.world_size = 2;  // rank 1 never comes
  auto g = Group::start(two, *id);
  ASSERT_TRUE(g) << g.error().what();
  auto started = Clock::now();
  auto ready = (*g)->wait_ready(deadline_in(3s));
  auto took = Clock::now() - started;
  ASSERT_FALSE(ready);
  EXPECT_EQ(ready.error().code(), ErrorCode::kTimeout) << ready.error().what();
  EXPECT_GE(took, 3s);
  EXPECT_LT(took, 60s) << "ncclCommAbort took too long";
  EXPECT_TRUE((*g)->aborted());
  std::printf("init with a missing peer: aborted after %.3f s: %s\n", std::chrono::duration<double>(took).count(),
              ready.error().what().c_str());
  EXPECT_FALSE((*g)->warmup(deadline_in(1s)));  // dead
  g->reset();

  auto fresh_id = new_unique_id(library());
  ASSERT_TRUE(fresh_id);
  auto fresh = Group::start(one_rank(), *fresh_id);
  ASSERT_TRUE(fresh) << fresh.error().what();
  ASSERT_TRUE((*fresh)->wait_ready(deadline_in(120s)));
  auto warm = (*fresh)->warmup(deadline_in(120s));
  EXPECT_TRUE(warm) << warm.error().what();
}

TEST(NcclGpu, AbortFromAnotherThreadEndsAPendingInit) {
  ARLO_REQUIRE_GPU(backend);
  auto id = new_unique_id(library());
  ASSERT_TRUE(id) << id.error().what();
  GroupConfig two = one_rank();
  two.world_size = 2;
  auto g = Group::start(two, *id);
  ASSERT_TRUE(g) << g.error().what();
  Group& group = **g;
  std::thread aborter([&] { group.abort("test: receiver failed"); });  // before or during wait_ready
  auto started = Clock::now();
  auto ready = group.wait_ready(deadline_in(120s));
  aborter.join();
  ASSERT_FALSE(ready);
  EXPECT_TRUE(ready.error().code() == ErrorCode::kCancelled || ready.error().code() == ErrorCode::kUnavailable)
      << ready.error().what();
  EXPECT_TRUE(group.aborted());
  EXPECT_NE(ready.error().what().find("receiver failed"), std::string::npos);
  EXPECT_LT(Clock::now() - started, 60s);
}

}  // namespace
}  // namespace arlo::weight_sync::nccl
