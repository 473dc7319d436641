#pragma once
// What the tcp transport's serving side (server.cc), publisher (sender.cc) and receiver
// (receiver.cc) share: the sizes of their send and receive calls, the authentication context,
// and small helpers. tcp.cc describes the protocol.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "weight_sync/types.h"

namespace arlo::weight_sync::detail {

inline constexpr std::size_t kChunk = 4u << 20;      // per send() call
inline constexpr std::size_t kRecvChunk = 4u << 20;  // per recv() call (hashed from L3 right after);
                                                     // 1 MiB and 256 KiB calls cost the receiver more CPU
// A cut-through relay passes bytes on in these steps: every hop of a chain delays the stream by one
// step's time on its link (4 MiB at 2 Gbit/s: 17 ms a hop).
inline constexpr std::size_t kCutChunk = 1u << 20;

inline constexpr std::string_view kAuthContext = "arlo-weights/1";

inline std::string vb(Version v, std::size_t i) {
  return "version " + std::to_string(v) + ", bucket " + std::to_string(i);
}

// The reconnect window of the resolved params (reconnect_window_ms).
inline std::chrono::milliseconds reconnect_window(const nlohmann::json& params) {
  return std::chrono::milliseconds(params.at("reconnect_window_ms").get<std::int64_t>());
}

}  // namespace arlo::weight_sync::detail
