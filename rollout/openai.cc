#include "rollout/openai.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "rollout/tool_calls.h"

namespace arlo::rollout {

std::string endpoint_path(const CompletionRequest& r) {
  return r.is_chat() ? "/v1/chat/completions" : "/v1/completions";
}

Json to_openai_body(const CompletionRequest& r) {
  Json b = Json::object();
  if (!r.model.empty()) b["model"] = r.model;
  if (r.is_chat()) {
    b["messages"] = to_json(r.messages);
    if (r.sampling.logprobs) b["logprobs"] = true;
    if (r.tools.is_array() && !r.tools.empty()) {
      b["tools"] = r.tools;
      if (!r.tool_choice.is_null()) b["tool_choice"] = r.tool_choice;
    }
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
  // The API's seed is a signed 64-bit integer: vLLM (pydantic, le 2^63 - 1) refuses a larger one
  // with HTTP 400, so the top bit of arlo's 64-bit request seeds is dropped on the wire.
  if (s.seed) b["seed"] = static_cast<std::int64_t>(*s.seed & 0x7fffffffffffffffull);
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
    if (!x.is_number_integer())
      return make_error(ErrorCode::kParse, fmt::format("{}: token id is not an integer", where));
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
    } else if (s.is_object() && s.contains("version") && s.contains("first_token") &&
               s["version"].is_number_integer() && s["first_token"].is_number_integer()) {
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

// SGLang's per-choice meta_info (return_meta_info): output_token_logprobs = [[logprob, token_id,
// text], ...] carries the generated ids where an older chat server has no "token_ids".
Status parse_meta_info(const Json& ch, const std::string& where, std::vector<std::int32_t>& ids,
                       std::vector<float>& logprobs) {
  if (!ch.contains("meta_info") || !ch["meta_info"].is_object()) return ok();
  const Json& meta = ch["meta_info"];
  if (!meta.contains("output_token_logprobs") || !meta["output_token_logprobs"].is_array()) return ok();
  for (const auto& e : meta["output_token_logprobs"]) {
    if (!e.is_array() || e.size() < 2 || !e[0].is_number() || !e[1].is_number_integer())
      return make_error(ErrorCode::kParse,
                        where + ".meta_info.output_token_logprobs: each entry must be [logprob, token_id, ...]");
    logprobs.push_back(e[0].get<float>());
    ids.push_back(e[1].get<std::int32_t>());
  }
  return ok();
}

// SGLang's label of the weights that answered (non-streaming responses: "metadata": {"weight_version":
// "7"}, the string arlo sent with the update); nullopt when absent or not a number ("default": a
// server never updated).
std::optional<std::int64_t> metadata_version(const Json& body) {
  if (!body.contains("metadata") || !body["metadata"].is_object()) return std::nullopt;
  const Json& label = body["metadata"].value("weight_version", Json());
  if (label.is_number_integer()) return label.get<std::int64_t>();
  if (!label.is_string()) return std::nullopt;
  const auto& text = label.get_ref<const std::string&>();
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

// What turns on the token data check_token_data() found missing, per server.
std::string enable_hint(AdminDialect server, bool chat, bool logprobs_missing) {
  switch (server) {
    case AdminDialect::kVllm:
      if (logprobs_missing)
        return fmt::format(
            "arlo asks with \"logprobs\": {}; vLLM returns them unless something between drops them "
            "(start vLLM with --logprobs-mode processed_logprobs so they are the sampler's: after "
            "temperature and top-p)",
            chat ? "true" : "0");
      return "arlo asks with \"return_token_ids\": true, which vLLM answers from version 0.10.2 on: upgrade the server";
    case AdminDialect::kSglang:
      if (logprobs_missing)
        return fmt::format(
            "arlo asks with \"logprobs\": {}; SGLang returns them unless something between drops them "
            "(leave SGLANG_RETURN_ORIGINAL_LOGPROB unset so they are the sampler's: after temperature)",
            chat ? "true" : "0");
      return chat ? "arlo asks with \"return_token_ids\", \"return_prompt_token_ids\" and \"return_meta_info\": "
                    "true; an SGLang that answers none of them is too old: upgrade the server"
                  : "arlo asks with \"return_token_ids\": true; an SGLang whose /v1/completions ignores it is too "
                    "old: upgrade the server";
    case AdminDialect::kArlo: break;
  }
  return "arlo-worker always returns it: is this server an arlo-worker (inference.kind arlo)? Otherwise set "
         "inference.kind to vllm or sglang";
}

}  // namespace

Json token_data_request(AdminDialect server, bool chat) {
  // SGLang's chat: return_token_ids on recent versions; before that the prompt ids came with
  // return_prompt_token_ids and the generated ids inside return_meta_info.
  if (server == AdminDialect::kSglang && chat) return {{"return_prompt_token_ids", true}, {"return_meta_info", true}};
  return Json::object();
}

Status check_token_data(const Completion& c, bool chat, bool logprobs, AdminDialect server) {
  const std::string who = fmt::format("{}{} (inference.kind {})", c.worker,
                                      chat ? "/v1/chat/completions" : "/v1/completions", to_string(server));
  for (std::size_t i = 0; i < c.choices.size(); ++i) {
    const auto& ch = c.choices[i];
    if (ch.token_ids.empty() && ch.finish_reason != FinishReason::kAbort)
      return make_error(ErrorCode::kMismatch,
                        fmt::format("{}: the response carries no generated token ids (choices[{}].token_ids{}): the "
                                    "trainer needs the server's own ids; {}",
                                    who, i, server == AdminDialect::kSglang && chat ? " or choices[].meta_info" : "",
                                    enable_hint(server, chat, false)));
    if (logprobs && ch.logprobs.size() != ch.token_ids.size())
      return make_error(ErrorCode::kMismatch,
                        fmt::format("{}: the response carries {} logprobs for {} tokens (choices[{}].{}): the trainer "
                                    "needs the sampler's logprob of every token; {}",
                                    who, ch.logprobs.size(), ch.token_ids.size(), i,
                                    chat ? "logprobs.content[].logprob" : "logprobs.token_logprobs",
                                    enable_hint(server, chat, true)));
  }
  if (c.prompt_token_ids.empty()) {
    const char* field = server == AdminDialect::kVllm && chat ? "prompt_token_ids"
                        : server == AdminDialect::kArlo       ? "prompt_token_ids"
                                                              : "choices[].prompt_token_ids";
    return make_error(
        ErrorCode::kMismatch,
        fmt::format("{}: the response carries no prompt token ids ({}): the trainer needs the prompt "
                    "as the server tokenized it{}; {}",
                    who, field, chat ? " (with its chat template)" : "", enable_hint(server, chat, false)));
  }
  return ok();
}

// A chat choice's message: its content, and its tool_calls (a server's tool parser, e.g. vLLM's
// `hermes`, takes the calls out of the content). The text keeps the calls in the documented syntax
// (rollout/tool_calls.h) after the content, so that what the model wrote stays in the turn's text.
static Status parse_chat_message(const Json& message, const std::string& where, CompletionChoice& out) {
  const auto& content = message.value("content", Json());
  out.text = content.is_string() ? content.get<std::string>() : "";
  if (!message.contains("tool_calls") || message["tool_calls"].is_null()) return ok();
  auto parsed = chat_message_from_json(Json{{"role", "assistant"}, {"tool_calls", message["tool_calls"]}});
  if (!parsed) return make_error(ErrorCode::kParse, fmt::format("{}.message: {}", where, parsed.error()));
  if (parsed->tool_calls.is_array() && !parsed->tool_calls.empty()) {
    out.tool_calls = std::move(parsed->tool_calls);
    if (out.text.find(kToolCallOpen) == std::string::npos)
      out.text += (out.text.empty() ? "" : "\n") + render_tool_calls(out.tool_calls);
  }
  return ok();
}

Result<Completion> parse_openai_response(const Json& body, bool chat) {
  if (!body.is_object()) return make_error(ErrorCode::kParse, "completion response: expected a JSON object");
  if (body.contains("error")) {
    const auto& e = body["error"];
    std::string msg =
        e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : e.dump();
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
  if (body.contains("version") && body["version"].is_number_integer())
    response_version = body["version"].get<std::int64_t>();
  else
    response_version = metadata_version(body);

  for (std::size_t i = 0; i < body["choices"].size(); ++i) {
    const Json& ch = body["choices"][i];
    const std::string where = fmt::format("choices[{}]", i);
    if (!ch.is_object()) return make_error(ErrorCode::kParse, where + ": expected an object");
    CompletionChoice out;
    out.index = ch.contains("index") && ch["index"].is_number_integer() ? ch["index"].get<int>() : static_cast<int>(i);
    if (chat) {
      if (!ch.contains("message") || !ch["message"].is_object())
        return make_error(ErrorCode::kParse, where + ": missing 'message'");
      ARLO_TRY(parse_chat_message(ch["message"], where, out));
    } else {
      if (!ch.contains("text") || !ch["text"].is_string())
        return make_error(ErrorCode::kParse, where + ": missing 'text'");
      out.text = ch["text"].get<std::string>();
    }
    if (ch.contains("token_ids") && !ch["token_ids"].is_null()) {
      ARLO_ASSIGN_OR_RETURN(out.token_ids, parse_ids(ch["token_ids"], where + ".token_ids"));
    }
    std::vector<float> meta_logprobs;  // SGLang's meta_info, when the choice has no token_ids
    if (!ch.contains("token_ids") || ch["token_ids"].is_null()) {
      ARLO_TRY(parse_meta_info(ch, where, out.token_ids, meta_logprobs));
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
          if (!x.is_number())
            return make_error(ErrorCode::kParse, where + ".logprobs.token_logprobs: non-numeric entry");
          out.logprobs.push_back(x.get<float>());
        }
      }
    }
    if (out.logprobs.empty()) out.logprobs = std::move(meta_logprobs);
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
      return make_error(ErrorCode::kParse,
                        fmt::format("{}: {} logprobs for {} tokens", where, out.logprobs.size(), out.token_ids.size()));
    c.choices.push_back(std::move(out));
  }
  std::sort(c.choices.begin(), c.choices.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  return c;
}

}  // namespace arlo::rollout
