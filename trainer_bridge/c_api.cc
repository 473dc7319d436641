// The C ABI (arlo_bridge.h) over BridgeClient and weight_sync::StagingPublisher. No exception crosses it:
// every entry point catches, converts to a status, and records the message for this thread.
#include "trainer_bridge/arlo_bridge.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer_bridge/bridge.h"

#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
#include "weight_sync/staging.h"
#include "weight_sync/subscriber.h"
#include "weight_sync/wire.h"
#endif

using arlo::Error;
using arlo::ErrorCode;
using nlohmann::json;

namespace {

thread_local std::string g_last_error;

arlo_status to_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return ARLO_INVALID_ARGUMENT;
    case ErrorCode::kParse: return ARLO_PARSE;
    case ErrorCode::kNotFound: return ARLO_NOT_FOUND;
    case ErrorCode::kIo: return ARLO_IO;
    case ErrorCode::kTimeout: return ARLO_TIMEOUT;
    case ErrorCode::kCancelled: return ARLO_CANCELLED;
    case ErrorCode::kMismatch: return ARLO_MISMATCH;
    case ErrorCode::kUnavailable: return ARLO_UNAVAILABLE;
    case ErrorCode::kResourceExhausted: return ARLO_RESOURCE_EXHAUSTED;
    case ErrorCode::kInternal: return ARLO_INTERNAL;
  }
  return ARLO_INTERNAL;
}

arlo_status fail(const Error& e) {
  g_last_error = e.what();
  return to_status(e.code());
}
arlo_status fail(arlo_status s, std::string message) {
  g_last_error = std::move(message);
  return s;
}
arlo_status succeed() {
  g_last_error.clear();
  return ARLO_OK;
}

// Runs `body`, turning any exception into ARLO_INTERNAL with its message.
template <typename F>
arlo_status guarded(const char* what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return fail(ARLO_INTERNAL, fmt::format("{}: unexpected exception: {}", what, e.what()));
  } catch (...) {
    return fail(ARLO_INTERNAL, fmt::format("{}: unexpected exception", what));
  }
}

std::chrono::milliseconds ms_or_forever(int64_t timeout_ms) {
  // "Forever" as a very long finite wait keeps the arithmetic on time points safe.
  return std::chrono::milliseconds(timeout_ms < 0 ? int64_t{1} << 40 : timeout_ms);
}

#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
namespace ws = arlo::weight_sync;

// Borrowed host tensors as a WeightSource for one publish() call.
class BorrowedSource final : public ws::WeightSource {
 public:
  BorrowedSource(std::vector<ws::TensorSpec> specs, std::vector<const void*> data)
      : specs_(std::move(specs)), data_(std::move(data)) {}
  const std::vector<ws::TensorSpec>& specs() const override { return specs_; }
  arlo::Result<ws::TensorView> view(std::size_t index) const override {
    if (index >= specs_.size())
      return arlo::make_error(ErrorCode::kNotFound, fmt::format("tensor index {} out of range", index));
    return ws::TensorView{
        &specs_[index],
        {static_cast<const std::byte*>(data_[index]), static_cast<std::size_t>(specs_[index].nbytes())},
        ws::Device::cpu()};
  }

 private:
  std::vector<ws::TensorSpec> specs_;
  std::vector<const void*> data_;
};

arlo::Result<ws::Options> weight_sync_options(const json& block) {
  ws::Options base;
  base.peer_name = "trainer";
  return ws::options_from_json(block, base);
}
#endif

}  // namespace

struct arlo_bridge {
  std::unique_ptr<arlo::bridge::BridgeClient> client;
  // Calls in progress, so close() can wake them and wait for them to return before freeing.
  std::mutex calls_mu;
  std::condition_variable calls_cv;
  int calls = 0;
  json weight_sync_config;  // null when absent
  std::mutex publish_mu;    // one publish at a time
#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
  std::unique_ptr<ws::StagingPublisher> publisher;  // announces through `client`; destroyed before it
#endif
};

#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
// The receiving side (ws::StagingSubscriber) and the C views of the version it holds.
struct arlo_receiver {
  ws::StagingSubscriber subscriber;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<arlo_tensor> views;
  std::string report = "{}";

  // The views of the tensors held now.
  void describe() {
    const auto& specs = subscriber.held().specs();
    shapes.clear();
    views.clear();
    shapes.reserve(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto& spec = specs[i];
      auto v = subscriber.held().view(i);
      shapes.push_back(spec.shape);
      views.push_back(arlo_tensor{spec.name.c_str(), static_cast<int32_t>(spec.dtype),
                                  static_cast<int32_t>(spec.shape.size()), shapes.back().data(), v->bytes.data(),
                                  spec.nbytes()});
    }
  }
};
#endif

namespace {

// Counts a call in progress on `b` for its lifetime.
class CallGuard {
 public:
  explicit CallGuard(arlo_bridge* b) : b_(b) {
    std::lock_guard lock(b_->calls_mu);
    ++b_->calls;
  }
  ~CallGuard() {
    std::lock_guard lock(b_->calls_mu);
    if (--b_->calls == 0) b_->calls_cv.notify_all();
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  arlo_bridge* b_;
};

// What an arlo_batch points into.
struct BatchHolder {
  arlo::bridge::BatchView view;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<arlo_tensor> tensors;
  std::string metadata_json;
  arlo_batch batch{};
};

}  // namespace

extern "C" {

int arlo_bridge_abi_version(void) { return ARLO_BRIDGE_ABI_VERSION; }

const char* arlo_bridge_last_error(void) { return g_last_error.c_str(); }

arlo_status arlo_bridge_connect(const char* config_json, arlo_bridge** out) {
  return guarded("arlo_bridge_connect", [&]() -> arlo_status {
    if (config_json == nullptr || out == nullptr)
      return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_connect: config_json and out must not be NULL");
    *out = nullptr;
    json cfg = json::parse(config_json, nullptr, false);
    if (!cfg.is_object()) return fail(ARLO_PARSE, "arlo_bridge_connect: config is not a JSON object");
    arlo::bridge::ClientOptions o;
    static const char* known[] = {"transport",
                                  "run_dir",
                                  "host",
                                  "port",
                                  "rank",
                                  "start_after_step",
                                  "heartbeat_interval_ms",
                                  "heartbeat_timeout_ms",
                                  "weight_sync"};
    for (const auto& [key, value] : cfg.items()) {
      if (std::find(std::begin(known), std::end(known), key) == std::end(known)) {
        return fail(ARLO_INVALID_ARGUMENT, fmt::format("arlo_bridge_connect: unknown config key '{}'", key));
      }
    }
    try {
      o.transport = cfg.value("transport", std::string("dir"));
      o.run_dir = cfg.value("run_dir", std::string());
      o.host = cfg.value("host", std::string("127.0.0.1"));
      o.host_source = "the \"host\" of the arlo_bridge_connect config";
      o.port = cfg.value("port", std::uint16_t{0});
      o.rank = cfg.value("rank", 0);
      o.start_after_step = cfg.value("start_after_step", int64_t{0});
      if (cfg.contains("heartbeat_interval_ms"))
        o.heartbeat_interval = std::chrono::milliseconds(cfg.at("heartbeat_interval_ms").get<int64_t>());
      if (cfg.contains("heartbeat_timeout_ms"))
        o.heartbeat_timeout = std::chrono::milliseconds(cfg.at("heartbeat_timeout_ms").get<int64_t>());
    } catch (const json::exception& e) {
      return fail(ARLO_INVALID_ARGUMENT, fmt::format("arlo_bridge_connect: config: {}", e.what()));
    }
    auto client = arlo::bridge::connect(o);
    if (!client) return fail(client.error());
    auto bridge = std::make_unique<arlo_bridge>();
    bridge->client = std::move(*client);
    if (cfg.contains("weight_sync")) {
      if (!cfg["weight_sync"].is_object())
        return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_connect: weight_sync must be an object");
      bridge->weight_sync_config = cfg["weight_sync"];
    }
    *out = bridge.release();
    return succeed();
  });
}

arlo_status arlo_bridge_next_batch(arlo_bridge* bridge, int64_t timeout_ms, arlo_batch** out) {
  return guarded("arlo_bridge_next_batch", [&]() -> arlo_status {
    if (bridge == nullptr || out == nullptr)
      return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_next_batch: bridge and out must not be NULL");
    *out = nullptr;
    CallGuard call(bridge);
    auto view = bridge->client->next_batch(ms_or_forever(timeout_ms));
    if (!view) return fail(view.error());
    auto holder = std::make_unique<BatchHolder>(BatchHolder{std::move(*view), {}, {}, {}, {}, {}});
    const auto refs = holder->view.tensors();
    holder->names.reserve(refs.size());
    holder->shapes.reserve(refs.size());
    for (const auto& r : refs) {
      holder->names.emplace_back(r.name);
      holder->shapes.emplace_back(r.shape.begin(), r.shape.end());
    }
    for (std::size_t i = 0; i < refs.size(); ++i) {
      holder->tensors.push_back(arlo_tensor{holder->names[i].c_str(), static_cast<int32_t>(refs[i].dtype),
                                            static_cast<int32_t>(holder->shapes[i].size()), holder->shapes[i].data(),
                                            refs[i].bytes.data(), refs[i].bytes.size()});
    }
    holder->metadata_json = json(holder->view.metadata()).dump();
    arlo_batch& b = holder->batch;
    b.step = holder->view.step();
    b.rank = holder->view.rank();
    b.num_ranks = holder->view.num_ranks();
    b.rows = holder->view.rows();
    b.seq_len = holder->view.seq_len();
    b.num_tensors = holder->tensors.size();
    b.tensors = holder->tensors.data();
    b.metadata_json = holder->metadata_json.c_str();
    b.internal_ = holder.get();
    *out = &holder.release()->batch;
    return succeed();
  });
}

arlo_status arlo_batch_release(arlo_batch* batch) {
  if (batch == nullptr) return succeed();
  delete static_cast<BatchHolder*>(batch->internal_);
  return succeed();
}

const arlo_tensor* arlo_batch_tensor(const arlo_batch* batch, const char* name) {
  if (batch == nullptr || name == nullptr) return nullptr;
  for (std::size_t i = 0; i < batch->num_tensors; ++i) {
    if (std::string_view(batch->tensors[i].name) == name) return &batch->tensors[i];
  }
  return nullptr;
}

arlo_status arlo_bridge_ack(arlo_bridge* bridge, int64_t step) {
  return guarded("arlo_bridge_ack", [&]() -> arlo_status {
    if (bridge == nullptr) return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_ack: bridge is NULL");
    CallGuard call(bridge);
    auto s = bridge->client->ack(step);
    return s ? succeed() : fail(s.error());
  });
}

arlo_status arlo_bridge_publish(arlo_bridge* bridge, int64_t version, const arlo_tensor* tensors, size_t num_tensors,
                                int64_t timeout_ms) {
  return guarded("arlo_bridge_publish", [&]() -> arlo_status {
    if (bridge == nullptr || (tensors == nullptr && num_tensors > 0)) {
      return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_publish: bridge and tensors must not be NULL");
    }
    CallGuard call(bridge);
    if (version < 0) return fail(ARLO_INVALID_ARGUMENT, fmt::format("arlo_bridge_publish: version {} < 0", version));
#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
    if (bridge->weight_sync_config.is_null()) {
      return fail(ARLO_INVALID_ARGUMENT,
                  "arlo_bridge_publish: the connect config has no \"weight_sync\" section; add one "
                  "(e.g. {\"transport\": \"filesystem\", \"dir\": \"<run_dir>/weights\"}) or use arlo_bridge_announce");
    }
    std::lock_guard lock(bridge->publish_mu);
    std::vector<ws::TensorSpec> specs;
    std::vector<const void*> data;
    for (std::size_t i = 0; i < num_tensors; ++i) {
      const arlo_tensor& t = tensors[i];
      if (t.name == nullptr || t.dtype < ARLO_F64 || t.dtype > ARLO_BOOL || t.ndim < 0 ||
          (t.ndim > 0 && t.shape == nullptr) || (t.data == nullptr && t.nbytes > 0)) {
        return fail(ARLO_INVALID_ARGUMENT,
                    fmt::format("arlo_bridge_publish: tensor {} is malformed (name, dtype, ndim, shape, data)", i));
      }
      ws::TensorSpec spec{t.name, static_cast<ws::DType>(t.dtype), std::vector<int64_t>(t.shape, t.shape + t.ndim)};
      if (spec.nbytes() != t.nbytes) {
        return fail(ARLO_INVALID_ARGUMENT,
                    fmt::format("arlo_bridge_publish: tensor '{}' has {} bytes, its dtype and shape need {}", spec.name,
                                t.nbytes, spec.nbytes()));
      }
      specs.push_back(std::move(spec));
      data.push_back(t.data);
    }
    if (!bridge->publisher) {
      auto opts = weight_sync_options(bridge->weight_sync_config);
      if (!opts) return fail(opts.error());
      auto* client = bridge->client.get();
      auto pub = ws::StagingPublisher::create(*opts, [client](const ws::Announcement& a) {
        return client->published(a.version, json{{"weight_sync", ws::to_json(a)}});
      });
      if (!pub) return fail(pub.error());
      bridge->publisher = std::move(*pub);
    }
    // A version that could not be published (its disk full, its notice not written) is one the
    // orchestrator waits for in vain: the trainer hears of it here, as arlo-trainer does.
    if (auto failed = bridge->publisher->failure(); !failed)
      return fail(Error(failed.error()).with_context("arlo_bridge_publish"));
    BorrowedSource source(std::move(specs), std::move(data));
    auto staged = bridge->publisher->stage(version, source);
    if (!staged) return fail(staged.error());
    if (timeout_ms == 0) return succeed();
    if (auto published = bridge->publisher->flush(ws::Clock::now() + ms_or_forever(timeout_ms)); !published)
      return fail(Error(published.error()).with_context(fmt::format("arlo_bridge_publish v{}", version)));
    return succeed();
#else
    (void)num_tensors;
    (void)timeout_ms;
    return fail(ARLO_UNAVAILABLE, "arlo_bridge_publish: this libarlo_bridge was built without weight_sync; use arlo_bridge_announce");
#endif
  });
}

arlo_status arlo_bridge_announce(arlo_bridge* bridge, int64_t version, const char* info_json) {
  return guarded("arlo_bridge_announce", [&]() -> arlo_status {
    if (bridge == nullptr) return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_announce: bridge is NULL");
    CallGuard call(bridge);
    json info = json::object();
    if (info_json != nullptr) {
      info = json::parse(info_json, nullptr, false);
      if (!info.is_object()) return fail(ARLO_PARSE, "arlo_bridge_announce: info_json is not a JSON object");
    }
    auto s = bridge->client->published(version, info);
    return s ? succeed() : fail(s.error());
  });
}

arlo_status arlo_bridge_heartbeat(arlo_bridge* bridge) {
  return guarded("arlo_bridge_heartbeat", [&]() -> arlo_status {
    if (bridge == nullptr) return fail(ARLO_INVALID_ARGUMENT, "arlo_bridge_heartbeat: bridge is NULL");
    CallGuard call(bridge);
    auto s = bridge->client->heartbeat();
    return s ? succeed() : fail(s.error());
  });
}

int64_t arlo_bridge_last_acked_step(const arlo_bridge* bridge) {
  return bridge == nullptr ? -1 : bridge->client->last_acked_step();
}

arlo_status arlo_bridge_close(arlo_bridge* bridge) {
  return guarded("arlo_bridge_close", [&]() -> arlo_status {
    if (bridge == nullptr) return succeed();
#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
    arlo::Status published = arlo::ok();
    if (bridge->publisher) {  // the last version reaches the orchestrator before the bridge closes
      published = bridge->publisher->flush(ws::Clock::now() + std::chrono::seconds(60));
      bridge->publisher.reset();
    }
#endif
    bridge->client->close();  // wakes a next_batch in progress (it returns ARLO_CANCELLED)
    {
      std::unique_lock lock(bridge->calls_mu);
      bridge->calls_cv.wait(lock, [&] { return bridge->calls == 0; });
    }
    delete bridge;
#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
    if (!published) return fail(Error(published.error()).with_context("arlo_bridge_close: closed, but"));
#endif
    return succeed();
  });
}

#ifdef ARLO_BRIDGE_HAVE_WEIGHT_SYNC
arlo_status arlo_receiver_open(const char* block_json, arlo_receiver** out) {
  return guarded("arlo_receiver_open", [&]() -> arlo_status {
    if (block_json == nullptr || out == nullptr)
      return fail(ARLO_INVALID_ARGUMENT, "arlo_receiver_open: block_json and out must not be NULL");
    *out = nullptr;
    const json block = json::parse(block_json, nullptr, false);
    if (!block.is_object())
      return fail(ARLO_PARSE, "arlo_receiver_open: the block is not a JSON object (docs/weight-sync.md)");
    ws::Options base;
    base.peer_name = "receiver";
    auto opts = ws::options_from_json(block, base);
    if (!opts) return fail(Error(opts.error()).with_context("arlo_receiver_open"));
    auto r = std::make_unique<arlo_receiver>();
    if (auto st = r->subscriber.use(*opts); !st) return fail(Error(st.error()).with_context("arlo_receiver_open"));
    *out = r.release();
    return succeed();
  });
}

arlo_status arlo_receiver_receive(arlo_receiver* receiver, int64_t timeout_ms, int64_t* version_out) {
  return guarded("arlo_receiver_receive", [&]() -> arlo_status {
    if (receiver == nullptr) return fail(ARLO_INVALID_ARGUMENT, "arlo_receiver_receive: receiver is NULL");
    auto got = receiver->subscriber.pull(ws::Clock::now() + ms_or_forever(timeout_ms));
    if (!got) return fail(Error(got.error()).with_context("arlo_receiver_receive"));
    receiver->describe();
    receiver->report = ws::to_json(*got).dump();
    if (version_out != nullptr) *version_out = got->report.version;
    return succeed();
  });
}

int64_t arlo_receiver_version(const arlo_receiver* receiver) {
  if (receiver == nullptr) return -1;
  const auto v = receiver->subscriber.version();
  return v ? *v : -1;
}

arlo_status arlo_receiver_tensors(const arlo_receiver* receiver, const arlo_tensor** tensors, size_t* num_tensors) {
  if (receiver == nullptr || tensors == nullptr || num_tensors == nullptr)
    return fail(ARLO_INVALID_ARGUMENT, "arlo_receiver_tensors: receiver, tensors and num_tensors must not be NULL");
  const auto& views = receiver->views;
  *tensors = views.data();
  *num_tensors = views.size();
  return succeed();
}

const char* arlo_receiver_report(const arlo_receiver* receiver) {
  return receiver == nullptr ? "{}" : receiver->report.c_str();
}

arlo_status arlo_receiver_close(arlo_receiver* receiver) {
  return guarded("arlo_receiver_close", [&]() -> arlo_status {
    delete receiver;
    return succeed();
  });
}
#else
arlo_status arlo_receiver_open(const char*, arlo_receiver** out) {
  if (out != nullptr) *out = nullptr;
  return fail(ARLO_UNAVAILABLE, "arlo_receiver_open: this libarlo_bridge was built without weight_sync");
}
arlo_status arlo_receiver_receive(arlo_receiver*, int64_t, int64_t*) { return arlo_receiver_open(nullptr, nullptr); }
int64_t arlo_receiver_version(const arlo_receiver*) { return -1; }
arlo_status arlo_receiver_tensors(const arlo_receiver*, const arlo_tensor**, size_t*) {
  return arlo_receiver_open(nullptr, nullptr);
}
const char* arlo_receiver_report(const arlo_receiver*) { return "{}"; }
arlo_status arlo_receiver_close(arlo_receiver*) { return succeed(); }
#endif

}  // extern "C"
