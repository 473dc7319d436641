#pragma once
// StagingSubscriber: the receiving side of stage / announce / pull (docs/weight-sync.md), the
// counterpart of StagingPublisher (staging.h); what arlo-worker and the C ABI receiver
// (arlo_receiver_*) pull versions with.
//
//   weight_sync::StagingSubscriber sub(own);        // this side's block: timeouts, peer name, relay listen
//   ...for each version the orchestrator tells of (an announcement, or the receiver block made of one):
//   ARLO_ASSIGN_OR_RETURN(auto o, sub.options_for(announcement));  // its transport and endpoint over `own`
//   ARLO_TRY(sub.use(o));                            // the same block as last time: the same connection
//   ARLO_ASSIGN_OR_RETURN(auto got, sub.pull(deadline_in(60s)));   // into held(), or pull(sink, ...)
//   got.report.version, checksum_hex(got.checksum), sub.held().specs() / view(i)
//
// - pull() receives the next version newer than the one held and commits it to the sink only once
//   every bucket verified (ApplyMode::kStaging, what the update blocks of a worker ask for): a pull
//   that fails leaves the version held before it whole, and version() unchanged.
// - use() keeps the transport's Subscriber (its connection, relay and delta base) while the options
//   stay the same; other options start a new one, told which version the sinks hold (the last
//   pulled, or assume_version()) so its first delta applies.
// - The checksum is weights_checksum() of what the sink holds after the commit: what the trainer
//   announced with the version.
//
// Thread-safety: one thread at a time (a pull blocks that thread until the version arrived, failed
// or the deadline passed).
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/weight_sync.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {

// The newest version in host memory, in whatever tensors the publisher's manifest names (the
// subscriber asks for every tensor before data moves). A tensor keeps its buffer while its name,
// dtype and shape stay (the base a delta applies to); a new or reshaped one gets a fresh buffer that
// replaces the held one only at commit, so a receive that fails leaves the version held before it.
// specs() and view() are the committed version's tensors, in the manifest's order.
class HeldVersion final : public WeightSink, public WeightSource {
 public:
  // Called before each receive: the manifest that follows names the tensors anew.
  void begin();
  Result<std::span<std::byte>> buffer_for(const TensorSpec& spec) override;
  Status commit(Version version) override;
  const std::vector<TensorSpec>& specs() const override { return specs_; }
  Result<TensorView> view(std::size_t index) const override;

 private:
  struct Buffer {
    TensorSpec spec;
    std::unique_ptr<std::byte[]> data;
  };
  std::map<std::string, Buffer> held_, fresh_;  // the version held; this receive's new buffers
  std::vector<std::string> asked_;              // this receive's manifest, in order
  std::vector<TensorSpec> specs_;
};

struct Pulled {
  ReceiveReport report;        // report.version: what the sink holds now
  std::uint64_t checksum = 0;  // weights_checksum() of what the sink holds now
};

class StagingSubscriber {
 public:
  explicit StagingSubscriber(Options own = {});
  ~StagingSubscriber();
  StagingSubscriber(const StagingSubscriber&) = delete;
  StagingSubscriber& operator=(const StagingSubscriber&) = delete;

  // The options one version is pulled with: `block` (a receiver block, wire.h) over this side's own
  // block; or an announcement's transport and endpoint over it (wire.h receiver_block).
  Result<Options> options_for(const nlohmann::json& block) const;
  Result<Options> options_for(const Announcement& announcement) const;

  // Pulls with `options` from now on (see above). An error (no such transport, a relay that cannot
  // listen, ...) leaves no transport: pull() fails until a use() succeeds.
  Status use(const Options& options);
  // The version the sinks hold before the first pull of a new transport (e.g. loaded from disk).
  void assume_version(std::optional<Version> version) { assumed_ = version; }

  // Receives the next version into held() (or into `sink`, seen as `held` for the checksum: the same
  // weights as a source; a reference::ModelWeights, a HostWeights) and commits it.
  Result<Pulled> pull(Deadline deadline);
  Result<Pulled> pull(WeightSink& sink, const WeightSource& held, Deadline deadline);
  template <typename Weights>
  Result<Pulled> pull(Weights& weights, Deadline deadline) {
    return pull(static_cast<WeightSink&>(weights), static_cast<const WeightSource&>(weights), deadline);
  }

  const HeldVersion& held() const { return held_; }
  // The version the last pull committed (or assume_version()'s, before it); nullopt before either.
  std::optional<Version> version() const { return assumed_; }
  // Chain: where the next node connects (an endpoint object); empty object when not relaying.
  nlohmann::json relay_endpoint() const;

 private:
  Options own_;
  std::unique_ptr<Subscriber> subscriber_;
  std::string key_;  // the options subscriber_ was made with, as JSON
  std::optional<Version> assumed_;
  HeldVersion held_;
};

// A pull's report as one JSON object: version, payload, wire_bytes, buckets, retried_buckets, path,
// seconds, checksum (16 hex digits).
nlohmann::json to_json(const Pulled& pulled);

}  // namespace arlo::weight_sync
