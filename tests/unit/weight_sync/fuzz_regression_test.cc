// Inputs from untrusted peers that used to be accepted wrongly or throw, found by the fuzz targets
// (tests/fuzz/manifest_fuzz, tests/fuzz/tcp_frame_fuzz); each must now be a clear error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "weight_sync/manifest.h"
#include "weight_sync/transports/tcp/conn.h"

namespace arlo::weight_sync {
namespace {

using nlohmann::json;

json manifest_with_shape(json shape, std::uint64_t total) {
  return {{"format", "arlo-weight-sync/1"},
          {"version", 1},
          {"payload", "full"},
          {"zstd", false},
          {"bucket_bytes", 1 << 20},
          {"total_bytes", total},
          {"tensors", json::array({{{"name", "w"}, {"dtype", "F32"}, {"shape", shape}}})},
          {"buckets", json::array()}};
}

// Regression (manifest_fuzz): a negative dimension counted as 0 elements, so the manifest was
// accepted with a shape no tensor has.
TEST(WeightSyncFuzzRegression, ManifestNegativeDimensionIsRefused) {
  auto m = Manifest::from_json(manifest_with_shape({-1, 4}, 0));
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().what().find("'w'"), std::string::npos) << m.error().what();
  EXPECT_TRUE(Manifest::from_json(manifest_with_shape({2, 4}, 32)).has_value());
}

// Regression (manifest_fuzz): a shape whose byte size overflows 64 bits wrapped around to a small
// total_bytes and was accepted.
TEST(WeightSyncFuzzRegression, ManifestOversizedShapeIsRefused) {
  // 2^62 elements of 4 bytes = 2^64 bytes, which wraps to 0.
  auto m = Manifest::from_json(manifest_with_shape({std::int64_t{1} << 31, std::int64_t{1} << 31}, 0));
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().what().find("oversized"), std::string::npos) << m.error().what();
}

// Regression (manifest_fuzz, make fuzz): an integer field written as a huge floating-point number
// (bucket_bytes 1.05e106) was cast to an integer, which is undefined behaviour; every integer field
// must now be an integer.
TEST(WeightSyncFuzzRegression, ManifestIntegerFieldsRefuseFloatingPointNumbers) {
  for (const char* key : {"version", "bucket_bytes", "total_bytes"}) {
    auto j = manifest_with_shape({2, 4}, 32);
    j[key] = 1.0485779e106;
    auto m = Manifest::from_json(j);
    ASSERT_FALSE(m.has_value()) << key;
    EXPECT_NE(m.error().what().find(key), std::string::npos) << m.error().what();
    EXPECT_NE(m.error().what().find("non-negative integer"), std::string::npos) << m.error().what();
  }
  auto shape = manifest_with_shape(json::array({2.5e300, 4}), 32);
  EXPECT_FALSE(Manifest::from_json(shape).has_value());
  auto checksums = manifest_with_shape({2, 4}, 32);
  checksums["checksums"] = json::array({-1});
  EXPECT_FALSE(Manifest::from_json(checksums).has_value());
}

// Regression (tcp_frame_fuzz): HELLO fields of the wrong type threw json::type_error out of the
// publisher's gather and resume threads (a resume thread that throws ends the process).
TEST(WeightSyncFuzzRegression, TcpHelloWithWrongTypesIsRefused) {
  for (const char* text : {R"({"peer": 5})", R"({"version": "7"})", R"({"version": -1})", R"({"resume": 3})",
                           R"({"resume": {"version": 1}})", R"({"resume": {"version": 1, "bucket": -2}})", "[]"}) {
    auto h = detail::parse_hello(json::parse(text));
    ASSERT_FALSE(h.has_value()) << text;
    EXPECT_EQ(h.error().code(), ErrorCode::kParse) << text;
  }
  auto h = detail::parse_hello(json::parse(R"({"peer": "w0", "version": 3, "resume": {"version": 4, "bucket": 2}})"));
  ASSERT_TRUE(h.has_value()) << h.error().what();
  EXPECT_EQ(h->peer, "w0");
  EXPECT_EQ(h->version, 3u);
  EXPECT_EQ(h->resume_version, 4u);
  EXPECT_EQ(h->resume_bucket, 2u);
}

// Regression (tcp_frame_fuzz): ANSWER fields of the wrong type threw; a negative start became a huge
// bucket index.
TEST(WeightSyncFuzzRegression, TcpAnswerWithWrongTypesOrRangeIsRefused) {
  for (const char* text : {R"({"state": 1})", R"({"state": "maybe"})", R"({"state": "accepted", "start": -1})",
                           R"({"state": "accepted", "start": 9})", R"({"state": "accepted", "error": []})"}) {
    auto a = detail::parse_answer(json::parse(text), 4);
    ASSERT_FALSE(a.has_value()) << text;
    EXPECT_EQ(a.error().code(), ErrorCode::kParse) << text;
  }
  auto a = detail::parse_answer(json::parse(R"({"state": "accepted", "error": "", "start": 4})"), 4);
  ASSERT_TRUE(a.has_value()) << a.error().what();
  EXPECT_EQ(a->start, 4u);
}

}  // namespace
}  // namespace arlo::weight_sync
