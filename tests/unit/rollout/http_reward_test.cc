// The http reward module against a real local reward server, run through RewardScorer.
#include <gtest/gtest.h>

#include <thread>

#include "rollout/reward_scorer.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

namespace asio = boost::asio;

// A reward server on its own thread and io_context (the module blocks its scorer thread).
class RewardServer {
 public:
  RewardServer() {
    http::ServerOptions o;
    o.stop_grace = std::chrono::milliseconds(100);
    server_ = std::make_unique<http::Server>(io_, o);
    server_->route(http::Verb::post, "/score", [this](http::Request req) -> asio::awaitable<http::Response> {
      ++calls;
      auto j = req.json();
      if (!j) co_return http::Response::error(400, "bad json");
      const Json& r = (*j)["rollout"];
      const bool correct = r["completion_text"] == (*j)["task"]["answer"];
      co_return http::Response::json(200, {{"reward", correct ? 1.0 : 0.0},
                                           {"metrics", {{"chars", r["completion_text"].get<std::string>().size()}}}});
    });
    server_->route(http::Verb::post, "/group", [this](http::Request req) -> asio::awaitable<http::Response> {
      ++calls;
      auto j = req.json();
      Json scores = Json::array();
      for (std::size_t i = 0; i < (*j)["rollouts"].size(); ++i) scores.push_back({{"reward", static_cast<double>(i)}});
      co_return http::Response::json(200, {{"scores", scores}});
    });
    server_->route(http::Verb::post, "/broken", [](http::Request) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200, {{"score", 1}});
    });
    port_ = *server_->start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~RewardServer() {
    asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    thread_.join();
  }
  std::string url(const std::string& path) const { return fmt::format("http://127.0.0.1:{}{}", port_, path); }
  std::atomic<int> calls{0};

 private:
  asio::io_context io_;
  std::unique_ptr<http::Server> server_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// What HTTP reward servers and plugins receive of a task (docs/reward-modules.md): its id, env,
// answer, info and prompt or messages; never its token ids, which only the orchestrator uses.
TEST(HttpReward, TaskJsonIsTheDocumentedFormWithoutTokenIds) {
  const Task t = test::sample_completion_task();
  ASSERT_FALSE(t.prompt_tokens.empty());
  ASSERT_FALSE(t.answer_tokens.empty());
  EXPECT_EQ(to_json(t), Json::parse(R"({"id": "arithmetic-7", "env": "arithmetic", "answer": "5",
                                        "info": {"level": 1}, "prompt": "2+3="})"));
  Task chat = test::sample_chat_task();
  chat.prompt_tokens = {7};
  EXPECT_EQ(to_json(chat), Json::parse(R"({"id": "q-8", "env": "gsm8k", "answer": "4", "info": {},
      "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"}]})"));
}

Task task() {
  Task t;
  t.id = "t";
  t.prompt = "reverse abc:";
  t.answer = "cba";
  return t;
}

std::vector<Rollout> group() {
  std::vector<Rollout> g(2);
  g[0].text = "cba";
  g[1].text = "abc";
  g[1].sample_index = 1;
  return g;
}

Status score(const Json& spec, std::vector<Rollout>& g, FailurePolicy policy = FailurePolicy::kFail) {
  asio::io_context io;
  auto m = make_reward_module(spec);
  EXPECT_TRUE(m) << (m ? "" : m.error().what());
  Status st = ok();
  {
    RewardScorer scorer(io, std::shared_ptr<RewardModule>(std::move(*m)),
                        {.timeout = std::chrono::seconds(10),
                         .on_failure = policy,
                         .assign_value = 0,
                         .threads = 2,
                         .max_abandoned = 4});
    test::run(io, [&]() -> asio::awaitable<void> { st = co_await scorer.score_group(task(), g); }());
  }
  test::drain(io);
  return st;
}

TEST(HttpReward, PostsEachRolloutAndReadsRewardAndMetrics) {
  RewardServer srv;
  auto g = group();
  auto st = score({{"kind", "http"}, {"url", srv.url("/score")}}, g);
  ASSERT_TRUE(st) << st.error().what();
  EXPECT_EQ(g[0].reward, 1.0);
  EXPECT_EQ(g[1].reward, 0.0);
  EXPECT_EQ(g[0].metrics.at("chars"), 3.0);
  EXPECT_EQ(srv.calls.load(), 2);
}

TEST(HttpReward, GroupModePostsOnce) {
  RewardServer srv;
  auto g = group();
  auto st = score({{"kind", "http"}, {"url", srv.url("/group")}, {"group", true}}, g);
  ASSERT_TRUE(st) << st.error().what();
  EXPECT_EQ(g[0].reward, 0.0);
  EXPECT_EQ(g[1].reward, 1.0);
  EXPECT_EQ(srv.calls.load(), 1);
}

TEST(HttpReward, BadAnswersAndDeadServersFollowThePolicy) {
  RewardServer srv;
  auto g = group();
  auto st = score({{"kind", "http"}, {"url", srv.url("/broken")}}, g);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().what().find("reward"), std::string::npos);
  g = group();
  ASSERT_TRUE(
      score({{"kind", "http"}, {"url", "http://127.0.0.1:1/score"}, {"timeout_s", 2}}, g, FailurePolicy::kDrop));
  EXPECT_FALSE(g[0].reward);
  EXPECT_FALSE(g[1].reward);
}

}  // namespace
}  // namespace arlo::rollout
