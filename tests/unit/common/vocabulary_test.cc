// The shared vocabulary's names: every pause mode and finish reason prints as the name the wire and
// the configuration use, and parses back; the aliases servers send map to arlo's reasons.
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
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError,
                         FinishReason::kUnknown})
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

}  // namespace
}  // namespace arlo
