// Rollouts from servers that are not arlo-worker (inference.kind vllm / sglang), through the real
// path of `arlo run`: run_parts' task source chosen from the config, the orchestrator, the
// RolloutInference adapter and rollout's InferencePool over loopback HTTP to a server that
// answers /v1/completions and /v1/chat/completions in vLLM's or SGLang's response shapes, and the
// trainer bridge (dir transport) to a trainer thread that reads the packed batches.
//
// The server has its own tokenizer and chat template (ids nothing like the built-in tokenizer's),
// checks that every request carries text or messages (never built-in ids) and asks for token ids
// and logprobs, and answers with its ids. The trainer thread checks that every packed sample is
// exactly the server's prompt ids (chat template included) followed by the server's completion
// ids, with the server's logprobs. The server is InferenceServerFake with its completion answers
// replaced (on_completion); weight updates use its arlo admin plane (the vLLM and SGLang admin
// dialects have their own tests in tests/unit/rollout/admin_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "session/rollout_parts.h"
#include "common/http.h"
#include "common/async/io_thread.h"
#include "session/adapters/bridge_trainer.h"
#include "session/adapters/rollout_adapters.h"
#include "orchestrator/orchestrator.h"
#include "reference/tokenizer.h"
#include "testing/inference_server_fake.h"
#include "tests/integration/orchestrator_loop/orchestrator_run.h"

namespace arlo::session {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<std::int32_t>;

// The server's tokenizer and chat template (Qwen-like special ids; one id per byte otherwise).
constexpr std::int32_t kImStart = 151644, kImEnd = 151645, kEndOfText = 151643, kNewline = 198;
Ids server_ids(const std::string& text) {
  Ids out;
  for (unsigned char c : text) out.push_back(1000 + c);
  return out;
}
Ids server_prompt_ids(const std::string& prompt) { return server_ids(prompt); }
Ids server_chat_ids(const json& messages) {
  Ids out;
  auto turn = [&](const std::string& role) {
    out.push_back(kImStart);
    auto r = server_ids(role);
    out.insert(out.end(), r.begin(), r.end());
    out.push_back(kNewline);
  };
  for (const auto& m : messages) {
    turn(m.at("role").get<std::string>());
    auto c = server_ids(m.at("content").get<std::string>());
    out.insert(out.end(), c.begin(), c.end());
    out.push_back(kImEnd);
    out.push_back(kNewline);
  }
  turn("assistant");  // the generation prompt
  return out;
}
// Generated: the text's ids, then the end token (not part of the text).
Ids server_completion_ids(const std::string& text, bool chat) {
  auto ids = server_ids(text);
  ids.push_back(chat ? kImEnd : kEndOfText);
  return ids;
}
// Logprob of token k of sample j: exact in float, so the trainer side can compare with ==.
float server_logprob(std::size_t k, int j) {
  return -0.125f * static_cast<float>(k + 1) - 0.03125f * static_cast<float>(j);
}

// Which real server's response shapes the test server speaks.
enum class Shape {
  kVllm,            // vLLM >= 0.10.2 with return_token_ids
  kVllmWithoutIds,  // vLLM before return_token_ids: text and logprobs only
  kSglang,          // SGLang: completions with return_token_ids; chat as before return_token_ids
                    // (return_prompt_token_ids, ids in meta_info via return_meta_info)
};

// Answers "...a+b=" with the sum for even samples and "0" for odd ones (so groups have reward
// variance), in `shape`'s response format, on InferenceServerFake's completion routes; weight updates
// go to the fake's arlo admin plane.
class ExternalServer {
 public:
  ExternalServer(asio::io_context& io, Shape shape)
      : fake_(io, testing::InferenceServerOptions{.dialect = testing::Dialect::kArlo}), shape_(shape) {
    fake_.on_completion = [this](const std::string& path, const json& body) {
      return answer(body, path == "/v1/chat/completions");
    };
  }
  std::string url() const { return fake_.url(); }
  void close() { fake_.close(); }
  int requests() const { return fake_.received; }

  std::vector<std::string> violations;  // what a request got wrong

 private:
  void expect(bool ok, const std::string& what) {
    if (!ok && violations.size() < 20) violations.push_back(what);
  }

  http::Response answer(const json& b, bool chat) {
    std::string question;  // the text holding "a+b="
    Ids prompt_ids;
    if (chat) {
      expect(b.contains("messages") && b["messages"].is_array() && !b["messages"].empty(), "chat: no messages");
      if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
        return http::Response::error(400, "messages");
      for (const auto& m : b["messages"]) {
        expect(m.contains("content") && m["content"].is_string(), "chat: a message without text content");
        if (m.value("role", "") == "user") question = m.value("content", "");
      }
      prompt_ids = server_chat_ids(b["messages"]);
      expect(b.value("logprobs", json()) == json(true), "chat: logprobs is not true: " + b.dump());
    } else {
      // Text, as the server's own tokenizer must see it; built-in token ids would be an array.
      expect(b.contains("prompt") && b["prompt"].is_string(), "completions: prompt is not text: " + b.dump());
      question = b.value("prompt", json("")).is_string() ? b["prompt"].get<std::string>() : "";
      prompt_ids = server_prompt_ids(question);
      expect(b.value("logprobs", json()) == json(0), "completions: logprobs is not 0: " + b.dump());
    }
    expect(b.value("return_token_ids", false), "no return_token_ids: " + b.dump());
    if (shape_ == Shape::kSglang && chat) {
      expect(b.value("return_prompt_token_ids", false), "sglang chat: no return_prompt_token_ids");
      expect(b.value("return_meta_info", false), "sglang chat: no return_meta_info");
    } else {
      expect(!b.contains("return_meta_info") && !b.contains("return_prompt_token_ids"),
             "SGLang's fields sent to another server: " + b.dump());
    }
    int a = 0, c = 0;
    const auto eq = question.rfind('=');
    const auto plus = question.rfind('+', eq);
    if (eq != std::string::npos && plus != std::string::npos && plus > 0) {
      auto start = question.find_last_not_of("0123456789", plus - 1);
      start = start == std::string::npos ? 0 : start + 1;
      std::sscanf(question.c_str() + start, "%d+%d=", &a, &c);
    }
    const int n = b.value("n", 1);
    json choices = json::array();
    for (int j = 0; j < n; ++j) {
      const std::string text = j % 2 == 0 ? std::to_string(a + c) : "0";
      const Ids ids = server_completion_ids(text, chat);
      choices.push_back(chat ? chat_choice(j, text, ids, prompt_ids) : completion_choice(j, text, ids, prompt_ids));
    }
    json out = {{"id", fmt::format("req-{}", fake_.received)},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", 1},
                {"model", "served-model"},
                {"choices", choices},
                {"usage", {{"prompt_tokens", prompt_ids.size()}, {"completion_tokens", 0}, {"total_tokens", 0}}}};
    if (shape_ == Shape::kVllm && chat) {
      out["prompt_logprobs"] = nullptr;
      out["prompt_token_ids"] = prompt_ids;  // vLLM's chat: on the response
    }
    if (shape_ == Shape::kSglang) out["metadata"] = {{"weight_version", "default"}};
    return http::Response::json(200, out);
  }

  json completion_choice(int j, const std::string& text, const Ids& ids, const Ids& prompt_ids) const {
    json lps = json::array(), tokens = json::array(), offsets = json::array();
    for (std::size_t k = 0; k < ids.size(); ++k) {
      lps.push_back(server_logprob(k, j));
      tokens.push_back(k < text.size() ? text.substr(k, 1) : "<|endoftext|>");
      offsets.push_back(std::min(k, text.size()));
    }
    json ch = {{"index", j},
               {"text", text},
               {"logprobs",
                {{"text_offset", offsets}, {"token_logprobs", lps}, {"tokens", tokens}, {"top_logprobs", nullptr}}},
               {"finish_reason", "stop"}};
    switch (shape_) {
      case Shape::kVllm:
        ch["stop_reason"] = nullptr;
        ch["prompt_logprobs"] = nullptr;
        ch["prompt_token_ids"] = prompt_ids;  // vLLM's completions: on each choice
        ch["token_ids"] = ids;
        break;
      case Shape::kVllmWithoutIds: ch["stop_reason"] = nullptr; break;
      case Shape::kSglang:
        ch["matched_stop"] = kEndOfText;
        ch["token_ids"] = ids;
        ch["prompt_token_ids"] = prompt_ids;
        break;
    }
    return ch;
  }

  json chat_choice(int j, const std::string& text, const Ids& ids, const Ids& prompt_ids) const {
    json content = json::array(), triples = json::array();
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::string piece = k < text.size() ? text.substr(k, 1) : "<|im_end|>";
      content.push_back({{"token", piece},
                         {"logprob", server_logprob(k, j)},
                         {"bytes", json::array()},
                         {"top_logprobs", json::array()}});
      triples.push_back({server_logprob(k, j), ids[k], piece});
    }
    json ch = {{"index", j}, {"logprobs", {{"content", content}}}, {"finish_reason", "stop"}};
    switch (shape_) {
      case Shape::kVllm:
        ch["message"] = {{"role", "assistant"}, {"content", text}, {"tool_calls", json::array()}};
        ch["stop_reason"] = nullptr;
        ch["token_ids"] = ids;
        break;
      case Shape::kVllmWithoutIds:
        ch["message"] = {{"role", "assistant"}, {"content", text}, {"tool_calls", json::array()}};
        ch["stop_reason"] = nullptr;
        break;
      case Shape::kSglang:
        ch["message"] = {
            {"role", "assistant"}, {"content", text}, {"reasoning_content", nullptr}, {"tool_calls", nullptr}};
        ch["matched_stop"] = kImEnd;
        ch["prompt_token_ids"] = prompt_ids;
        ch["meta_info"] = {{"id", "r"},
                           {"finish_reason", {{"type", "stop"}, {"matched", kImEnd}}},
                           {"prompt_tokens", prompt_ids.size()},
                           {"completion_tokens", ids.size()},
                           {"output_token_logprobs", triples}};
        break;
    }
    return ch;
  }

  testing::InferenceServerFake fake_;
  Shape shape_;
};

// One packed training sample as the trainer reads it back from the batch.
struct ReadSample {
  Ids prompt, completion;
  std::vector<float> logprobs;
};

struct Outcome {
  orch::RunSummary summary;
  std::vector<std::int64_t> trained;  // steps the trainer thread received
  std::vector<ReadSample> samples;
  std::optional<Error> unusable;  // what on_unusable_server reported
  int requests = 0;
  std::vector<std::string> violations;
  std::vector<arlo::Task> tasks;  // the tasks the jsonl held, as the task source converts them
};

constexpr int kSteps = 2;

// Runs the orchestrator against one ExternalServer, `inference.kind` = `kind`, with prompt or chat
// tasks from a jsonl file, until kSteps steps are trained or the run stops.
Outcome run(Shape shape, const std::string& kind, bool chat) {
  const auto dir = fs::temp_directory_path() /
                   fmt::format("arlo_external_{}_{}_{}", ::getpid(), static_cast<int>(shape), chat ? "chat" : "text");
  fs::remove_all(dir);
  fs::create_directories(dir / "bridge");
  {
    std::ofstream f(dir / "tasks.jsonl");
    for (int i = 0; i < 12; ++i) {
      const std::string q = fmt::format("{}+{}=", i + 2, 3 * i + 1);
      const std::string answer = std::to_string(i + 2 + 3 * i + 1);
      const json line =
          chat ? json{{"messages",
                       {{{"role", "system"}, {"content", "Add the numbers."}}, {{"role", "user"}, {"content", q}}}},
                      {"answer", answer}}
               : json{{"prompt", "Q: " + q}, {"answer", answer}};
      f << line.dump() << "\n";
    }
  }
  Outcome out;
  asio::io_context io;
  ExternalServer server(io, shape);
  const std::string url = server.url();

  config::LoadOptions lo;
  lo.overrides = {"inference.launch=external",
                  "inference.kind=" + kind,
                  "inference.urls=[\"" + url + "\"]",
                  "env.kind=jsonl",
                  "env.path=" + (dir / "tasks.jsonl").string(),
                  "env.shuffle=false",
                  "eval.interval=0"};
  auto cfg = config::load_string("run:\n  name: external\n", "<test>", lo);
  EXPECT_TRUE(cfg) << cfg.error().what();
  if (!cfg) return out;
  auto parts = build_rollout_parts(*cfg);
  EXPECT_TRUE(parts) << parts.error().what();
  if (!parts) return out;
  auto dialect = rollout::parse_admin_dialect(kind);
  EXPECT_TRUE(dialect);

  // As in `arlo run`: the pool and its HTTP work on a network thread of their own.
  IoThread network;
  rollout::InferencePool pool(network.context());
  struct StopNetworkFirst {  // before the pool is destroyed, on every path
    IoThread& network;
    ~StopNetworkFirst() { network.stop(); }
  } stop_network_first{network};
  pool.add_worker(url);
  asio::post(network.context(), [&pool] { pool.start(); });
  std::vector<std::unique_ptr<rollout::AdminClient>> admins;
  admins.push_back(rollout::make_admin_client(rollout::AdminDialect::kArlo, pool.client(), url));
  session::adapters::RolloutInference inference(
      pool, std::move(admins),
      [](const std::string&, const orch::WeightRound&) {
        rollout::WeightUpdate u;
        u.weight_sync = {{"transport", "filesystem"}};
        return u;
      },
      "", network.executor(), *dialect);
  RunTasks tasks(parts->stream, parts->tokenize);
  auto dataset = rollout::load_jsonl((dir / "tasks.jsonl").string(), "jsonl");
  EXPECT_TRUE(dataset) << dataset.error().what();
  if (!dataset) return out;
  for (std::size_t i = 0; i < (*dataset)->size(); ++i) out.tasks.push_back(tasks.prepare((*dataset)->at(i)));

  rollout::RewardScorer reward(io, parts->reward, {});
  session::adapters::RolloutScorer scorer(reward, rollout::AdvantageOptions{});
  bridge::ServerOptions bo;
  bo.transport = "dir";
  bo.run_dir = (dir / "bridge").string();
  auto bridge_server = bridge::BridgeServer::create(io, bo);
  EXPECT_TRUE(bridge_server) << bridge_server.error().what();
  if (!bridge_server) return out;
  ThreadPool threads(1);
  bridge::PackOptions pack;
  pack.seq_len = 128;
  session::adapters::BridgeTrainer trainer(io, **bridge_server, threads, pack);

  RealClock clock(io.get_executor());
  auto opt = orch::test::small_run_options(kSteps);
  opt.eval_at_start = false;
  opt.eval_at_end = false;
  opt.console = false;
  opt.progress = false;
  opt.log_interval_s = 60;
  orch::Orchestrator orchestrator(io, orch::Ports{&inference, &tasks, &scorer, &trainer, &clock, nullptr, {}}, opt);
  inference.on_unusable_server([&](const Error& e) {
    out.unusable = e;
    orchestrator.request_stop(e.what());
  });
  EXPECT_TRUE(orchestrator.start());
  EXPECT_TRUE((*bridge_server)->start());

  // The trainer: a thread on the bridge's blocking client, reading each packed sample back.
  std::atomic<bool> stop_trainer{false};
  std::mutex mu;
  std::thread trainer_thread([&] {
    bridge::ClientOptions co;
    co.transport = "dir";
    co.run_dir = (dir / "bridge").string();
    auto client = bridge::connect(co);
    if (!client) return;
    for (int done = 0; done < kSteps && !stop_trainer;) {
      auto batch = (*client)->next_batch(std::chrono::milliseconds(100));
      if (!batch) continue;
      const auto ids = batch->input_ids();
      const auto mask = batch->loss_mask();
      const auto lps = batch->inference_logprobs();
      const auto sid = batch->sample_ids();
      std::map<std::int32_t, ReadSample> by_sample;
      for (std::size_t t = 0; t < ids.size(); ++t) {
        if (sid[t] < 0) continue;
        auto& s = by_sample[sid[t]];
        if (mask[t]) {
          s.completion.push_back(ids[t]);
          s.logprobs.push_back(lps[t]);
        } else {
          s.prompt.push_back(ids[t]);
        }
      }
      {
        std::lock_guard lock(mu);
        out.trained.push_back(batch->step());
        for (auto& [i, s] : by_sample) out.samples.push_back(std::move(s));
      }
      const auto step = batch->step();
      if (!(*client)->ack(step) || !(*client)->published(step)) break;
      ++done;
    }
    (*client)->close();
  });

  const bool timed_out = orch::test::run_to_the_end(io, orchestrator, std::chrono::seconds(60), [&] {
    asio::post(network.context(), [&pool] { pool.stop(); });
    (*bridge_server)->stop();
    server.close();
  });
  network.stop();
  stop_trainer = true;
  trainer_thread.join();
  EXPECT_FALSE(timed_out);
  out.summary = orchestrator.summary();
  out.requests = server.requests();
  out.violations = server.violations;
  fs::remove_all(dir);
  return out;
}

// Every packed sample: the server's prompt ids of one of the tasks, then the server's ids of the
// right answer or of "0", with the server's logprobs (token k of sample j: server_logprob(k, j)).
void expect_trained_on_server_ids(const Outcome& o, bool chat) {
  ASSERT_TRUE(o.violations.empty()) << o.violations.front();
  EXPECT_TRUE(o.summary.ok) << o.summary.error;
  EXPECT_EQ(o.trained, (std::vector<std::int64_t>{1, 2}));
  ASSERT_EQ(o.samples.size(), static_cast<std::size_t>(kSteps * 8));
  ASSERT_EQ(o.tasks.size(), 12u);
  const reference::Tokenizer builtin;
  std::map<Ids, std::string> answers;  // server prompt ids -> the task's answer
  for (const auto& t : o.tasks) {
    // The task source leaves tokenizing to the server.
    EXPECT_TRUE(t.prompt_tokens.empty());
    EXPECT_TRUE(t.answer_tokens.empty());
    EXPECT_EQ(t.messages.empty(), !chat);
    // The two tokenizers disagree, so a sample tokenized by the built-in one cannot pass below.
    if (!chat) {
      ASSERT_NE(server_prompt_ids(t.prompt_text()), builtin.encode_prompt(t.prompt_text()));
    }
    json messages = json::array();
    for (const auto& m : t.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    answers[chat ? server_chat_ids(messages) : server_prompt_ids(t.prompt_text())] = t.answer;
  }
  for (const auto& s : o.samples) {
    auto it = answers.find(s.prompt);
    ASSERT_NE(it, answers.end()) << "a packed prompt is not the server's ids of any task (" << s.prompt.size()
                                 << " tokens)";
    const auto right = server_completion_ids(it->second, chat), wrong = server_completion_ids("0", chat);
    EXPECT_TRUE(s.completion == right || s.completion == wrong) << "completion of " << s.completion.size() << " tokens";
    ASSERT_EQ(s.logprobs.size(), s.completion.size());
    const float j = -(s.logprobs[0] + 0.125f) / 0.03125f;  // the sample index the server used
    EXPECT_TRUE(j == 0 || j == 1 || j == 2 || j == 3) << s.logprobs[0];
    for (std::size_t k = 0; k < s.logprobs.size(); ++k)
      EXPECT_EQ(s.logprobs[k], server_logprob(k, static_cast<int>(j)));
  }
}

TEST(ExternalServer, VllmCompletionsTrainOnTheServersIds) {
  const auto o = run(Shape::kVllm, "vllm", false);
  expect_trained_on_server_ids(o, false);
  EXPECT_FALSE(o.unusable.has_value());
}

TEST(ExternalServer, VllmChatTrainsOnThePromptWithItsChatTemplate) {
  const auto o = run(Shape::kVllm, "vllm", true);
  expect_trained_on_server_ids(o, true);
  EXPECT_FALSE(o.unusable.has_value());
}

TEST(ExternalServer, SglangCompletionsTrainOnTheServersIds) {
  const auto o = run(Shape::kSglang, "sglang", false);
  expect_trained_on_server_ids(o, false);
}

TEST(ExternalServer, SglangChatIdsComeFromMetaInfo) {
  const auto o = run(Shape::kSglang, "sglang", true);
  expect_trained_on_server_ids(o, true);
}

// A vLLM without return_token_ids: the first response stops the run with an error naming the
// server, the missing field and what enables it; nothing is trained.
TEST(ExternalServer, ServerWithoutTokenIdsStopsTheRun) {
  for (bool chat : {false, true}) {
    const auto o = run(Shape::kVllmWithoutIds, "vllm", chat);
    ASSERT_TRUE(o.unusable.has_value()) << "chat " << chat;
    const auto what = o.unusable->what();
    for (const std::string& part :
         {std::string("http://127.0.0.1:"), std::string(chat ? "/v1/chat/completions" : "/v1/completions"),
          std::string("inference.kind vllm"), std::string("choices[0].token_ids"), std::string("return_token_ids"),
          std::string("0.10.2")})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
    EXPECT_TRUE(o.trained.empty());
    EXPECT_TRUE(o.samples.empty());
    EXPECT_GE(o.requests, 1);
    EXPECT_EQ(o.summary.steps, 0);
  }
}

}  // namespace
}  // namespace arlo::session
