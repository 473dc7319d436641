// verifiers: tasks from a dataset file (env.path, as jsonl) that a verifiers environment runs through
// verifiers' own environment server (docs/environments.md, "verifiers environments"). The server
// calls the model through the policy gateway, which records each call into the task's trajectory;
// the episode's reward closes it (session/verifiers_env.h starts the server and speaks to it).
#include "rollout/environment.h"

namespace arlo::rollout {

namespace {

std::pair<std::string, std::string> check_verifiers(const Json& o) {
  const bool external = o.value("verifiers_launch", std::string("embedded")) == "external";
  if (external && o.value("verifiers_address", std::string()).empty())
    return {"verifiers_address", "is required when verifiers_launch is external (tcp://host:port)"};
  if (o.contains("verifiers_args") && !o["verifiers_args"].is_object())
    return {"verifiers_args", "must be a map (verifiers' environment config: taskset arguments, agent, ...)"};
  return {};
}

}  // namespace

EnvironmentKind verifiers_environment() {
  return {
      "verifiers",
      "a dataset file whose tasks a verifiers environment runs through verifiers' environment server",
      {string_option("verifiers_env", "",
                     "the environment (its taskset id: an installed package or a module on "
                     "env.verifiers_python_path).")
           .must_be_given()
           .user_key(),
       any_option("verifiers_args",
                  "the rest of verifiers' environment config, merged under it (e.g. {taskset: "
                  "{num_tasks: 4}, agent: {max_turns: 4}}); the agent's runtime is subprocess unless given.")
           .user_key(Json::object()),
       string_option("verifiers_launch", "embedded",
                     "embedded (arlo starts the server with the project's Python, supervised) or "
                     "external (env.verifiers_address).")
           .one_of({"embedded", "external"})
           .user_key(),
       string_option("verifiers_address", "",
                     "the server's ZeroMQ address (tcp://host:port); external: required; "
                     "embedded: empty picks a free loopback port.")
           .user_key(),
       int_option("verifiers_concurrency", 0, "episodes the embedded server runs at once (0: no bound of its own).")
           .range(0, 1 << 20)
           .user_key(),
       float_option("verifiers_start_timeout_s", 120.0,
                    "how long the server may take to answer its first health request.")
           .range(1, 3600)
           .user_key(),
       string_option("verifiers_python_path", "",
                     "a directory the embedded server puts first on sys.path (environments that "
                     "are modules, not installed packages).")
           .user_key()
           .is_path()},
      true,
      [](const EnvironmentSpec& s) { return load_jsonl(s.path, "verifiers", s.size); },
      check_verifiers,
      "env.verifiers_address is given when env.verifiers_launch is external.",
      nullptr,
      true,  // the environment server calls the model through the policy gateway
  };
}

}  // namespace arlo::rollout
