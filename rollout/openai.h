#pragma once
// The OpenAI-compatible wire format (DESIGN.md section 3): building request bodies and parsing
// responses of /v1/completions and /v1/chat/completions. Pure functions, no I/O.
//
// Parsed per choice: text (or message.content), token ids ("token_ids"), per-token logprobs
// (completions: logprobs.token_logprobs; chat: logprobs.content[].logprob), finish_reason, and
// version spans ("version_spans": [[version, first_token], ...] or [{"version", "first_token"}]; a
// bare "version" on the choice or the response means one span from token 0). Prompt token ids come
// from the response's or the first choice's "prompt_token_ids".
#include <string>

#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

// "/v1/chat/completions" for chat requests, "/v1/completions" otherwise.
std::string endpoint_path(const CompletionRequest& request);
Json to_openai_body(const CompletionRequest& request);
// Errors (kParse) name the field that is missing or malformed.
Result<Completion> parse_openai_response(const Json& body, bool chat);

}  // namespace arlo::rollout
