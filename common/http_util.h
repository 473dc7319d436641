#pragma once
// Private helpers shared by http_server.cc, http_client.cc and http_message.cc. Not part of the
// public HTTP API (common/http.h); do not include from outside common/http_*.cc and their tests.
#include <map>
#include <string>
#include <string_view>

namespace arlo::http::detail {

// Decodes %XX escapes and, when `plus_is_space`, '+' as ' ' (form/query encoding). Malformed
// escapes ("%4", "%zz") are kept literally rather than rejected: a query is advisory input.
std::string percent_decode(std::string_view in, bool plus_is_space);

// Splits "a=1&b=x%20y&flag" into {"a": "1", "b": "x y", "flag": ""}. A repeated key keeps its
// last value.
std::map<std::string, std::string> parse_query(std::string_view query);

// ASCII lower-case copy (header names).
std::string to_lower(std::string_view s);

// RFC 9110 token (header field name) and field value (no CR, LF or NUL). Server and client
// serialise heads themselves, so these checks are what keeps a caller's string from injecting
// headers or splitting a message.
bool valid_header_name(std::string_view name);
bool valid_header_value(std::string_view value);

// Appends "Name: value\r\n".
void append_header(std::string& out, std::string_view name, std::string_view value);

}  // namespace arlo::http::detail
