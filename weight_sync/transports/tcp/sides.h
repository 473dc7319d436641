#pragma once
// The two sides of the tcp transport: the publisher (sender.cc) and a receiver, relaying or not
// (receiver.cc), both on a Server (server.h) for the links they serve. tcp.cc describes the
// protocol and registers them.
#include <cstddef>
#include <memory>
#include <string>

#include "weight_sync/transport.h"
#include "weight_sync/transports/tcp/server.h"

namespace arlo::weight_sync::detail {

// The publisher serving `expected` receivers a version from `server`.
std::unique_ptr<SenderTransport> make_tcp_sender(std::unique_ptr<Server> server, std::size_t expected);
// A receiver of `s.params`'s upstream; `relay` (chain) serves the next node; `token` proves this
// receiver to the upstream.
std::unique_ptr<ReceiverTransport> make_tcp_receiver(const ReceiverState& s, std::unique_ptr<Server> relay,
                                                     std::string token);

}  // namespace arlo::weight_sync::detail
