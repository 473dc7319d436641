// common/auth.h: SHA-256 and HMAC-SHA256 against the published test vectors (FIPS 180-2 appendix B,
// RFC 4231), the challenge proofs, the loopback rule, bearer headers and confined names.
#include "common/auth.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace arlo::auth {
namespace {

std::string hex(const Digest& d) { return to_hex(d); }

TEST(Sha256, PublishedVectors) {
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary (55, 56, 64 bytes) go through one or two final blocks.
  EXPECT_NE(hex(sha256(std::string(55, 'x'))), hex(sha256(std::string(56, 'x'))));
}

TEST(HmacSha256, Rfc4231Vectors) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block is hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Proof, BindsTokenContextAndNonce) {
  const std::string p = proof("secret", "arlo-bridge/1", "n1");
  EXPECT_EQ(p.size(), 64u);
  EXPECT_TRUE(verify_proof("secret", "arlo-bridge/1", "n1", p));
  EXPECT_FALSE(verify_proof("other", "arlo-bridge/1", "n1", p));
  EXPECT_FALSE(verify_proof("secret", "arlo-weights/1", "n1", p));  // another plane
  EXPECT_FALSE(verify_proof("secret", "arlo-bridge/1", "n2", p));   // a replayed answer
  EXPECT_FALSE(verify_proof("secret", "arlo-bridge/1", "n1", ""));
  auto a = nonce(), b = nonce();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  auto t = generate_token();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->size(), 64u);
}

TEST(Loopback, OnlyLoopbackBindsGoWithoutToken) {
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.3.4.5"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("[::1]"));
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.5"));
  EXPECT_FALSE(is_loopback(""));
  EXPECT_EQ(host_of("10.0.0.5:29500"), "10.0.0.5");
  EXPECT_EQ(host_of("[::1]:80"), "::1");
  EXPECT_EQ(host_of(":29500"), "");
  EXPECT_EQ(host_of("trainer"), "trainer");
  EXPECT_TRUE(require_token_off_loopback("x", "127.0.0.1", ""));
  EXPECT_TRUE(require_token_off_loopback("x", "0.0.0.0", "t"));
  auto refused = require_token_off_loopback("the worker admin server", "0.0.0.0", "");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("the worker admin server would listen on 0.0.0.0"), std::string::npos)
      << refused.error().message();
  EXPECT_NE(refused.error().message().find("security.token"), std::string::npos);
}

TEST(Bearer, SchemeAndToken) {
  EXPECT_TRUE(bearer_matches("Bearer abc", "abc"));
  EXPECT_TRUE(bearer_matches("bearer abc ", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer abd", "abc"));
  EXPECT_FALSE(bearer_matches("Basic abc", "abc"));
  EXPECT_FALSE(bearer_matches("abc", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
}

TEST(TokenSources, ExplicitThenFileThenEnvironment) {
  const auto dir = std::filesystem::temp_directory_path() / ("arlo-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "tok") << "  from-file\n"; }
  { std::ofstream(dir / "empty") << "\n"; }
  ::unsetenv("ARLO_TOKEN");
  ::unsetenv("ARLO_TOKEN_FILE");
  EXPECT_EQ(resolve_token("given", (dir / "tok").string()).value(), "given");
  EXPECT_EQ(resolve_token("", (dir / "tok").string()).value(), "from-file");
  EXPECT_EQ(process_token().value(), "");
  auto empty = read_token_file(dir / "empty");
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().message().find("is empty"), std::string::npos);
  EXPECT_FALSE(read_token_file(dir / "missing"));
  ::setenv("ARLO_TOKEN_FILE", (dir / "tok").c_str(), 1);
  EXPECT_EQ(process_token().value(), "from-file");
  ::setenv("ARLO_TOKEN", "from-env", 1);
  EXPECT_EQ(process_token().value(), "from-env");
  ::unsetenv("ARLO_TOKEN");
  ::unsetenv("ARLO_TOKEN_FILE");
  std::filesystem::remove_all(dir);
}

TEST(ConfinedPath, NamesStayInTheirDirectory) {
  const std::filesystem::path dir = "/run/w/v3";
  EXPECT_EQ(confined_path(dir, "model-00001-of-00002.safetensors", "shard").value(),
            dir / "model-00001-of-00002.safetensors");
  EXPECT_EQ(confined_path(dir, "payload/bucket-00001.bin", "file").value(), dir / "payload/bucket-00001.bin");
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./x", "a/.", "a\\b"}) {
    auto r = confined_path(dir, bad, "shard name in /run/w/v3/manifest.json");
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message().find("shard name in /run/w/v3/manifest.json"), std::string::npos)
        << r.error().message();
    EXPECT_NE(r.error().message().find(std::string("'") + bad + "'"), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE(confined_path(dir, std::string("a\0b", 3), "x"));
}

}  // namespace
}  // namespace arlo::auth
