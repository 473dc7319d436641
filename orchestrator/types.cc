#include "orchestrator/types.h"

namespace arlo::orch {

nlohmann::json task_checkpoint_json(const Task& t) {
  nlohmann::json j = {{"id", t.id},
                      {"env", t.env},
                      {"answer", t.answer},
                      {"info", t.info},
                      {"prompt_tokens", t.prompt_tokens},
                      {"answer_tokens", t.answer_tokens}};
  if (t.prompt) {
    j["prompt"] = *t.prompt;
  } else {
    j["messages"] = to_json(t.messages);
  }
  if (!t.tools.is_null()) j["tools"] = t.tools;
  return j;
}

namespace {

// The task's id. Earlier versions wrote a sequence number and kept the environment's id in
// info["task_id"]; that id is the task's, and leaves `info` as the environment gave it.
std::string checkpoint_task_id(const nlohmann::json& id, nlohmann::json& info) {
  if (id.is_string()) return id.get<std::string>();
  const auto seq = id.get<std::uint64_t>();  // throws for anything but a string or a number
  const auto it = info.find("task_id");
  if (it == info.end() || !it->is_string()) return std::to_string(seq);
  auto env_id = it->get<std::string>();
  info.erase(it);
  return env_id;
}

}  // namespace

Task task_from_checkpoint_json(const nlohmann::json& j) {
  Task t;
  t.env = j.value("env", std::string());
  t.info = j.value("info", nlohmann::json::object());
  t.id = checkpoint_task_id(j.at("id"), t.info);
  // Earlier versions wrote the prompt as text beside a chat task's messages: messages win.
  for (const auto& m : j.value("messages", nlohmann::json::array())) {
    auto message = chat_message_from_json(m);
    if (!message) throw std::invalid_argument("task " + t.id + ": " + message.error());
    t.messages.push_back(std::move(*message));
  }
  t.tools = j.value("tools", nlohmann::json());
  if (t.messages.empty() && j.contains("prompt")) t.prompt = j.at("prompt").get<std::string>();
  t.prompt_tokens = j.value("prompt_tokens", std::vector<std::int32_t>{});
  t.answer = j.value("answer", std::string());
  t.answer_tokens = j.value("answer_tokens", std::vector<std::int32_t>{});
  return t;
}

}  // namespace arlo::orch
