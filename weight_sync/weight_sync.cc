#include "weight_sync/weight_sync.h"

#include <cstring>

#include "weight_sync/xxh.h"

#include "common/log.h"
#include "weight_sync/transport.h"

namespace arlo::weight_sync {

namespace {

Status validate(const Options& o) {
  if (o.bucket_bytes < (1ull << 20) || o.bucket_bytes >= (4ull << 30))
    return make_error(ErrorCode::kInvalidArgument, "weight_sync.bucket_bytes must be in [1 MiB, 4 GiB)");
  if (o.payload.delta_density_threshold < 0 || o.payload.delta_density_threshold > 1)
    return make_error(ErrorCode::kInvalidArgument, "weight_sync.delta_density_threshold must be in [0, 1]");
  if (o.keep_last < 2) return make_error(ErrorCode::kInvalidArgument, "weight_sync.keep_last must be >= 2");
  if (o.bucket_timeout.count() <= 0 || o.timeout.count() <= 0)
    return make_error(ErrorCode::kInvalidArgument, "weight_sync bucket_timeout and timeout must be > 0");
  if (o.expected_receivers < 1)
    return make_error(ErrorCode::kInvalidArgument, "weight_sync expected_receivers must be >= 1");
  return ok();
}

// The descriptor of o.transport, refusing what it cannot do.
Result<const TransportDescriptor*> descriptor_for(const Options& o) {
  ARLO_TRY(validate(o));
  ARLO_ASSIGN_OR_RETURN(const auto* d, find_transport(o.transport));
  if (o.relay && !d->capabilities.relays)
    return make_error(ErrorCode::kInvalidArgument,
                      "weight_sync chain: the " + d->name + " transport does not relay; use topology star");
  return d;
}

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(std::unique_ptr<SenderTransport> t, SenderState state)
      : transport_(std::move(t)), state_(std::move(state)) {}

  Result<PublishReport> publish(Version version, const WeightSource& source, Deadline deadline) override {
    if (state_.last_version && version <= *state_.last_version)
      return make_error(ErrorCode::kInvalidArgument, "publish(" + std::to_string(version) +
                                                         "): versions must increase; last was " +
                                                         std::to_string(*state_.last_version));
    auto report = transport_->publish(version, source, state_, deadline);
    if (!report) return report;
    state_.last_version = version;
    if (state_.options.payload.kind == PayloadKind::kDelta) {
      // Snapshot what was published: the base the next delta is computed against.
      if (!state_.base || state_.base->specs() != source.specs())
        state_.base = std::make_unique<HostWeights>(source.specs());
      for (std::size_t t = 0; t < source.specs().size(); ++t) {
        ARLO_ASSIGN_OR_RETURN(auto v, source.view(t));
        std::memcpy(state_.base->bytes(t).data(), v.bytes.data(), v.bytes.size());
      }
    }
    for (const auto& p : report->peers)
      if (!p.ok) ARLO_WARN("weight_sync: version {} not delivered to {}: {}", version, p.peer, p.error);
    return report;
  }

  nlohmann::json endpoint() const override { return transport_->endpoint(); }

 private:
  std::unique_ptr<SenderTransport> transport_;
  SenderState state_;
};

class SubscriberImpl final : public Subscriber {
 public:
  SubscriberImpl(std::unique_ptr<ReceiverTransport> t, ReceiverState state)
      : transport_(std::move(t)), state_(std::move(state)) {}
  Result<ReceiveReport> receive(WeightSink& sink, Deadline deadline) override {
    return transport_->receive(sink, state_, deadline);
  }
  std::optional<Version> version() const override { return state_.version; }
  void assume_version(std::optional<Version> v) override { state_.version = v; }
  const std::vector<TensorSpec>& specs() const override { return state_.specs; }
  nlohmann::json relay_endpoint() const override { return transport_->relay_endpoint(); }

 private:
  std::unique_ptr<ReceiverTransport> transport_;
  ReceiverState state_;
};

// Either side: the descriptor of options' transport, the state (options, params with the
// descriptor's defaults, `tap`) and the transport the descriptor's `factory` makes from that state.
template <typename Side, typename Factory>
Result<Side> make_side(const Options& options, std::shared_ptr<BucketTap> tap, Factory TransportDescriptor::*factory) {
  Side side;
  ARLO_ASSIGN_OR_RETURN(side.descriptor, descriptor_for(options));
  side.state.options = options;
  ARLO_ASSIGN_OR_RETURN(side.state.params, resolve_params(*side.descriptor, options.params));
  side.state.tap = std::move(tap);
  ARLO_ASSIGN_OR_RETURN(side.transport, (side.descriptor->*factory)(side.state));
  return side;
}

}  // namespace

Result<SenderSide> make_sender(const Options& options, std::shared_ptr<BucketTap> tap) {
  if (options.relay)
    return make_error(ErrorCode::kInvalidArgument, "weight_sync: relay is a receiver option, not a publisher's");
  return make_side<SenderSide>(options, std::move(tap), &TransportDescriptor::sender);
}

Result<ReceiverSide> make_receiver(const Options& options, std::shared_ptr<BucketTap> tap) {
  return make_side<ReceiverSide>(options, std::move(tap), &TransportDescriptor::receiver);
}

Result<std::unique_ptr<Publisher>> Publisher::create(const Options& options, std::shared_ptr<BucketTap> tap) {
  ARLO_ASSIGN_OR_RETURN(auto side, make_sender(options, std::move(tap)));
  return std::unique_ptr<Publisher>(new PublisherImpl(std::move(side.transport), std::move(side.state)));
}

Result<std::unique_ptr<Subscriber>> Subscriber::create(const Options& options, std::shared_ptr<BucketTap> tap) {
  ARLO_ASSIGN_OR_RETURN(auto side, make_receiver(options, std::move(tap)));
  return std::unique_ptr<Subscriber>(new SubscriberImpl(std::move(side.transport), std::move(side.state)));
}

Result<std::uint64_t> Subscriber::checksum(WeightSink& sink) const {
  // Same definition as weights_checksum(): name, shape, bytes of every tensor in order.
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (const auto& spec : specs()) {
    ARLO_ASSIGN_OR_RETURN(auto buf, sink.buffer_for(spec));
    XXH3_64bits_update(&st, spec.name.data(), spec.name.size());
    for (auto d : spec.shape) XXH3_64bits_update(&st, &d, sizeof d);
    XXH3_64bits_update(&st, buf.data(), buf.size());
  }
  return XXH3_64bits_digest(&st);
}

}  // namespace arlo::weight_sync
