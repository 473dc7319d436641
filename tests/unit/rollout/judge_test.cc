// The judge reward (rollout/rewards/judge.h): its parsers and templates directly; its retry loop
// against the fake inference server (testing/inference_server_fake.h: 500s, then an answer); the
// module against a real arlo-worker (a small random policy, greedy: the judge's reward must be what
// its parser makes of the worker's own answer to the same request), its cache counted by the worker's
// request counter, its concurrency cap seen in the worker's queue while the worker is paused, its
// deadlines, a server that is down, and the failure policy through RewardScorer.
#include <gtest/gtest.h>
#include <signal.h>

#include <boost/asio/io_context.hpp>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "config/config.h"
#include "rollout/reward_scorer.h"
#include "rollout/rewards/judge.h"
#include "testing/inference_server_fake.h"
#include "testing/process.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using judge::Parser;

Parser parser(Parser::Kind kind, std::string pattern = "", std::string field = "", double max_score = 0) {
  return Parser{kind, std::move(pattern), std::move(field), max_score};
}

double value(const Result<double>& r) {
  EXPECT_TRUE(r) << (r ? "" : r.error().what());
  return r ? *r : -1;
}

// The error's message, "" when there is none.
template <typename T>
std::string failure(const Result<T>& r) {
  return r ? std::string() : r.error().what();
}

TEST(JudgeParsers, NumberTakesTheFirstNumberAndScalesByMaxScore) {
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kNumber), "Score: 7/10")), 7);
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kNumber), "-2.5 points")), -2.5);
  EXPECT_DOUBLE_EQ(value(judge::parse_answer(parser(Parser::Kind::kNumber, "", "", 10), "7 of 10")), 0.7);
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kNumber, "", "", 10), "12")), 1.0);  // clamped
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kNumber, "", "", 10), "-3")), 0.0);
  auto none = judge::parse_answer(parser(Parser::Kind::kNumber), "no idea");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ErrorCode::kParse);
  EXPECT_NE(failure(none).find("'no idea'"), std::string::npos) << failure(none);
}

TEST(JudgeParsers, RegexReadsItsFirstCaptureAsANumber) {
  const Parser p = parser(Parser::Kind::kRegex, R"(\[\[(\d+(?:\.\d+)?)\]\])", "", 10);
  EXPECT_DOUBLE_EQ(value(judge::parse_answer(p, "3 ideas... Rating: [[8]] overall")), 0.8);
  EXPECT_NE(failure(judge::parse_answer(p, "Rating: 8")).find("does not match"), std::string::npos);
  const Parser words = parser(Parser::Kind::kRegex, "Rating: (\\w+)");
  EXPECT_NE(failure(judge::parse_answer(words, "Rating: good")).find("'good' is not a number"), std::string::npos);
}

TEST(JudgeParsers, JsonFollowsAFieldPathInTheAnswersObject) {
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kJson, "", "score"), R"({"score": 4})")), 4);
  const Parser deep = parser(Parser::Kind::kJson, "", "verdict.points.1");
  EXPECT_EQ(value(judge::parse_answer(deep, R"(Here: {"verdict": {"points": [1, "3"]}} done)")), 3);
  EXPECT_EQ(value(judge::parse_answer(parser(Parser::Kind::kJson, "", "ok"), R"({"ok": true})")), 1);
  EXPECT_NE(failure(judge::parse_answer(deep, R"({"verdict": {}})")).find("no field 'verdict.points.1'"),
            std::string::npos);
  EXPECT_NE(failure(judge::parse_answer(deep, "plain words")).find("no JSON object"), std::string::npos);
  EXPECT_NE(failure(judge::parse_answer(parser(Parser::Kind::kJson, "", "s"), R"({"s": "high"})")).find("not a number"),
            std::string::npos);
}

TEST(JudgeParsers, YesNoReadsTheFirstWordElseFails) {
  const Parser p = parser(Parser::Kind::kYesNo);
  EXPECT_EQ(value(judge::parse_answer(p, "Yes.")), 1);
  EXPECT_EQ(value(judge::parse_answer(p, "  no, because 2+2=4")), 0);
  for (const char* text : {"Maybe", "yesterday", "", "WWWW"}) {
    auto r = judge::parse_answer(p, text);
    ASSERT_FALSE(r) << text;
    EXPECT_EQ(r.error().code(), ErrorCode::kParse);
    EXPECT_NE(failure(r).find("neither yes nor no"), std::string::npos);
  }
}

TEST(JudgeTemplate, FillsPlaceholdersAndNamesWhatIsWrong) {
  auto t =
      judge::Template::parse("Q: {prompt} Ref: {answer} Topic: {info.topic} n={info.n} {{\"a\": 1}} A: {completion}");
  ASSERT_TRUE(t) << failure(t);
  Task task = test::task();
  task.info = {{"topic", "sums"}, {"n", 3}};
  EXPECT_EQ(*t->render(task, "68"), "Q: 23+45= Ref: 68 Topic: sums n=3 {\"a\": 1} A: 68");
  task.info = Json::object();
  EXPECT_NE(failure(t->render(task, "68")).find("no info field 'topic'"), std::string::npos);
  EXPECT_NE(failure(judge::Template::parse("{reponse} {completion}")).find("unknown placeholder {reponse}"),
            std::string::npos);
  EXPECT_NE(failure(judge::Template::parse("Is it right?")).find("{completion}"), std::string::npos);
  EXPECT_NE(failure(judge::Template::parse("{completion} {answer")).find("never closed"), std::string::npos);
  EXPECT_EQ(judge::check_template(Json("{prompt} -> {completion}")), "");
  EXPECT_NE(judge::check_template(Json("{foo} {completion}")).find("{foo}"), std::string::npos);
}

TEST(JudgeTemplate, EndpointUrlFromABaseUrl) {
  EXPECT_EQ(judge::endpoint_url("http://h:8000", true), "http://h:8000/v1/chat/completions");
  EXPECT_EQ(judge::endpoint_url("http://h:8000/v1/", false), "http://h:8000/v1/completions");
  EXPECT_EQ(judge::endpoint_url("http://h/api/v1/chat/completions", false), "http://h/api/v1/chat/completions");
}

Json spec(Json extra) {
  Json s = {{"kind", "judge"},
            {"url", "http://127.0.0.1:1"},
            {"model", "m"},
            {"template", "Is {completion} right? Answer yes or no."}};
  for (const auto& [k, v] : extra.items()) s[k] = v;
  return s;
}

TEST(JudgeConfig, RefusesWhatCannotWorkNamingIt) {
  ASSERT_TRUE(make_reward_module(spec(Json::object())));
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"model", ""}}, "needs 'model'"},
      {{{"template", "Rate {respone}"}}, "unknown placeholder {respone}"},
      {{{"endpoint", "responses"}}, "endpoint: 'responses' is not one of chat, completions"},
      {{{"parser", "score"}}, "parser: 'score' is not one of"},
      {{{"parser", "regex"}, {"pattern", "\\d+"}}, "no capture group"},
      {{{"parser", "regex"}}, "needs a 'pattern'"},
      {{{"parser", "json"}}, "needs a 'field'"},
      {{{"concurrency", 0}}, "concurrency: 0 is outside"},
      {{{"url", "https://api.example/v1"}}, "must start with http://"},
      {{{"api_key_env", "ARLO_JUDGE_TEST_UNSET_KEY"}}, "ARLO_JUDGE_TEST_UNSET_KEY, which is not set"},
      {{{"tempo", 1}}, "unknown option 'tempo'"},
  };
  for (const auto& [extra, expected] : cases) {
    auto m = make_reward_module(spec(extra));
    EXPECT_NE(failure(m).find(expected), std::string::npos) << extra.dump() << " -> " << failure(m);
  }
  // The config schema's form: url a key of the item, the rest in its config map.
  Json schema_form = {{"kind", "judge"},
                      {"url", "http://127.0.0.1:1/v1"},
                      {"path", ""},
                      {"pattern", ""},
                      {"config", {{"model", "m"}, {"template", "{completion}"}, {"parser", "yes_no"}}}};
  EXPECT_TRUE(make_reward_module(schema_form)) << failure(make_reward_module(schema_form));
}

// arlo check-config (the config loader's rules) checks the options in a judge item's config map as
// the judge itself does, naming each problem.
TEST(JudgeConfig, CheckConfigChecksTheConfigMap) {
  auto problems = [](const std::string& config) {
    auto r = config::load_string(
        "reward:\n  modules:\n    - {kind: judge, url: 'http://127.0.0.1:1', config: " + config + "}\n");
    return failure(r);
  };
  EXPECT_EQ(problems("{model: m, template: 'Is {completion} right?', parser: yes_no}"), "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{model: m, template: 'Rate {respone}'}",
       "reward.modules[0].config.template: judge template: unknown "
       "placeholder {respone}"},
      {"{model: m, template: '{completion}', parser: score}", "config.parser: 'score' is not one of number, regex"},
      {"{model: m, template: '{completion}', retries: -1}", "config.retries: -1 is outside [0, 100]"},
      {"{model: m, template: '{completion}', tempo: 1}", "reward.modules[0].config: unknown option 'tempo'"},
      {"{model: m, template: '{completion}', max_tokens: many}", "option 'max_tokens' has the wrong type"},
  };
  for (const auto& [config, expected] : cases)
    EXPECT_NE(problems(config).find(expected), std::string::npos) << config << " -> " << problems(config);
  auto numeric = config::load_string("reward:\n  modules:\n    - {kind: numeric_match, config: {rel_tol: x}}\n");
  EXPECT_NE(failure(numeric).find("option 'rel_tol' has the wrong type"), std::string::npos) << failure(numeric);
}

// ------------------------------------------------------------------ retries, on the fake server

// Runs call_with_retries against the fake on one io_context; `on_retry` may turn the fake's knobs.
Result<http::Response> call_fake(asio::io_context& io, testing::InferenceServerFake& fake, int retries,
                                 std::function<void(int, const std::string&)> on_retry = {}) {
  http::Client client(io);
  http::ClientRequest req;
  req.method = http::Verb::post;
  req.url = fake.url() + "/v1/completions";
  req.body = Json{{"model", "m"}, {"prompt", "judge this"}}.dump();
  std::optional<Result<http::Response>> out;
  test::run(io, [&]() -> asio::awaitable<void> {
    out = co_await judge::call_with_retries(client, req, {retries, 5s, 1ms}, on_retry);
  }());
  return out ? std::move(*out) : make_error(ErrorCode::kInternal, "did not finish");
}

TEST(JudgeRetries, FiveHundredsThenAnAnswer) {
  asio::io_context io;
  testing::InferenceServerFake fake(io);
  fake.fail_with_status = 500;
  std::vector<std::string> reasons;
  auto r = call_fake(io, fake, 3, [&](int attempt, const std::string& reason) {
    reasons.push_back(reason);
    if (attempt == 2) fake.fail_with_status = 0;  // the third attempt is answered
  });
  ASSERT_TRUE(r) << failure(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(fake.received, 3);
  EXPECT_EQ(fake.answered, 1);
  ASSERT_EQ(reasons.size(), 2u);
  EXPECT_NE(reasons[0].find("HTTP 500"), std::string::npos) << reasons[0];
}

TEST(JudgeRetries, ExhaustedRetriesAndClientErrorsEndWithTheReason) {
  asio::io_context io;
  testing::InferenceServerFake fake(io);
  fake.fail_with_status = 503;
  auto r = call_fake(io, fake, 2);
  ASSERT_FALSE(r);
  EXPECT_NE(failure(r).find("3 attempt(s), the last: HTTP 503"), std::string::npos) << failure(r);
  EXPECT_EQ(fake.received, 3);
  fake.fail_with_status = 400;  // not retried: the same request would be refused again
  r = call_fake(io, fake, 2);
  EXPECT_NE(failure(r).find("1 attempt(s), the last: HTTP 400"), std::string::npos) << failure(r);
  EXPECT_EQ(fake.received, 4);
}

// ------------------------------------------------------------------ the module

// Scores `texts` of test::task() through RewardScorer (policy assign, value 0.25).
std::vector<Rollout> score_assign(std::shared_ptr<RewardModule> module, std::initializer_list<const char*> texts) {
  asio::io_context io;
  auto g = test::group(texts);
  {
    RewardScorer scorer(io, std::move(module),
                        {.timeout = 30s, .on_failure = FailurePolicy::kAssign, .assign_value = 0.25, .threads = 2});
    test::run(io, [&]() -> asio::awaitable<void> { EXPECT_TRUE(co_await scorer.score_group(test::task(), g)); }());
  }
  test::drain(io);
  return g;
}

TEST(JudgeModule, AServerThatIsDownFailsUnderThePolicyAfterItsRetries) {
  std::uint16_t port = 0;
  {  // a port nothing listens on
    asio::io_context io;
    http::Server s(io, {});
    port = *s.start();
    s.close();
  }
  auto m = make_reward_module(
      spec({{"url", fmt::format("http://127.0.0.1:{}", port)}, {"retries", 1}, {"backoff_s", 0.001}}));
  ASSERT_TRUE(m);
  std::shared_ptr<RewardModule> module(std::move(*m));
  auto r = module->score(test::task(), test::group({"68"})[0]);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(failure(r).find("2 attempt(s)"), std::string::npos) << failure(r);
  EXPECT_NE(failure(r).find(fmt::format("127.0.0.1:{}/v1/chat/completions", port)), std::string::npos);
  auto g = score_assign(module, {"68", "67"});
  EXPECT_EQ(g[0].reward, 0.25);
  EXPECT_EQ(g[1].metrics["reward/failed"], 1.0);
}

TEST(JudgeModule, TheFakesAnswerThroughTheCompletionsEndpoint) {
  asio::io_context io;
  testing::InferenceServerFake fake(io);
  auto m = make_reward_module(spec(
      {{"url", fake.url()}, {"endpoint", "completions"}, {"parser", "number"}, {"template", "{answer} {completion}"}}));
  ASSERT_TRUE(m);
  std::shared_ptr<RewardModule> module(std::move(*m));
  std::thread server([&] { io.run_for(20s); });
  auto r = module->score(test::task(), test::group({"x"})[0]);  // the fake answers "echo:68 x"
  io.stop();
  server.join();
  ASSERT_TRUE(r) << failure(r);
  EXPECT_EQ(r->reward, 68);
  ASSERT_EQ(fake.bodies.size(), 1u);
  EXPECT_EQ(fake.bodies[0]["prompt"], "68 x");
  EXPECT_EQ(fake.bodies[0]["model"], "m");
  EXPECT_EQ(fake.bodies[0]["temperature"], 0.0);
}

// ------------------------------------------------------------------ against arlo-worker
#ifdef ARLO_WORKER_BINARY

// One HTTP call (no retries), blocking.
Result<http::Response> worker_call(http::Verb verb, const std::string& url, const Json& body = nullptr) {
  asio::io_context io;
  http::Client client(io);
  http::ClientRequest req;
  req.method = verb;
  req.url = url;
  if (!body.is_null()) req.body = body.dump();
  std::optional<Result<http::Response>> out;
  test::run(io, [&]() -> asio::awaitable<void> {
    out = co_await judge::call_with_retries(client, req, {0, 60s, 0s});
  }());
  return out ? std::move(*out) : make_error(ErrorCode::kInternal, "did not finish");
}

// One arlo-worker (seeded weights, greedy answers reproducible) for the suite.
class JudgeWorker : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    log_ = std::filesystem::temp_directory_path() / fmt::format("arlo_judge_worker_{}.log", ::getpid());
    pid_ = e2e::spawn_logged({ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--init-seed", "1"}, log_);
    ASSERT_TRUE(e2e::wait_for_text(log_, "listening on ", pid_, 60s)) << e2e::read_text(log_);
    const std::string text = e2e::read_text(log_);
    const auto at = text.find("listening on ") + std::string("listening on ").size();
    url_ = "http://" + text.substr(at, text.find('\n', at) - at);
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(log_);
  }

  // A counter or gauge of the worker's /metrics (0 before it exists).
  static double metric(const std::string& name) {
    auto r = worker_call(http::Verb::get, url_ + "/metrics");
    EXPECT_TRUE(r) << failure(r);
    if (!r) return -1;
    const std::string line = "\n" + name + " ";
    const auto at = ("\n" + r->body).find(line);
    return at == std::string::npos ? 0 : std::strtod(r->body.c_str() + at + line.size() - 1, nullptr);
  }
  static void admin(const std::string& path) {
    auto r = worker_call(http::Verb::post, url_ + path, Json::object());
    ASSERT_TRUE(r) << failure(r);
  }

  std::shared_ptr<RewardModule> module(Json extra) {
    Json s = spec(std::move(extra));
    s["url"] = url_;
    auto m = make_reward_module(s);
    EXPECT_TRUE(m) << failure(m);
    return m ? std::shared_ptr<RewardModule>(std::move(*m)) : nullptr;
  }

  static inline std::filesystem::path log_;
  static inline pid_t pid_ = -1;
  static inline std::string url_;
};

// The worker's own answer to the request the judge makes for `completion` (chat, greedy, 8 tokens).
std::string worker_answer(const std::string& url, const std::string& prompt) {
  Json body = {{"model", "m"},
               {"temperature", 0.0},
               {"max_tokens", 8},
               {"messages", Json::array({{{"role", "user"}, {"content", prompt}}})}};
  auto r = worker_call(http::Verb::post, url + "/v1/chat/completions", body);
  EXPECT_TRUE(r) << failure(r);
  return r ? r->parse_json().value()["choices"][0]["message"]["content"].get<std::string>() : "";
}

TEST_F(JudgeWorker, TheRewardIsWhatTheParserMakesOfTheWorkersAnswer) {
  for (const char* parser : {"number", "yes_no"}) {
    auto m = module({{"parser", parser}, {"max_tokens", 8}, {"cache_size", 0}});
    ASSERT_TRUE(m);
    const Rollout r = test::group({"69"})[0];
    const std::string answer = worker_answer(url_, "Is 69 right? Answer yes or no.");
    const Parser p = parser == std::string("number") ? judge::Parser{} : judge::Parser{Parser::Kind::kYesNo, "", "", 0};
    auto expected = judge::parse_answer(p, answer);
    auto got = m->score(test::task(), r);
    ASSERT_EQ(bool(got), bool(expected)) << parser << ": worker said '" << answer << "': " << failure(got);
    if (got) {
      EXPECT_EQ(got->reward, *expected);
    } else {
      EXPECT_NE(failure(got).find(expected.error().message()), std::string::npos) << failure(got);
    }
  }
}

TEST_F(JudgeWorker, AParseFailureTakesTheFailurePolicyWithTheReason) {
  const std::string answer = worker_answer(url_, "Is 68 right? Answer yes or no.");
  ASSERT_FALSE(judge::parse_answer(parser(Parser::Kind::kYesNo), answer))
      << "the seeded worker said '" << answer << "'";
  auto m = module({{"parser", "yes_no"}, {"max_tokens", 8}});
  auto r = m->score(test::task(), test::group({"68"})[0]);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kParse);
  EXPECT_NE(failure(r).find("judge 'judge'"), std::string::npos) << failure(r);
  EXPECT_NE(failure(r).find("neither yes nor no"), std::string::npos) << failure(r);
  auto g = score_assign(m, {"68", "68"});
  EXPECT_EQ(g[0].reward, 0.25);
  EXPECT_EQ(g[1].reward, 0.25);
  EXPECT_EQ(g[0].metrics["reward/failed"], 1.0);
}

TEST_F(JudgeWorker, TheCacheAnswersRepeatedRequestsWithoutCallingTheServer) {
  auto m = module({{"parser", "yes_no"}, {"max_tokens", 4}, {"cache_size", 2}});
  auto* judge = dynamic_cast<judge::JudgeReward*>(m.get());
  ASSERT_TRUE(judge);
  const double before = metric("arlo_worker_requests_chat");
  auto score = [&](const char* text) { return m->score(test::task(), test::group({text})[0]); };
  for (const char* text : {"a", "a", "b", "a", "c", "b", "a"}) (void)score(text);
  // a, a (hit), b, a (hit), c (evicts b), b (evicts a), a
  EXPECT_EQ(metric("arlo_worker_requests_chat") - before, 5);
  EXPECT_EQ(judge->stats().requests, 5u);
  EXPECT_EQ(judge->stats().cache_hits, 2u);
}

TEST_F(JudgeWorker, TheConcurrencyCapHoldsAcrossScorerThreads) {
  auto m = module({{"parser", "number"}, {"max_tokens", 2}, {"concurrency", 2}, {"timeout_s", 60}});
  auto* judge = dynamic_cast<judge::JudgeReward*>(m.get());
  ASSERT_TRUE(judge);
  const double before = metric("arlo_worker_requests_chat");
  admin("/pause?mode=keep");  // requests queue in the worker until /resume
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i)
    threads.emplace_back([&, i] { (void)m->score(test::task(), test::group({std::to_string(i).c_str()})[0]); });
  asio::io_context io;
  bool capped = false;
  test::run(io, [&]() -> asio::awaitable<void> {
    capped = co_await test::eventually(
        [&] { return judge->stats().waiting == 3 && metric("arlo_worker_engine_queued") >= 2; });
  }());
  EXPECT_TRUE(capped) << "waiting " << judge->stats().waiting << ", in flight " << judge->stats().in_flight;
  EXPECT_EQ(metric("arlo_worker_engine_queued"), 2);  // three calls wait in arlo, two in the worker
  EXPECT_EQ(judge->stats().in_flight, 2);
  admin("/resume");
  for (auto& t : threads) t.join();
  EXPECT_EQ(judge->stats().max_in_flight, 2);
  EXPECT_EQ(metric("arlo_worker_requests_chat") - before, 5);
}

TEST_F(JudgeWorker, EachAttemptHasItsDeadline) {
  auto m = module({{"timeout_s", 0.2}, {"retries", 1}, {"backoff_s", 0.001}});
  auto* judge = dynamic_cast<judge::JudgeReward*>(m.get());
  admin("/pause?mode=keep");
  auto r = m->score(test::task(), test::group({"68"})[0]);
  admin("/resume");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout) << failure(r);
  EXPECT_NE(failure(r).find("2 attempt(s)"), std::string::npos) << failure(r);
  EXPECT_EQ(judge->stats().attempts, 2u);
}

#endif  // ARLO_WORKER_BINARY

}  // namespace
}  // namespace arlo::rollout
