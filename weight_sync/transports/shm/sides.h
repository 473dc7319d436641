#pragma once
// The two sides of the shm transport: the publisher (sender.cc) and a receiver (receiver.cc).
// shm.cc describes the protocol and registers them.
#include <memory>

#include "weight_sync/transport.h"

namespace arlo::weight_sync::shm {

std::unique_ptr<SenderTransport> make_sender(const SenderState& s);
// `s.params` must name the segment ("shm_name"; checked at registration).
std::unique_ptr<ReceiverTransport> make_receiver(const ReceiverState& s);

}  // namespace arlo::weight_sync::shm
