#include "apps/arlo-worker/openai_api.h"

#include <fmt/format.h>

#include "rollout/tool_calls.h"

namespace arlo::worker {
namespace {

using nlohmann::json;
using reference::Tokenizer;

std::unexpected<ApiError> bad(std::string message, std::optional<std::string> param = std::nullopt) {
  return std::unexpected(ApiError{400, std::move(message), std::move(param)});
}

// Reads an optional number field; absent or null keeps `out`.
template <typename T>
std::optional<ApiError> read_number(const json& body, const char* key, T& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return ApiError{400, fmt::format("'{}' must be an integer", key), key};
  } else {
    if (!it->is_number()) return ApiError{400, fmt::format("'{}' must be a number", key), key};
  }
  out = it->get<T>();
  return std::nullopt;
}

std::optional<ApiError> read_token_ids(const json& j, std::vector<std::int32_t>& out, int vocab) {
  for (const auto& x : j) {
    if (!x.is_number_integer()) return ApiError{400, "token-id prompts must hold integers only", "prompt"};
    auto v = x.get<std::int64_t>();
    if (v < 0 || v >= vocab)
      return ApiError{400, fmt::format("token id {} is outside the vocabulary [0, {})", v, vocab), "prompt"};
    out.push_back(static_cast<std::int32_t>(v));
  }
  return std::nullopt;
}

std::vector<int> byte_list(const std::string& s) {
  std::vector<int> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// An assistant message's "tool_calls" rendered after its content in the documented syntax
// (rollout/tool_calls.h: one <tool_call>{"name", "arguments"}</tool_call> block per call).
std::optional<ApiError> append_tool_calls(const json& m, std::string& content) {
  if (!m.contains("tool_calls") || m["tool_calls"].is_null()) return std::nullopt;
  auto parsed = arlo::chat_message_from_json(m);
  if (!parsed) return bad(parsed.error(), "messages").error();
  const std::string calls = arlo::rollout::render_tool_calls(parsed->tool_calls);
  if (!calls.empty()) content += (content.empty() ? "" : "\n") + calls;
  return std::nullopt;
}

// A chat request's "tools" (checked: each names a function) and "tool_choice" ("none": no parsing).
std::optional<ApiError> read_tools(const json& body, json& tools) {
  if (!body.contains("tools") || body["tools"].is_null()) return std::nullopt;
  if (auto names = arlo::rollout::tool_names(body["tools"]); !names)
    return bad(names.error().message(), "tools").error();
  if (body.contains("tool_choice") && !body["tool_choice"].is_null() && !body["tool_choice"].is_string() &&
      !body["tool_choice"].is_object())
    return bad("tool_choice must be a string or an object", "tool_choice").error();
  if (body.value("tool_choice", json()) != "none") tools = body["tools"];
  return std::nullopt;
}

// A chat choice's message: with tools, its well-formed <tool_call> blocks become tool_calls.
json chat_message(const CompletionJob& job, const std::string& text) {
  json message = {{"role", "assistant"}, {"content", text}};
  if (!job.tools.is_array() || job.tools.empty()) return message;
  auto parsed = arlo::rollout::parse_tool_calls(text, job.tools);
  if (!parsed || parsed->tool_calls.is_null()) return message;
  message["content"] = parsed->content.empty() ? json() : json(parsed->content);
  message["tool_calls"] = std::move(parsed->tool_calls);
  return message;
}

// A chat request's prompt: its 'messages' (string content, or a list of text parts) through the
// chat template.
std::expected<std::vector<std::int32_t>, ApiError> chat_prompt(const json& body, const Tokenizer& tok) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return bad("'messages' must be a non-empty array", "messages");
  std::vector<Tokenizer::Message> messages;
  for (const auto& m : *it) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad("each message needs a string 'role'", "messages");
    Tokenizer::Message msg{m["role"].get<std::string>(), ""};
    // The template knows system, user and assistant: a tool's result (an environment's message in a
    // multi-turn trajectory) is rendered as a user turn holding its content.
    if (msg.role == "tool") msg.role = "user";
    const json content = m.value("content", json());

    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (const auto& part : content) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return bad("message content parts must be {\"type\": \"text\", \"text\": ...}", "messages");
        msg.content += part["text"].get<std::string>();
      }
    } else if (!content.is_null()) {
      return bad("message content must be a string or a list of text parts", "messages");
    }
    if (auto e = append_tool_calls(m, msg.content)) return std::unexpected(*e);
    messages.push_back(std::move(msg));
  }
  auto ids = tok.apply_chat_template(messages);
  if (!ids) return bad("message roles must be system, user, assistant or tool", "messages");
  return std::move(*ids);
}

// A completion request's prompts, appended to `out`: 'prompt' is a string, a list of token ids, or
// a list of those (one prompt each). 'echo' and 'suffix' are refused.
std::optional<ApiError> completion_prompts(const json& body, const Tokenizer& tok,
                                           std::vector<std::vector<std::int32_t>>& out) {
  const int vocab = tok.vocab_size();
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return ApiError{400, "'prompt' is required", "prompt"};
  const json& p = *it;
  const ApiError malformed{400, "'prompt' must be a string, a list of token ids, or a list of those", "prompt"};
  if (p.is_string()) {
    out.push_back(tok.encode_prompt(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    std::vector<std::int32_t> ids;
    if (auto e = read_token_ids(p, ids, vocab)) return e;
    out.push_back(std::move(ids));
  } else if (p.is_array() && !p.empty()) {
    for (const auto& one : p) {
      if (one.is_string()) {
        out.push_back(tok.encode_prompt(one.get<std::string>()));
      } else if (one.is_array() && !one.empty()) {
        std::vector<std::int32_t> ids;
        if (auto e = read_token_ids(one, ids, vocab)) return e;
        out.push_back(std::move(ids));
      } else {
        return malformed;
      }
    }
  } else {
    return malformed;
  }
  if (body.contains("echo") && body["echo"] == true)
    return ApiError{400, "'echo' is not supported by arlo-worker", "echo"};
  if (body.contains("suffix") && !body["suffix"].is_null())
    return ApiError{400, "'suffix' is not supported by arlo-worker", "suffix"};
  return std::nullopt;
}

// The sampling numbers: max_tokens (max_completion_tokens too for chat; by default 16, or for chat
// what the context leaves after the longest prompt), temperature, top_p, n (best_of only equal to
// n), seed. Each is range-checked, naming the field.
std::optional<ApiError> read_sampling_numbers(const json& body, bool chat, int room, CompletionJob& job) {
  auto& s = job.params;
  s.max_tokens = chat ? room : 16;
  if (auto e = read_number(body, "max_tokens", s.max_tokens)) return e;
  if (chat)
    if (auto e = read_number(body, "max_completion_tokens", s.max_tokens)) return e;
  if (s.max_tokens < 1)
    return ApiError{400, fmt::format("'max_tokens' must be >= 1, got {}", s.max_tokens), "max_tokens"};
  if (auto e = read_number(body, "temperature", s.temperature)) return e;
  if (s.temperature < 0 || s.temperature > 2)
    return ApiError{400, fmt::format("'temperature' must be in [0, 2], got {}", s.temperature), "temperature"};
  if (auto e = read_number(body, "top_p", s.top_p)) return e;
  if (!(s.top_p > 0 && s.top_p <= 1))
    return ApiError{400, fmt::format("'top_p' must be in (0, 1], got {}", s.top_p), "top_p"};
  if (auto e = read_number(body, "n", job.n)) return e;
  if (job.n < 1 || job.n > 128) return ApiError{400, fmt::format("'n' must be in [1, 128], got {}", job.n), "n"};
  if (!chat && body.contains("best_of") && !body["best_of"].is_null()) {
    int best_of = 1;
    if (auto e = read_number(body, "best_of", best_of)) return e;
    if (best_of != job.n) return ApiError{400, "'best_of' other than n is not supported by arlo-worker", "best_of"};
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return ApiError{400, "'seed' must be an integer", "seed"};
    s.seed = static_cast<std::uint64_t>(body["seed"].get<std::int64_t>());
  }
  return std::nullopt;
}

// 'stop': a string or a list of non-empty strings, appended to `stop`.
std::optional<ApiError> read_stop(const json& body, std::vector<std::string>& stop) {
  if (!body.contains("stop") || body["stop"].is_null()) return std::nullopt;
  const ApiError malformed{400, "'stop' must be a string or a list of strings", "stop"};
  const json& st = body["stop"];
  if (st.is_string()) {
    stop.push_back(st.get<std::string>());
  } else if (st.is_array()) {
    for (const auto& x : st) {
      if (!x.is_string()) return malformed;
      stop.push_back(x.get<std::string>());
    }
  } else {
    return malformed;
  }
  for (const auto& x : stop)
    if (x.empty()) return ApiError{400, "'stop' strings must not be empty", "stop"};
  return std::nullopt;
}

// Logprobs: chat's 'logprobs' (boolean) and 'top_logprobs' (0-20, only with logprobs), or a
// completion's 'logprobs' (the number of top alternatives, 0-5).
std::optional<ApiError> read_logprobs(const json& body, bool chat, CompletionJob& job) {
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      if (!body["logprobs"].is_boolean()) return ApiError{400, "'logprobs' must be a boolean", "logprobs"};
      job.logprobs = body["logprobs"].get<bool>();
    }
    if (auto e = read_number(body, "top_logprobs", job.top_logprobs)) return e;
    if (job.top_logprobs < 0 || job.top_logprobs > 20)
      return ApiError{400, "'top_logprobs' must be in [0, 20]", "top_logprobs"};
    if (job.top_logprobs > 0 && !job.logprobs)
      return ApiError{400, "'top_logprobs' needs 'logprobs': true", "top_logprobs"};
  } else if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    int k = 0;
    if (auto e = read_number(body, "logprobs", k)) return e;
    if (k < 0 || k > 5) return ApiError{400, fmt::format("'logprobs' must be in [0, 5], got {}", k), "logprobs"};
    job.logprobs = true;
    job.top_logprobs = k;
  }
  return std::nullopt;
}

}  // namespace

arlo::SamplingParams CompletionJob::choice_params(int k) const {
  arlo::SamplingParams p = params;
  if (p.seed) p.seed = *p.seed + static_cast<std::uint64_t>(k);
  return p;
}

std::expected<CompletionJob, ApiError> parse_completion_request(const json& body, bool chat, const Tokenizer& tok,
                                                                int context) {
  if (!body.is_object()) return bad("the request body must be a JSON object");
  CompletionJob job;
  job.chat = chat;
  if (body.contains("stream") && body["stream"] == true)
    return bad("streaming is not supported by arlo-worker", "stream");
  if (chat) {
    auto ids = chat_prompt(body, tok);
    if (!ids) return std::unexpected(ids.error());
    job.prompts.push_back(std::move(*ids));
    if (auto e = read_tools(body, job.tools)) return std::unexpected(*e);
  } else if (auto e = completion_prompts(body, tok, job.prompts)) {
    return std::unexpected(*e);
  }
  std::size_t longest = 0;
  for (const auto& p : job.prompts) longest = std::max(longest, p.size());
  if (static_cast<int>(longest) >= context)
    return bad(fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens, which leaves "
                           "no room to generate",
                           context, longest),
               chat ? "messages" : "prompt");
  if (auto e = read_sampling_numbers(body, chat, context - static_cast<int>(longest), job)) return std::unexpected(*e);
  if (auto e = read_stop(body, job.params.stop)) return std::unexpected(*e);
  if (body.contains("ignore_eos") && body["ignore_eos"].is_boolean())
    job.params.ignore_eos = body["ignore_eos"].get<bool>();
  if (auto e = read_logprobs(body, chat, job)) return std::unexpected(*e);
  job.params.top_logprobs = job.top_logprobs;
  return job;
}

json completion_response(const CompletionJob& job, const std::vector<reference::Generation>& gens,
                         const std::string& model, const Tokenizer& tok, const std::string& id, std::int64_t created) {
  json choices = json::array();
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : job.prompts) prompt_tokens += static_cast<std::int64_t>(p.size());
  for (std::size_t k = 0; k < gens.size(); ++k) {
    const auto& g = gens[k];
    completion_tokens += static_cast<std::int64_t>(g.tokens.size());
    json spans = json::array();
    for (const auto& s : g.version_spans) spans.push_back({s.version, s.first_token});
    json c = {{"index", k}, {"finish_reason", std::string(arlo::to_string(g.finish))}};
    if (job.chat) {
      c["message"] = chat_message(job, g.text);
      if (c["message"].contains("tool_calls") && g.finish == FinishReason::kStop) c["finish_reason"] = "tool_calls";
    } else {
      c["text"] = g.text;
    }
    json lp = nullptr;
    if (job.logprobs) {
      if (job.chat) {
        json content = json::array();
        for (std::size_t t = 0; t < g.tokens.size(); ++t) {
          const std::string piece = tok.piece(g.tokens[t], true);
          json top = json::array();
          if (t < g.top_logprobs.size())
            for (const auto& [tid, tlp] : g.top_logprobs[t]) {
              const std::string tp = tok.piece(tid, true);
              top.push_back({{"token", tp}, {"logprob", tlp}, {"bytes", byte_list(tp)}});
            }
          content.push_back(
              {{"token", piece}, {"logprob", g.logprobs[t]}, {"bytes", byte_list(piece)}, {"top_logprobs", top}});
        }
        lp = {{"content", content}, {"refusal", nullptr}};
      } else {
        json tokens = json::array(), token_logprobs = json::array(), offsets = json::array();
        json top = job.top_logprobs > 0 ? json::array() : json(nullptr);
        std::size_t offset = 0;
        for (std::size_t t = 0; t < g.tokens.size(); ++t) {
          tokens.push_back(tok.piece(g.tokens[t], true));
          token_logprobs.push_back(g.logprobs[t]);
          offsets.push_back(std::min(offset, g.text.size()));
          offset += tok.piece(g.tokens[t]).size();
          if (job.top_logprobs > 0) {
            json alt = json::object();
            if (t < g.top_logprobs.size())
              for (const auto& [tid, tlp] : g.top_logprobs[t]) alt[tok.piece(tid, true)] = tlp;
            top.push_back(alt);
          }
        }
        lp = {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
      }
    }
    c["logprobs"] = lp;
    c["token_ids"] = g.tokens;
    c["prompt_token_ids"] = g.prompt;
    c["version_spans"] = spans;
    c["stop_reason"] = g.matched_stop ? json(*g.matched_stop) : json(nullptr);
    choices.push_back(std::move(c));
  }
  json out = {
      {"id", id},
      {"object", job.chat ? "chat.completion" : "text_completion"},
      {"created", created},
      {"model", model},
      {"system_fingerprint", nullptr},
      {"choices", choices},
      {"usage",
       {{"prompt_tokens", prompt_tokens},
        {"completion_tokens", completion_tokens},
        {"total_tokens", prompt_tokens + completion_tokens}}},
  };
  if (job.prompts.size() == 1) out["prompt_token_ids"] = job.prompts[0];
  return out;
}

std::expected<json, ApiError> tokenize_request(const json& body, const Tokenizer& tok, int context) {
  if (!body.is_object()) return bad("the request body must be a JSON object");
  auto flag = [&](const char* key, bool fallback) -> std::expected<bool, ApiError> {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return bad(fmt::format("'{}' must be a boolean", key), key);
    return it->get<bool>();
  };
  std::vector<std::int32_t> ids;
  if (body.contains("messages")) {
    auto generation_prompt = flag("add_generation_prompt", true);
    if (!generation_prompt) return std::unexpected(generation_prompt.error());
    auto rendered = chat_prompt(body, tok);
    if (!rendered) return std::unexpected(rendered.error());
    ids = std::move(*rendered);
    if (!*generation_prompt) ids.pop_back();  // the template's closing <|assistant|>
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) return bad("'prompt' (a string) or 'messages' is required", "prompt");
    auto special = flag("add_special_tokens", true);
    if (!special) return std::unexpected(special.error());
    ids = *special ? tok.encode_prompt(it->get<std::string>()) : tok.encode(it->get<std::string>());
  }
  return json{{"count", ids.size()}, {"max_model_len", context}, {"tokens", ids}};
}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param ? json(*e.param) : json(nullptr)},
            {"code", nullptr}}}};
}

}  // namespace arlo::worker
