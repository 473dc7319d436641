#pragma once
// Helpers shared by the weight_sync tests: odd tensor layouts, seeded fills, expected decodes, and
// the transfers and checks the transport tests share.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weight_sync/codec.h"
#include "weight_sync/manifest.h"
#include "weight_sync/transport.h"
#include "weight_sync/types.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync::testing {

inline constexpr std::uint64_t kTestBucket = 1u << 20;

// Every dtype, odd shapes, an empty tensor, a scalar, sizes not a multiple of 128, and a tensor
// larger than one bucket (split across buckets).
inline std::vector<TensorSpec> odd_specs() {
  using D = DType;
  return {
      {"model.big.f32", D::F32, {1000, 301}},  // 1.2 MB: spans buckets
      {"model.w.bf16", D::BF16, {7, 13, 5}},
      {"model.w.f16", D::F16, {129}},
      {"model.w.f64", D::F64, {3, 41}},
      {"model.empty", D::F32, {0, 5}},
      {"model.scalar", D::F32, {}},
      {"model.i32", D::I32, {17}},
      {"model.i64", D::I64, {5}},
      {"model.i16", D::I16, {11}},
      {"model.i8", D::I8, {9}},
      {"model.u8", D::U8, {1023}},
      {"model.bool", D::BOOL, {3}},
      {"model.f8", D::F8_E4M3, {33}},
      {"model.f8b", D::F8_E5M2, {2}},
      {"model.mid.bf16", D::BF16, {300, 777}},  // 466 KB
  };
}

// Fills floating tensors with finite values in [-4, 4] (bool with 0/1), others with random bytes.
inline void fill(HostWeights& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    auto b = w.bytes(t);
    const DType d = w.specs()[t].dtype;
    const std::size_t es = safetensors::dtype_size(d);
    for (std::size_t k = 0; k < b.size() / es; ++k) {
      std::byte* p = b.data() + k * es;
      const float f = u(rng);
      if (d == DType::F32)
        std::memcpy(p, &f, 4);
      else if (d == DType::F64) {
        double x = f;
        std::memcpy(p, &x, 8);
      } else if (d == DType::F16) {
        _Float16 h = static_cast<_Float16>(f);
        std::memcpy(p, &h, 2);
      } else if (d == DType::BF16) {
        auto h = f32_to_bf16(f);
        std::memcpy(p, &h, 2);
      } else if (d == DType::BOOL)
        *p = static_cast<std::byte>(rng() & 1);
      else
        for (std::size_t j = 0; j < es; ++j) p[j] = static_cast<std::byte>(rng() & 0xFF);
    }
  }
}

// Weights of odd_specs() filled from `seed` (as fill()).
inline HostWeights filled(std::uint64_t seed) {
  HostWeights w(odd_specs());
  fill(w, seed);
  return w;
}

// Changes about `fraction` of elements (byte-flip of the element's first byte, never a no-op).
inline void perturb(HostWeights& w, double fraction, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    const DType d = w.specs()[t].dtype;
    if (d == DType::BOOL) continue;
    const std::size_t es = safetensors::dtype_size(d);
    auto b = w.bytes(t);
    for (std::size_t k = 0; k < b.size() / es; ++k)
      if (u(rng) < fraction) b[k * es] ^= std::byte{0x01};
  }
}

inline HostWeights copy_of(const HostWeights& w) {
  HostWeights out(w.specs());
  for (std::size_t t = 0; t < w.specs().size(); ++t)
    std::memcpy(out.bytes(t).data(), w.bytes(t).data(), w.bytes(t).size());
  return out;
}

// What a receiver should hold after `w` went through `payload` (lossy for casts).
inline HostWeights expected_after(const HostWeights& w, PayloadOptions payload, std::uint64_t bucket = kTestBucket) {
  if (payload.kind == PayloadKind::kDelta) payload.kind = PayloadKind::kFull;
  auto m = Manifest::plan(w.specs(), bucket, payload).value();
  auto enc = BucketEncoder::create(m, w, nullptr).value();
  HostWeights out(w.specs());
  std::vector<std::span<std::byte>> dest;
  for (std::size_t t = 0; t < w.specs().size(); ++t) dest.push_back(out.bytes(t));
  std::vector<std::byte> buf(std::max<std::uint64_t>(enc.max_capacity(), 1));
  for (std::size_t i = 0; i < m.buckets.size(); ++i) {
    auto b = enc.encode(i, buf).value();
    std::vector<std::byte> wire;
    for (auto p : b.parts) wire.insert(wire.end(), p.begin(), p.end());
    auto s = decode_bucket(m, i, wire, dest);
    if (!s) throw std::runtime_error(s.error().what());
  }
  return out;
}

// A name unique to this process and call ("<prefix>-<pid>-<n>").
inline std::string unique_name(const std::string& prefix) {
  static std::atomic<int> n{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Options::params for `transport` that keep concurrent tests apart: its own shm segment name and
// its own directory where the descriptor has such keys (a transport with another per-run resource
// adds its key here); every other key keeps the descriptor's default (tcp: a free loopback port).
inline nlohmann::json isolated_params(const std::string& transport, const std::string& shm_name,
                                      const std::filesystem::path& dir) {
  nlohmann::json p = nlohmann::json::object();
  auto d = find_transport(transport);
  if (!d) return p;
  if ((*d)->option("shm_name")) p["shm_name"] = shm_name;
  if ((*d)->option("dir")) p["dir"] = dir.string();
  return p;
}

// Receiver options that reach `endpoint` (a Publisher::endpoint() or relay_endpoint() object):
// its keys are the receiver's params of the same names, as an announcement hands them on.
inline Options reaching(Options o, const nlohmann::json& endpoint) {
  for (const auto& [k, v] : endpoint.items()) o.params[k] = v;
  return o;
}

inline bool same_bytes(const HostWeights& a, const HostWeights& b) {
  if (a.specs() != b.specs()) return false;
  for (std::size_t t = 0; t < a.specs().size(); ++t)
    if (std::memcmp(a.bytes(t).data(), b.bytes(t).data(), a.bytes(t).size()) != 0) return false;
  return true;
}

// What one publish() and the receive() that ran beside it on another thread came to.
struct Transfer {
  Result<PublishReport> published;
  Result<ReceiveReport> received;
};

// Publishes version `v` of `w` while `sub` receives into `sink` on another thread, each within
// `timeout`; returns once both ended.
inline Transfer publish_while_receiving(Publisher& pub, Version v, const HostWeights& w, Subscriber& sub,
                                        HostWeights& sink, std::chrono::milliseconds timeout) {
  auto received = std::async(std::launch::async, [&] { return sub.receive(sink, deadline_in(timeout)); });
  auto published = pub.publish(v, w, deadline_in(timeout));
  return {std::move(published), received.get()};
}

// What one publish() and the receives beside it came to: each subscriber's result and sink.
struct Fanout {
  Result<PublishReport> published;
  std::vector<Result<ReceiveReport>> received;
  std::vector<HostWeights> sinks;
};

// Publishes version `v` of `w` while each of `subs` receives into a new sink (w's specs) on its own
// thread, each within `timeout`; returns once all ended.
inline Fanout publish_to_all(Publisher& pub, Version v, const HostWeights& w,
                             const std::vector<std::unique_ptr<Subscriber>>& subs, std::chrono::milliseconds timeout) {
  Fanout out{make_error(ErrorCode::kInternal, "not published"), {}, {}};
  for (std::size_t k = 0; k < subs.size(); ++k) out.sinks.emplace_back(w.specs());
  std::vector<std::future<Result<ReceiveReport>>> got;
  for (std::size_t k = 0; k < subs.size(); ++k)
    got.push_back(
        std::async(std::launch::async, [&, k] { return subs[k]->receive(out.sinks[k], deadline_in(timeout)); }));
  out.published = pub.publish(v, w, deadline_in(timeout));
  for (auto& g : got) out.received.push_back(g.get());
  return out;
}

// A publisher and one subscriber that reaches it.
struct Link {
  std::unique_ptr<Publisher> pub;
  std::unique_ptr<Subscriber> sub;
};

// Creates the publisher from `publisher` (with `publisher_tap`, e.g. a fault of
// testing/fault_injection.h), then the subscriber from `receiver` with the publisher's endpoint (as
// reaching()); throws (failing the test) where either cannot be created.
inline Link connect(const Options& publisher, const Options& receiver,
                    std::shared_ptr<BucketTap> publisher_tap = nullptr) {
  auto pub = Publisher::create(publisher, std::move(publisher_tap)).value();
  auto sub = Subscriber::create(reaching(receiver, pub->endpoint())).value();
  return {std::move(pub), std::move(sub)};
}

// What a receiver of two versions ended with: the weights of the last version sent, and its sink.
struct Sent {
  HostWeights w;
  HostWeights sink;
};

// A run's first two steps over `link`: version 1 of odd_specs() filled from `seed`, then version 2
// with about `changed` of the elements changed, each sent while the subscriber receives into one
// sink (publish_while_receiving). `check(v, w, sink, transfer)` judges each; version 2 is not sent
// after a fatal failure.
inline Sent send_two_versions(
    Link& link, std::uint64_t seed, double changed, std::chrono::milliseconds timeout,
    const std::function<void(Version, const HostWeights&, const HostWeights&, const Transfer&)>& check) {
  Sent sent{filled(seed), HostWeights(odd_specs())};
  for (Version v : {1, 2}) {
    if (v == 2) perturb(sent.w, changed, seed + 1);
    check(v, sent.w, sent.sink, publish_while_receiving(*link.pub, v, sent.w, *link.sub, sent.sink, timeout));
    if (::testing::Test::HasFatalFailure()) break;
  }
  return sent;
}

// A receiver already on version 1 that is sent version 2: `v1` (odd_specs() filled from `seed`),
// `sink` (a copy of v1 committed as version 1, its subscriber told so), `v2` (v1 with half the
// elements changed) and the transfer of v2. The start of every test of a corrupted transfer.
struct SecondVersion {
  HostWeights v1;
  HostWeights v2;
  HostWeights sink;
  Transfer transfer;
};
inline SecondVersion send_second_version(Publisher& pub, Subscriber& sub, std::uint64_t seed,
                                         std::chrono::milliseconds timeout) {
  HostWeights v1 = filled(seed);
  HostWeights sink = copy_of(v1);
  EXPECT_TRUE(sink.commit(1));
  sub.assume_version(1);
  HostWeights v2 = copy_of(v1);
  perturb(v2, 0.5, seed + 1);
  auto transfer = publish_while_receiving(pub, 2, v2, sub, sink, timeout);
  return {std::move(v1), std::move(v2), std::move(sink), std::move(transfer)};
}

// `sub` receives once into `sink` (within 30 s) and must end on version `v` holding exactly `w`.
inline void expect_receives(Subscriber& sub, HostWeights& sink, Version v, const HostWeights& w) {
  auto r = sub.receive(sink, deadline_in(std::chrono::seconds(30)));
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_EQ(r->version, v);
  EXPECT_TRUE(same_bytes(sink, w));
}

// A new subscriber with `options` receives once into a new sink and must end on version `v`
// holding exactly `w`.
inline void expect_new_receiver_gets(const Options& options, Version v, const HostWeights& w) {
  auto sub = Subscriber::create(options);
  ASSERT_TRUE(sub) << sub.error().what();
  HostWeights sink(w.specs());
  expect_receives(**sub, sink, v, w);
}

}  // namespace arlo::weight_sync::testing
