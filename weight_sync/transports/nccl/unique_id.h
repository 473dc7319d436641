#pragma once
// The 128-byte NCCL unique id (ncclUniqueId, NCCL_UNIQUE_ID_BYTES), as rank 0 mints it and every
// peer reads it from the rendezvous store. Shared by the store (store.h: the keys and the pickled
// form vLLM reads) and the communicator (group.h).
#include <array>
#include <cstddef>

namespace arlo::weight_sync::nccl {

struct UniqueId {
  std::array<std::byte, 128> bytes{};
  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

}  // namespace arlo::weight_sync::nccl
