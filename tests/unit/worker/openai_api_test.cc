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

// POST /tokenize takes vLLM's fields: a prompt with or without <bos>, a conversation with or without
// the generation prompt; a tool message renders as a user turn.
TEST(WorkerOpenAiApi, TokenizeMatchesTheTokenizerAndTheChatTemplate) {
  const reference::Tokenizer tok;
  auto plain = tokenize_request(json::parse(R"({"prompt": "12+3", "add_special_tokens": false})"), tok, 256);
  ASSERT_TRUE(plain.has_value()) << plain.error().message;
  EXPECT_EQ((*plain)["tokens"].get<std::vector<std::int32_t>>(), tok.encode("12+3"));
  EXPECT_EQ((*plain)["count"], 4);
  EXPECT_EQ((*plain)["max_model_len"], 256);
  auto with_bos = tokenize_request(json::parse(R"({"prompt": "12+3"})"), tok, 256);
  EXPECT_EQ((*with_bos)["tokens"].get<std::vector<std::int32_t>>(), tok.encode_prompt("12+3"));

  const auto chat = json::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b"}, {"role": "tool", "content": "c"}]})");
  auto rendered = tokenize_request(chat, tok, 256);
  ASSERT_TRUE(rendered.has_value()) << rendered.error().message;
  const auto expected = tok.apply_chat_template({{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  EXPECT_EQ((*rendered)["tokens"].get<std::vector<std::int32_t>>(), *expected);
  auto open = chat;
  open["add_generation_prompt"] = false;
  auto without = tokenize_request(open, tok, 256);
  ASSERT_TRUE(without.has_value());
  EXPECT_EQ((*without)["tokens"].get<std::vector<std::int32_t>>(),
            std::vector<std::int32_t>(expected->begin(), expected->end() - 1));

  for (const char* body : {R"({})", R"({"prompt": 5})", R"({"prompt": "x", "add_special_tokens": "no"})",
                           R"({"messages": [{"role": "robot", "content": "x"}]})", R"([1])"}) {
    auto refused = tokenize_request(json::parse(body), tok, 256);
    ASSERT_FALSE(refused.has_value()) << body;
    EXPECT_EQ(refused.error().status, 400);
  }
}

// Tool calls (docs/environments.md, "Tool calls"): "tools" is checked, an assistant message's
// tool_calls render as <tool_call> blocks after its content, and a choice's well-formed blocks come
// back as message.tool_calls with finish_reason "tool_calls".
TEST(WorkerOpenAiApi, ToolsAreCheckedRenderedAndParsed) {
  const reference::Tokenizer tok;
  const char* tools = R"([{"type": "function", "function": {"name": "calc"}}])";
  auto job = parse(std::string(R"({"messages": [{"role": "user", "content": "a"}], "tools": )") + tools + "}", true);
  ASSERT_TRUE(job.has_value()) << job.error().message;
  EXPECT_EQ(job->tools.size(), 1u);
  for (const char* bad_tools : {R"("calc")", R"([{"type": "function"}])"}) {
    auto refused =
        parse(std::string(R"({"messages": [{"role": "user", "content": "a"}], "tools": )") + bad_tools + "}", true);
    ASSERT_FALSE(refused.has_value()) << bad_tools;
    EXPECT_EQ(refused.error().param, "tools");
  }

  const auto structured = json::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "ok", "tool_calls": [{"id": "x", "type": "function",
        "function": {"name": "calc", "arguments": "{\"e\": \"1\"}"}}]},
      {"role": "tool", "tool_call_id": "x", "content": "1"}]})");
  const auto as_text = json::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "ok\n<tool_call>{\"arguments\":{\"e\":\"1\"},\"name\":\"calc\"}</tool_call>"},
      {"role": "tool", "content": "1"}]})");
  auto a = tokenize_request(structured, tok, 256);
  auto b = tokenize_request(as_text, tok, 256);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ((*a)["tokens"], (*b)["tokens"]);

  reference::Generation g;
  g.finish = FinishReason::kStop;
  g.text = R"(sure <tool_call>{"name": "calc", "arguments": {"e": "2"}}</tool_call>)";
  auto response = completion_response(*job, {g}, "m", tok, "id", 0);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "sure");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "calc");
  g.text = "<tool_call>{broken";  // malformed: stays text
  response = completion_response(*job, {g}, "m", tok, "id", 0);
  EXPECT_EQ(response["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(response["choices"][0]["message"]["content"], "<tool_call>{broken");
  EXPECT_FALSE(response["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace arlo::worker
