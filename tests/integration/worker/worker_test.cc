// arlo-worker end to end: a real process, real HTTP, real weight transports.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/http.h"
#include "reference/engine.h"
#include "reference/model.h"
#include "reference/model_weights.h"
#include "rollout/admin.h"
#include "tests/integration/worker/child_process.h"
#include "weight_sync/transport.h"
#include "weight_sync/weight_sync.h"

namespace arlo {
namespace {

namespace asio = boost::asio;
using nlohmann::json;

// One HTTP call on a private io_context.
Result<http::Response> call(http::Verb verb, const std::string& url, const std::optional<json>& body = std::nullopt,
                            std::chrono::seconds timeout = std::chrono::seconds(60)) {
  asio::io_context io;
  http::Client client(io);
  http::ClientRequest req;
  req.method = verb;
  req.url = url;
  if (body) req.body = body->dump();
  req.timeout = timeout;
  req.retry = http::RetryPolicy{1, {}, {}};
  std::optional<Result<http::Response>> out;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { out = co_await client.request(std::move(req)); }, asio::detached);
  io.run();
  return std::move(*out);
}

json body_of(const Result<http::Response>& r) {
  EXPECT_TRUE(r) << (r ? "" : r.error().what());
  if (!r) return json();
  auto j = r->parse_json();
  EXPECT_TRUE(j) << r->body;
  return j ? *j : json();
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("arlo_worker_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

class Worker {
 public:
  // The filesystem transport's versions live under the temp directory (temp_dir()): allowed.
  explicit Worker(std::vector<std::string> extra = {"--init-seed", "1", "--allow-weights-from",
                                                    std::filesystem::temp_directory_path().string()}) {
    std::vector<std::string> argv{ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--log-level", "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<testing::ChildProcess>(argv);
    auto rest = proc_->wait_for_line("listening on ", std::chrono::seconds(60));
    if (rest) url_ = "http://" + *rest;
  }
  bool ok() const { return !url_.empty(); }
  std::string url(const std::string& path) const { return url_ + path; }
  json post(const std::string& path, const json& body, int expect_status = 200) const {
    auto r = call(http::Verb::post, url(path), body);
    EXPECT_TRUE(r && r->status == expect_status)
        << path << " -> " << (r ? std::to_string(r->status) + " " + r->body : r.error().what());
    return body_of(r);
  }
  json get(const std::string& path, int expect_status = 200) const {
    auto r = call(http::Verb::get, url(path));
    EXPECT_TRUE(r && r->status == expect_status)
        << path << " -> " << (r ? std::to_string(r->status) + " " + r->body : r.error().what());
    return body_of(r);
  }

 private:
  std::unique_ptr<testing::ChildProcess> proc_;
  std::string url_;
};

// ------------------------------------------------------------------ OpenAI shape

std::string kind(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "boolean";
  if (j.is_number_integer()) return "integer";
  if (j.is_number()) return "number";
  if (j.is_string()) return "string";
  if (j.is_array()) return "array";
  return "object";
}

// Every field of the reference exists in ours with the same JSON type; arrays: each of our
// elements against the reference's first. Extra fields in ours are allowed (token_ids, ...).
void expect_shape(const json& ours, const json& ref, const std::string& where) {
  const std::string k = kind(ref), o = kind(ours);
  if (k == "number") {
    EXPECT_TRUE(ours.is_number()) << where << ": expected a number, got " << o;
    return;
  }
  ASSERT_EQ(o, k) << where << ": " << ours.dump();
  if (ref.is_object()) {
    for (const auto& [key, value] : ref.items()) {
      ASSERT_TRUE(ours.contains(key)) << where << ": missing '" << key << "' in " << ours.dump();
      expect_shape(ours[key], value, where + "." + key);
    }
  } else if (ref.is_array() && !ref.empty()) {
    for (std::size_t i = 0; i < ours.size(); ++i) expect_shape(ours[i], ref[0], fmt::format("{}[{}]", where, i));
  }
}

TEST(WorkerOpenAi, RecordedRequestResponsePairs) {
  Worker w;
  ASSERT_TRUE(w.ok());
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ARLO_WORKER_RECORDED_DIR)) {
    std::ifstream in(entry.path());
    json pair = json::parse(in);
    ++files;
    SCOPED_TRACE(entry.path().filename().string());
    auto r = call(http::Verb::post, w.url(pair["path"].get<std::string>()), pair["request"]);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, pair["status"].get<int>()) << r->body;
    EXPECT_EQ(r->content_type.rfind("application/json", 0), 0u) << r->content_type;
    json ours = body_of(r);
    expect_shape(ours, pair["response"], "response");
    if (r->status != 200) {
      EXPECT_EQ(ours["error"]["param"], pair["response"]["error"]["param"]);
      continue;
    }
    const json& req = pair["request"];
    const int n = req.value("n", 1);
    ASSERT_EQ(ours["choices"].size(), static_cast<std::size_t>(n));
    std::int64_t completion_tokens = 0;
    for (std::size_t i = 0; i < ours["choices"].size(); ++i) {
      const json& c = ours["choices"][i];
      EXPECT_EQ(c["index"], i);
      EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << c["finish_reason"];
      completion_tokens += static_cast<std::int64_t>(c["token_ids"].size());
      EXPECT_EQ(c["prompt_token_ids"], ours["prompt_token_ids"]);
      EXPECT_EQ(c["version_spans"], json::parse("[[0, 0]]"));
      if (req.contains("max_tokens")) {
        EXPECT_LE(c["token_ids"].size(), req["max_tokens"].get<std::size_t>());
      }
      if (c["logprobs"].is_object() && c["logprobs"].contains("token_logprobs")) {
        EXPECT_EQ(c["logprobs"]["token_logprobs"].size(), c["token_ids"].size());
      }
      if (c["logprobs"].is_object() && c["logprobs"].contains("content")) {
        EXPECT_EQ(c["logprobs"]["content"].size(), c["token_ids"].size());
      }
    }
    EXPECT_EQ(ours["usage"]["completion_tokens"], completion_tokens);
    EXPECT_EQ(ours["usage"]["prompt_tokens"], ours["prompt_token_ids"].size());
    EXPECT_EQ(ours["usage"]["total_tokens"], ours["usage"]["prompt_tokens"].get<int>() + completion_tokens);
  }
  EXPECT_GE(files, 7);
}

TEST(WorkerOpenAi, TokenIdPromptsSeedsAndErrors) {
  Worker w;
  ASSERT_TRUE(w.ok());
  json text = w.post("/v1/completions", {{"prompt", "12+3="}, {"max_tokens", 6}, {"seed", 5}});
  auto ids = text["prompt_token_ids"];
  EXPECT_EQ(ids[0], 1);  // <bos>
  // The same ids as a token prompt and the same seed give the same completion.
  json again = w.post("/v1/completions", {{"prompt", ids}, {"max_tokens", 6}, {"seed", 5}});
  EXPECT_EQ(again["choices"][0]["token_ids"], text["choices"][0]["token_ids"]);
  EXPECT_EQ(again["choices"][0]["text"], text["choices"][0]["text"]);
  // Several prompts: choices are prompt-major.
  json multi = w.post("/v1/completions", {{"prompt", {"a", "b"}}, {"max_tokens", 2}, {"n", 2}});
  EXPECT_EQ(multi["choices"].size(), 4u);
  EXPECT_EQ(multi["choices"][3]["prompt_token_ids"], json::parse("[1, 75]"));
  // Errors: OpenAI bodies with the right 4xx.
  EXPECT_EQ(w.post("/v1/completions", {{"prompt", {1, 999}}}, 400)["error"]["param"], "prompt");
  EXPECT_EQ(w.post("/v1/completions", {{"prompt", "x"}, {"temperature", -1}}, 400)["error"]["param"], "temperature");
  EXPECT_EQ(w.post("/v1/completions", {{"prompt", std::string(80, 'x')}}, 400)["error"]["param"], "prompt");
  EXPECT_EQ(
      w.post("/v1/chat/completions", {{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, 400)["error"]["type"],
      "invalid_request_error");
  auto raw = call(http::Verb::post, w.url("/v1/completions"), std::nullopt);
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  auto missing = call(http::Verb::get, w.url("/v1/nothing"));
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST(WorkerOpenAi, HealthModelsMetrics) {
  Worker w;
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w.get("/health")["version"], 0);
  json models = w.get("/v1/models");
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "arlo-policy");
  EXPECT_EQ(models["data"][0]["object"], "model");
  w.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}});
  auto m = call(http::Verb::get, w.url("/metrics"));
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("arlo_worker_version 0"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("arlo_worker_tokens_generated"), std::string::npos) << m->body;
}

// ------------------------------------------------------------------ admin plane

// A malformed update is refused with a message naming what is wrong, and nothing starts.
TEST(WorkerAdmin, BadWeightSyncBlocksAreRefused) {
  Worker w;
  ASSERT_TRUE(w.ok());
  auto missing = w.post("/weights/prepare", {{"version", 1}}, 400);
  EXPECT_EQ(missing["error"]["param"], "weight_sync") << missing.dump();
  auto unknown = w.post("/weights/prepare", {{"version", 1}, {"weight_sync", {{"transport", "carrier-pigeon"}}}}, 400);
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("carrier-pigeon"), std::string::npos) << unknown.dump();
  auto bad_key =
      w.post("/weights/prepare", {{"version", 1}, {"weight_sync", {{"transport", "tcp"}, {"dir", "/tmp"}}}}, 400);
  EXPECT_NE(bad_key["error"]["message"].get<std::string>().find("'dir'"), std::string::npos) << bad_key.dump();
  EXPECT_TRUE(w.get("/weights")["preparing"].is_null());
}

TEST(WorkerAdmin, PauseQueuesRequestsUntilResume) {
  Worker w;
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w.post("/pause?mode=sideways", json::object(), 400)["error"]["param"], "mode");
  w.post("/pause?mode=keep", json::object());
  EXPECT_EQ(w.get("/weights")["paused"], true);
  auto pending = std::async(std::launch::async, [&] {
    return call(http::Verb::post, w.url("/v1/completions"), json{{"prompt", "q"}, {"max_tokens", 3}});
  });
  // Wait (on the worker's own report, not a sleep) until the request is queued behind the pause.
  bool queued = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!queued && std::chrono::steady_clock::now() < until) {
    auto m = call(http::Verb::get, w.url("/metrics"));
    queued = m && m->body.find("arlo_worker_engine_queued 1") != std::string::npos;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(queued);
  w.post("/resume", json::object());
  auto r = pending.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  w.post("/pause?mode=abort", json::object());
  w.post("/resume", json::object());
}

// Publishes `model` as `version` with a real publisher of `transport`, and drives the worker through
// prepare + commit. Returns the commit response.
struct Update {
  std::string transport;
  std::filesystem::path dir;
  std::string shm_name;
};

json update_worker(const Worker& w, const Update& u, reference::Model& model, std::int64_t version, int expect_status) {
  weight_sync::Options o;
  o.transport = u.transport;
  const auto* d = *weight_sync::find_transport(u.transport);
  if (d->option("dir")) o.params["dir"] = u.dir.string();
  if (d->option("shm_name")) o.params["shm_name"] = u.shm_name;
  o.expected_receivers = 1;
  o.bucket_timeout = std::chrono::milliseconds(20000);
  auto pub = weight_sync::Publisher::create(o);
  EXPECT_TRUE(pub) << (pub ? "" : pub.error().what());
  if (!pub) return json();
  reference::ModelWeights source(model);
  // The receiver block the orchestrator sends: the transport and the publisher's endpoint.
  json block = (*pub)->endpoint();
  block["transport"] = u.transport;
  block["timeout_ms"] = 60000;
  const json prepare = {{"version", version}, {"weight_sync", block}};
  if (d->capabilities.durable) {
    auto rep = (*pub)->publish(version, source, weight_sync::deadline_in(std::chrono::seconds(30)));
    EXPECT_TRUE(rep) << (rep ? "" : rep.error().what());
    w.post("/weights/prepare", prepare);
    return w.post("/weights/commit", {{"version", version}}, expect_status);
  }
  w.post("/weights/prepare", prepare);
  auto publishing = std::async(std::launch::async, [&] {
    return (*pub)->publish(version, source, weight_sync::deadline_in(std::chrono::seconds(30)));
  });
  json out = w.post("/weights/commit", {{"version", version}}, expect_status);
  auto rep = publishing.get();
  EXPECT_TRUE(rep) << (rep ? "" : rep.error().what());
  return out;
}

// Generates locally with the same engine code and parameters: what the worker must now answer.
reference::Generation local_generation(std::shared_ptr<reference::Model> model, const arlo::SamplingParams& p,
                                       const std::string& prompt) {
  reference::Engine engine(model->config(), {});
  std::promise<void> applied;
  EXPECT_TRUE(engine.set_model(model, 0, [&] { applied.set_value(); }));
  applied.get_future().wait();
  std::promise<Result<reference::Generation>> done;
  EXPECT_TRUE(engine.submit(reference::Tokenizer().encode_prompt(prompt), p,
                            [&](Result<reference::Generation> g) { done.set_value(std::move(g)); }));
  auto g = done.get_future().get();
  EXPECT_TRUE(g);
  return *g;
}

class WorkerWeights : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerWeights, UpdateChangesVersionChecksumAndCompletions) {
  const std::string transport = GetParam();
  Worker w;
  ASSERT_TRUE(w.ok());
  auto before = w.get("/weights");
  EXPECT_EQ(before["version"], 0);
  const json request = {
      {"prompt", "1+2="}, {"max_tokens", 8}, {"temperature", 0.8}, {"seed", 11}, {"ignore_eos", true}};
  json old_completion = w.post("/v1/completions", request);

  auto next = reference::Model::init({}, 99);
  ASSERT_TRUE(next);
  Update u{transport, temp_dir("ws_" + transport), fmt::format("arlo-test-{}-{}", transport, ::getpid())};
  json committed = update_worker(w, u, **next, 1, 200);
  auto expected_sum = reference::weights_checksum_hex(**next);
  ASSERT_TRUE(expected_sum);
  EXPECT_EQ(committed["version"], 1);
  EXPECT_EQ(committed["checksum"], *expected_sum);
  auto after = w.get("/weights");
  EXPECT_EQ(after["version"], 1);
  EXPECT_EQ(after["checksum"], *expected_sum);
  EXPECT_NE(after["checksum"], before["checksum"]);
  EXPECT_EQ(w.get("/health")["version"], 1);

  json fresh = w.post("/v1/completions", request);
  EXPECT_EQ(fresh["choices"][0]["version_spans"], json::parse("[[1, 0]]"));
  arlo::SamplingParams p;
  p.max_tokens = 8;
  p.temperature = 0.8;
  p.seed = 11;
  p.ignore_eos = true;
  auto expect = local_generation(*next, p, "1+2=");
  EXPECT_EQ(fresh["choices"][0]["token_ids"].get<std::vector<int>>(),
            std::vector<int>(expect.tokens.begin(), expect.tokens.end()));
  EXPECT_NE(fresh["choices"][0]["token_ids"], old_completion["choices"][0]["token_ids"]);
  // Asked for an older version than it holds (a durable transport handed it the newest one): it
  // answers at once that it holds v1, and the commit reports v1; nothing waits for a transfer.
  const auto t0 = std::chrono::steady_clock::now();
  json block = {{"transport", transport}, {"timeout_ms", 60000}};
  if (transport == "filesystem") block["dir"] = u.dir.string();
  if (transport == "shm") block["shm_name"] = u.shm_name;
  if (transport == "tcp") block["address"] = "127.0.0.1:1";
  json held = w.post("/weights/prepare", {{"version", 0}, {"weight_sync", block}});
  EXPECT_EQ(held["preparing"], 1) << held.dump();
  EXPECT_EQ(held.value("held", false), true) << held.dump();
  EXPECT_EQ(w.post("/weights/commit", {{"version", 0}})["version"], 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  std::filesystem::remove_all(u.dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, WorkerWeights, ::testing::Values("filesystem", "tcp", "shm"));

TEST(WorkerAdmin, FailedUpdateKeepsTheOldVersionServing) {
  Worker w;
  ASSERT_TRUE(w.ok());
  auto before = w.get("/weights");
  // A model of another shape: the worker's sink refuses the manifest before any byte moves.
  reference::ModelConfig other;
  other.hidden = 32;
  other.heads = 2;
  auto wrong = reference::Model::init(other, 5);
  ASSERT_TRUE(wrong);
  Update u{"filesystem", temp_dir("ws_fail"), ""};
  json failed = update_worker(w, u, **wrong, 1, 500);
  EXPECT_EQ(failed["error"]["type"], "server_error");
  EXPECT_NE(failed["error"]["message"].get<std::string>().find("still serving v0"), std::string::npos) << failed.dump();
  auto after = w.get("/weights");
  EXPECT_EQ(after["version"], 0);
  EXPECT_EQ(after["checksum"], before["checksum"]);
  json c = w.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}});
  EXPECT_EQ(c["choices"][0]["version_spans"], json::parse("[[0, 0]]"));
  // Commit without a prepare is a conflict.
  EXPECT_EQ(w.post("/weights/commit", {{"version", 7}}, 409)["error"]["type"], "conflict_error");
  std::filesystem::remove_all(u.dir);
}

// What the orchestrator sees of a failed pull: prepare then commit through the arlo admin client
// (its default retry policy, which repeats a commit answered 5xx), as the orchestrator drives a
// worker. The error carries the pull's reason and source, on the first answer and on the retries,
// never "no weight transfer was prepared".
TEST(WorkerAdmin, AFailedPullsReasonReachesTheAdminClient) {
  Worker w;
  ASSERT_TRUE(w.ok());
  asio::io_context io;
  http::Client client(io);
  auto admin = rollout::make_admin_client(rollout::AdminDialect::kArlo, client, w.url(""));
  rollout::WeightUpdate u;
  u.version = 1;
  // Nothing listens on port 1 (loopback: allowed by default): the pull fails once timeout_ms passed.
  u.weight_sync = {{"transport", "tcp"}, {"address", "127.0.0.1:1"}, {"timeout_ms", 2000}};
  std::optional<Status> prepared, committed;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        prepared = co_await admin->prepare_weights(u);
        if (*prepared) committed = co_await admin->commit_weights(1);
      },
      asio::detached);
  io.run();
  ASSERT_TRUE(prepared && *prepared) << (prepared ? prepared->error().what() : "no answer");
  ASSERT_TRUE(committed);
  ASSERT_FALSE(*committed);
  const std::string what = committed->error().what();
  EXPECT_NE(what.find("/weights/commit: HTTP 500: weight update to v1 failed: receiving over tcp from 127.0.0.1:1: "
                      "cannot reach upstream"),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find("no weight transfer was prepared"), std::string::npos) << what;
  // A commit asked again (as a retry would) still names the reason; another version is a conflict.
  json again = w.post("/weights/commit", {{"version", 1}}, 500);
  EXPECT_NE(again["error"]["message"].get<std::string>().find("cannot reach upstream"), std::string::npos)
      << again.dump();
  EXPECT_EQ(w.post("/weights/commit", {{"version", 2}}, 409)["error"]["type"], "conflict_error");
  EXPECT_EQ(w.get("/weights")["version"], 0);
}

TEST(WorkerAdmin, ServesNothingBeforeItHoldsAVersion) {
  Worker w(std::vector<std::string>{"--allow-weights-from", std::filesystem::temp_directory_path().string()});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w.get("/health", 503)["status"], "no_weights");
  EXPECT_EQ(w.post("/v1/completions", {{"prompt", "x"}}, 503)["error"]["type"], "server_error");
  EXPECT_TRUE(w.get("/weights")["version"].is_null());
  auto v0 = reference::Model::init({}, 1);
  ASSERT_TRUE(v0);
  Update u{"filesystem", temp_dir("ws_first"), ""};
  json committed = update_worker(w, u, **v0, 0, 200);
  EXPECT_EQ(committed["version"], 0);
  EXPECT_EQ(w.get("/health")["version"], 0);
  w.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  std::filesystem::remove_all(u.dir);
}

}  // namespace
}  // namespace arlo
