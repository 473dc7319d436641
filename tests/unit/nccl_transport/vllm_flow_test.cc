// The whole collective update as `arlo run` drives it, without a GPU: the vLLM and SGLang admin
// adapters (rollout/admin.h) and the run's TrainerCollective session against test servers on
// loopback (InferenceServerFake's vLLM and SGLang personalities), and the trainer's real nccl
// StagingPublisher (control and rendezvous stores) with the communicator's double in place of
// libnccl. The servers read the unique id from the rendezvous store as their workers do, and the
// double holds every broadcast until the server holds the metadata request, so a broadcast that
// came first would hang the test into its deadline.
#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>

#include "common/http.h"
#include "session/adapters/collective_session.h"
#include "rollout/admin.h"
#include "tests/unit/nccl_transport/nccl_trainer.h"
#include "tests/unit/rollout/rollout_test_util.h"
#include "weight_sync/staging.h"
#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"
#include "testing/inference_server_fake.h"
#include "testing/nccl_fake_backend.h"
#include "weight_sync/wire.h"

namespace arlo {
namespace {

namespace asio = boost::asio;
namespace ws = weight_sync;
using namespace std::chrono_literals;
using nlohmann::json;
using ws::nccl::testing::Call;

std::vector<ws::TensorSpec> specs() {
  return {{"model.embed_tokens.weight", ws::DType::BF16, {32, 8}}, {"lm_head.weight", ws::DType::F32, {32, 8}}};
}

// Ran broadcasts the double recorded.
std::size_t broadcasts_ran(const ws::nccl::testing::FakeBackend& fake) {
  std::size_t n = 0;
  for (const auto& c : fake.calls(Call::Kind::kBroadcast)) n += c.ran ? 1 : 0;
  return n;
}

// The server's workers' side of the test, on InferenceServerFake's vLLM or SGLang personality:
// the rendezvous as its workers do it (the id read from the store named in the group init), and
// the metadata request that lets the held broadcasts run.
class Workers {
 public:
  Workers(asio::io_context& io, ws::nccl::testing::FakeBackend& fake, testing::InferenceServerFake& server)
      : io_(io), fake_(fake), server_(server) {
    server_.on_violation = [](const std::string& what) { ADD_FAILURE() << what; };
  }

  // What a worker reads from the group's rendezvous store (a real TCPStore client's keys).
  static std::string read_id(const json& info, const std::string& key) {
    auto store = ws::nccl::StoreClient::connect(info.at("master_address").get<std::string>(),
                                                info.at("master_port").get<std::uint16_t>(), ws::deadline_in(5s));
    if (!store) return "";
    auto v = (*store)->get(key, ws::deadline_in(5s));
    return v ? *v : "";
  }
  // The metadata request is here: let the broadcasts run, answer once they did (as a real server
  // answers once the tensors arrived).
  asio::awaitable<bool> receive(std::size_t broadcasts) {
    if (broadcasts_ran(fake_) != ran_before_) {
      server_.violation("a broadcast ran before the server held the metadata request");
      co_return false;
    }
    fake_.release_collectives();
    asio::steady_timer t(io_);
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (broadcasts_ran(fake_) < ran_before_ + broadcasts && std::chrono::steady_clock::now() < end) {
      t.expires_after(5ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    ran_before_ = broadcasts_ran(fake_);
    fake_.hold_collectives_from(fake_.calls().size());  // the next version's wait for their request too
    co_return broadcasts_ran(fake_) == ran_before_&& ran_before_ > 0;
  }

 private:
  asio::io_context& io_;
  ws::nccl::testing::FakeBackend& fake_;
  testing::InferenceServerFake& server_;
  std::size_t ran_before_ = 0;
};

// vLLM 0.28 with two workers: the init's ranks, the pickled id vLLM's StatelessProcessGroup reads
// (the warm-up all-reduce already ran on rank 0's side), both tensors in one packed bucket.
void vllm_workers(testing::InferenceServerFake& server, Workers& workers) {
  server.on_group_init = [&server](const json& info) -> std::optional<http::Response> {
    if (info.at("rank_offset") != 1 || info.at("world_size") != 3)
      return server.violation("init_info ranks: " + info.dump());
    const auto pickled = Workers::read_id(info, std::string(ws::nccl::kVllmUniqueIdKey));
    if (pickled.size() < 200 || static_cast<unsigned char>(pickled[0]) != 0x80)
      return server.violation("no pickled id in the store");
    return std::nullopt;
  };
  server.on_weights_request = [&workers](json) -> asio::awaitable<std::optional<http::Response>> {
    if (co_await workers.receive(1)) co_return std::nullopt;
    co_return http::Response::json(500, json{{"error", "no broadcast"}});
  };
}

// SGLang: torch's ProcessGroupNCCL reads the raw id under its PrefixStore key; one broadcast per tensor.
void sglang_workers(testing::InferenceServerFake& server, Workers& workers) {
  server.on_group_init = [&server](const json& b) -> std::optional<http::Response> {
    const auto raw = Workers::read_id(b, ws::nccl::sglang_unique_id_key(b.at("group_name").get<std::string>()));
    if (raw.size() != 128) return server.violation("no raw id under SGLang's key");
    return std::nullopt;
  };
  server.on_weights_request = [&workers](json) -> asio::awaitable<std::optional<http::Response>> {
    if (co_await workers.receive(2)) co_return std::nullopt;
    co_return http::Response::json(200, json{{"success", false}, {"message", "no broadcast"}});
  };
}

std::string what(const Status& s) { return s ? std::string("ok") : s.error().what(); }

void one_update(rollout::AdminDialect dialect, const char* flavor, std::size_t collectives_before_update) {
  ws::nccl::testing::ScopedBackend fake;
  fake->hold_collectives_from(collectives_before_update);  // vLLM's warm-up may run; broadcasts wait
  ws::testing::NcclTrainer trainer(10s);                   // stages v1
  trainer.start();
  ws::HostWeights w(specs());
  ASSERT_TRUE(trainer.pub->stage(1, w));
  asio::io_context io;
  const bool vllm = dialect == rollout::AdminDialect::kVllm;
  testing::InferenceServerFake server(
      io, testing::InferenceServerOptions{.dialect = vllm ? testing::Dialect::kVllm : testing::Dialect::kSglang,
                                          .world_size = vllm ? 2 : 1});
  Workers workers(io, *fake, server);
  (vllm ? vllm_workers : sglang_workers)(server, workers);
  auto session =
      session::adapters::TrainerCollective::create({.expected = 1, .flavor = flavor, .gather = 2s, .timeout = 10s});
  session->announce({{"weight_sync", ws::to_json(trainer.announcement(1))}});
  http::Client client(io);
  rollout::AdminOptions o;
  o.call_timeout = 10s;
  o.transfer_timeout = 10s;
  auto admin = rollout::make_admin_client(dialect, client, server.url(), o);
  rollout::test::run(io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->pause(arlo::PauseMode::kAbort)), "ok");
    rollout::WeightUpdate u;
    u.version = 1;
    u.collective = session;
    EXPECT_EQ(what(co_await admin->prepare_weights(u)), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
  }());
  EXPECT_TRUE(server.violations.empty());
  EXPECT_TRUE(fake->misuse().empty());
  const auto inits = fake->calls(Call::Kind::kInit);
  ASSERT_EQ(inits.size(), 1u);
  EXPECT_EQ(inits[0].rank, 0);
}

TEST(CollectiveFlow, VllmServerGetsTheGroupWarmUpAndPackedBroadcastBehindItsMetadataRequest) {
  one_update(rollout::AdminDialect::kVllm, "vllm", /*warm-up=*/1);
}

TEST(CollectiveFlow, SglangServerGetsItsKeyAndOneBroadcastPerTensorBehindItsMetadataRequest) {
  one_update(rollout::AdminDialect::kSglang, "sglang", 0);
}

}  // namespace
}  // namespace arlo
