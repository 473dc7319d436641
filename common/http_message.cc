// Request/Response helpers of common/http.h and the small pieces shared by server and client.
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/http.h"
#include "common/http_util.h"

namespace arlo::http {

namespace detail {

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string percent_decode(std::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%' && i + 2 < in.size()) {
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && c == '+' ? ' ' : c);
  }
  return out;
}

std::map<std::string, std::string> parse_query(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    std::string key = percent_decode(pair.substr(0, eq), true);
    std::string value = eq == std::string_view::npos ? std::string{} : percent_decode(pair.substr(eq + 1), true);
    out.insert_or_assign(std::move(key), std::move(value));
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool valid_header_name(std::string_view name) {
  if (name.empty()) return false;
  for (const char c : name) {
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum && std::string_view("!#$%&'*+-.^_`|~").find(c) == std::string_view::npos) return false;
  }
  return true;
}

bool valid_header_value(std::string_view value) {
  return value.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

void append_header(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append("\r\n");
}

}  // namespace detail

namespace {
// nlohmann reports "parse error at line L, column C: ..." with the byte offset; keep both so the
// caller can say where the body is malformed.
Result<nlohmann::json> parse_json_body(const std::string& body, std::string_view what) {
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(ErrorCode::kParse, fmt::format("{} is not valid JSON (byte {}): {}", what, e.byte, e.what()));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kParse, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}
}  // namespace

Result<nlohmann::json> Request::json() const { return parse_json_body(body, "request body"); }

std::optional<std::string> Request::query_param(const std::string& key) const {
  const auto it = query.find(key);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

Response Response::json(int status, const nlohmann::json& body) {
  Response r;
  r.status = status;
  // Invalid UTF-8 in a string is replaced rather than thrown: a response must always be producible.
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

Response Response::text(int status, std::string body, std::string content_type) {
  Response r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

Response Response::error(int status, std::string message, std::string type, std::optional<std::string> param) {
  nlohmann::json err = {{"message", std::move(message)},
                        {"type", std::move(type)},
                        {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
                        {"code", status}};
  return json(status, nlohmann::json{{"error", std::move(err)}});
}

Result<nlohmann::json> Response::parse_json() const { return parse_json_body(body, "response body"); }

Result<std::uint64_t> raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    return make_error(ErrorCode::kIo, fmt::format("getrlimit(RLIMIT_NOFILE): {}", std::strerror(errno)));
  }
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      return make_error(ErrorCode::kIo,
                        fmt::format("setrlimit(RLIMIT_NOFILE, {}): {}", lim.rlim_max, std::strerror(errno)));
    }
  }
  return static_cast<std::uint64_t>(lim.rlim_cur);
}

}  // namespace arlo::http
