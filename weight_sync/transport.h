#pragma once
// Transports: how encoded versions travel. One SenderTransport/ReceiverTransport pair per kind,
// created by name from a registry (Options::transport), so a GPU transport (cuda_ipc, nccl) can be
// registered later without touching Publisher/Subscriber or their callers.
//
// A transport owns the whole exchange of one version (handshake, buckets, acknowledgement) because
// the kinds differ in shape: streaming (tcp, shm) versus durable files (filesystem). The shared
// pieces (manifest planning, payload codecs, verify-then-apply) live in codec.h and are used by each.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "weight_sync/types.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {

class HostWeights;

// State the Publisher keeps across versions and lends to its transport.
struct SenderState {
  Options options;
  std::optional<Version> last_version;  // last version published (the delta base)
  std::unique_ptr<HostWeights> base;    // snapshot of last_version; kept only for the delta payload
};

// State the Subscriber keeps across versions and lends to its transport.
struct ReceiverState {
  Options options;
  std::optional<Version> version;       // what the sink holds
  std::vector<TensorSpec> specs;        // tensors of the last applied manifest
};

class SenderTransport {
 public:
  virtual ~SenderTransport() = default;
  virtual std::string endpoint() const = 0;
  // Delivers `version` to every receiver. Does not update `state` (the Publisher does).
  virtual Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                        Deadline deadline) = 0;
};

class ReceiverTransport {
 public:
  virtual ~ReceiverTransport() = default;
  // Receives the next version into `sink` and commits it; updates state.version/specs on success
  // and on an in-place failure (version reset).
  virtual Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) = 0;
  // Where downstream nodes connect (tcp chain relays); empty otherwise.
  virtual std::string relay_endpoint() const { return {}; }
};

using SenderFactory = std::function<Result<std::unique_ptr<SenderTransport>>(const Options&)>;
using ReceiverFactory = std::function<Result<std::unique_ptr<ReceiverTransport>>(const Options&)>;

Result<std::unique_ptr<SenderTransport>> make_sender_transport(const Options& options);
Result<std::unique_ptr<ReceiverTransport>> make_receiver_transport(const Options& options);

}  // namespace arlo::weight_sync
