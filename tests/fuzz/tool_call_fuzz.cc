// libFuzzer target for the tool-call syntax in model text (rollout/tool_calls.h): arbitrary bytes as
// the model's turn, parsed against a fixed set of tools, as the environment adapter parses a turn.
//
// Properties checked:
//   - nothing crashes or throws, whatever the bytes; every error is kInvalidArgument and says which
//     call and why;
//   - an accepted turn's calls are well-formed OpenAI tool_calls: ids call_0, call_1, ... in order,
//     a known tool's name, arguments a JSON object as a string;
//   - the calls rendered back in the syntax parse to the same calls.
#include <cstdint>
#include <string>
#include <string_view>

#include "rollout/tool_calls.h"
#include "tests/fuzz/check.h"

namespace {

using arlo::fuzz::check;
using arlo::rollout::Json;

const Json& tools() {
  static const Json t = Json::parse(R"([{"type": "function", "function": {"name": "add"}},
                                        {"type": "function", "function": {"name": "search"}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = arlo::rollout::parse_tool_calls(bytes, tools());
  if (!parsed) {
    check(parsed.error().code() == arlo::ErrorCode::kInvalidArgument, "a malformed call is kInvalidArgument", bytes);
    check(parsed.error().message().rfind("tool call ", 0) == 0, "the error names the call", bytes);
    return 0;
  }
  if (parsed->tool_calls.is_null()) return 0;
  check(parsed->tool_calls.is_array() && !parsed->tool_calls.empty(), "calls are a non-empty array", bytes);
  for (std::size_t k = 0; k < parsed->tool_calls.size(); ++k) {
    const Json& call = parsed->tool_calls[k];
    check(call["id"] == "call_" + std::to_string(k), "ids count in order", bytes);
    const std::string name = call["function"]["name"].get<std::string>();
    check(name == "add" || name == "search", "only known tools", bytes);
    const Json arguments = Json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    check(arguments.is_object(), "arguments are a JSON object", bytes);
  }
  auto back = arlo::rollout::parse_tool_calls(arlo::rollout::render_tool_calls(parsed->tool_calls), tools());
  check(back.has_value() && back->tool_calls == parsed->tool_calls, "rendered calls parse to the same calls", bytes);
  return 0;
}
