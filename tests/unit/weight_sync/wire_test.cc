// The wire form's readers (weight_sync/wire.h): versions as they travel, and the delta threshold
// under its config name with its old name read for one release.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tests/log_capture.h"
#include "weight_sync/manifest.h"
#include "weight_sync/transports/tcp/conn.h"
#include "weight_sync/wire.h"

namespace arlo::weight_sync {
namespace {

using nlohmann::json;

using arlo::test_log::log_capture;

json manifest_json() {
  auto m = Manifest::plan({{"w", DType::F32, {2, 4}}}, 1 << 20, {PayloadKind::kDelta, false, 0.1});
  EXPECT_TRUE(m.has_value());
  m->version = 5;
  m->base_version = 4;
  return m->to_json();
}

constexpr Version kMax = std::numeric_limits<Version>::max();

TEST(WeightSyncWire, VersionsInRangeAreReadWhetherParsedOrBuiltInProcess) {
  // Parsed text holds a non-negative integer as unsigned, a json built from a Version as signed.
  for (const json& v :
       {json::parse("0"), json::parse("7"), json(Version{7}), json(kMax), json::parse("9223372036854775807")}) {
    auto got = version_from_json(v, "test");
    ASSERT_TRUE(got.has_value()) << v.dump() << ": " << got.error().what();
    EXPECT_EQ(*got, v.is_number_unsigned() ? static_cast<Version>(v.get<std::uint64_t>()) : v.get<Version>());
  }
  EXPECT_EQ(version_from_text("0", "t").value_or(-1), 0);
  EXPECT_EQ(version_from_text("9223372036854775807", "t").value_or(-1), kMax);
}

TEST(WeightSyncWire, NegativeFractionalTextualAndOversizedVersionsAreRefusedNamingWhere) {
  for (const char* text :
       {"-1", "1.5", "1e3", "\"3\"", "null", "true", "[1]", "9223372036854775808", "18446744073709551615"}) {
    auto got = version_from_json(json::parse(text), "announcement 'version'");
    ASSERT_FALSE(got.has_value()) << text;
    EXPECT_EQ(got.error().code(), ErrorCode::kParse) << text;
    EXPECT_NE(got.error().what().find("announcement 'version'"), std::string::npos) << got.error().what();
    EXPECT_NE(got.error().what().find("non-negative integer"), std::string::npos) << got.error().what();
  }
  for (const char* text : {"", "-1", "+1", " 1", "1x", "0x10", "9223372036854775808", "99999999999999999999"}) {
    auto got = version_from_text(text, "v<N> directory");
    ASSERT_FALSE(got.has_value()) << "'" << text << "'";
    EXPECT_NE(got.error().what().find("v<N> directory"), std::string::npos) << got.error().what();
  }
}

TEST(WeightSyncWire, EveryVersionReaderRefusesANegativeVersion) {
  Announcement a;
  a.version = 3;
  a.transport = "tcp";
  a.endpoint = {{"address", "127.0.0.1:1"}};
  auto ok_back = parse_announcement(to_json(a));  // built in process: the version is a signed json number
  ASSERT_TRUE(ok_back.has_value()) << ok_back.error().what();
  EXPECT_EQ(ok_back->version, 3);
  auto ann = to_json(a);
  ann["version"] = -3;
  auto bad = parse_announcement(ann);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().what().find("'version'"), std::string::npos) << bad.error().what();

  for (const char* key : {"version", "base_version"}) {
    auto j = manifest_json();
    ASSERT_TRUE(Manifest::from_json(j).has_value());
    j[key] = -1;
    auto m = Manifest::from_json(j);
    ASSERT_FALSE(m.has_value()) << key;
    EXPECT_NE(m.error().what().find(std::string("manifest '") + key + "'"), std::string::npos) << m.error().what();
  }

  for (const char* text :
       {R"({"version": -2})", R"({"resume": {"version": -1, "bucket": 0}})", R"({"version": 9223372036854775808})"}) {
    auto h = detail::parse_hello(json::parse(text));
    ASSERT_FALSE(h.has_value()) << text;
    EXPECT_EQ(h.error().code(), ErrorCode::kParse) << text;
    EXPECT_NE(h.error().what().find("HELLO"), std::string::npos) << h.error().what();
  }
}

TEST(WeightSyncWire, BlockCarriesTheThresholdUnderItsConfigName) {
  auto o = options_from_json({{"transport", "tcp"}, {"delta_density_threshold", 0.1}});
  ASSERT_TRUE(o.has_value()) << o.error().what();
  EXPECT_DOUBLE_EQ(o->payload.delta_density_threshold, 0.1);
  const json back = to_json(*o);
  EXPECT_DOUBLE_EQ(back.value("delta_density_threshold", 0.0), 0.1);
  EXPECT_FALSE(back.contains("delta_dense_threshold")) << back.dump();
  auto again = options_from_json(back);
  ASSERT_TRUE(again.has_value()) << again.error().what();
  EXPECT_DOUBLE_EQ(again->payload.delta_density_threshold, 0.1);
  EXPECT_EQ(log_capture().count("delta_dense_threshold", "delta_density_threshold"), 0u);

  auto wrong = options_from_json({{"transport", "tcp"}, {"delta_density_threshold", "0.1"}});
  ASSERT_FALSE(wrong.has_value());
  EXPECT_NE(wrong.error().what().find("delta_density_threshold"), std::string::npos) << wrong.error().what();
}

TEST(WeightSyncWire, BlockWithTheOldThresholdNameIsReadWithAWarningNamingTheNewOne) {
  const auto before = log_capture().count("delta_dense_threshold", "delta_density_threshold");
  auto o = options_from_json({{"transport", "tcp"}, {"delta_dense_threshold", 0.3}});
  ASSERT_TRUE(o.has_value()) << o.error().what();
  EXPECT_DOUBLE_EQ(o->payload.delta_density_threshold, 0.3);
  EXPECT_EQ(log_capture().count("delta_dense_threshold", "delta_density_threshold"), before + 1);
  EXPECT_FALSE(o->params.contains("delta_dense_threshold")) << o->params.dump();  // a shared key, not the transport's

  auto same =
      options_from_json({{"transport", "tcp"}, {"delta_dense_threshold", 0.3}, {"delta_density_threshold", 0.3}});
  ASSERT_TRUE(same.has_value()) << same.error().what();
  EXPECT_DOUBLE_EQ(same->payload.delta_density_threshold, 0.3);

  auto both =
      options_from_json({{"transport", "tcp"}, {"delta_dense_threshold", 0.3}, {"delta_density_threshold", 0.1}});
  ASSERT_FALSE(both.has_value());
  EXPECT_EQ(both.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(both.error().what().find("delta_dense_threshold"), std::string::npos) << both.error().what();
  EXPECT_NE(both.error().what().find("delta_density_threshold"), std::string::npos) << both.error().what();
}

TEST(WeightSyncWire, ManifestThresholdUnderItsConfigNameAndTheOldOneForOneRelease) {
  const json j = manifest_json();
  EXPECT_DOUBLE_EQ(j.value("delta_density_threshold", 0.0), 0.1);
  EXPECT_FALSE(j.contains("delta_dense_threshold")) << j.dump();
  auto m = Manifest::from_json(j);
  ASSERT_TRUE(m.has_value()) << m.error().what();
  EXPECT_DOUBLE_EQ(m->payload.delta_density_threshold, 0.1);

  // What a publisher of the previous release writes.
  json old = j;
  old.erase("delta_density_threshold");
  old["delta_dense_threshold"] = 0.4;
  const auto before = log_capture().count("delta_dense_threshold", "delta_density_threshold");
  auto read_old = Manifest::from_json(old);
  ASSERT_TRUE(read_old.has_value()) << read_old.error().what();
  EXPECT_DOUBLE_EQ(read_old->payload.delta_density_threshold, 0.4);
  EXPECT_EQ(read_old->fingerprint(), m->fingerprint());
  EXPECT_EQ(log_capture().count("delta_dense_threshold", "delta_density_threshold"), before + 1);

  json both = j;
  both["delta_dense_threshold"] = 0.4;
  auto refused = Manifest::from_json(both);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().what().find("manifest"), std::string::npos) << refused.error().what();
  EXPECT_NE(refused.error().what().find("delta_dense_threshold"), std::string::npos) << refused.error().what();
}

}  // namespace
}  // namespace arlo::weight_sync
