#pragma once
// Transports: how encoded versions travel. Each transport is one folder or file under transports/
// that defines a TransportDescriptor (name, capabilities, its own options, sender and receiver
// factories) and one line in transports/registry.inc; nothing outside weight_sync/ knows a
// transport by name. The config schema (weight_sync.* keys), docs/configuration.md, the wire form
// (wire.h) and every caller read the registered descriptors.
//
// A transport owns the whole exchange of one version (handshake, buckets, acknowledgement) because
// the kinds differ in shape: streaming (tcp, shm) versus durable files (filesystem). The shared
// pieces (manifest planning, payload codecs, verify-then-apply) live in codec.h and are used by each.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/option_spec.h"
#include "common/registry.h"
#include "common/result.h"
#include "weight_sync/types.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {

class HostWeights;
class CollectiveControl;
struct Announcement;

struct Capabilities {
  bool durable = false;  // a staged version outlives its publisher (files); false: streamed
  bool relays = false;   // a receiver can serve the next one (chain topology)
  // Publisher and receivers enter one collective per version (collective.h): the orchestrator
  // forms the group and each receiver says when it receives; nobody pulls on its own.
  bool collective = false;
  std::vector<Device::Kind> devices{Device::Kind::kCpu};  // where source and sink memory may live
};

// Watches the buckets one side moves: the streaming data paths (tcp, shm) call it where one is set
// (Publisher::create / Subscriber::create take it; none in production). Calls may come from several
// threads at once (tcp serves each link on its own) and again for a bucket that is sent again. A tcp
// relay shows its tap the buckets it receives, not the ones it forwards.
class BucketTap {
 public:
  virtual ~BucketTap() = default;
  // This side is about to move bucket `bucket` of `version` (a sender to hand it over, a receiver to take it).
  virtual void before(Version /*version*/, std::size_t /*bucket*/) {}
  // Sender: `bytes` of the bucket were hashed into its checksum and are about to be handed over. They
  // are this side's own copy (a buffer, the wire copy, the shared segment), never the source's memory,
  // and may be one piece of the bucket; empty where receivers read the source itself (shm direct
  // read). `checksum`, where not null, is the bucket's checksum about to be posted.
  virtual void sealed(Version /*version*/, std::size_t /*bucket*/, std::span<std::byte> /*bytes*/,
                      std::uint64_t* /*checksum*/) {}
};

// State the Publisher keeps across versions and lends to its transport.
struct SenderState {
  Options options;
  nlohmann::json params;                // options.params with the descriptor's defaults filled in
  std::shared_ptr<BucketTap> tap;       // null but where the creator gave one
  std::optional<Version> last_version;  // last version published (the delta base)
  std::unique_ptr<HostWeights> base;    // snapshot of last_version; kept only for the delta payload
};

// State the Subscriber keeps across versions and lends to its transport.
struct ReceiverState {
  Options options;
  nlohmann::json params;
  std::shared_ptr<BucketTap> tap;
  std::optional<Version> version;  // what the sink holds
  std::vector<TensorSpec> specs;   // tensors of the last applied manifest
};

class SenderTransport {
 public:
  virtual ~SenderTransport() = default;
  // Where receivers reach this sender: the endpoint object of an announcement (wire.h).
  virtual nlohmann::json endpoint() const = 0;
  // Delivers `version` to the receivers that come for it. Does not update `state` (the Publisher does).
  virtual Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                        Deadline deadline) = 0;
};

class ReceiverTransport {
 public:
  virtual ~ReceiverTransport() = default;
  // Receives the next version into `sink` and commits it; updates state.version/specs on success
  // and on an in-place failure (version reset).
  virtual Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) = 0;
  // Where downstream nodes connect (chain relays), an endpoint object; empty otherwise.
  virtual nlohmann::json relay_endpoint() const { return nlohmann::json::object(); }
};

// Factories get the state's options and params (defaults filled, types checked).
using SenderFactory = std::function<Result<std::unique_ptr<SenderTransport>>(const SenderState&)>;
using ReceiverFactory = std::function<Result<std::unique_ptr<ReceiverTransport>>(const ReceiverState&)>;

struct TransportDescriptor {
  // What a config calls a name, in errors: "unknown weight_sync transport 'x': use ...".
  static constexpr const char* kWhat = "weight_sync transport";
  std::string name;  // the value of weight_sync.transport
  std::string doc;   // one line for docs/configuration.md
  Capabilities capabilities;
  // Its own options: keys of Options::params; those marked user_key() are also keys of the
  // weight_sync config section (documented in docs/configuration.md), the others set by arlo.
  std::vector<OptionSpec> options;
  SenderFactory sender;
  ReceiverFactory receiver;
  // Durable transports: the directory of `version` under `endpoint` (what vLLM and SGLang load).
  std::function<std::string(const nlohmann::json& endpoint, Version version)> version_path;
  // Relaying transports: the params that make a receiver relay at host:port (first) and the
  // endpoint the next receiver then pulls from (second).
  std::function<std::pair<nlohmann::json, nlohmann::json>(const std::string& host, std::uint16_t port)> relay_at;
  // Publishers that listen on an address: why one made from `params` (the trainer's block) is
  // reachable from its own host only, naming the keys to set; empty when others can reach it.
  // `arlo run` refuses a trainer it starts with such a block when the workers are on other hosts.
  std::function<std::string(const nlohmann::json& params)> local_only;
  // Collective transports: the orchestrator's control of the publisher at `endpoint`.
  std::function<Result<std::unique_ptr<CollectiveControl>>(const nlohmann::json& endpoint, Deadline deadline)> control;

  const OptionSpec* option(std::string_view key) const;
};

// Every registered transport, in registration order (transports/registry.inc).
const ExtensionRegistry<TransportDescriptor>& transports();
// The descriptor of `name`; the error lists the registered names.
inline Result<const TransportDescriptor*> find_transport(std::string_view name) { return transports().find(name); }
// `params` checked against `d` (unknown keys and wrong types are errors naming the key) with the
// descriptor's defaults filled in for absent keys.
Result<nlohmann::json> resolve_params(const TransportDescriptor& d, const nlohmann::json& params);

// A side of a transfer made from `options` (checked; params resolved) with `tap` in its state: what
// Publisher, Subscriber and StagingPublisher are built on.
struct SenderSide {
  const TransportDescriptor* descriptor = nullptr;
  SenderState state;
  std::unique_ptr<SenderTransport> transport;
};
struct ReceiverSide {
  const TransportDescriptor* descriptor = nullptr;
  ReceiverState state;
  std::unique_ptr<ReceiverTransport> transport;
};
Result<SenderSide> make_sender(const Options& options, std::shared_ptr<BucketTap> tap = nullptr);
Result<ReceiverSide> make_receiver(const Options& options, std::shared_ptr<BucketTap> tap = nullptr);

}  // namespace arlo::weight_sync
