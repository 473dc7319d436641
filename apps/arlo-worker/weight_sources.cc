// Which weight sources an update may name (weight_sources.h).
#include "apps/arlo-worker/weight_sources.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "common/auth.h"
#include "weight_sync/transport.h"

namespace arlo::worker {

using nlohmann::json;

namespace {

bool is_address_key(std::string_view key) { return key == "address" || key.ends_with("_address"); }

}  // namespace

std::string addresses_of(const json& endpoint) {
  std::string out;
  if (!endpoint.is_object()) return out;
  for (const auto& [key, value] : endpoint.items())
    if (is_address_key(key) && value.is_string() && !value.get_ref<const std::string&>().empty())
      out += (out.empty() ? "" : ", ") + value.get<std::string>();
  return out;
}

namespace {

// `path` made absolute, with symlinks of its existing part resolved, so ".." and links cannot
// leave an allowed directory.
std::filesystem::path resolved(const std::filesystem::path& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? std::filesystem::absolute(path).lexically_normal() : p;
}

bool inside(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto rel = path.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

std::optional<std::string> refused_source(const json& block, const weight_sync::Options& o, const WorkerOptions& w) {
  const json& own = w.own_block;
  if (own.contains("transport") && own["transport"] != o.transport)
    return fmt::format("this worker takes weights over {} only (its --weight-sync block), not {}",
                       own["transport"].get<std::string>(), o.transport);
  auto d = weight_sync::find_transport(o.transport);
  if (!d) return d.error().message();
  for (const auto& [key, value] : block.items()) {
    if ((*d)->option(key) && own.contains(key) && own[key] != value)
      return fmt::format("'{}' is pinned to {} by this worker's --weight-sync block; the update names {}", key,
                         own[key].dump(), value.dump());
  }
  std::vector<std::filesystem::path> dirs;
  std::vector<std::string> dir_names, hosts;
  for (const auto& entry : w.allow_weights_from) {
    if (entry.starts_with('/')) {
      dirs.push_back(resolved(entry));
      dir_names.push_back(dirs.back().string());
    } else {
      hosts.push_back(entry);
    }
  }
  for (const auto& spec : (*d)->options) {
    // What the request names (defaults are this worker's own).
    if (spec.type != OptionSpec::Type::kString || !block.contains(spec.key) || !o.params.contains(spec.key)) continue;
    const auto& v = o.params[spec.key];
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) continue;
    const std::string value = v.get<std::string>();
    if (own.contains(spec.key) && own[spec.key] == v) continue;  // what the worker was started with
    if (spec.path || value.find('/') != std::string::npos) {     // a file or directory (a library to load, too)
      const auto p = resolved(value);
      if (std::none_of(dirs.begin(), dirs.end(), [&](const auto& dir) { return p == dir || inside(p, dir); }))
        return fmt::format(
            "'{}' {} is outside the directories this worker loads weights from ({}); start it with "
            "--allow-weights-from DIR to allow one",
            spec.key, value,
            dirs.empty() ? std::string("none allowed") : fmt::format("{}", fmt::join(dir_names, ", ")));
    } else if (is_address_key(spec.key)) {
      const std::string host = auth::host_of(value);
      const bool listed = std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
        return h == value || (auth::host_of(h) == h && h == host);
      });
      if (!listed && !(hosts.empty() && auth::is_loopback(host)))
        return fmt::format(
            "'{}' {} is not a host this worker loads weights from ({}); start it with "
            "--allow-weights-from HOST[:PORT] to allow one",
            spec.key, value, hosts.empty() ? std::string("loopback only") : fmt::format("{}", fmt::join(hosts, ", ")));
    }
  }
  return std::nullopt;
}

}  // namespace arlo::worker
