#pragma once
// judge: an LLM judge (reward.modules[].kind: judge, docs/reward-modules.md). Each rollout becomes a
// prompt (a template over the task's prompt, reference answer, info fields and the completion), sent
// to any OpenAI-compatible server (chat or completions endpoint); the reward is parsed from its answer
// (a number, a regex capture, a JSON field, yes/no).
//
// Calls are blocking on the scorer's worker thread (as the http kind's), at most `concurrency` at a
// time across the module; each attempt has its own deadline (timeout), and connection failures,
// timeouts, 429 and 5xx answers are retried `retries` times with doubling backoff. Answers are kept
// in an LRU cache keyed by the exact request (URL and body); a hit makes no call. A parse failure or
// a call that fails after its retries is an error: the scorer's failure policy applies, with it as
// the reason.
//
// The pieces are exposed for the tests: the parsers, the template and the retrying call.
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http.h"
#include "common/result.h"
#include "rollout/reward.h"

namespace arlo::rollout::judge {

// How the judge's answer becomes a reward.
struct Parser {
  enum class Kind { kNumber, kRegex, kJson, kYesNo };
  Kind kind = Kind::kNumber;
  std::string pattern;   // kRegex: ECMAScript, its first capture group is the number
  std::string field;     // kJson: a path of object keys and array indices, "score" or "verdict.points.0"
  double max_score = 0;  // kNumber, kRegex, kJson: > 0 scales the number by 1/max_score, clamped to [0, 1]
};

// The reward `text` (the judge's answer) gives under `parser`; a kParse error says why not and
// quotes the start of the text.
Result<double> parse_answer(const Parser& parser, std::string_view text);
// "number", "regex", "json", "yes_no".
Result<Parser::Kind> parse_parser_kind(std::string_view name);
// The first decimal number in `text` ("-3", "4.5", "1e3"), or nullopt.
std::optional<double> first_number(std::string_view text);

// A prompt template: literal text with {prompt}, {answer}, {completion} and {info.<field>}
// placeholders; "{{" and "}}" stand for literal braces.
class Template {
 public:
  // An unknown placeholder ("{reponse}"), an unclosed brace or a template without {completion} is
  // an error naming it.
  static Result<Template> parse(std::string_view text);
  // The prompt for one rollout; a task without an {info.<field>} it names is an error naming it.
  Result<std::string> render(const Task& task, std::string_view completion) const;

 private:
  struct Piece {
    bool placeholder = false;
    std::string text;  // literal text, or the placeholder's name ("completion", "info.topic")
  };
  std::vector<Piece> pieces_;
};
// The config's check of a template ("" when fine).
std::string check_template(const Json& value);

// One call's retry rule: `retries` more attempts after the first, each under its own `timeout`,
// waiting `backoff`, then twice that, ... (at most 8 s) in between.
struct RetryRule {
  int retries = 2;
  Duration timeout = std::chrono::seconds(10);
  Duration backoff = std::chrono::milliseconds(500);
};
// The request through `client`, retried under `rule` while it fails with a connection error, a
// timeout, 429 or 5xx. `on_retry(attempt, reason)` runs before each retry (attempt: 1, 2, ...).
// The result: a 2xx response, or an error naming the attempts made and the last reason.
boost::asio::awaitable<Result<http::Response>> call_with_retries(
    http::Client& client, http::ClientRequest request, RetryRule rule,
    std::function<void(int, const std::string&)> on_retry = {});

struct Options {
  std::string url;  // an OpenAI-compatible base URL (http://host:port[/v1]) or the endpoint's own URL
  std::string model;
  std::string api_key;  // sent as a bearer token when not empty
  bool chat = true;     // /v1/chat/completions (else /v1/completions)
  std::string template_text;
  double temperature = 0;
  int max_tokens = 64;
  Parser parser;
  int concurrency = 8;
  RetryRule retry;
  std::size_t cache_size = 4096;  // answers kept; 0: no cache
};

// What the module has done, for tests and metrics.
struct Stats {
  std::uint64_t requests = 0;    // calls that went to the server (a retried call counts once)
  std::uint64_t attempts = 0;    // attempts sent
  std::uint64_t cache_hits = 0;  // rollouts answered from the cache
  int in_flight = 0;             // calls running now
  int waiting = 0;               // calls waiting for a concurrency slot now
  int max_in_flight = 0;         // the most calls that ran at once
};

class JudgeReward : public NamedModule {
 public:
  using NamedModule::NamedModule;
  virtual Stats stats() const = 0;
};

// The endpoint's URL for `base` ("http://h:8000" -> "http://h:8000/v1/chat/completions").
std::string endpoint_url(std::string_view base, bool chat);

Result<std::unique_ptr<JudgeReward>> make_judge(std::string name, Options options);

}  // namespace arlo::rollout::judge
