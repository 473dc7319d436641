#pragma once
// What every fuzz target shares: how a broken invariant is reported, and the fuzzer's bytes as a file
// or as the JSON body of an HTTP message. ARLO_FUZZ_TARGET, the target's name (its file stem), is
// defined for each target by tests/fuzz/CMakeLists.txt.
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#ifndef ARLO_FUZZ_TARGET
#error "ARLO_FUZZ_TARGET names the fuzz target; tests/fuzz/CMakeLists.txt defines it"
#endif

namespace arlo::fuzz {

// Aborts, which libFuzzer reports as a crash, when an invariant does not hold: says which, and
// `detail` (the input or the value that broke it) where given.
inline void check(bool ok, const char* what, std::string_view detail = {}) {
  if (ok) return;
  std::fprintf(stderr, "%s: invariant broken: %s\n", ARLO_FUZZ_TARGET, what);
  if (!detail.empty()) std::fprintf(stderr, "%.*s\n", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// The fuzzer's bytes as a real file: written into one memfd (made on first use, emptied for each
// input) and returned as the /proc/self/fd path that opens it.
inline std::string as_file(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create(ARLO_FUZZ_TARGET, MFD_CLOEXEC);
  check(fd >= 0, "memfd_create");
  check(::ftruncate(fd, 0) == 0, "ftruncate");
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    check(n > 0, "pwrite");
    done += static_cast<std::size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

// The fuzzer's bytes as the body of `message` (an http::Request or http::Response), parsed as JSON by
// `parse` (Request::json, Response::parse_json) as the code under test parses it: the JSON, or
// nullopt when the bytes are not JSON, whose error must then say why.
template <typename Message, typename Parse>
auto json_body(Message& message, Parse parse, const std::uint8_t* data, std::size_t size)
    -> std::optional<typename decltype((message.*parse)())::value_type> {
  message.body.assign(reinterpret_cast<const char*>(data), size);
  auto body = (message.*parse)();
  if (!body) {
    check(!body.error().what().empty(), "a JSON error says why", message.body);
    return std::nullopt;
  }
  return std::move(*body);
}

}  // namespace arlo::fuzz
