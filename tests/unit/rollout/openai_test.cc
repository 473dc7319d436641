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

// vLLM refuses a seed above 2^63 - 1 (HTTP 400: "Input should be less than or equal to
// 9223372036854775807"); arlo draws 64-bit seeds.
TEST(OpenAI, TheSeedFitsASigned64BitInteger) {
  CompletionRequest r;
  r.prompt = "x";
  r.sampling.seed = 18301848765998365067ull;
  const Json b = to_openai_body(r);
  ASSERT_TRUE(b["seed"].is_number_integer());
  EXPECT_EQ(b["seed"].get<std::int64_t>(), static_cast<std::int64_t>(18301848765998365067ull - (1ull << 63)));
  EXPECT_EQ(b.dump().find("18301848765998365067"), std::string::npos);
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
  EXPECT_EQ(c->prompt_token_ids, (std::vector<std::int32_t>{1, 2}));
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

// Tools go in a chat body (tool_choice only with them); a message's tool_calls (a server's tool
// parser took them out of the content) are kept and rendered back into the text.
TEST(OpenAI, ChatToolsGoInTheBodyAndToolCallsComeBack) {
  CompletionRequest r;
  r.messages = {{"user", "hi"}};
  r.tool_choice = "auto";
  EXPECT_FALSE(to_openai_body(r).contains("tools"));
  EXPECT_FALSE(to_openai_body(r).contains("tool_choice"));
  r.tools = Json::parse(R"([{"type": "function", "function": {"name": "add"}}])");
  EXPECT_EQ(to_openai_body(r)["tools"], r.tools);
  EXPECT_EQ(to_openai_body(r)["tool_choice"], "auto");
  const Json body = Json::parse(R"({"choices": [{"index": 0, "finish_reason": "tool_calls",
    "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
      "function": {"name": "add", "arguments": "{\"terms\": [1]}"}}]}}]})");
  auto c = parse_openai_response(body, true);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->choices[0].tool_calls[0]["function"]["name"], "add");
  EXPECT_EQ(c->choices[0].text, "<tool_call>{\"arguments\":{\"terms\":[1]},\"name\":\"add\"}</tool_call>");
  auto bad =
      parse_openai_response(Json::parse(R"({"choices": [{"message": {"content": "", "tool_calls": 3}}]})"), true);
  EXPECT_FALSE(bad);
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
  r = parse_openai_response(
      Json::parse(R"({"choices": [{"text": "ab", "token_ids": [1, 2], "logprobs": {"token_logprobs": [-1]}}]})"),
      false);
  ASSERT_FALSE(r);
  r = parse_openai_response(Json::parse(R"({"error": {"message": "model overloaded"}})"), false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("model overloaded"), std::string::npos);
  EXPECT_FALSE(parse_openai_response(Json::array(), false));
}

// vLLM's non-streaming shapes with return_token_ids (its OpenAI server's CompletionResponse and
// ChatCompletionResponse): completions put the prompt ids on each choice, chat on the response.
TEST(OpenAI, ParsesVllmShapes) {
  const Json completions = Json::parse(R"({
    "id": "cmpl-7", "object": "text_completion", "created": 1, "model": "Qwen/Qwen3-1.7B",
    "choices": [{"index": 0, "text": " 5", "finish_reason": "stop", "stop_reason": null,
                 "logprobs": {"text_offset": [0, 1], "token_logprobs": [-0.25, -0.5], "tokens": [" ", "5"],
                              "top_logprobs": null},
                 "prompt_logprobs": null, "prompt_token_ids": [151644, 17, 10, 18, 28], "token_ids": [220, 20]}],
    "usage": {"prompt_tokens": 5, "total_tokens": 7, "completion_tokens": 2}})");
  auto c = parse_openai_response(completions, false);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->prompt_token_ids, (std::vector<std::int32_t>{151644, 17, 10, 18, 28}));
  EXPECT_EQ(c->choices[0].token_ids, (std::vector<std::int32_t>{220, 20}));
  EXPECT_EQ(c->choices[0].logprobs, (std::vector<float>{-0.25f, -0.5f}));
  c->worker = "http://127.0.0.1:8000";
  EXPECT_TRUE(check_token_data(*c, false, true, AdminDialect::kVllm));

  const Json chat = Json::parse(R"({
    "id": "chatcmpl-7", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "5", "tool_calls": []},
                 "logprobs": {"content": [{"token": "5", "logprob": -0.125, "bytes": [53], "top_logprobs": []},
                                          {"token": "<|im_end|>", "logprob": -0.0625, "bytes": [], "top_logprobs": []}]},
                 "finish_reason": "stop", "stop_reason": null, "token_ids": [20, 151645]}],
    "usage": {"prompt_tokens": 9, "total_tokens": 11, "completion_tokens": 2},
    "prompt_logprobs": null, "prompt_token_ids": [151644, 872, 198, 17, 10, 18, 151645, 198, 151644]})");
  c = parse_openai_response(chat, true);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->prompt_token_ids.size(), 9u);
  EXPECT_EQ(c->choices[0].token_ids, (std::vector<std::int32_t>{20, 151645}));
  EXPECT_EQ(c->choices[0].logprobs, (std::vector<float>{-0.125f, -0.0625f}));
  EXPECT_TRUE(check_token_data(*c, true, true, AdminDialect::kVllm));
}

// SGLang's chat before return_token_ids: prompt ids on the choice (return_prompt_token_ids), the
// generated ids only inside meta_info (return_meta_info) as [logprob, token_id, text] triples.
TEST(OpenAI, ParsesSglangChatMetaInfo) {
  const Json chat = Json::parse(R"({
    "id": "x", "object": "chat.completion", "created": 1, "model": "default",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "5", "reasoning_content": null,
                                         "tool_calls": null},
                 "logprobs": null, "finish_reason": "stop", "matched_stop": 151645,
                 "prompt_token_ids": [151644, 872, 198],
                 "meta_info": {"id": "x", "finish_reason": {"type": "stop", "matched": 151645},
                               "prompt_tokens": 3, "completion_tokens": 2,
                               "output_token_logprobs": [[-0.5, 20, "5"], [-0.75, 151645, "<|im_end|>"]]}}],
    "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2},
    "metadata": {"weight_version": "default"}})");
  auto c = parse_openai_response(chat, true);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_EQ(c->prompt_token_ids, (std::vector<std::int32_t>{151644, 872, 198}));
  EXPECT_EQ(c->choices[0].token_ids, (std::vector<std::int32_t>{20, 151645}));
  EXPECT_EQ(c->choices[0].logprobs, (std::vector<float>{-0.5f, -0.75f}));
  EXPECT_TRUE(check_token_data(*c, true, true, AdminDialect::kSglang));

  auto bad = chat;
  bad["choices"][0]["meta_info"]["output_token_logprobs"][1] = Json::array({-0.75});
  auto r = parse_openai_response(bad, true);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("meta_info.output_token_logprobs"), std::string::npos);
}

// SGLang labels a non-streaming response with the weights that answered it: that label (the
// version arlo sent with the update) is the completion's version; "default" (never updated) is none.
TEST(OpenAI, SglangMetadataWeightVersionIsTheCompletionsVersion) {
  Json body = Json::parse(R"({
    "id": "x", "object": "text_completion", "created": 1, "model": "default",
    "choices": [{"index": 0, "text": "5", "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop",
                 "matched_stop": 151643, "token_ids": [20], "prompt_token_ids": [1, 2]},
                {"index": 1, "text": "6", "logprobs": {"token_logprobs": [-0.25]}, "finish_reason": "stop",
                 "matched_stop": 151643, "token_ids": [21], "prompt_token_ids": [1, 2]}],
    "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1},
    "metadata": {"weight_version": "12"}})");
  auto c = parse_openai_response(body, false);
  ASSERT_TRUE(c) << c.error().what();
  for (const auto& ch : c->choices) EXPECT_EQ(ch.version_spans, (std::vector<VersionSpan>{{12, 0}}));
  for (const char* label : {"default", "", "12b", "v12"}) {
    body["metadata"]["weight_version"] = label;
    c = parse_openai_response(body, false);
    ASSERT_TRUE(c) << c.error().what();
    EXPECT_TRUE(c->choices[0].version_spans.empty()) << label;
  }
  body.erase("metadata");
  c = parse_openai_response(body, false);
  ASSERT_TRUE(c) << c.error().what();
  EXPECT_TRUE(c->choices[0].version_spans.empty());
}

TEST(OpenAI, SglangChatAsksForPromptIdsAndMetaInfo) {
  EXPECT_EQ(token_data_request(AdminDialect::kSglang, true),
            (Json{{"return_prompt_token_ids", true}, {"return_meta_info", true}}));
  EXPECT_TRUE(token_data_request(AdminDialect::kSglang, false).empty());
  EXPECT_TRUE(token_data_request(AdminDialect::kVllm, true).empty());
  EXPECT_TRUE(token_data_request(AdminDialect::kArlo, true).empty());
}

// A response without token data names the server, the field and what turns it on.
TEST(OpenAI, MissingTokenDataNamesServerFieldAndFlag) {
  Completion c;
  c.worker = "http://127.0.0.1:8000";
  c.prompt_token_ids = {1, 2};
  CompletionChoice ch;
  ch.text = "5";
  ch.finish_reason = FinishReason::kStop;
  c.choices = {ch};
  auto st = check_token_data(c, false, true, AdminDialect::kVllm);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kMismatch);
  for (const char* part : {"http://127.0.0.1:8000/v1/completions", "inference.kind vllm", "choices[0].token_ids",
                           "return_token_ids", "0.10.2"})
    EXPECT_NE(st.error().what().find(part), std::string::npos) << part << " in " << st.error().what();

  c.choices[0].token_ids = {20};
  st = check_token_data(c, true, true, AdminDialect::kVllm);
  ASSERT_FALSE(st);
  for (const char* part : {"/v1/chat/completions", "logprobs.content[].logprob", "--logprobs-mode processed_logprobs"})
    EXPECT_NE(st.error().what().find(part), std::string::npos) << part << " in " << st.error().what();
  EXPECT_TRUE(check_token_data(c, true, false, AdminDialect::kVllm));  // logprobs not asked for

  c.choices[0].logprobs = {-0.5f};
  c.prompt_token_ids.clear();
  st = check_token_data(c, true, true, AdminDialect::kSglang);
  ASSERT_FALSE(st);
  for (const char* part : {"inference.kind sglang", "choices[].prompt_token_ids", "return_prompt_token_ids"})
    EXPECT_NE(st.error().what().find(part), std::string::npos) << part << " in " << st.error().what();

  // An aborted choice may have generated nothing yet.
  c.prompt_token_ids = {1};
  c.choices[0].token_ids.clear();
  c.choices[0].logprobs.clear();
  c.choices[0].finish_reason = FinishReason::kAbort;
  EXPECT_TRUE(check_token_data(c, false, true, AdminDialect::kSglang));
}

}  // namespace
}  // namespace arlo::rollout
