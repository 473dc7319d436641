// The tool-call syntax in model text (rollout/tool_calls.h): well-formed blocks become OpenAI
// tool_calls, every kind of malformed block is an error naming what is wrong.
#include "rollout/tool_calls.h"

#include <gtest/gtest.h>

#include <string>

namespace arlo::rollout {
namespace {

const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "calc", "parameters": {}}},
                                    {"type": "function", "function": {"name": "search"}}])");

std::string error_of(std::string_view text, const Json& tools = kTools) {
  auto parsed = parse_tool_calls(text, tools);
  EXPECT_FALSE(parsed) << text;
  return parsed ? std::string() : std::string(parsed.error().what());
}

TEST(ToolCalls, TextWithoutBlocksIsContentOnly) {
  auto parsed = parse_tool_calls("  the answer is 5 \n", kTools);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->content, "the answer is 5");
  EXPECT_TRUE(parsed->tool_calls.is_null());
}

TEST(ToolCalls, BlocksBecomeOpenAICallsInOrder) {
  auto parsed = parse_tool_calls(
      "Let me compute.\n<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"2+3\"}}</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>",
      kTools);
  ASSERT_TRUE(parsed) << parsed.error().what();
  EXPECT_EQ(parsed->content, "Let me compute.");
  ASSERT_EQ(parsed->tool_calls.size(), 2u);
  const Json& first = parsed->tool_calls[0];
  EXPECT_EQ(first["id"], "call_0");
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["function"]["name"], "calc");
  EXPECT_EQ(Json::parse(first["function"]["arguments"].get<std::string>()), Json({{"expr", "2+3"}}));
  EXPECT_EQ(parsed->tool_calls[1]["id"], "call_1");
  EXPECT_EQ(parsed->tool_calls[1]["function"]["arguments"], "{}");
}

TEST(ToolCalls, AbsentArgumentsAreEmptyAndAnyNameGoesWithoutTools) {
  auto parsed = parse_tool_calls("<tool_call>{\"name\": \"anything\"}</tool_call>", nullptr);
  ASSERT_TRUE(parsed) << parsed.error().what();
  EXPECT_EQ(parsed->content, "");
  EXPECT_EQ(parsed->tool_calls[0]["function"]["name"], "anything");
  EXPECT_EQ(parsed->tool_calls[0]["function"]["arguments"], "{}");
}

TEST(ToolCalls, MalformedBlocksNameTheProblem) {
  EXPECT_NE(error_of("<tool_call>{\"name\": \"calc\", </tool_call>").find("tool call 0: not JSON"), std::string::npos);
  EXPECT_NE(error_of("<tool_call>{\"arguments\": {}}</tool_call>").find("\"name\""), std::string::npos);
  EXPECT_NE(error_of("<tool_call>{\"name\": 3}</tool_call>").find("\"name\""), std::string::npos);
  EXPECT_NE(error_of("<tool_call>{\"name\": \"calc\", \"arguments\": \"2+3\"}</tool_call>")
                .find("\"arguments\" must be a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of("<tool_call>[1, 2]</tool_call>").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(error_of("<tool_call>{\"name\": \"rm\"}</tool_call>").find("unknown tool 'rm'"), std::string::npos);
  EXPECT_NE(error_of("ok <tool_call>{\"name\": \"calc\"}").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("<tool_call>{\"name\": \"calc\"}</tool_call><tool_call>{}").find("tool call 1"),
            std::string::npos);
  EXPECT_NE(error_of("<tool_call><tool_call>{\"name\": \"calc\"}</tool_call>").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("done</tool_call>").find("without <tool_call>"), std::string::npos);
}

TEST(ToolCalls, MalformedToolsAreNamed) {
  auto parsed = parse_tool_calls("x", Json::parse(R"([{"type": "function"}])"));
  ASSERT_FALSE(parsed);
  EXPECT_NE(std::string(parsed.error().what()).find("tools[0]"), std::string::npos);
  EXPECT_FALSE(parse_tool_calls("x", Json::object()));
}

TEST(ToolCalls, MessagesGetTheirCallsOnceAndOthersAreLeftAlone) {
  ChatMessage m{"assistant", "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"1\"}}</tool_call>"};
  auto filled = with_parsed_tool_calls(m, kTools);
  ASSERT_TRUE(filled);
  EXPECT_EQ(filled->content, "");
  ASSERT_EQ(filled->tool_calls.size(), 1u);
  auto again = with_parsed_tool_calls(*filled, kTools);  // already structured: unchanged
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *filled);
  ChatMessage user{"user", "<tool_call>oops"};
  EXPECT_EQ(*with_parsed_tool_calls(user, kTools), user);
  EXPECT_FALSE(with_parsed_tool_calls(ChatMessage{"assistant", "<tool_call>oops"}, kTools));
}

TEST(ToolCalls, RenderingParsesBackToTheSameCalls) {
  auto parsed = parse_tool_calls(
      "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"7*6\"}}</tool_call>"
      "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}</tool_call>",
      kTools);
  ASSERT_TRUE(parsed);
  const std::string text = render_tool_calls(parsed->tool_calls);
  auto back = parse_tool_calls(text, kTools);
  ASSERT_TRUE(back) << text;
  EXPECT_EQ(back->tool_calls, parsed->tool_calls);
  EXPECT_EQ(render_tool_calls(nullptr), "");
}

}  // namespace
}  // namespace arlo::rollout
