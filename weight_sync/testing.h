#pragma once
// Test seam: fault injection for the tests of the real transports. Not for production callers.
//
//   weight_sync::testing::ScopedFaults corrupt(weight_sync::testing::Side::kPublisher, {.corrupt_bucket = 1});
//   auto pub = weight_sync::Publisher::create(options);  // created while the faults are set: it has them
//
// Publishers and subscribers take the faults of their side when they are created, so a test that
// forks a child sets them in the child before it creates its side.
#include "weight_sync/transport.h"

namespace arlo::weight_sync::testing {

enum class Side { kPublisher, kSubscriber };

void set_faults(Side side, Faults faults);
Faults faults(Side side);

class ScopedFaults {
 public:
  ScopedFaults(Side side, Faults faults) : side_(side) { set_faults(side_, faults); }
  ~ScopedFaults() { set_faults(side_, {}); }
  ScopedFaults(const ScopedFaults&) = delete;
  ScopedFaults& operator=(const ScopedFaults&) = delete;

 private:
  Side side_;
};

}  // namespace arlo::weight_sync::testing
