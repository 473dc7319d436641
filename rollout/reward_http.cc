#include "rollout/reward_http.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <fmt/format.h>

#include "common/http.h"

namespace arlo::rollout {
namespace {

namespace asio = boost::asio;

Result<Score> parse_score(const Json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("reward") || !j["reward"].is_number())
    return make_error(ErrorCode::kParse,
                      fmt::format("{}: expected {{\"reward\": <number>, \"metrics\": {{...}}}}", where));
  Score s;
  s.reward = j["reward"].get<double>();
  if (j.contains("metrics")) {
    if (!j["metrics"].is_object())
      return make_error(ErrorCode::kParse, fmt::format("{}: 'metrics' must be an object", where));
    for (const auto& [k, v] : j["metrics"].items()) {
      if (!v.is_number())
        return make_error(ErrorCode::kParse, fmt::format("{}: metric '{}' is not a number", where, k));
      s.metrics[k] = v.get<double>();
    }
  }
  return s;
}

class HttpReward : public RewardModule {
 public:
  HttpReward(std::string name, HttpRewardOptions o) : name_(std::move(name)), options_(std::move(o)) {}
  const std::string& name() const override { return name_; }
  bool scores_groups() const override { return options_.group; }

  Result<Score> score(const Task& task, const Rollout& r) override {
    ARLO_ASSIGN_OR_RETURN(Json body, post({{"task", to_json(task)}, {"rollout", to_json(r)}}));
    return parse_score(body, fmt::format("reward server {}", options_.url));
  }

  Result<std::vector<Score>> score_group(const Task& task, std::span<const Rollout> group) override {
    if (!options_.group) return RewardModule::score_group(task, group);
    Json rollouts = Json::array();
    for (const auto& r : group) rollouts.push_back(to_json(r));
    ARLO_ASSIGN_OR_RETURN(Json body, post({{"task", to_json(task)}, {"rollouts", rollouts}}));
    if (!body.is_object() || !body.contains("scores") || !body["scores"].is_array() ||
        body["scores"].size() != group.size())
      return make_error(
          ErrorCode::kParse,
          fmt::format("reward server {}: expected {{\"scores\": [...]}} with {} entries", options_.url, group.size()));
    std::vector<Score> out;
    for (std::size_t i = 0; i < group.size(); ++i) {
      ARLO_ASSIGN_OR_RETURN(
          Score s, parse_score(body["scores"][i], fmt::format("reward server {} scores[{}]", options_.url, i)));
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  // Blocking POST on the calling (scorer worker) thread.
  Result<Json> post(Json payload) {
    asio::io_context io;
    http::ClientOptions copts;
    copts.retry.max_attempts = 1;
    http::Client client(io, copts);
    std::optional<Result<http::Response>> result;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          result = co_await client.post_json(options_.url, std::move(payload), options_.timeout);
        },
        asio::detached);
    io.run();
    if (!result) return make_error(ErrorCode::kInternal, "http reward: request did not complete");
    if (!*result)
      return std::unexpected(std::move(*result).error().with_context(fmt::format("reward server {}", options_.url)));
    const http::Response& resp = **result;
    if (resp.status < 200 || resp.status >= 300)
      return make_error(ErrorCode::kUnavailable, fmt::format("reward server {} answered HTTP {}: {}", options_.url,
                                                             resp.status, resp.body.substr(0, 200)));
    return resp.parse_json();
  }

  std::string name_;
  HttpRewardOptions options_;
};

}  // namespace

Result<std::unique_ptr<RewardModule>> make_http_reward(std::string name, HttpRewardOptions options) {
  if (options.url.rfind("http://", 0) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reward 'http': url must start with http://, got '{}'", options.url));
  return std::unique_ptr<RewardModule>(std::make_unique<HttpReward>(std::move(name), std::move(options)));
}

}  // namespace arlo::rollout
