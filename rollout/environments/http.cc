// http: tasks from a dataset file (env.path, as jsonl), trajectories run by an environment server
// (env.url) that speaks the protocol of rollout/multi_turn.h (docs/environments.md).
#include "rollout/environment.h"
#include "rollout/multi_turn.h"

namespace arlo::rollout {

EnvironmentKind http_environment() {
  return {
      "http",
      "a dataset file whose tasks an environment server at env.url runs, turn by turn",
      {string_option("url", "", "the environment server's base URL (http://host:port).").must_be_given().user_key()},
      true,
      [](const EnvironmentSpec& s) { return load_jsonl(s.path, "http", s.size); },
      nullptr,
      {},
      [](const EnvironmentSpec& s) { return make_http_environment({s.options["url"].get<std::string>()}); }};
}

}  // namespace arlo::rollout
