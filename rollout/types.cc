#include "rollout/types.h"

#include <algorithm>

namespace arlo::rollout {

Json to_json(const std::vector<VersionSpan>& spans) {
  Json out = Json::array();
  for (const auto& s : spans) out.push_back(Json::array({s.version, s.first_token}));
  return out;
}

Json to_json(const Task& task) {
  Json j = {{"id", task.id}, {"env", task.env}, {"answer", task.answer}, {"info", task.info}};
  if (task.prompt) {
    j["prompt"] = *task.prompt;
  } else {
    j["messages"] = to_json(task.messages);
  }
  if (!task.tools.is_null()) j["tools"] = task.tools;
  return j;
}

Result<Task> task_from_json(const Json& j) {
  if (!j.is_object()) return make_error(ErrorCode::kParse, "task: expected a JSON object");
  Task t;
  try {
    if (j.contains("id")) t.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
    if (j.contains("env")) t.env = j["env"].get<std::string>();
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) return make_error(ErrorCode::kParse, "task: 'prompt' must be a string");
      t.prompt = j["prompt"].get<std::string>();
    } else if (j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty())
        return make_error(ErrorCode::kParse, "task: 'messages' must be a non-empty array of {role, content}");
      for (std::size_t i = 0; i < j["messages"].size(); ++i) {
        const Json& given = j["messages"][i];
        auto m = chat_message_from_json(given);
        if (!m) return make_error(ErrorCode::kParse, fmt::format("task: messages[{}]: {}", i, m.error()));
        // A prompt's message says something: only an assistant's calls may stand without content.
        if (given.value("content", Json()).is_null() && m->tool_calls.is_null())
          return make_error(ErrorCode::kParse, fmt::format("task: messages[{}] needs a string 'content'", i));
        t.messages.push_back(std::move(*m));
      }
    } else {
      return make_error(ErrorCode::kParse, "task: needs 'prompt' (string) or 'messages' (array)");
    }
    if (j.contains("answer")) {
      const auto& a = j["answer"];
      t.answer = a.is_string() ? a.get<std::string>() : a.dump();
    }
    if (j.contains("info")) {
      if (!j["info"].is_object()) return make_error(ErrorCode::kParse, "task: 'info' must be a JSON object");
      t.info = j["info"];
    }
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse, std::string("task: ") + e.what());
  }
  return t;
}

Json to_json(const Rollout& r) {
  Json metrics = Json::object();
  for (const auto& [k, v] : r.metrics) metrics[k] = v;
  // "group_id" stays in the form reward servers read; samples carry no group name (always "").
  return {{"task_id", r.task_id},
          {"group_id", ""},
          {"sample_index", r.sample_index},
          {"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"completion_text", r.text},
          {"logprobs", r.logprobs},
          {"version_spans", to_json(r.version_spans)},
          {"finish_reason", std::string(to_string(r.finish_reason))},
          {"reward", r.reward ? Json(*r.reward) : Json(nullptr)},
          {"metrics", metrics}};
}

}  // namespace arlo::rollout
