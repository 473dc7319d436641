// arlo run's collective session (session/adapters/collective_session.h) over the real nccl
// publisher and stores, with the communicator's double: workers that ask together get one group;
// their receiving() calls make one broadcast; a failure makes the next group a new generation; a
// rejoining worker starts a new group with everyone who asks with it.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include "session/adapters/collective_session.h"
#include "tests/unit/nccl_transport/nccl_trainer.h"
#include "testing/nccl_fake_backend.h"
#include "weight_sync/wire.h"

namespace arlo::session::adapters {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using weight_sync::nccl::testing::Call;
using weight_sync::nccl::testing::ScopedBackend;

class Rig {
 public:
  explicit Rig(std::size_t expected) {
    trainer.start();
    CollectiveSessionOptions so;
    so.expected = expected;
    so.flavor = "sglang";
    so.gather = 3s;
    so.timeout = 5s;
    session = TrainerCollective::create(so);
  }
  void stage(arlo::Version v) {
    weight_sync::HostWeights w({{"model.w", weight_sync::DType::F32, {16}}});
    ASSERT_TRUE(trainer.pub->stage(v, w));
    session->announce({{"weight_sync", announced(v)}});
  }
  // The trainer's announcement of `v` (or later) as the session is handed it.
  nlohmann::json announced(arlo::Version v) { return weight_sync::to_json(trainer.announcement(v)); }
  // Runs `tasks` on one io_context until all finished.
  template <typename T>
  std::vector<T> run(std::vector<std::function<asio::awaitable<T>()>> tasks) {
    asio::io_context io;
    std::vector<std::optional<T>> out(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i)
      asio::co_spawn(io, tasks[i](), [&out, i](std::exception_ptr e, T v) {
        if (!e) out[i].emplace(std::move(v));
      });
    io.run();
    std::vector<T> r;
    for (auto& o : out) r.push_back(std::move(o.value()));
    return r;
  }

  ScopedBackend fake;
  weight_sync::testing::NcclTrainer trainer{5s};
  std::shared_ptr<TrainerCollective> session;
};

TEST(CollectiveSession, WorkersThatAskTogetherShareOneGroupAndOneBroadcast) {
  Rig rig(2);
  rig.stage(0);
  auto s = rig.session;
  auto joins = rig.run<Result<nlohmann::json>>(
      {[s] { return s->group("http://a", 2); }, [s] { return s->group("http://b", 1); }});
  ASSERT_TRUE(joins[0]) << joins[0].error().what();
  ASSERT_TRUE(joins[1]) << joins[1].error().what();
  EXPECT_EQ(joins[0]->at("generation"), joins[1]->at("generation"));
  EXPECT_EQ(joins[0]->at("world_size"), 4);
  std::set<int> offsets = {joins[0]->at("rank_offset").get<int>(), joins[1]->at("rank_offset").get<int>()};
  EXPECT_TRUE(offsets == (std::set<int>{1, 3}) || offsets == (std::set<int>{1, 2}))
      << joins[0]->dump() << joins[1]->dump();
  const auto g = joins[0]->at("generation").get<std::int64_t>();
  auto sent = rig.run<Result<std::int64_t>>(
      {[s, g] { return s->receiving("http://a", g, 0); }, [s, g] { return s->receiving("http://b", g, 0); }});
  ASSERT_TRUE(sent[0]) << sent[0].error().what();
  ASSERT_TRUE(sent[1]) << sent[1].error().what();
  EXPECT_EQ(rig.fake->count(Call::Kind::kBroadcast), 1u);  // one tensor, once for both
  // The group stays: asking again gives the same one.
  auto again = rig.run<Result<nlohmann::json>>({[s] { return s->group("http://a", 2); }});
  EXPECT_EQ(again[0]->at("generation"), g);
  auto tensors = rig.run<Result<nlohmann::json>>({[s] { return s->tensors(); }});
  ASSERT_TRUE(tensors[0]);
  EXPECT_EQ(tensors[0]->at(0).at("name"), "model.w");
}

TEST(CollectiveSession, AFailureMakesTheNextGroupANewGeneration) {
  Rig rig(1);
  rig.stage(0);
  auto s = rig.session;
  auto first = rig.run<Result<nlohmann::json>>({[s] { return s->group("http://a", 1); }});
  const auto g = first[0]->at("generation").get<std::int64_t>();
  s->failed("http://a", g, "HTTP 500 (test)");
  auto next = rig.run<Result<nlohmann::json>>({[s] { return s->group("http://a", 1); }});
  ASSERT_TRUE(next[0]) << next[0].error().what();
  EXPECT_GT(next[0]->at("generation").get<std::int64_t>(), g);
}

// A worker not in the group (it rejoined after being left out) starts a new one that keeps the
// current members; they get it on their next call.
TEST(CollectiveSession, ARejoiningWorkerStartsANewGroupWithTheOthers) {
  Rig rig(2);
  rig.stage(0);
  rig.session = TrainerCollective::create({.expected = 2, .flavor = "sglang", .gather = 300ms, .timeout = 5s});
  auto s = rig.session;
  s->announce({{"weight_sync", rig.announced(0)}});
  auto alone =
      rig.run<Result<nlohmann::json>>({[s] { return s->group("http://a", 1); }});  // b is down: the window passes
  ASSERT_TRUE(alone[0]) << alone[0].error().what();
  const auto g = alone[0]->at("generation").get<std::int64_t>();
  EXPECT_EQ(alone[0]->at("world_size"), 2);
  auto b = rig.run<Result<nlohmann::json>>({[s] { return s->group("http://b", 1); }});
  ASSERT_TRUE(b[0]) << b[0].error().what();
  EXPECT_GT(b[0]->at("generation").get<std::int64_t>(), g);
  EXPECT_EQ(b[0]->at("world_size"), 3);   // a and b
  EXPECT_EQ(b[0]->at("rank_offset"), 2);  // after a
  auto a = rig.run<Result<nlohmann::json>>({[s] { return s->group("http://a", 1); }});
  EXPECT_EQ(a[0]->at("generation"), b[0]->at("generation"));
  EXPECT_EQ(a[0]->at("rank_offset"), 1);
}

TEST(CollectiveSession, NoAnnouncementYetIsAClearError) {
  auto s = TrainerCollective::create({});
  asio::io_context io;
  std::optional<Result<nlohmann::json>> r;
  asio::co_spawn(io, s->group("http://a", 1),
                 [&](std::exception_ptr, Result<nlohmann::json> v) { r.emplace(std::move(v)); });
  io.run();
  ASSERT_TRUE(r && !*r);
  EXPECT_NE(r->error().what().find("announced no version"), std::string::npos) << r->error().what();
}

}  // namespace
}  // namespace arlo::session::adapters
