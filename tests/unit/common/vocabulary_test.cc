// The shared vocabulary's names: every pause mode and finish reason prints as the name the wire and
// the configuration use, and parses back; the aliases servers send map to arlo's reasons. A task's
// prompt reads as one text whether it is a completions prompt or chat messages.
#include "common/vocabulary.h"

#include <gtest/gtest.h>

namespace arlo {
namespace {

TEST(Vocabulary, PauseModeRoundTrips) {
  for (PauseMode m : {PauseMode::kKeep, PauseMode::kWait, PauseMode::kAbort}) {
    auto parsed = parse_pause_mode(to_string(m));
    ASSERT_TRUE(parsed.has_value()) << to_string(m);
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_EQ(to_string(PauseMode::kWait), "wait");
  EXPECT_FALSE(parse_pause_mode("Keep").has_value());
  EXPECT_FALSE(parse_pause_mode("").has_value());
}

TEST(Vocabulary, FinishReasonRoundTripsAndAliases) {
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError, FinishReason::kUnknown})
    EXPECT_EQ(parse_finish_reason(to_string(r)), r) << to_string(r);
  EXPECT_EQ(parse_finish_reason("eos"), FinishReason::kStop);
  EXPECT_EQ(parse_finish_reason("end_turn"), FinishReason::kStop);
  EXPECT_EQ(parse_finish_reason("max_tokens"), FinishReason::kLength);
  EXPECT_EQ(parse_finish_reason("canceled"), FinishReason::kAbort);
  EXPECT_EQ(parse_finish_reason("tool_calls"), FinishReason::kUnknown);
}

TEST(Vocabulary, VersionSpanCompares) {
  EXPECT_EQ((VersionSpan{3, 10}), (VersionSpan{3, 10}));
  EXPECT_NE((VersionSpan{3, 10}), (VersionSpan{4, 10}));
  EXPECT_EQ(VersionSpan{}.version, 0);
  EXPECT_LT(kNoVersion, Version{0});
}

TEST(Vocabulary, TaskPromptTextIsThePromptOrTheMessagesAsLines) {
  Task completion;
  completion.prompt = "23+45=";
  EXPECT_FALSE(completion.is_chat());
  EXPECT_EQ(completion.prompt_text(), "23+45=");

  Task chat;
  chat.messages = {{"system", "Answer briefly."}, {"user", "2+2?"}};
  EXPECT_TRUE(chat.is_chat());
  EXPECT_EQ(chat.prompt_text(), "system: Answer briefly.\nuser: 2+2?");

  Task empty_prompt;
  empty_prompt.prompt = "";
  EXPECT_FALSE(empty_prompt.is_chat());  // an empty prompt is still a completions prompt
  EXPECT_EQ(empty_prompt.prompt_text(), "");
}

TEST(Vocabulary, TasksCompareByEveryField) {
  Task a;
  a.id = "arithmetic-3";
  a.prompt = "1+1=";
  a.info = {{"level", 1}};
  Task b = a;
  EXPECT_EQ(a, b);
  b.prompt_tokens = {1, 2};
  EXPECT_NE(a, b);
  b = a;
  b.info["level"] = 2;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace arlo
