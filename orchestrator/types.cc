#include "orchestrator/types.h"

namespace arlo::orch {

nlohmann::json to_json(const Task& t) {
  return {{"id", t.id},     {"env", t.env},         {"prompt", t.prompt}, {"messages", t.messages}, {"prompt_tokens", t.prompt_tokens},
          {"answer", t.answer}, {"answer_tokens", t.answer_tokens}, {"info", t.info}};
}

// Throws nlohmann::json::exception on malformed input; callers convert at their edge.
Task task_from_json(const nlohmann::json& j) {
  Task t;
  t.id = j.at("id").get<std::uint64_t>();
  t.env = j.value("env", std::string("default"));
  t.prompt = j.value("prompt", std::string());
  t.messages = j.value("messages", nlohmann::json::array());
  t.prompt_tokens = j.value("prompt_tokens", std::vector<std::int32_t>{});
  t.answer = j.value("answer", std::string());
  t.answer_tokens = j.value("answer_tokens", std::vector<std::int32_t>{});
  t.info = j.value("info", nlohmann::json::object());
  return t;
}

}  // namespace arlo::orch
