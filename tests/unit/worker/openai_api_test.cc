// arlo-worker's OpenAI request parser refuses malformed bodies with a 400 naming the field; it never
// throws (a throw reaches the HTTP server as a 500 "internal error in handler"). The bodies below are
// the ones tests/fuzz/openai_request_fuzz found throwing.
#include <gtest/gtest.h>

#include "apps/arlo-worker/openai_api.h"

namespace arlo::worker {
namespace {

using nlohmann::json;

std::expected<CompletionJob, ApiError> parse(const std::string& text, bool chat) {
  const reference::Tokenizer tok;
  return parse_completion_request(json::parse(text), chat, tok, 256);
}

// Regression (openai_request_fuzz): "stream" that is not a boolean threw json::type_error.
TEST(WorkerOpenAiApi, FuzzNonBooleanStreamIsNotAnError) {
  auto job = parse(R"({"prompt": "hi", "stream": "yes"})", false);
  ASSERT_TRUE(job.has_value()) << job.error().message;
  auto refused = parse(R"({"prompt": "hi", "stream": true})", false);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().status, 400);
  EXPECT_EQ(refused.error().param, "stream");
}

// Regression (openai_request_fuzz): "echo" that is not a boolean threw json::type_error.
TEST(WorkerOpenAiApi, FuzzNonBooleanEchoIsNotAnError) {
  EXPECT_TRUE(parse(R"({"prompt": "hi", "echo": 1})", false).has_value());
  auto refused = parse(R"({"prompt": "hi", "echo": true})", false);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().param, "echo");
}

// Regression (openai_request_fuzz): a content part whose "type" is not a string threw.
TEST(WorkerOpenAiApi, FuzzContentPartWithNonStringTypeIsRefused) {
  for (const char* body : {R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})",
                           R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})"}) {
    auto refused = parse(body, true);
    ASSERT_FALSE(refused.has_value()) << body;
    EXPECT_EQ(refused.error().status, 400);
    EXPECT_EQ(refused.error().param, "messages");
  }
  auto job = parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})", true);
  ASSERT_TRUE(job.has_value()) << job.error().message;
  EXPECT_EQ(job->prompts.size(), 1u);
}

}  // namespace
}  // namespace arlo::worker
