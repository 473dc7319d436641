// http: a reward server that rollouts are posted to (rollout/reward_http.h).
#include "rollout/reward.h"
#include "rollout/reward_http.h"

namespace arlo::rollout {

namespace {
Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  HttpRewardOptions o;
  o.url = s.options["url"].get<std::string>();
  if (o.url.empty()) return make_error(ErrorCode::kInvalidArgument, "reward 'http': needs 'url'");
  o.timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s.options["timeout_s"].get<double>()));
  o.group = s.options["group"].get<bool>();
  return make_http_reward(s.name, std::move(o));
}
}  // namespace

RewardKind http_reward() {
  return {"http",
          "a reward server",
          {string_option("url", "", "URL the rollouts are posted to.").user_key().must_be_given(),
           float_option("timeout_s", 10.0, "deadline of one request"),
           bool_option("group", false, "post each group once (ranking rewards) instead of each rollout")},
          true,
          make};
}

}  // namespace arlo::rollout
