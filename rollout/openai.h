#pragma once
// The OpenAI-compatible wire format: building request bodies and parsing
// responses of /v1/completions and /v1/chat/completions. Pure functions, no I/O.
//
// Parsed per choice: text (or message.content), token ids ("token_ids"), per-token logprobs
// (completions: logprobs.token_logprobs; chat: logprobs.content[].logprob), finish_reason, and
// version spans ("version_spans": [[version, first_token], ...] or [{"version", "first_token"}]; a
// bare "version" on the choice or the response means one span from token 0, and so does SGLang's
// "metadata": {"weight_version": "<n>"} on the response). Prompt token ids come from the response's
// or the first choice's "prompt_token_ids".
//
// What each server returns for the token data training needs, when asked as token_data_request()
// asks (sources: vLLM's and SGLang's OpenAI-compatible serving code):
//
//   server                       completion ids         prompt ids                          logprobs
//   arlo-worker                  choices[].token_ids    prompt_token_ids                    OpenAI's
//   vLLM >= 0.10.2               choices[].token_ids    completions: choices[].prompt_token_ids;
//     (return_token_ids)                                chat: prompt_token_ids              OpenAI's
//   SGLang (return_token_ids)    choices[].token_ids    choices[].prompt_token_ids          OpenAI's
//   SGLang chat before that      meta_info ids (below)  choices[].prompt_token_ids          OpenAI's or meta_info's
//     (return_prompt_token_ids, return_meta_info: choices[].meta_info.output_token_logprobs =
//      [[logprob, token_id, text], ...])
//
//   OpenAI logprobs: completions ("logprobs": 0) choices[].logprobs.token_logprobs[];
//                    chat ("logprobs": true) choices[].logprobs.content[].logprob.
//
// The prompt ids include what the server added (BOS, a chat template): they are what the policy
// saw, so they are what the trainer must see.
#include <string>

#include "common/result.h"
#include "rollout/admin.h"
#include "rollout/types.h"

namespace arlo::rollout {

// "/v1/chat/completions" for chat requests, "/v1/completions" otherwise.
std::string endpoint_path(const CompletionRequest& request);
Json to_openai_body(const CompletionRequest& request);
// Errors (kParse) name the field that is missing or malformed.
Result<Completion> parse_openai_response(const Json& body, bool chat);

// Request fields `server` needs, beyond what to_openai_body always sends (return_token_ids,
// logprobs), to return the token data above; merge them into CompletionRequest::extra.
Json token_data_request(AdminDialect server, bool chat);

// Whether `completion` (parsed from `server`'s answer to a request that asked for logprobs when
// `logprobs`) carries what training needs: every choice's token ids (a choice that generated
// nothing is allowed only when aborted), the prompt's token ids, and a logprob per token.
// kMismatch otherwise, naming the server's url, the missing field and what enables it on that
// server (its version, flag or request parameter).
Status check_token_data(const Completion& completion, bool chat, bool logprobs, AdminDialect server);

}  // namespace arlo::rollout
