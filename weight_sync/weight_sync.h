#pragma once
// weight_sync: moves a versioned set of named tensors from one trainer to many inference workers.
//
// ## Usage
//
// Trainer (one Publisher per run; publish() pushes one version to every connected receiver):
//
//   weight_sync::Options opt;
//   opt.transport = "tcp";                 // a registered transport: tcp | shm | filesystem
//   opt.params = {{"address", "0.0.0.0:29500"}};  // tcp: where the publisher listens
//   opt.expected_receivers = 2;            // star: number of workers; chain: 1
//   opt.payload.kind = weight_sync::PayloadKind::kFull;
//   ARLO_ASSIGN_OR_RETURN(auto pub, weight_sync::Publisher::create(opt));
//   weight_sync::HostWeights weights(specs);            // or your own WeightSource over torch tensors
//   ARLO_ASSIGN_OR_RETURN(auto report, pub->publish(step, weights, weight_sync::deadline_in(60s)));
//
// Worker (one Subscriber per worker; receive() blocks until the next version is applied):
//
//   weight_sync::Options opt;
//   opt.transport = "tcp";
//   opt.params = {{"address", "trainer-host:29500"}};  // the publisher (in a chain, the previous worker)
//   opt.relay = true;                      // chain: serve the next worker (tcp: at params relay_listen)
//   opt.apply_mode = weight_sync::ApplyMode::kInPlace;  // generation is paused; or kStaging
//   ARLO_ASSIGN_OR_RETURN(auto sub, weight_sync::Subscriber::create(opt));
//   MySink sink(model);                    // a WeightSink handing out the parameter buffers by name
//   ARLO_ASSIGN_OR_RETURN(auto got, sub->receive(sink, weight_sync::deadline_in(60s)));
//   // got.version is now in the sink (sink.commit(version) was called); sub->version() says so too.
//
// filesystem: the publisher writes <dir>/v<version>/ (HF safetensors shards, index, manifest.json,
// STABLE last); receive() applies the newest STABLE version above the one held. shm: same host;
// publisher and subscribers name the same `shm_name`. Each transport's keys: its descriptor
// (transport.h); the one JSON form of Options and of an announcement: wire.h (docs/weight-sync.md).
// A trainer that must not wait for receivers uses the StagingPublisher (staging.h) around this.
//
// ## Contracts
// - The manifest (names, dtypes, shapes, bucket layout, payload, version) is agreed before any data
//   moves; a receiver whose sink does not match refuses and the publisher reports that peer.
// - Every bucket carries an xxh3-64 checksum; a bucket is applied only after it verified.
// - A version is committed to the sink only when every bucket verified. In staging mode a failed
//   transfer leaves the sink untouched (previous version). In in_place mode a failure after bytes
//   were written calls sink.discard() and version() becomes nullopt (nothing to serve) until the next
//   successful receive, which is then a full resync.
// - Every blocking step has a deadline (Options::bucket_timeout per bucket, and the call's deadline).
//   Errors say which bucket, which peer and why.
// Thread-safety: a Publisher / Subscriber is used from one thread at a time.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync {

class BucketTap;  // transport.h: watches the buckets a side moves

enum class PayloadKind {
  kFull,      // bytes as trained
  kCastBf16,  // floating tensors rounded to bf16 on the wire (RNE), decoded back to their dtype
  kCastFp8,   // floating tensors as fp8 e4m3 with one fp32 scale per 128-element block
  kDelta,     // changed elements since the receiver's version (overwrite encoding)
};
std::string_view to_string(PayloadKind kind);
Result<PayloadKind> parse_payload(std::string_view text);  // full | bf16 | fp8 | delta

struct PayloadOptions {
  PayloadKind kind = PayloadKind::kFull;
  bool zstd = false;                      // zstd level 1 on top of any payload
  double delta_density_threshold = 0.25;  // per bucket item: above this changed fraction, send dense
};

enum class ApplyMode {
  kStaging,  // verified buckets are kept aside; the sink is written only after all verified
  kInPlace,  // verified buckets go straight into the sink (caller paused generation); lowest memory
};

// What every transport shares. The transport's own parameters (tcp's address, the filesystem's dir,
// ...) are `params`, a JSON object checked against the transport's descriptor (transport.h: its
// keys, types and defaults); wire.h has the one JSON form of the whole block.
struct Options {
  std::string transport = "tcp";  // a registered transport (transport.h: transports())
  PayloadOptions payload;
  std::uint64_t bucket_bytes = 256ull << 20;
  ApplyMode apply_mode = ApplyMode::kStaging;
  std::chrono::milliseconds bucket_timeout{30000};  // deadline for each bucket (and each handshake)
  std::chrono::milliseconds timeout{120000};        // deadline for moving one version
  std::size_t keep_last = 2;                        // versions a publisher keeps (staged, or on disk); >= 2
  std::size_t expected_receivers = 1;               // publisher: direct downstream links (star: the workers; chain: 1)
  // Publisher: once the first receiver of a transfer came, how long it waits for the other expected
  // ones before it streams to those present (a late one gets the next transfer).
  std::chrono::milliseconds gather_window{50};
  bool relay = false;                                // receiver in a chain: serve the next one (transports that relay)
  std::string peer_name;                             // how this side is named in reports ("worker-0")
  nlohmann::json params = nlohmann::json::object();  // the transport's own options
};

struct PeerReport {
  std::string peer;
  bool ok = false;
  std::string error;             // empty when ok
  std::uint64_t wire_bytes = 0;  // bytes sent to this peer
};

struct PublishReport {
  Version version = 0;
  PayloadKind payload = PayloadKind::kFull;  // what was actually sent (delta may fall back to full)
  std::uint64_t raw_bytes = 0;               // model bytes
  std::uint64_t wire_bytes = 0;              // encoded bytes of one copy of the stream
  std::size_t buckets = 0;
  double seconds = 0;
  std::vector<PeerReport> peers;
  bool all_ok() const;
};

struct ReceiveReport {
  Version version = 0;
  PayloadKind payload = PayloadKind::kFull;
  std::uint64_t wire_bytes = 0;
  std::size_t buckets = 0;
  std::size_t retried_buckets = 0;  // buckets that failed verification or were cut and came again
  std::string path;                 // how the bytes came: "tcp", "shm direct read", "shm slots", "filesystem"
  double seconds = 0;
};

class Publisher {
 public:
  virtual ~Publisher() = default;
  // `tap`, where given, watches the buckets this side moves (transport.h).
  static Result<std::unique_ptr<Publisher>> create(const Options& options, std::shared_ptr<BucketTap> tap = nullptr);

  // Sends `version` of `source` to every receiver and waits until each applied it or failed.
  // Returns an error only when nothing could be delivered (no receiver, bad source); per-peer
  // failures are in the report. `source` must stay unchanged until this returns.
  virtual Result<PublishReport> publish(Version version, const WeightSource& source, Deadline deadline) = 0;
  // Where receivers reach it: the transport's endpoint object (tcp {"address": bound host:port},
  // shm {"shm_name"}, filesystem {"dir"}), what an announcement carries (wire.h).
  virtual nlohmann::json endpoint() const = 0;
};

class Subscriber {
 public:
  virtual ~Subscriber() = default;
  static Result<std::unique_ptr<Subscriber>> create(const Options& options, std::shared_ptr<BucketTap> tap = nullptr);

  // Waits for the next version (newer than version()), receives it into `sink` and commits it.
  virtual Result<ReceiveReport> receive(WeightSink& sink, Deadline deadline) = 0;
  // The version the sink holds (nullopt before the first receive, or after an in-place failure).
  virtual std::optional<Version> version() const = 0;
  // xxh3 checksum of the weights `sink` holds now (same definition as weights_checksum()).
  Result<std::uint64_t> checksum(WeightSink& sink) const;
  // The version this subscriber knows the sink holds (e.g. loaded from disk at start), so the first
  // delta can apply. Call before receive().
  virtual void assume_version(std::optional<Version> version) = 0;
  // Tensors of the last applied version (empty before the first).
  virtual const std::vector<TensorSpec>& specs() const = 0;
  // Chain: where the next node connects, as an endpoint object (tcp {"address": bound host:port});
  // empty object when not relaying.
  virtual nlohmann::json relay_endpoint() const = 0;
};

}  // namespace arlo::weight_sync
