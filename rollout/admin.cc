#include "rollout/admin.h"

#include <charconv>

#include <fmt/format.h>

#include "common/enum_names.h"
#include "rollout/admin_dialects/admin_base.h"

namespace arlo::rollout {

// The registered dialects: one function per dialect (admin_dialects/<name>.cc), listed in
// admin_dialects/registry.inc.
const ExtensionRegistry<AdminDialectInfo>& admin_dialects() {
  static const ExtensionRegistry<AdminDialectInfo> dialects = {
#include "rollout/admin_dialects/registry.inc"
  };
  return dialects;
}

Result<AdminDialect> parse_admin_dialect(std::string_view name) {
  ARLO_ASSIGN_OR_RETURN(const AdminDialectInfo* d, find_admin_dialect(name));
  return d->completions;
}

std::string_view to_string(AdminDialect d) {
  static constexpr EnumName<AdminDialect> kNames[] = {
      {AdminDialect::kArlo, "arlo"}, {AdminDialect::kVllm, "vllm"}, {AdminDialect::kSglang, "sglang"}};
  return enum_name(kNames, d, "?");
}

std::unique_ptr<AdminClient> make_admin_client(AdminDialect dialect, http::Client& client, std::string base_url,
                                               AdminOptions options) {
  auto d = find_admin_dialect(to_string(dialect));
  return (d ? *d : &admin_dialects().front())->make(client, std::move(base_url), std::move(options));
}

std::unique_ptr<AdminClient> make_admin_client(std::string_view dialect, http::Client& client, std::string base_url,
                                               AdminOptions options) {
  auto d = find_admin_dialect(dialect);
  return d ? (*d)->make(client, std::move(base_url), std::move(options)) : nullptr;
}

namespace admin_detail {

Result<TensorLists> tensor_lists(const Json& tensors) {
  if (!tensors.is_array() || tensors.empty())
    return make_error(ErrorCode::kInvalidArgument, "the collective session lists no tensors");
  TensorLists out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dtype") ||
        !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array())
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("the collective session's tensor {} lacks a string name, a string dtype or a shape list: {}", i,
                      t.dump().substr(0, 200)));
    out.names.push_back(t["name"]);
    out.dtypes.push_back(t["dtype"]);
    out.shapes.push_back(t["shape"]);
  }
  return out;
}

Result<std::int64_t> group_generation(const Json& g) {
  if (!g.is_object() || !g.contains("generation") || !g["generation"].is_number_integer())
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("the collective session's group has no integer generation: {}", g.dump().substr(0, 200)));
  return g["generation"].get<std::int64_t>();
}

// Copies `keys` from the session's group into `out`; every key must be there.
Status copy_keys(const Json& group, std::initializer_list<const char*> keys, Json& out) {
  for (const char* k : keys) {
    if (!group.contains(k))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("the collective session's group lacks '{}': {}", k, group.dump().substr(0, 300)));
    out[k] = group[k];
  }
  return ok();
}

// A version label as the servers keep it ("7") back to a number; nullopt when it is not one.
std::optional<std::int64_t> version_number(const Json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_string()) return std::nullopt;
  const auto s = v.get<std::string>();
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return n;
}

}  // namespace admin_detail

}  // namespace arlo::rollout
