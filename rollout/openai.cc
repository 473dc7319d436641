#include "rollout/openai.h"

#include <algorithm>

#include <fmt/format.h>

namespace arlo::rollout {

std::string endpoint_path(const CompletionRequest& r) { return r.is_chat() ? "/v1/chat/completions" : "/v1/completions"; }

Json to_openai_body(const CompletionRequest& r) {
  Json b = Json::object();
  if (!r.model.empty()) b["model"] = r.model;
  if (r.is_chat()) {
    Json msgs = Json::array();
    for (const auto& m : r.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    b["messages"] = std::move(msgs);
    if (r.sampling.logprobs) b["logprobs"] = true;
  } else {
    if (!r.prompt_token_ids.empty())
      b["prompt"] = r.prompt_token_ids;
    else
      b["prompt"] = r.prompt.value_or("");
    if (r.sampling.logprobs) b["logprobs"] = 0;  // chosen-token logprob only
  }
  const auto& s = r.sampling;
  b["temperature"] = s.temperature;
  b["top_p"] = s.top_p;
  b["max_tokens"] = s.max_tokens;
  b["n"] = s.n;
  if (s.seed) b["seed"] = *s.seed;
  if (!s.stop.empty()) b["stop"] = s.stop;
  b["return_token_ids"] = true;
  for (const auto& [k, v] : r.extra.items()) b[k] = v;
  return b;
}

namespace {

Result<std::vector<std::int32_t>> parse_ids(const Json& j, const std::string& where) {
  if (!j.is_array()) return make_error(ErrorCode::kParse, fmt::format("{}: expected an array of token ids", where));
  std::vector<std::int32_t> out;
  out.reserve(j.size());
  for (const auto& x : j) {
    if (!x.is_number_integer()) return make_error(ErrorCode::kParse, fmt::format("{}: token id is not an integer", where));
    out.push_back(x.get<std::int32_t>());
  }
  return out;
}

Result<std::vector<VersionSpan>> parse_spans(const Json& j, const std::string& where) {
  if (!j.is_array()) return make_error(ErrorCode::kParse, fmt::format("{}: expected an array", where));
  std::vector<VersionSpan> out;
  for (const auto& s : j) {
    VersionSpan v;
    if (s.is_array() && s.size() == 2 && s[0].is_number_integer() && s[1].is_number_integer()) {
      v = {s[0].get<std::int64_t>(), s[1].get<std::int64_t>()};
    } else if (s.is_object() && s.contains("version") && s.contains("first_token") && s["version"].is_number_integer() &&
               s["first_token"].is_number_integer()) {
      v = {s["version"].get<std::int64_t>(), s["first_token"].get<std::int64_t>()};
    } else {
      return make_error(ErrorCode::kParse, fmt::format("{}: each span must be [version, first_token]", where));
    }
    if (!out.empty() && v.first_token < out.back().first_token)
      return make_error(ErrorCode::kParse, fmt::format("{}: spans must be sorted by first_token", where));
    out.push_back(v);
  }
  return out;
}

}  // namespace

Result<Completion> parse_openai_response(const Json& body, bool chat) {
  if (!body.is_object()) return make_error(ErrorCode::kParse, "completion response: expected a JSON object");
  if (body.contains("error")) {
    const auto& e = body["error"];
    std::string msg = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : e.dump();
    return make_error(ErrorCode::kUnavailable, fmt::format("server error: {}", msg));
  }
  if (!body.contains("choices") || !body["choices"].is_array())
    return make_error(ErrorCode::kParse, "completion response: missing 'choices' array");
  Completion c;
  if (body.contains("id") && body["id"].is_string()) c.id = body["id"].get<std::string>();
  if (body.contains("model") && body["model"].is_string()) c.model = body["model"].get<std::string>();
  if (body.contains("prompt_token_ids") && !body["prompt_token_ids"].is_null()) {
    ARLO_ASSIGN_OR_RETURN(c.prompt_token_ids, parse_ids(body["prompt_token_ids"], "prompt_token_ids"));
  }
  std::optional<std::int64_t> response_version;
  if (body.contains("version") && body["version"].is_number_integer()) response_version = body["version"].get<std::int64_t>();

  for (std::size_t i = 0; i < body["choices"].size(); ++i) {
    const Json& ch = body["choices"][i];
    const std::string where = fmt::format("choices[{}]", i);
    if (!ch.is_object()) return make_error(ErrorCode::kParse, where + ": expected an object");
    CompletionChoice out;
    out.index = ch.contains("index") && ch["index"].is_number_integer() ? ch["index"].get<int>() : static_cast<int>(i);
    if (chat) {
      if (!ch.contains("message") || !ch["message"].is_object())
        return make_error(ErrorCode::kParse, where + ": missing 'message'");
      const auto& content = ch["message"].value("content", Json());
      out.text = content.is_string() ? content.get<std::string>() : "";
    } else {
      if (!ch.contains("text") || !ch["text"].is_string()) return make_error(ErrorCode::kParse, where + ": missing 'text'");
      out.text = ch["text"].get<std::string>();
    }
    if (ch.contains("token_ids") && !ch["token_ids"].is_null()) {
      ARLO_ASSIGN_OR_RETURN(out.token_ids, parse_ids(ch["token_ids"], where + ".token_ids"));
    }
    if (c.prompt_token_ids.empty() && ch.contains("prompt_token_ids") && !ch["prompt_token_ids"].is_null()) {
      ARLO_ASSIGN_OR_RETURN(c.prompt_token_ids, parse_ids(ch["prompt_token_ids"], where + ".prompt_token_ids"));
    }
    if (ch.contains("logprobs") && ch["logprobs"].is_object()) {
      const Json& lp = ch["logprobs"];
      if (chat) {
        if (lp.contains("content") && lp["content"].is_array())
          for (const auto& t : lp["content"]) {
            if (!t.is_object() || !t.contains("logprob") || !t["logprob"].is_number())
              return make_error(ErrorCode::kParse, where + ".logprobs.content: entry without numeric 'logprob'");
            out.logprobs.push_back(t["logprob"].get<float>());
          }
      } else if (lp.contains("token_logprobs") && lp["token_logprobs"].is_array()) {
        for (const auto& x : lp["token_logprobs"]) {
          if (!x.is_number()) return make_error(ErrorCode::kParse, where + ".logprobs.token_logprobs: non-numeric entry");
          out.logprobs.push_back(x.get<float>());
        }
      }
    }
    if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
      out.finish_reason = parse_finish_reason(ch["finish_reason"].get<std::string>());
    if (ch.contains("version_spans") && !ch["version_spans"].is_null()) {
      ARLO_ASSIGN_OR_RETURN(out.version_spans, parse_spans(ch["version_spans"], where + ".version_spans"));
    } else if (ch.contains("version") && ch["version"].is_number_integer()) {
      out.version_spans = {{ch["version"].get<std::int64_t>(), 0}};
    } else if (response_version) {
      out.version_spans = {{*response_version, 0}};
    }
    if (!out.logprobs.empty() && !out.token_ids.empty() && out.logprobs.size() != out.token_ids.size())
      return make_error(ErrorCode::kParse, fmt::format("{}: {} logprobs for {} tokens", where, out.logprobs.size(), out.token_ids.size()));
    c.choices.push_back(std::move(out));
  }
  std::sort(c.choices.begin(), c.choices.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  return c;
}

}  // namespace arlo::rollout
