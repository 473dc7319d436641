// Request bodies and response parsing for the OpenAI-compatible wire format.
#include <gtest/gtest.h>

#include "rollout/openai.h"

namespace arlo::rollout {
namespace {

TEST(OpenAI, CompletionBodyCarriesTokenIdsAndSampling) {
  CompletionRequest r;
  r.model = "m";
  r.prompt_token_ids = {5, 6, 7};
  r.sampling.n = 4;
  r.sampling.seed = 9;
  r.sampling.temperature = 0.7;
  r.sampling.top_p = 0.9;
  r.sampling.max_tokens = 16;
  r.sampling.stop = {"\n"};
  r.extra = {{"top_k", 5}};
  EXPECT_EQ(endpoint_path(r), "/v1/completions");
  const Json b = to_openai_body(r);
  EXPECT_EQ(b["prompt"], Json::array({5, 6, 7}));
  EXPECT_EQ(b["n"], 4);
  EXPECT_EQ(b["seed"], 9);
  EXPECT_EQ(b["temperature"], 0.7);
  EXPECT_EQ(b["top_p"], 0.9);
  EXPECT_EQ(b["max_tokens"], 16);
  EXPECT_EQ(b["stop"], Json::array({"\n"}));
  EXPECT_EQ(b["logprobs"], 0);
  EXPECT_EQ(b["return_token_ids"], true);
  EXPECT_EQ(b["top_k"], 5);
  EXPECT_EQ(b["model"], "m");

  CompletionRequest chat;
  chat.messages = {{"user", "hi"}};
  EXPECT_EQ(endpoint_path(chat), "/v1/chat/completions");
  const Json c = to_openai_body(chat);
  EXPECT_EQ(c["messages"][0]["content"], "hi");
  EXPECT_EQ(c["logprobs"], true);
  EXPECT_FALSE(c.contains("seed"));
}

TEST(OpenAI, ParsesCompletionsWithTokenIdsLogprobsAndVersionSpans) {
  const Json body = Json::parse(R"({
    "id": "cmpl-1", "model": "m",
    "choices": [
      {"index": 1, "text": "ab", "token_ids": [97, 98], "finish_reason": "length",
       "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2]},
       "prompt_token_ids": [1, 2], "version_spans": [[3, 0], [4, 1]]},
      {"index": 0, "text": "c", "token_ids": [99], "finish_reason": "stop",
       "logprobs": {"token_logprobs": [-1.5]}, "version_spans": [{"version": 4, "first_token": 0}]}
    ]})");
  auto c = parse_openai_response(body, false);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->id, "cmpl-1");
  EXPECT_EQ(c->prompt_token_ids, (std::vector<std::int32_t>{1, 2}));
  ASSERT_EQ(c->choices.size(), 2u);
  EXPECT_EQ(c->choices[0].text, "c");  // sorted by index
  const auto& ch = c->choices[1];
  EXPECT_EQ(ch.token_ids, (std::vector<std::int32_t>{97, 98}));
  ASSERT_EQ(ch.logprobs.size(), 2u);
  EXPECT_FLOAT_EQ(ch.logprobs[1], -0.2f);
  EXPECT_EQ(ch.finish_reason, FinishReason::kLength);
  EXPECT_EQ(ch.version_spans, (std::vector<VersionSpan>{{3, 0}, {4, 1}}));
  EXPECT_EQ(c->choices[0].version_spans, (std::vector<VersionSpan>{{4, 0}}));

  Task t;
  t.id = "t";
  t.prompt = "p";
  Rollout r = make_rollout(t, "g", 1, *c, ch);
  EXPECT_EQ(r.oldest_version(), 3);
  EXPECT_EQ(r.newest_version(), 4);
  EXPECT_TRUE(r.truncated());
  EXPECT_EQ(r.prompt_tokens, (std::vector<std::int32_t>{1, 2}));
}

TEST(OpenAI, ParsesChatLogprobsAndTopLevelPromptIds) {
  const Json body = Json::parse(R"({
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "stop",
                 "token_ids": [1, 2],
                 "logprobs": {"content": [{"token": "he", "logprob": -0.5}, {"token": "y", "logprob": -0.25}]}}],
    "prompt_token_ids": [7, 8, 9], "version": 12})");
  auto c = parse_openai_response(body, true);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->choices[0].text, "hey");
  EXPECT_EQ(c->choices[0].logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(c->prompt_token_ids, (std::vector<std::int32_t>{7, 8, 9}));
  EXPECT_EQ(c->choices[0].version_spans, (std::vector<VersionSpan>{{12, 0}}));
}

TEST(OpenAI, MalformedResponsesNameTheField) {
  auto r = parse_openai_response(Json::parse(R"({"choices": [{"index": 0}]})"), false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("choices[0]"), std::string::npos);
  r = parse_openai_response(Json::parse(R"({"choices": [{"text": "a", "token_ids": [1, "x"]}]})"), false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("token_ids"), std::string::npos);
  r = parse_openai_response(Json::parse(R"({"choices": [{"text": "a", "version_spans": [[1, 5], [2, 0]]}]})"), false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("sorted"), std::string::npos);
  r = parse_openai_response(Json::parse(R"({"choices": [{"text": "ab", "token_ids": [1, 2], "logprobs": {"token_logprobs": [-1]}}]})"), false);
  ASSERT_FALSE(r);
  r = parse_openai_response(Json::parse(R"({"error": {"message": "model overloaded"}})"), false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("model overloaded"), std::string::npos);
  EXPECT_FALSE(parse_openai_response(Json::array(), false));
}

}  // namespace
}  // namespace arlo::rollout
