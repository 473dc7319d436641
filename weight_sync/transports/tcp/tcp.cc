// tcp transport (Boost.Asio). Star: the publisher serves every receiver directly. Chain: each
// relaying receiver (Options::relay, at `relay_listen`) serves the next one, so each link carries the stream once.
//
// Every link opens with sender -> CHALLENGE {nonce}; the receiver's HELLO carries proof =
// auth::proof(token, "arlo-weights/1", nonce) when it has a token (common/auth.h: $ARLO_TOKEN or
// $ARLO_TOKEN_FILE). A serving side with a token answers a missing or wrong proof with REFUSED
// {error} and closes, so weights go only to receivers that hold the run's token; one bound to a
// non-loopback address refuses to listen without a token. Handshake frames are at most 64 KiB.
//
// Per version, on each link: receiver -> HELLO {peer, version, resume, proof?}; sender -> MANIFEST;
// receiver -> ANSWER {accepted | refused | need_full, start}; sender -> BUCKET frames (header, data,
// trailer xxh3) from `start`; receiver -> DONE {peers: reports of itself and everything downstream}.
// Relays check their own sink, then offer the manifest downstream before answering, so a refusal or
// a need for a full resync anywhere is known before data moves.
//
// Who is served: publish(v, deadline) waits until `deadline` for the first receiver, then at most
// min(bucket_timeout, Options::gather_window) for the other expected ones, and streams to those that came; one that
// never comes holds nobody (it is served by a later publish). Once receivers came the transfer runs
// under Options::timeout even if `deadline` is nearer, so a caller may poll for receivers with short
// deadlines (the StagingPublisher does). A receiver that already holds v is not sent v again.
//
// Every operation runs under a deadline (bucket_timeout per bucket, the call deadline overall). A
// receiver that loses its link or sees a checksum mismatch reconnects and resumes from its first
// unverified bucket; the sending side waits reconnect_window for it. Data moves in 4 MiB send and
// receive calls (fewer syscalls; a chunk still sits in the shared cache when it is hashed), a
// cut-through relay's in 1 MiB steps (each hop delays the stream by one step). Each bucket is hashed
// once on the publisher, by the first link that sends it, and reused for every other link; a relay
// forwards the checksum it verified instead of hashing again. Receivers hash what they receive.
// `full` is sent straight from the source tensors and, in place, received straight into the sink's
// buffers.
//
// This folder is the protocol: the serving side (server.h: handshake, gather, offer, per-link
// streaming and resumption; side_by_side.h runs exchanges on every link at once), the publisher
// (sender.cc), the receiver and relay (receiver.cc), and here the registration; common.h is what
// they share. Links and frames are in conn.h; the buffering window between a version's producer
// and its downstream links, with the shared checksum cache, is feed.h (Feed).
#include "common/auth.h"
#include "weight_sync/transport.h"
#include "weight_sync/transports/tcp/common.h"
#include "weight_sync/transports/tcp/sides.h"

namespace arlo::weight_sync {

using detail::reconnect_window;
using detail::Server;

TransportDescriptor tcp_transport() {
  TransportDescriptor d;
  d.name = "tcp";
  d.doc = "streamed over TCP from the trainer (star) or worker to worker (chain), any host";
  d.capabilities.relays = true;
  d.options = {
      string_option("address", "127.0.0.1:0",
                    "publisher: where it listens (port 0: any free port, announced); receiver: the upstream host:port")
          .user_key(),
      string_option("advertise_host", "",
                    "publisher: the host it announces to receivers (empty: the host of address); needed when address "
                    "listens on every interface (0.0.0.0)")
          .user_key(),
      string_option("relay_listen", "127.0.0.1:0",
                    "relaying receiver (chain): where the next node connects (port 0: any free port)"),
      int_option("reconnect_window_ms", 5000, "how long either side waits for a dropped link to come back and resume")
          .range(0, 3600000)
          .user_key(),
  };
  d.sender = [](const SenderState& s) -> Result<std::unique_ptr<SenderTransport>> {
    const auto& address = s.params.at("address").get_ref<const std::string&>();
    const auto& advertise = s.params.at("advertise_host").get_ref<const std::string&>();
    ARLO_ASSIGN_OR_RETURN(auto server, Server::listen(address, advertise, reconnect_window(s.params), s.tap));
    const auto bound = auth::host_of(server->endpoint());
    if (advertise.empty() && (bound == "0.0.0.0" || bound == "::"))
      return make_error(ErrorCode::kInvalidArgument,
                        "tcp: the publisher's address " + address +
                            " listens on every interface, so it cannot announce "
                            "where receivers reach it; set weight_sync.advertise_host to the address the workers reach "
                            "this host on");
    return detail::make_tcp_sender(std::move(server), s.options.expected_receivers);
  };
  d.receiver = [](const ReceiverState& s) -> Result<std::unique_ptr<ReceiverTransport>> {
    std::unique_ptr<Server> relay;
    const auto& relay_listen = s.params.at("relay_listen").get_ref<const std::string&>();
    if (s.options.relay) {
      ARLO_ASSIGN_OR_RETURN(relay, Server::listen(relay_listen, "", reconnect_window(s.params), nullptr));
    }
    ARLO_ASSIGN_OR_RETURN(auto token, auth::process_token());
    return detail::make_tcp_receiver(s, std::move(relay), std::move(token));
  };
  d.local_only = [](const nlohmann::json& params) -> std::string {
    const std::string address = params.value("address", std::string("127.0.0.1:0"));
    if (!params.value("advertise_host", std::string()).empty() || !auth::is_loopback(auth::host_of(address))) return "";
    return "weight_sync.address " + address +
           " is a loopback address; set it to this host's address, or to "
           "0.0.0.0:<port> with weight_sync.advertise_host naming the address the workers reach this host on";
  };
  d.relay_at = [](const std::string& host, std::uint16_t port) {
    const std::string at = (host.find(':') != std::string::npos && !host.starts_with('[') ? "[" + host + "]" : host) +
                           ":" + std::to_string(port);
    return std::pair{nlohmann::json{{"relay_listen", at}}, nlohmann::json{{"address", at}}};
  };
  return d;
}

}  // namespace arlo::weight_sync
