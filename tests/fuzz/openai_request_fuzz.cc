// libFuzzer target for arlo-worker's OpenAI request parser (apps/arlo-worker/openai_api.cc): the
// body of POST /v1/completions and /v1/chat/completions, read as the worker reads it
// (http::Request::json(), then parse_completion_request() with the built-in tokenizer).
//
// Every input is parsed both as a completion and as a chat request. Properties checked:
//   - nothing crashes or throws (a throw would be a 500 "internal error in handler" for what is a
//     client's mistake): malformed JSON is a kParse error, a bad request an ApiError with status
//     400 and a message;
//   - an accepted job is one the engine can run: at least one prompt, every prompt shorter than
//     the context with ids inside the vocabulary, max_tokens >= 1, temperature in [0, 2], top_p in
//     (0, 1], n in [1, 128], top_logprobs in [0, 20] and only with logprobs, non-empty stops.
#include <cstdint>
#include <string>

#include "apps/arlo-worker/openai_api.h"
#include "common/http.h"
#include "tests/fuzz/check.h"

namespace {

using arlo::fuzz::check;
using arlo::worker::CompletionJob;

constexpr int kContext = 256;

void check_job(const CompletionJob& job, bool chat, const std::string& input) {
  const arlo::reference::Tokenizer tok;
  check(job.chat == chat, "chat flag", input);
  check(!job.prompts.empty(), "at least one prompt", input);
  for (const auto& p : job.prompts) {
    check(!p.empty() && static_cast<int>(p.size()) < kContext, "prompt fits the context", input);
    for (const auto id : p) check(tok.valid(id), "prompt ids inside the vocabulary", input);
  }
  const auto& s = job.params;
  check(s.max_tokens >= 1, "max_tokens >= 1", input);
  check(s.temperature >= 0 && s.temperature <= 2, "temperature in [0, 2]", input);
  check(s.top_p > 0 && s.top_p <= 1, "top_p in (0, 1]", input);
  check(job.n >= 1 && job.n <= 128, "n in [1, 128]", input);
  check(job.top_logprobs >= 0 && job.top_logprobs <= 20, "top_logprobs in [0, 20]", input);
  check(job.top_logprobs == 0 || job.logprobs, "top_logprobs only with logprobs", input);
  check(s.top_logprobs == job.top_logprobs, "sampler asks for the job's alternatives", input);
  for (const auto& stop : s.stop) check(!stop.empty(), "stop strings are non-empty", input);
  check(job.choices() == static_cast<int>(job.prompts.size()) * job.n, "choices", input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  arlo::http::Request request;
  const auto body = arlo::fuzz::json_body(request, &arlo::http::Request::json, data, size);
  if (!body) return 0;
  const arlo::reference::Tokenizer tok;
  for (const bool chat : {false, true}) {
    auto job = arlo::worker::parse_completion_request(*body, chat, tok, kContext);
    if (job) {
      check_job(*job, chat, request.body);
    } else {
      check(job.error().status == 400 && !job.error().message.empty(), "a refusal is a 400 with a message",
            request.body);
      (void)arlo::worker::error_body(job.error()).dump();
    }
  }
  return 0;
}
