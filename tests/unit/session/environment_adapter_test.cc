// The EnvironmentPort adapter (session/adapters/environment_adapter.h) against the real arlo-worker:
// token-in/token-out. What an environment adds becomes ids from the worker's own /tokenize that
// extend the trajectory's ids exactly: the next turn's prompt is the previous turn's prompt, its
// completion and the environment's ids, and the worker reports that very prompt back; for a chat task
// it equals the worker's own rendering of the whole conversation. A chat template that does not
// extend the trajectory (arlo-worker's closes an assistant turn with '\n' where the model ended it
// with <eos>) ends the trajectory there and is counted. Errors carry codes (unreachable worker,
// missed deadline).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reference/tokenizer.h"
#include "rollout/inference_pool.h"
#include "rollout/multi_turn.h"
#include "session/adapters/environment_adapter.h"
#include "session/adapters/rollout_adapters.h"
#include "tests/integration/worker/child_process.h"

namespace arlo::session::adapters {
namespace {

namespace asio = boost::asio;
using Ids = std::vector<std::int32_t>;
using rollout::Json;

// Feedback after every model turn (short: the built-in model's context is 64 tokens), done after
// `turns` of them with reward 1.
class Feedback final : public rollout::LocalEnvironment {
 public:
  explicit Feedback(int turns) : turns_(turns) {}
  Result<rollout::EnvTurn> reset_now(const Task&) const override {
    rollout::EnvTurn t;
    t.state = {{"turn", 0}};
    return t;
  }
  Result<rollout::EnvTurn> step_now(const Task&, const Json& state, const std::vector<ChatMessage>&) const override {
    rollout::EnvTurn t;
    const int turn = state["turn"].get<int>() + 1;
    t.state = {{"turn", turn}};
    if (turn >= turns_) {
      t.done = true;
      t.reward = 1.0;
    } else {
      t.messages.push_back({"tool", "\nno\n"});
      t.messages.push_back({"user", "23+45="});
    }
    return t;
  }

 private:
  int turns_;
};

class EnvironmentAdapterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    worker_ = new testing::ChildProcess(
        {ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--log-level", "warn", "--init-seed", "1"});
    if (auto rest = worker_->wait_for_line("listening on ", std::chrono::seconds(60))) url_ = "http://" + *rest;
  }
  static void TearDownTestSuite() {
    delete worker_;
    worker_ = nullptr;
  }

  void SetUp() override {
    ASSERT_FALSE(url_.empty()) << "arlo-worker did not start";
    pool_.add_worker(url_);
    run(pool_.check_all());
    inference_ = std::make_unique<RolloutInference>(
        pool_, std::vector<std::unique_ptr<rollout::AdminClient>>{},
        [](const std::string&, const orch::WeightRound&) { return rollout::WeightUpdate{}; });
    adapter_ = std::make_unique<EnvironmentAdapter>(
        std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>>{
            {"feedback", std::make_shared<Feedback>(3)}, {"arithmetic", nullptr}},
        tokenizer_);
  }
  void TearDown() override {
    pool_.stop();
    io_.run_for(std::chrono::milliseconds(20));
  }

  template <typename T>
  T run(Awaitable<T> op) {
    std::optional<T> out;
    asio::co_spawn(
        io_, [&]() -> Awaitable<void> { out.emplace(co_await std::move(op)); }, asio::detached);
    io_.restart();  // a previous run may have run out of work, which stops the context
    while (!out) io_.run_one();
    return std::move(*out);
  }
  void run(Awaitable<void> op) {
    bool done = false;
    asio::co_spawn(
        io_,
        [&]() -> Awaitable<void> {
          co_await std::move(op);
          done = true;
        },
        asio::detached);
    io_.restart();
    while (!done) io_.run_one();
  }

  static orch::TimePoint soon() { return orch::Clock_::now() + std::chrono::seconds(30); }

  // One model turn of `task` from `prompt` (empty: the task's own prompt), seeded.
  orch::GenerateResult generate(std::shared_ptr<const Task> task, Ids prompt, std::uint64_t seed) {
    orch::GenerateRequest r;
    r.group_id = 1;
    r.task = std::move(task);
    r.prompt_tokens = std::move(prompt);
    r.sampling.max_tokens = 6;
    r.sampling.temperature = 1.0;
    r.seed = seed;
    r.deadline = soon();
    auto result = run(inference_->generate(std::move(r)));
    EXPECT_TRUE(result) << result.error().what();
    return result ? std::move(*result) : orch::GenerateResult{};
  }

  Result<orch::EnvReply> step(std::shared_ptr<const Task> task, const Sample& trajectory, Ids prompt,
                              orch::TimePoint deadline = soon()) {
    return run(adapter_->step(std::move(task), trajectory, std::move(prompt), deadline));
  }

  static std::shared_ptr<const Task> completion_task() {
    Task t;
    t.id = "sum-1";
    t.env = "feedback";
    t.prompt = "23+45=";
    return std::make_shared<const Task>(std::move(t));
  }
  static std::shared_ptr<const Task> chat_task() {
    Task t;
    t.id = "chat-1";
    t.env = "feedback";
    t.messages = {{"system", "add"}, {"user", "23+45="}};
    return std::make_shared<const Task>(std::move(t));
  }

  static testing::ChildProcess* worker_;
  static std::string url_;
  asio::io_context io_;
  rollout::InferencePool pool_{io_};
  WorkerTokenizer tokenizer_{pool_.client()};
  std::unique_ptr<RolloutInference> inference_;
  std::unique_ptr<EnvironmentAdapter> adapter_;
  const reference::Tokenizer tok_{};
};

testing::ChildProcess* EnvironmentAdapterTest::worker_ = nullptr;
std::string EnvironmentAdapterTest::url_;

TEST_F(EnvironmentAdapterTest, MultiTurnOnlyForTasksOfAMultiTurnEnvironment) {
  EXPECT_TRUE(adapter_->multi_turn(*completion_task()));
  Task single = *completion_task();
  single.env = "arithmetic";
  EXPECT_FALSE(adapter_->multi_turn(single));
  single.env = "unknown";  // no environment under "": single-turn
  EXPECT_FALSE(adapter_->multi_turn(single));
  auto reset = run(adapter_->reset(completion_task(), soon()));
  ASSERT_TRUE(reset) << reset.error().what();
  EXPECT_TRUE(reset->messages.empty());
  EXPECT_EQ(reset->state, (Json{{"turn", 0}}));
  EXPECT_TRUE(reset->tokens.empty());
}

// A completion-style trajectory over three model turns: each turn's prompt is the previous prompt,
// its completion and the environment's ids (its text tokenized alone, no <bos>), and the worker
// reports exactly that prompt.
TEST_F(EnvironmentAdapterTest, CompletionTaskTurnsExtendTheTrajectoryIds) {
  auto task = completion_task();
  auto first = generate(task, {}, 11);
  ASSERT_EQ(first.completions.size(), 1u);
  const Ids prompt = first.prompt_tokens;
  EXPECT_EQ(prompt, tok_.encode_prompt("23+45="));
  Sample trajectory = std::move(first.completions[0]);
  EXPECT_EQ(trajectory.worker, url_);
  trajectory.env_state = {{"turn", 0}};
  for (int turn = 1; turn <= 3; ++turn) {
    trajectory.turns.push_back({"assistant", trajectory.text});
    auto reply = step(task, trajectory, prompt);
    ASSERT_TRUE(reply) << reply.error().what();
    trajectory.env_state = reply->state;
    if (turn == 3) {
      EXPECT_TRUE(reply->done);
      EXPECT_EQ(reply->reward, 1.0);
      EXPECT_TRUE(reply->tokens.empty());
      break;
    }
    ASSERT_FALSE(reply->done);
    EXPECT_EQ(reply->tokens, tok_.encode("\nno\n23+45="));  // the worker's own tokenization
    Ids next = prompt;
    next.insert(next.end(), trajectory.completion_tokens.begin(), trajectory.completion_tokens.end());
    next.insert(next.end(), reply->tokens.begin(), reply->tokens.end());
    trajectory.completion_tokens.insert(trajectory.completion_tokens.end(), reply->tokens.begin(), reply->tokens.end());
    for (auto& m : reply->messages) trajectory.turns.push_back(std::move(m));
    auto again = generate(task, next, 11 + static_cast<std::uint64_t>(turn));
    ASSERT_EQ(again.completions.size(), 1u);
    EXPECT_EQ(again.prompt_tokens, next) << "turn " << turn + 1;
    trajectory.completion_tokens.insert(trajectory.completion_tokens.end(),
                                        again.completions[0].completion_tokens.begin(),
                                        again.completions[0].completion_tokens.end());
    trajectory.text = again.completions[0].text;
  }
  EXPECT_EQ(trajectory.turns.size(), 7u);  // three model turns, two of them followed by two messages
  EXPECT_EQ(adapter_->stats().splits, 0u);
}

// A chat trajectory whose model turn ended at the stop "\n": the template renders the turn the same
// way, so the whole conversation rendered by the worker starts with the trajectory's ids and the
// environment's ids are what follows; the next turn's prompt is that rendering.
TEST_F(EnvironmentAdapterTest, ChatTaskTurnExtendsWhenTheTemplateRendersTheModelTurnAsGenerated) {
  auto task = chat_task();
  const Ids prompt = *tok_.apply_chat_template({{"system", "add"}, {"user", "23+45="}});
  Sample trajectory;
  trajectory.worker = url_;
  trajectory.text = "67";
  trajectory.completion_tokens = tok_.encode("67\n");  // the turn ended at the stop "\n"
  trajectory.env_state = {{"turn", 0}};
  trajectory.turns = {{"assistant", "67"}};
  auto reply = step(task, trajectory, prompt);
  ASSERT_TRUE(reply) << reply.error().what();
  ASSERT_FALSE(reply->done);
  const auto whole = *tok_.apply_chat_template(
      {{"system", "add"}, {"user", "23+45="}, {"assistant", "67"}, {"user", "\nno\n"}, {"user", "23+45="}});
  Ids next = prompt;
  next.insert(next.end(), trajectory.completion_tokens.begin(), trajectory.completion_tokens.end());
  next.insert(next.end(), reply->tokens.begin(), reply->tokens.end());
  EXPECT_EQ(next, whole);
  auto again = generate(task, next, 5);
  EXPECT_EQ(again.prompt_tokens, next);
  EXPECT_EQ(adapter_->stats().splits, 0u);
}

// The model ended its turn with <eos>; arlo-worker's template closes an assistant turn with '\n':
// the rendering does not start with the trajectory's ids, so the trajectory splits there: not done,
// no tokens, the environment's messages, and the worker's rendering of the whole conversation as the
// next piece's prompt; the split is counted.
TEST_F(EnvironmentAdapterTest, ChatTemplateThatDoesNotExtendSplitsTheTrajectoryAndIsCounted) {
  int callbacks = 0;
  adapter_->on_split([&] { ++callbacks; });
  Sample trajectory;
  trajectory.worker = url_;
  trajectory.text = "67";
  trajectory.completion_tokens = tok_.encode("67");
  trajectory.completion_tokens.push_back(reference::Tokenizer::kEos);
  trajectory.env_state = {{"turn", 0}};
  trajectory.turns = {{"assistant", "67"}};
  auto reply = step(chat_task(), trajectory, *tok_.apply_chat_template({{"system", "add"}, {"user", "23+45="}}));
  ASSERT_TRUE(reply) << reply.error().what();
  EXPECT_FALSE(reply->done);
  EXPECT_TRUE(reply->tokens.empty());
  ASSERT_FALSE(reply->messages.empty());
  std::vector<reference::Tokenizer::Message> conversation = {
      {"system", "add"}, {"user", "23+45="}, {"assistant", "67"}};
  for (const auto& m : reply->messages)  // arlo-worker renders a tool message as a user turn
    conversation.push_back({m.role == "tool" ? "user" : m.role, m.content});
  ASSERT_TRUE(tok_.apply_chat_template(conversation));
  EXPECT_EQ(reply->restart_prompt, *tok_.apply_chat_template(conversation));
  EXPECT_EQ(adapter_->stats().splits, 1u);
  EXPECT_EQ(callbacks, 1);
}

TEST_F(EnvironmentAdapterTest, TokenizeFailuresCarryTheirCodes) {
  Sample trajectory;
  trajectory.text = "67";
  trajectory.completion_tokens = tok_.encode("67\n");
  trajectory.env_state = {{"turn", 0}};
  trajectory.turns = {{"assistant", "67"}};
  const Ids prompt = tok_.encode_prompt("23+45=");

  trajectory.worker = "";  // no worker served it
  auto none = step(completion_task(), trajectory, prompt);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ErrorCode::kInvalidArgument);

  trajectory.worker = url_;  // the deadline is already over
  auto late = step(completion_task(), trajectory, prompt, orch::Clock_::now() - std::chrono::seconds(1));
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code(), ErrorCode::kTimeout);

  trajectory.worker = "http://127.0.0.1:1";  // nothing listens there
  auto down = step(completion_task(), trajectory, prompt);
  ASSERT_FALSE(down);
  EXPECT_EQ(down.error().code(), ErrorCode::kUnavailable) << down.error().what();

  Task unknown = *completion_task();  // a task of no multi-turn environment
  unknown.env = "arithmetic";
  auto wrong = step(std::make_shared<const Task>(unknown), trajectory, prompt);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), ErrorCode::kNotFound);
}

// Tool calls (docs/environments.md, "Tool calls"): a malformed <tool_call> in the model's turn ends
// the trajectory with env reward 0 and the counted reason, without calling the environment; a
// well-formed one goes on (the /tokenize body carries the task's tools).
TEST_F(EnvironmentAdapterTest, AMalformedToolCallEndsTheTrajectoryWithRewardZero) {
  Task t = *chat_task();
  t.tools = Json::parse(R"([{"type": "function", "function": {"name": "add"}}])");
  auto task = std::make_shared<const Task>(std::move(t));
  const Ids prompt = *tok_.apply_chat_template({{"system", "add"}, {"user", "23+45="}});
  Sample trajectory;
  trajectory.worker = url_;
  trajectory.env_state = {{"turn", 0}};
  trajectory.turns = {{"assistant", "<tool_call>{\"name\": \"sub\"}</tool_call>"}};
  auto reply = step(task, trajectory, prompt);
  ASSERT_TRUE(reply) << reply.error().what();
  EXPECT_TRUE(reply->done);
  EXPECT_EQ(reply->reward, 0.0);
  EXPECT_EQ(reply->ended_because, "malformed_tool_call");

  const std::string call = "<tool_call>{\"name\": \"add\"}</tool_call>";
  trajectory.text = call;
  trajectory.completion_tokens = tok_.encode(call + "\n");
  trajectory.turns = {{"assistant", call}};
  auto ok = step(task, trajectory, prompt);
  ASSERT_TRUE(ok) << ok.error().what();
  EXPECT_FALSE(ok->done);
  EXPECT_TRUE(ok->ended_because.empty());
  EXPECT_FALSE(ok->tokens.empty());
}

}  // namespace
}  // namespace arlo::session::adapters
