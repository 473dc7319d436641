// Multi-turn environments (rollout/multi_turn.h): the built-in arithmetic_retry and calculator
// kinds, the protocol's reply parser on every bad input, the http client against a test double of an
// environment server (500, garbage, wrong types, invalid UTF-8, a server that never answers) and
// against examples/env_server/server.py run with the project's Python.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "common/http.h"
#include "rollout/environment.h"
#include "rollout/multi_turn.h"
#include "testing/process.h"
#include "tests/coro_test_util.h"

namespace arlo::rollout {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

EnvironmentSpec spec_of(Json options, std::size_t size = 20) {
  EnvironmentSpec s;
  s.seed = 5;
  s.size = size;
  s.options = std::move(options);
  return s;
}

std::shared_ptr<const TaskSet> tasks_of(std::string_view kind, Json options) {
  auto tasks = make_task_source(kind, spec_of(std::move(options)));
  EXPECT_TRUE(tasks) << tasks.error().what();
  return *tasks;
}

std::shared_ptr<LocalEnvironment> local_env(std::string_view kind, Json options) {
  auto env = make_multi_turn_environment(kind, spec_of(std::move(options)));
  EXPECT_TRUE(env) << env.error().what();
  auto local = std::dynamic_pointer_cast<LocalEnvironment>(*env);
  EXPECT_NE(local, nullptr);
  return local;
}

std::vector<ChatMessage> with_turn(std::vector<ChatMessage> turns, std::string text) {
  turns.push_back({"assistant", std::move(text)});
  return turns;
}

TEST(MultiTurnKinds, OnlyMultiTurnKindsMakeAnEnvironment) {
  auto single = make_multi_turn_environment("arithmetic", spec_of(Json::object()));
  ASSERT_TRUE(single);
  EXPECT_EQ(*single, nullptr);
  for (const char* kind : {"arithmetic_retry", "calculator"}) {
    auto env = make_multi_turn_environment(kind, spec_of(Json::object()));
    ASSERT_TRUE(env) << kind;
    EXPECT_NE(*env, nullptr) << kind;
  }
  auto no_url = make_multi_turn_environment("http", spec_of(Json::object()));
  ASSERT_FALSE(no_url);
  EXPECT_EQ(no_url.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(no_url.error().message().find("env.url"), std::string::npos) << no_url.error().message();
  EXPECT_FALSE(make_multi_turn_environment("http", spec_of({{"url", "ftp://x"}})));
  EXPECT_TRUE(make_multi_turn_environment("http", spec_of({{"url", "http://127.0.0.1:1"}})));
}

TEST(ArithmeticRetry, TasksAreSeededSumsOfItsOwn) {
  auto a = tasks_of("arithmetic_retry", {{"max_operand", 49}});
  auto b = tasks_of("arithmetic_retry", {{"max_operand", 49}});
  ASSERT_EQ(a->size(), 20u);
  for (std::size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ(a->at(i), b->at(i));
    EXPECT_EQ(a->at(i).env, "arithmetic_retry");
    EXPECT_EQ(a->at(i).id, "arithmetic_retry-" + std::to_string(i));
    const auto& terms = a->at(i).info["terms"];
    EXPECT_EQ(std::to_string(terms[0].get<int>() + terms[1].get<int>()), a->at(i).answer);
  }
}

TEST(ArithmeticRetry, WrongAnswersGetFeedbackThenTheDiscountedReward) {
  auto env = local_env("arithmetic_retry", {{"max_tries", 3}, {"retry_discount", 0.5}});
  Task task = tasks_of("arithmetic_retry", Json::object())->at(0);
  auto start = env->reset_now(task);
  ASSERT_TRUE(start);
  EXPECT_TRUE(start->messages.empty());
  EXPECT_FALSE(start->done);

  auto first = env->step_now(task, start->state, with_turn({}, "0"));
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->done);
  EXPECT_FALSE(first->reward);
  ASSERT_EQ(first->messages.size(), 1u);
  EXPECT_EQ(first->messages[0].content, "\nwrong, try again\n" + *task.prompt);

  auto second = env->step_now(task, first->state, with_turn({}, " " + task.answer + " "));
  ASSERT_TRUE(second);
  EXPECT_TRUE(second->done);
  EXPECT_EQ(second->reward, 0.5);  // solved at the second try: 0.5^1
  EXPECT_EQ(second->state["tries"], 2);
}

TEST(ArithmeticRetry, EveryTryWrongEndsWithRewardZero) {
  auto env = local_env("arithmetic_retry", {{"max_tries", 2}});
  Task task = tasks_of("arithmetic_retry", Json::object())->at(3);
  Json state = env->reset_now(task)->state;
  auto t1 = env->step_now(task, state, with_turn({}, "x"));
  ASSERT_TRUE(t1);
  auto t2 = env->step_now(task, t1->state, with_turn({}, "x"));
  ASSERT_TRUE(t2);
  EXPECT_TRUE(t2->done);
  EXPECT_EQ(t2->reward, 0.0);
}

TEST(ArithmeticRetry, RefusesABadStateOrNoModelTurn) {
  auto env = local_env("arithmetic_retry", Json::object());
  Task task = tasks_of("arithmetic_retry", Json::object())->at(0);
  for (const Json& bad : {Json(nullptr), Json{{"tries", "1"}}, Json{{"tries", -1}}}) {
    auto r = env->step_now(task, bad, with_turn({}, "1"));
    ASSERT_FALSE(r) << bad.dump();
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  }
  auto no_turn = env->step_now(task, {{"tries", 0}}, {{"user", "hi"}});
  ASSERT_FALSE(no_turn);
  EXPECT_NE(no_turn.error().message().find("assistant"), std::string::npos);
}

TEST(Calculator, TheAnswerIsTheCallOrTheSum) {
  auto calls = tasks_of("calculator", Json::object());
  const Task& t = calls->at(0);
  EXPECT_EQ(t.env, "calculator");
  EXPECT_EQ(t.info["terms"].size(), 4u);
  EXPECT_EQ(t.answer, "calc(" + t.prompt->substr(0, t.prompt->size() - 1) + ")");
  auto sums = tasks_of("calculator", {{"calc_answer", "sum"}});
  EXPECT_EQ(sums->at(0).answer, std::to_string(sums->at(0).info["sum"].get<long long>()));
  EXPECT_FALSE(make_task_source("calculator", spec_of({{"calc_answer", "both"}})));
}

TEST(Calculator, ACallGetsTheResultThenTheAnswerIsScored) {
  auto env = local_env("calculator", Json::object());
  Task task = tasks_of("calculator", Json::object())->at(1);
  const std::string sum = std::to_string(task.info["sum"].get<long long>());
  Json state = env->reset_now(task)->state;
  auto call = env->step_now(task, state, with_turn({}, task.answer));
  ASSERT_TRUE(call) << call.error().what();
  EXPECT_FALSE(call->done);
  ASSERT_EQ(call->messages.size(), 1u);
  EXPECT_EQ(call->messages[0].role, "tool");
  EXPECT_EQ(call->messages[0].content, "=" + sum + "\n" + *task.prompt);
  EXPECT_EQ(call->state["calls"], 1);

  auto right = env->step_now(task, call->state, with_turn({}, sum));
  ASSERT_TRUE(right);
  EXPECT_TRUE(right->done);
  EXPECT_EQ(right->reward, 1.0);
  EXPECT_EQ(right->state["calls"], 1);
  auto wrong = env->step_now(task, call->state, with_turn({}, sum + "1"));
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->reward, 0.0);
  // One call more than env.max_calls ends the trajectory unpaid.
  auto again = env->step_now(task, call->state, with_turn({}, task.answer));
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->done);
  EXPECT_EQ(again->reward, 0.0);
}

TEST(Calculator, EvaluatesPlusAndMinusAndAnswersMalformedCallsWithError) {
  auto env = local_env("calculator", {{"max_calls", 10}});
  Task task = tasks_of("calculator", Json::object())->at(0);
  const std::vector<std::pair<std::string, std::string>> cases = {{"calc(1+2)", "=3\n"},
                                                                  {"calc( 10 - 3 + 5 )", "=12\n"},
                                                                  {"calc(12+)", "=error\n"},
                                                                  {"calc(1*2)", "=error\n"},
                                                                  {"calc(1+2", "=error\n"},
                                                                  {"calc()", "=error\n"},
                                                                  {"calc(1234567890123)", "=error\n"}};
  for (const auto& [call, want] : cases) {
    auto r = env->step_now(task, {{"calls", 0}}, with_turn({}, call));
    ASSERT_TRUE(r) << call;
    ASSERT_EQ(r->messages.size(), 1u) << call;
    EXPECT_EQ(r->messages[0].content, want + *task.prompt) << call;
  }
}

// parse_env_reply: every malformed reply is a kParse error naming what is wrong.
TEST(EnvReply, ParsesAWellFormedReply) {
  auto r = parse_env_reply(
      std::string_view(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null}],)"
                       R"("done":true,"reward":0.25,"state":{"k":[1]}})"),
      EnvCall::kStep);
  ASSERT_TRUE(r) << r.error().what();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0], (ChatMessage{"user", "hi"}));
  EXPECT_EQ(r->messages[1].content, "");
  EXPECT_TRUE(r->done);
  EXPECT_EQ(r->reward, 0.25);
  EXPECT_EQ(r->state, (Json{{"k", {1}}}));
  auto reset = parse_env_reply(std::string_view(R"({"state": 3})"), EnvCall::kReset);
  ASSERT_TRUE(reset);
  EXPECT_TRUE(reset->messages.empty());
  EXPECT_FALSE(reset->done);
  EXPECT_FALSE(reset->reward);
}

TEST(EnvReply, NamesTheFieldOfEachMalformedReply) {
  const std::vector<std::tuple<std::string, EnvCall, std::string>> cases = {
      {"", EnvCall::kStep, "not JSON"},
      {"{\"done\": tru", EnvCall::kStep, "not JSON"},
      {"[1]", EnvCall::kStep, "expected a JSON object"},
      {R"({"messages": {}, "done": false})", EnvCall::kStep, "'messages' must be an array"},
      {R"({"messages": [3], "done": false})", EnvCall::kStep, "messages[0]: a message must be an object"},
      {R"({"messages": [{"content": "x"}], "done": false})", EnvCall::kStep, "messages[0]: role must be a string"},
      {R"({"messages": [{"role": "user", "content": 1}], "done": false})", EnvCall::kStep,
       "messages[0]: content must be"},
      {R"({"messages": []})", EnvCall::kStep, "'done' (true or false) is missing"},
      {R"({"done": "yes"})", EnvCall::kStep, "'done' must be true or false"},
      {R"({"done": false, "reward": "1"})", EnvCall::kStep, "'reward' must be a finite number"},
      {R"({"done": false, "reward": 1e400})", EnvCall::kStep, "not JSON"},  // out of a double's range
      {R"({"done": true})", EnvCall::kReset, "'done' must be false"},
      {R"({"reward": 1})", EnvCall::kReset, "'reward' is not allowed"},
      {"{\"done\": false, \"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", EnvCall::kStep,
       "not valid UTF-8 (byte 58 of 63)"},
      {"{\"done\": false, \"state\": \"\xed\xa0\x80\"}", EnvCall::kStep, "not valid UTF-8"},
  };
  for (const auto& [body, call, want] : cases) {
    auto r = parse_env_reply(std::string_view(body), call);
    ASSERT_FALSE(r) << body;
    EXPECT_EQ(r.error().code(), ErrorCode::kParse) << body;
    EXPECT_NE(r.error().message().find(want), std::string::npos) << body << " -> " << r.error().message();
    EXPECT_NE(r.error().message().find(to_string(call)), std::string::npos) << r.error().message();
  }
}

TEST(EnvReply, RequestBodiesCarryTheTaskStateAndTurns) {
  Task task;
  task.id = "t-1";
  task.env = "http";
  task.prompt = "2+2=";
  EXPECT_EQ(env_request_json(task)["task"]["id"], "t-1");
  Json step = env_request_json(task, {{"n", 1}}, {{"user", "a"}, {"assistant", "4"}});
  EXPECT_EQ(step["state"], (Json{{"n", 1}}));
  EXPECT_EQ(step["turns"],
            (Json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "4"}}})));
  EXPECT_EQ(step["task"]["prompt"], "2+2=");
}

// A test double of an environment server: each route answers `reply` (status, body), or holds the
// request until `release` is set when `hold`.
struct EnvServerDouble {
  explicit EnvServerDouble(asio::io_context& io) : server(io, {}), release(io) {
    for (const char* path : {"/env/reset", "/env/step"}) {
      server.route(http::Verb::post, path, [this](http::Request req) -> asio::awaitable<http::Response> {
        requests.push_back(req);
        if (hold) co_await release.wait();
        http::Response r;
        r.status = status;
        r.body = body;
        co_return r;
      });
    }
    port = *server.start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/env/"; }

  http::Server server;
  test::Event release;
  std::uint16_t port = 0;
  int status = 200;
  std::string body;
  bool hold = false;
  std::vector<http::Request> requests;
};

Task http_task() { return *task_from_json({{"id", "guess-1"}, {"env", "http"}, {"prompt", "guess:"}}); }

// `r` failed with `code`.
void expect_failed(const Result<EnvTurn>& r, ErrorCode code) {
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), code) << r.error().what();
}

TEST(HttpEnvironment, PostsResetAndStepAndParsesTheReplies) {
  asio::io_context io;
  EnvServerDouble fake(io);
  auto env = *make_http_environment({fake.url()});
  const Task task = http_task();
  test::run(io, [&]() -> asio::awaitable<void> {
    fake.body = R"({"messages": [{"role": "user", "content": "pick"}], "state": {"s": 1}})";
    auto r = co_await env->reset(task, SteadyClock::now() + 10s);
    EXPECT_TRUE(r);
    EXPECT_EQ(r->messages.at(0).content, "pick");
    fake.body = R"({"messages": [], "done": true, "reward": 1, "state": {"s": 2}})";
    std::vector<ChatMessage> turns = {{"assistant", "7"}};
    auto s = co_await env->step(task, r->state, turns, SteadyClock::now() + 10s);
    EXPECT_TRUE(s);
    EXPECT_TRUE(s->done);
    EXPECT_EQ(s->reward, 1.0);
    co_await fake.server.stop();
  }());
  ASSERT_EQ(fake.requests.size(), 2u);
  EXPECT_EQ(fake.requests[0].path, "/env/reset");
  EXPECT_EQ(Json::parse(fake.requests[0].body)["task"]["id"], "guess-1");
  const Json step = Json::parse(fake.requests[1].body);
  EXPECT_EQ(fake.requests[1].path, "/env/step");
  EXPECT_EQ(step["state"], (Json{{"s", 1}}));
  EXPECT_EQ(step["turns"][0]["content"], "7");
}

TEST(HttpEnvironment, EachBadAnswerIsAClearError) {
  asio::io_context io;
  EnvServerDouble fake(io);
  auto env = *make_http_environment({fake.url()});
  const Task task = http_task();
  struct Case {
    int status;
    std::string body;
    ErrorCode code;
    std::string want;
  };
  const std::vector<Case> cases = {
      {500, "{\"error\": \"boom\"}", ErrorCode::kUnavailable, "answered HTTP 500: {\"error\": \"boom\"}"},
      {404, "", ErrorCode::kUnavailable, "answered HTTP 404"},
      {200, "<html>hello</html>", ErrorCode::kParse, "not JSON: '<html>hello</html>'"},
      {200, R"({"done": 1})", ErrorCode::kParse, "'done' must be true or false"},
      {200, R"({"done": false, "messages": [{"role": "user", "content": ["x"]}]})", ErrorCode::kParse,
       "messages[0]: content must be a string"},
      {200, "{\"done\": false, \"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}", ErrorCode::kParse,
       "not valid UTF-8"},
  };
  test::run(io, [&]() -> asio::awaitable<void> {
    for (const auto& c : cases) {
      fake.status = c.status;
      fake.body = c.body;
      std::vector<ChatMessage> turns = {{"assistant", "7"}};
      auto r = co_await env->step(task, Json::object(), turns, SteadyClock::now() + 10s);
      EXPECT_FALSE(r) << c.body;
      if (r) continue;
      EXPECT_EQ(r.error().code(), c.code) << r.error().what();
      EXPECT_NE(r.error().what().find(c.want), std::string::npos) << r.error().what();
      EXPECT_NE(r.error().what().find(fake.url() + "step"), std::string::npos) << r.error().what();
    }
    co_await fake.server.stop();
  }());
  EXPECT_EQ(fake.requests.size(), cases.size());  // one attempt each: a step is never retried
}

TEST(HttpEnvironment, AServerThatNeverAnswersTimesOutAtTheDeadline) {
  asio::io_context io;
  EnvServerDouble fake(io);
  fake.hold = true;
  auto env = *make_http_environment({fake.url()});
  const Task task = http_task();
  test::run(io, [&]() -> asio::awaitable<void> {
    expect_failed(co_await env->reset(task, SteadyClock::now() + 200ms), ErrorCode::kTimeout);
    // A deadline already past fails before anything is sent.
    const std::size_t sent = fake.requests.size();
    expect_failed(co_await env->reset(task, SteadyClock::now() - 1s), ErrorCode::kTimeout);
    EXPECT_EQ(fake.requests.size(), sent);
    fake.release.set();
    co_await fake.server.stop();
  }());
}

TEST(HttpEnvironment, AServerThatIsNotThereIsUnavailable) {
  asio::io_context io;
  const int port = e2e::free_loopback_port();
  auto env = *make_http_environment({"http://127.0.0.1:" + std::to_string(port)});
  const Task task = http_task();
  test::run(io, [&]() -> asio::awaitable<void> {
    expect_failed(co_await env->reset(task, SteadyClock::now() + 5s), ErrorCode::kUnavailable);
  }());
}

// The Python example (examples/env_server/server.py) played to the end by bisection.
// Starts an example server (examples/env_server/) under the project's Python: its port, "" when it
// did not start; `pid` is the process to kill.
std::string start_example(const std::string& script, const char* dir_name, pid_t& pid) {
  const auto log = e2e::fresh_temp_dir(dir_name) / "server.log";
  pid = e2e::spawn_logged({ARLO_PYTHON_BINARY, script, "--port", "0"}, log);
  if (pid <= 0 || !e2e::wait_for_text(log, "listening on port ", pid, std::chrono::seconds(60))) return "";
  const std::string text = e2e::read_text(log);
  return text.substr(text.find("port ") + 5, text.find('\n') - text.find("port ") - 5);
}

TEST(PythonEnvServer, GuessTheNumberThroughTheClient) {
  pid_t pid = 0;
  const std::string port = start_example(ARLO_ENV_SERVER, "arlo_env_server_test", pid);
  ASSERT_FALSE(port.empty()) << "examples/env_server/server.py did not start";
  auto env = *make_http_environment({"http://127.0.0.1:" + port});
  Task task = http_task();
  task.info = {{"secret", 37}};
  asio::io_context io;
  int guesses = 0;
  std::optional<double> reward;
  std::vector<std::string> hints;
  test::run(io, [&]() -> asio::awaitable<void> {
    auto start = co_await env->reset(task, SteadyClock::now() + 30s);
    EXPECT_TRUE(start) << (start ? "" : start.error().what());
    if (!start) co_return;
    std::vector<ChatMessage> turns = start->messages;
    Json state = start->state;
    int lo = 1, hi = 100;
    for (bool done = false; !done && guesses < 10; ++guesses) {
      const int guess = (lo + hi) / 2;
      turns.push_back({"assistant", std::to_string(guess)});
      auto r = co_await env->step(task, state, turns, SteadyClock::now() + 30s);
      EXPECT_TRUE(r) << (r ? "" : r.error().what());
      if (!r) co_return;
      done = r->done;
      reward = r->reward;
      state = r->state;
      for (const auto& m : r->messages) {
        turns.push_back(m);
        hints.push_back(m.content);
        (m.content.find("higher") != std::string::npos ? lo : hi) =
            m.content.find("higher") != std::string::npos ? guess + 1 : guess - 1;
      }
    }
  }());
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  // 50 lower, 25 higher, 37: found at the third guess.
  EXPECT_EQ(guesses, 3);
  EXPECT_EQ(hints, (std::vector<std::string>{"\nlower\nguess: ", "\nhigher\nguess: "}));
  ASSERT_TRUE(reward);
  EXPECT_DOUBLE_EQ(*reward, 0.8);
}

// Tool calls (docs/environments.md, "Tool calls"): reset's "tools" are checked and kept, and the
// example tool server answers the turn's OpenAI tool_calls with tool messages.
TEST(EnvReply, ResetMayGiveToolsStepMayNot) {
  auto reset = parse_env_reply(R"({"tools": [{"type": "function", "function": {"name": "add"}}]})", EnvCall::kReset);
  ASSERT_TRUE(reset) << reset.error().what();
  EXPECT_EQ(reset->tools[0]["function"]["name"], "add");
  auto bad = parse_env_reply(R"({"tools": [{"type": "function"}]})", EnvCall::kReset);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("tools[0]"), std::string::npos);
  auto step = parse_env_reply(R"({"done": false, "tools": []})", EnvCall::kStep);
  ASSERT_FALSE(step);
  EXPECT_NE(step.error().what().find("'tools' is only for reset"), std::string::npos);
}

TEST(PythonEnvServer, TheToolServerAnswersToolCalls) {
  const std::string server = ARLO_ENV_SERVER;
  pid_t pid = 0;
  const std::string port =
      start_example(server.substr(0, server.rfind('/')) + "/tool_server.py", "arlo_tool_server_test", pid);
  ASSERT_FALSE(port.empty()) << "examples/env_server/tool_server.py did not start";
  auto env = *make_http_environment({"http://127.0.0.1:" + port});
  Task task = *task_from_json(
      {{"id", "sum-1"}, {"env", "http"}, {"messages", {{{"role", "user"}, {"content", "2+3?"}}}}, {"answer", "5"}});
  asio::io_context io;
  test::run(io, [&]() -> asio::awaitable<void> {
    auto start = co_await env->reset(task, SteadyClock::now() + 30s);
    EXPECT_TRUE(start) << (start ? "" : start.error().what());
    if (!start) co_return;
    EXPECT_EQ(start->tools[0]["function"]["name"], "add");
    ChatMessage call{"assistant", ""};
    call.tool_calls = Json::parse(
        R"([{"id": "call_0", "type": "function", "function": {"name": "add", "arguments": "{\"terms\": [2, 3]}"}}])");
    std::vector<ChatMessage> turns{call};
    auto r = co_await env->step(task, start->state, turns, SteadyClock::now() + 30s);
    EXPECT_TRUE(r) << (r ? "" : r.error().what());
    if (!r) co_return;
    EXPECT_FALSE(r->done);
    EXPECT_EQ(r->messages.size(), 1u);
    if (r->messages.empty()) co_return;
    EXPECT_EQ(r->messages[0].role, "tool");
    EXPECT_EQ(r->messages[0].tool_call_id, "call_0");
    EXPECT_EQ(r->messages[0].content, "5.0");
    turns.insert(turns.end(), r->messages.begin(), r->messages.end());
    turns.push_back({"assistant", "5"});
    auto end = co_await env->step(task, r->state, turns, SteadyClock::now() + 30s);
    EXPECT_TRUE(end && end->done && end->reward == 1.0);
  }());
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace arlo::rollout
