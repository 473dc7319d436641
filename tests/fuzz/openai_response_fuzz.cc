// libFuzzer target for the orchestrator's parser of OpenAI-compatible responses
// (rollout/openai.cc): what arlo-worker, vLLM or SGLang answer to /v1/completions and
// /v1/chat/completions, read as the inference pool reads it (http::Response::parse_json(), then
// parse_openai_response() and check_token_data() for every server dialect).
//
// Properties checked:
//   - nothing crashes or throws, whatever the bytes; every error says why;
//   - an accepted completion is what the trainer can use: choices sorted by index, per choice
//     either no logprobs or one per token id, version spans sorted by first token.
#include <cstdint>
#include <string>

#include "common/http.h"
#include "rollout/openai.h"
#include "tests/fuzz/check.h"

namespace {

using arlo::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  arlo::http::Response response;
  const auto body = arlo::fuzz::json_body(response, &arlo::http::Response::parse_json, data, size);
  if (!body) return 0;
  for (const bool chat : {false, true}) {
    auto c = arlo::rollout::parse_openai_response(*body, chat);
    if (!c) {
      check(!c.error().what().empty(), "errors carry a message", response.body);
      continue;
    }
    for (std::size_t i = 0; i < c->choices.size(); ++i) {
      const auto& ch = c->choices[i];
      if (i > 0) check(c->choices[i - 1].index <= ch.index, "choices sorted by index", response.body);
      check(ch.logprobs.empty() || ch.token_ids.empty() || ch.logprobs.size() == ch.token_ids.size(),
            "one logprob per token", response.body);
      for (std::size_t s = 1; s < ch.version_spans.size(); ++s)
        check(ch.version_spans[s - 1].first_token <= ch.version_spans[s].first_token, "spans sorted", response.body);
    }
    c->worker = "http://fuzz:1";
    for (const auto dialect : {arlo::rollout::AdminDialect::kArlo, arlo::rollout::AdminDialect::kVllm,
                               arlo::rollout::AdminDialect::kSglang}) {
      for (const bool logprobs : {false, true}) {
        const auto status = arlo::rollout::check_token_data(*c, chat, logprobs, dialect);
        if (!status) check(!status.error().what().empty(), "a token-data mismatch says why", response.body);
      }
    }
  }
  return 0;
}
