// shm transport: one POSIX shared-memory segment per channel ("/arlo-ws-<shm_name>") holding a
// control header, the manifest, and two bucket slots. The publisher encodes bucket i into slot i%2
// while receivers verify and apply bucket i-1 from the other slot (double buffering).
//
// Synchronisation: atomics in the segment plus a futex "doorbell" every state change bumps; every
// wait is bounded (bucket_timeout, the call deadline) and polls the peer's pid, so a dead peer is
// noticed within milliseconds. Cleanup: the publisher unlinks the name when it is destroyed; if it
// died, the first receiver (or next publisher) that notices its pid is gone unlinks it; dead
// receivers' slots are reclaimed by the publisher.
//
// Session protocol per publish: phase kJoining (manifest written; receivers check it against their
// sink and answer accepted / refused / need_full), the publisher admits the accepted receivers and
// moves to kStreaming, then kDone once every admitted receiver applied or failed. publish(v,
// deadline) waits until `deadline` for the first answer, then at most min(bucket_timeout,
// Options::gather_window) for the other expected receivers; one that does not come holds nobody (it joins a later
// session). Once receivers came the session runs under Options::timeout even if `deadline` is nearer, so a caller may
// poll for receivers with short deadlines. A receiver that holds v already sits out v.
//
// Three data paths, chosen per session (Header::mode) and logged by the publisher when it changes:
//  - ring (default for in_place `full` when every admitted receiver applies in place): the publisher
//    copies 128 KiB pieces of the source into a 16 MiB ring (it stays in the shared L3 cache),
//    hashing each piece first; receivers take pieces out as they arrive, hash them and write them to
//    the sink with non-temporal stores. Both sides copy concurrently; memory traffic is that of one
//    memcpy. The publisher posts each bucket's xxh3 in a table next to the manifest once its last
//    piece is in; receivers check every bucket against it before it counts.
//  - direct read (same, with Options::shm_direct_read and every receiver permitted): the table also
//    lists the publisher's source addresses per bucket; receivers copy straight from the
//    publisher's memory with process_vm_readv, hashing each piece while it is hot, and check it
//    against the checksum the publisher computes once per bucket in parallel. Permission is probed
//    at join time (a word of known value in the publisher); a refusal selects the ring.
//  - slots (encoded payloads, staging receivers): the publisher copies or encodes bucket i into
//    slot i%2 and receivers copy it out, double-buffered.
//
// Files: segment.h (the segment's layout, mapping and doorbell waits), sender.cc (the publisher's
// sessions and the three paths), receiver.cc (attaching, answering, reading each path); this file
// registers the transport.
#include "weight_sync/transport.h"
#include "weight_sync/transports/shm/sides.h"

namespace arlo::weight_sync {

TransportDescriptor shm_transport() {
  TransportDescriptor d;
  d.name = "shm";
  d.doc = "a POSIX shared-memory segment on one host (streamed)";
  d.options = {
      string_option("shm_name", "",
                    "segment name (/dev/shm/arlo-ws-<name>); publisher default: arlo-weights-<its pid>, announced"),
      bool_option("direct_read", false,
                  "in-place full payload: receivers copy straight from the publisher's memory (process_vm_readv) "
                  "instead of through the shared ring")
          .user_key(),
  };
  d.sender = [](const SenderState& s) -> Result<std::unique_ptr<SenderTransport>> { return shm::make_sender(s); };
  d.receiver = [](const ReceiverState& s) -> Result<std::unique_ptr<ReceiverTransport>> {
    if (s.params.at("shm_name").get<std::string>().empty())
      return make_error(ErrorCode::kInvalidArgument,
                        "weight_sync shm: a receiver needs 'shm_name' (the publisher announces it)");
    return shm::make_receiver(s);
  };
  return d;
}

}  // namespace arlo::weight_sync
