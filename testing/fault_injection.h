#pragma once
// Faults for the tests of the real weight transports: taps (weight_sync/transport.h, BucketTap)
// handed to the side under test when it is created.
//
//   auto pub = weight_sync::Publisher::create(options, weight_sync::faults::corrupt_bucket(1));
//   auto sub = weight_sync::Subscriber::create(options, weight_sync::faults::stop_before_bucket(0));
//
// A test that forks a child creates the side with its fault in the child.
#include <cstddef>
#include <memory>

#include "weight_sync/transport.h"

namespace arlo::weight_sync::faults {

// A sender that flips one byte of bucket `bucket` once its checksum was taken, the first time it
// hands that bucket over in each version (on one link of several, not again when it is resent):
// one byte corrupted in transit. Where receivers read the source's own memory (shm direct read) it
// flips the checksum it posts instead, which they match just as little.
std::shared_ptr<BucketTap> corrupt_bucket(std::size_t bucket);

// A side that stops its process (SIGSTOP) each time just before it moves bucket `bucket`: a sender
// or receiver for the test to kill, or to leave stalled, mid-transfer.
std::shared_ptr<BucketTap> stop_before_bucket(std::size_t bucket);

}  // namespace arlo::weight_sync::faults
