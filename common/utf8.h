#pragma once
// Well-formed UTF-8 (RFC 3629): what text from outside (an environment's message, a server's reply)
// must be before it goes into JSON.
#include <cstddef>
#include <string_view>

namespace arlo {

// The offset of the first byte of `s` that is not part of well-formed UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF are not); s.size() when all is well-formed.
std::size_t utf8_prefix(std::string_view s);

inline bool valid_utf8(std::string_view s) { return utf8_prefix(s) == s.size(); }

}  // namespace arlo
