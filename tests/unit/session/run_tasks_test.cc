// Which tasks `arlo run` tokenizes itself: only those for arlo-worker (inference.kind arlo), whose
// policy the built-in tokenizer belongs to. For vLLM and SGLang the training stream and the eval
// set carry text (or messages) only; the server's response supplies the ids.
#include <gtest/gtest.h>

#include "session/rollout_parts.h"
#include "reference/tokenizer.h"
#include "tests/unit/session/session_test_util.h"

namespace arlo::session {
namespace {

using test::load;

TEST(ArloRunTasks, ArloWorkerGetsBuiltinIds) {
  const auto cfg = load({"eval.size=4", "eval.interval=5"});
  EXPECT_TRUE(uses_builtin_tokenizer(cfg));
  auto parts = build_rollout_parts(cfg);
  ASSERT_TRUE(parts) << parts.error().what();
  EXPECT_TRUE(parts->tokenize);
  RunTasks tasks(parts->stream, parts->tokenize);
  auto t = tasks.next();
  ASSERT_TRUE(t) << t.error().what();
  const reference::Tokenizer tok;
  EXPECT_EQ(t->prompt_tokens, tok.encode_prompt(t->prompt_text()));
  EXPECT_FALSE(t->answer_tokens.empty());
  ASSERT_EQ(parts->eval_tasks.size(), 4u);
  for (const auto& e : parts->eval_tasks) EXPECT_EQ(e.prompt_tokens, tok.encode_prompt(e.prompt_text()));
}

TEST(ArloRunTasks, VllmAndSglangGetTextOnly) {
  for (const char* kind : {"vllm", "sglang"}) {
    const auto cfg = load({"inference.launch=external", std::string("inference.kind=") + kind,
                           "inference.urls=[\"http://127.0.0.1:8000\"]", "eval.size=4", "eval.interval=5"});
    EXPECT_FALSE(uses_builtin_tokenizer(cfg)) << kind;
    auto parts = build_rollout_parts(cfg);
    ASSERT_TRUE(parts) << parts.error().what();
    EXPECT_FALSE(parts->tokenize);
    RunTasks tasks(parts->stream, parts->tokenize);
    for (int i = 0; i < 3; ++i) {
      auto t = tasks.next();
      ASSERT_TRUE(t) << t.error().what();
      EXPECT_FALSE(t->prompt_text().empty());
      EXPECT_TRUE(t->prompt_tokens.empty()) << kind;
      EXPECT_TRUE(t->answer_tokens.empty()) << kind;
    }
    ASSERT_EQ(parts->eval_tasks.size(), 4u);
    for (const auto& e : parts->eval_tasks) EXPECT_TRUE(e.prompt_tokens.empty()) << kind;
  }
}

TEST(ArloRunTasks, WarmUpNeedsArloWorker) {
  auto parts =
      build_rollout_parts(load({"inference.launch=external", "inference.kind=vllm",
                                "inference.urls=[\"http://127.0.0.1:8000\"]", "orchestrator.sft_warmup_steps=3"}));
  ASSERT_FALSE(parts);
  EXPECT_NE(parts.error().what().find("orchestrator.sft_warmup_steps"), std::string::npos) << parts.error().what();
  EXPECT_NE(parts.error().what().find("inference.kind vllm"), std::string::npos) << parts.error().what();
  EXPECT_TRUE(build_rollout_parts(load({"orchestrator.sft_warmup_steps=3"})));  // arlo-worker: fine
}

}  // namespace
}  // namespace arlo::session
