// Request/Response helpers and query parsing, without sockets.
#include <gtest/gtest.h>

#include "common/http.h"
#include "common/http_util.h"

namespace arlo::http {
namespace {

TEST(HttpMessage, ErrorBodyIsOpenAiShaped) {
  const Response r = Response::error(422, "max_tokens must be positive", "invalid_request_error", "max_tokens");
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.content_type, "application/json");
  const auto j = r.parse_json().value();
  EXPECT_EQ(j["error"]["message"], "max_tokens must be positive");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(j["error"]["code"], 422);
  EXPECT_TRUE(Response::error(500, "x").parse_json().value()["error"]["param"].is_null());
}

TEST(HttpMessage, MalformedJsonSaysWhere) {
  Request req;
  req.body = R"({"a": 1, "b": })";
  const auto j = req.json();
  ASSERT_FALSE(j);
  EXPECT_EQ(j.error().code(), ErrorCode::kParse);
  EXPECT_NE(j.error().message().find("byte 15"), std::string::npos) << j.error().message();

  req.body = "";
  EXPECT_FALSE(req.json());
  req.body = R"([1, 2, 3])";
  EXPECT_EQ(req.json().value().size(), 3u);
}

TEST(HttpMessage, TextAndJsonResponses) {
  const Response t = Response::text(201, "hi");
  EXPECT_EQ(t.status, 201);
  EXPECT_EQ(t.body, "hi");
  EXPECT_EQ(t.content_type, "text/plain; charset=utf-8");
  EXPECT_FALSE(t.parse_json());
  // Invalid UTF-8 is replaced, never thrown.
  const Response j = Response::json(200, {{"s", std::string("\xff\xfe")}});
  EXPECT_TRUE(j.parse_json());
}

TEST(HttpMessage, QueryParsingDecodesAndTolerates) {
  const auto q = detail::parse_query("mode=keep&name=a%20b+c&flag&&empty=&bad=%zz%4&mode=wait");
  EXPECT_EQ(q.at("mode"), "wait");  // last one wins
  EXPECT_EQ(q.at("name"), "a b c");
  EXPECT_EQ(q.at("flag"), "");
  EXPECT_EQ(q.at("empty"), "");
  EXPECT_EQ(q.at("bad"), "%zz%4");
  EXPECT_EQ(q.size(), 5u);
  EXPECT_EQ(detail::percent_decode("/a+b%2Fc", false), "/a+b/c");
  Request r;
  r.query = q;
  EXPECT_EQ(r.query_param("mode"), "wait");
  EXPECT_EQ(r.query_param("nope"), std::nullopt);
}

TEST(HttpMessage, RaiseOpenFileLimit) {
  const auto limit = raise_open_file_limit();
  ASSERT_TRUE(limit) << limit.error().what();
  EXPECT_GT(*limit, 0u);
}

}  // namespace
}  // namespace arlo::http
