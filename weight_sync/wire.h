#pragma once
// The one wire form of weight_sync, used from config to trainer, trainer to orchestrator and
// orchestrator to worker alike (docs/weight-sync.md):
//
// - The weight-sync block: Options as one flat JSON object. Shared keys
//     transport, payload (full | bf16 | fp8 | delta), zstd, delta_density_threshold, bucket_mb,
//     bucket_timeout_ms, timeout_ms, keep_last, expected_receivers, gather_window_ms, relay,
//     apply_mode (staging | in_place), peer_name
//   plus the keys of the transport's descriptor (transport.h), e.g.
//     {"transport": "tcp", "payload": "full", "address": "127.0.0.1:0", "expected_receivers": 2}
//   arlo-trainer takes it as --weight-sync, a `trainer.launch: command` trainer as ARLO_WEIGHT_SYNC,
//   the C ABI as the "weight_sync" object of its connect config, arlo-worker in /weights/prepare.
//
// - The announcement: "version v is staged here", what a trainer tells the orchestrator with each
//   version and the orchestrator hands on to every worker:
//     {"version": 7, "transport": "tcp", "endpoint": {"address": "10.0.0.5:29500"},
//      "payload": "full", "tensors": 24, "bytes": 1048576, "checksum": "9f2c..."}
//   `endpoint` is the sender's Publisher::endpoint(); `checksum` is weights_checksum() of the
//   version as 16 hex digits.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {

nlohmann::json to_json(const Options& options);
// Reads a block over `base` (keys absent from the block keep base's values; a block naming another
// transport than base starts that transport's keys from its defaults). Unknown keys, wrong types
// and out-of-range values are errors that name the key.
Result<Options> options_from_json(const nlohmann::json& block, const Options& base = {});

struct Announcement {
  Version version = 0;
  std::string transport;
  nlohmann::json endpoint = nlohmann::json::object();
  PayloadKind payload = PayloadKind::kFull;
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;
  std::optional<std::uint64_t> checksum;
};

nlohmann::json to_json(const Announcement& a);
Result<Announcement> parse_announcement(const nlohmann::json& j);
std::string checksum_hex(std::uint64_t checksum);

// The delta threshold of a weight-sync block or a manifest `j`, under the config key's name
// "delta_density_threshold"; nullopt when absent. The name it had before, "delta_dense_threshold",
// is read for one release with a warning naming the new key (a trainer of the previous release
// still sends it); both keys with different values are kInvalidArgument. A non-number is too.
// `where` names `j` in messages ("the weight_sync block", "manifest").
Result<std::optional<double>> delta_density_threshold_of(const nlohmann::json& j, std::string_view where);

// A version as it travels (announcement, manifest, HELLO, control-store values and keys, v<N>
// directory names): an integer in [0, 2^63), arlo::Version being signed (kNoVersion never travels).
// A negative, fractional, non-numeric or larger value is kParse naming `what`, so a peer's bad
// version is refused rather than wrapped.
Result<Version> version_from_json(const nlohmann::json& value, std::string_view what);
Result<Version> version_from_text(std::string_view text, std::string_view what);  // decimal digits only

// The block a receiver pulls `a` with: a's transport and endpoint over `base` (the receiver's own
// block: its timeouts, and keys of its own such as a chain relay's listen address).
nlohmann::json receiver_block(const Announcement& a, nlohmann::json base = nlohmann::json::object());

}  // namespace arlo::weight_sync
