#include "weight_sync/wire.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "common/log.h"
#include "weight_sync/transport.h"

namespace arlo::weight_sync {

using nlohmann::json;

namespace {

auto bad_key(std::string_view key, std::string_view why) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("weight_sync '{}': {}", key, why));
}

// Reads the shared key `key` of `block` into `out` when present.
template <typename T>
Status read(const json& block, std::string_view key, T& out) {
  auto it = block.find(key);
  if (it == block.end() || it->is_null()) return ok();
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return bad_key(key, "must be a boolean, got " + it->dump());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return bad_key(key, "must be a string, got " + it->dump());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return bad_key(key, "must be a number, got " + it->dump());
  } else {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
      return bad_key(key, "must be a non-negative integer, got " + it->dump());
  }
  out = it->get<T>();
  return ok();
}

Status read_ms(const json& block, std::string_view key, std::chrono::milliseconds& out) {
  std::int64_t ms = out.count();
  ARLO_TRY(read(block, key, ms));
  out = std::chrono::milliseconds(ms);
  return ok();
}

constexpr std::string_view kDeltaThreshold = "delta_density_threshold";
constexpr std::string_view kDeltaThresholdOld = "delta_dense_threshold";  // read for one release

constexpr std::string_view kShared[] = {
    "transport",         "payload",    "zstd",      kDeltaThreshold,      kDeltaThresholdOld, "bucket_mb",
    "bucket_timeout_ms", "timeout_ms", "keep_last", "expected_receivers", "gather_window_ms", "relay",
    "apply_mode",        "peer_name"};

bool is_shared(std::string_view key) {
  for (auto k : kShared)
    if (k == key) return true;
  return false;
}

}  // namespace

json to_json(const Options& o) {
  json j = {{"transport", o.transport},
            {"payload", std::string(to_string(o.payload.kind))},
            {"zstd", o.payload.zstd},
            {kDeltaThreshold, o.payload.delta_density_threshold},
            {"bucket_mb", o.bucket_bytes >> 20},
            {"bucket_timeout_ms", o.bucket_timeout.count()},
            {"timeout_ms", o.timeout.count()},
            {"keep_last", o.keep_last},
            {"expected_receivers", o.expected_receivers},
            {"gather_window_ms", o.gather_window.count()},
            {"relay", o.relay},
            {"apply_mode", o.apply_mode == ApplyMode::kInPlace ? "in_place" : "staging"}};
  if (!o.peer_name.empty()) j["peer_name"] = o.peer_name;
  if (o.params.is_object())
    for (const auto& [k, v] : o.params.items()) j[k] = v;
  return j;
}

Result<Options> options_from_json(const json& block, const Options& base) {
  if (!block.is_object()) return make_error(ErrorCode::kInvalidArgument, "the weight_sync block must be a JSON object");
  Options o = base;
  ARLO_TRY(read(block, "transport", o.transport));
  ARLO_ASSIGN_OR_RETURN(const auto* d, find_transport(o.transport));
  if (o.transport != base.transport) o.params = json::object();
  std::string payload(to_string(o.payload.kind));
  ARLO_TRY(read(block, "payload", payload));
  ARLO_ASSIGN_OR_RETURN(o.payload.kind, parse_payload(payload));
  ARLO_TRY(read(block, "zstd", o.payload.zstd));
  ARLO_ASSIGN_OR_RETURN(auto threshold, delta_density_threshold_of(block, "the weight_sync block"));
  if (threshold) o.payload.delta_density_threshold = *threshold;
  std::uint64_t bucket_mb = o.bucket_bytes >> 20;
  ARLO_TRY(read(block, "bucket_mb", bucket_mb));
  o.bucket_bytes = bucket_mb << 20;
  ARLO_TRY(read_ms(block, "bucket_timeout_ms", o.bucket_timeout));
  ARLO_TRY(read_ms(block, "timeout_ms", o.timeout));
  ARLO_TRY(read(block, "keep_last", o.keep_last));
  ARLO_TRY(read(block, "expected_receivers", o.expected_receivers));
  ARLO_TRY(read_ms(block, "gather_window_ms", o.gather_window));
  ARLO_TRY(read(block, "relay", o.relay));
  std::string apply = o.apply_mode == ApplyMode::kInPlace ? "in_place" : "staging";
  ARLO_TRY(read(block, "apply_mode", apply));
  if (apply != "staging" && apply != "in_place")
    return bad_key("apply_mode", "use staging or in_place, not '" + apply + "'");
  o.apply_mode = apply == "in_place" ? ApplyMode::kInPlace : ApplyMode::kStaging;
  ARLO_TRY(read(block, "peer_name", o.peer_name));
  json params = o.params.is_object() ? o.params : json::object();
  for (const auto& [k, v] : block.items())
    if (!is_shared(k)) params[k] = v;
  ARLO_TRY(resolve_params(*d, params));  // unknown keys and bad values surface here, naming the key
  o.params = std::move(params);
  return o;
}

Result<std::optional<double>> delta_density_threshold_of(const json& j, std::string_view where) {
  std::optional<double> value, old;
  for (auto [key, out] : {std::pair{kDeltaThreshold, &value}, std::pair{kDeltaThresholdOld, &old}}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: '{}' must be a number, got {}", where, key, it->dump()));
    *out = it->get<double>();
  }
  if (!old) return value;
  if (value && *value != *old)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: '{}' {} and its old name '{}' {} disagree: give '{}' only", where,
                                  kDeltaThreshold, *value, kDeltaThresholdOld, *old, kDeltaThreshold));
  ARLO_WARN("{}: '{}' is the old name of '{}' and is read for one release only; write '{}'", where, kDeltaThresholdOld,
            kDeltaThreshold, kDeltaThreshold);
  return old;
}

Result<Version> version_from_json(const json& value, std::string_view what) {
  if (value.is_number_unsigned() && value.get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<Version>::max()})
    return static_cast<Version>(value.get<std::uint64_t>());
  if (value.is_number_integer() && !value.is_number_unsigned() && value.get<std::int64_t>() >= 0)
    return value.get<std::int64_t>();
  return make_error(ErrorCode::kParse, fmt::format("{}: a version must be a non-negative integer below 2^63, not {}",
                                                   what, value.dump().substr(0, 40)));
}

Result<Version> version_from_text(std::string_view text, std::string_view what) {
  Version v = 0;
  const char* end = text.data() + text.size();
  // from_chars would take a leading '-': digits only, and out of range is refused rather than wrapped.
  const bool digits = !text.empty() && text.front() >= '0' && text.front() <= '9';
  if (auto r = std::from_chars(text.data(), end, v); !digits || r.ec != std::errc() || r.ptr != end)
    return make_error(ErrorCode::kParse,
                      fmt::format("{}: a version must be a non-negative integer below 2^63 in decimal digits, not '{}'",
                                  what, text.substr(0, 40)));
  return v;
}

std::string checksum_hex(std::uint64_t checksum) { return fmt::format("{:016x}", checksum); }

json to_json(const Announcement& a) {
  json j = {{"version", a.version},   {"transport", a.transport},
            {"endpoint", a.endpoint}, {"payload", to_string(a.payload)},
            {"tensors", a.tensors},   {"bytes", a.bytes}};
  if (a.checksum) j["checksum"] = checksum_hex(*a.checksum);
  return j;
}

Result<Announcement> parse_announcement(const json& j) {
  auto bad = [](const std::string& why) { return make_error(ErrorCode::kParse, "weight_sync announcement: " + why); };
  if (!j.is_object()) return bad("must be a JSON object, got " + j.dump());
  Announcement a;
  if (!j.contains("version")) return bad("'version' (a non-negative integer) is required");
  if (auto v = version_from_json(j["version"], "'version'"))
    a.version = *v;
  else
    return bad(v.error().message());
  if (!j.contains("transport") || !j["transport"].is_string()) return bad("'transport' (a string) is required");
  a.transport = j["transport"].get<std::string>();
  ARLO_ASSIGN_OR_RETURN(const auto* d, find_transport(a.transport));
  if (!j.contains("endpoint") || !j["endpoint"].is_object()) return bad("'endpoint' (an object) is required");
  a.endpoint = j["endpoint"];
  if (auto r = resolve_params(*d, a.endpoint); !r) return bad("endpoint: " + r.error().message());
  if (j.contains("payload")) {
    if (!j["payload"].is_string()) return bad("'payload' must be a string");
    ARLO_ASSIGN_OR_RETURN(a.payload, parse_payload(j["payload"].get<std::string>()));
  }
  for (auto [key, out] : {std::pair{"tensors", &a.tensors}, std::pair{"bytes", &a.bytes}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_number_unsigned()) return bad(fmt::format("'{}' must be a non-negative integer", key));
    *out = j[key].get<std::uint64_t>();
  }
  if (j.contains("checksum")) {
    const auto& c = j["checksum"];
    std::uint64_t v = 0;
    if (!c.is_string() || c.get<std::string>().size() != 16 ||
        std::sscanf(c.get<std::string>().c_str(), "%16llx", reinterpret_cast<unsigned long long*>(&v)) != 1)
      return bad("'checksum' must be 16 hex digits, got " + c.dump());
    a.checksum = v;
  }
  return a;
}

json receiver_block(const Announcement& a, json base) {
  if (!base.is_object()) base = json::object();
  base["transport"] = a.transport;
  for (const auto& [k, v] : a.endpoint.items()) base[k] = v;
  return base;
}

}  // namespace arlo::weight_sync
