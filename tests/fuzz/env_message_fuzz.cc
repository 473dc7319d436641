// libFuzzer target for the environment protocol's messages (rollout/multi_turn.h): the bytes an
// environment server answers to POST /reset and /step, read as the http environment client reads
// them (parse_env_reply), for both calls.
//
// Properties checked:
//   - nothing crashes or throws, whatever the bytes; every error is kParse and says why;
//   - an accepted reply is one arlo can use: a reset is not done and has no reward, every message's
//     role and content are UTF-8 (they serialize to JSON again), and the step request built from
//     the reply's messages and state serializes too;
//   - a reply written back as JSON from what was parsed parses to the same thing (nothing is lost;
//     the state compared as JSON text, where a number too large for a double reads as null).
#include <cstdint>
#include <string>
#include <string_view>

#include "rollout/multi_turn.h"
#include "tests/fuzz/check.h"

namespace {

using arlo::fuzz::check;
using arlo::rollout::EnvCall;
using arlo::rollout::EnvTurn;
using arlo::rollout::Json;

// `turn` as the reply body a server would send; "" when it does not serialize (a broken invariant).
std::string as_reply(const EnvTurn& turn, EnvCall call) {
  Json messages = Json::array();
  for (const auto& m : turn.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
  Json body = {{"messages", std::move(messages)}, {"state", turn.state}};
  if (call == EnvCall::kStep) {
    body["done"] = turn.done;
    body["reward"] = turn.reward ? Json(*turn.reward) : Json(nullptr);
  }
  try {
    return body.dump();
  } catch (const Json::exception&) {
    return {};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const EnvCall call : {EnvCall::kReset, EnvCall::kStep}) {
    auto turn = arlo::rollout::parse_env_reply(bytes, call);
    if (!turn) {
      check(turn.error().code() == arlo::ErrorCode::kParse, "a bad reply is a parse error", bytes);
      check(!turn.error().what().empty(), "errors carry a message", bytes);
      continue;
    }
    if (call == EnvCall::kReset) check(!turn->done && !turn->reward, "a reset is not done and has no reward", bytes);
    const std::string again = as_reply(*turn, call);
    check(!again.empty(), "an accepted reply serializes again (its text is UTF-8)", bytes);
    auto reparsed = arlo::rollout::parse_env_reply(again, call);
    check(reparsed.has_value(), "a reply written back parses", again);
    check(reparsed->messages == turn->messages && reparsed->done == turn->done &&
              reparsed->state.dump() == turn->state.dump(),
          "a reply written back parses to the same messages, done and state", again);
    check(reparsed->reward == turn->reward, "a reply written back keeps its reward", again);
    arlo::Task task;
    task.id = "fuzz";
    task.prompt = "1+1=";
    try {
      (void)arlo::rollout::env_request_json(task, turn->state, turn->messages).dump();
    } catch (const Json::exception&) {
      check(false, "the next step's request serializes", bytes);
    }
  }
  return 0;
}
