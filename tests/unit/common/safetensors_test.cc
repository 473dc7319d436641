// safetensors reader and writer: round trips of every dtype and odd shape, the streaming writer's
// contract (chunking, atomic rename, no file left behind), and a long list of hostile files that
// must each give an Error naming the file (and the tensor, where one is involved).
#include "common/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/temp_dir.h"

namespace arlo::safetensors {
namespace {

namespace fs = std::filesystem;
using test_files::TempDir;
using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                                DType::I64, DType::I32, DType::I16, DType::I8,   DType::U8,      DType::BOOL};

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

std::size_t numel_of(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// A whole file image: 8-byte little-endian `length`, then `header`, then `data`.
std::string image(std::uint64_t length, const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + data;
}
std::string image(const std::string& header, const std::string& data = "") {
  return image(header.size(), header, data);
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// --------------------------------------------------------------------------------------------
// dtypes
// --------------------------------------------------------------------------------------------

TEST(SafetensorsDType, NamesRoundTripAndSizes) {
  for (DType d : kAllDTypes) {
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
  }
  const std::pair<DType, std::size_t> sizes[] = {
      {DType::F64, 8}, {DType::I64, 8},     {DType::F32, 4},     {DType::I32, 4}, {DType::F16, 2}, {DType::BF16, 2},
      {DType::I16, 2}, {DType::F8_E4M3, 1}, {DType::F8_E5M2, 1}, {DType::I8, 1},  {DType::U8, 1},  {DType::BOOL, 1}};
  for (const auto& [dtype, size] : sizes) EXPECT_EQ(dtype_size(dtype), size) << dtype_name(dtype);
  EXPECT_FALSE(parse_dtype("f32"));
  EXPECT_FALSE(parse_dtype("U16"));
  EXPECT_FALSE(parse_dtype(""));
}

// --------------------------------------------------------------------------------------------
// Round trips
// --------------------------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDTypeWithMetadata) {
  TempDir dir;
  const fs::path path = dir.path() / "all.safetensors";
  std::vector<std::vector<std::byte>> payloads;
  std::vector<TensorData> tensors;
  std::uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    payloads.push_back(random_bytes(15 * dtype_size(d), seed++));
  }
  for (std::size_t i = 0; i < std::size(kAllDTypes); ++i) {
    tensors.push_back({{"t." + std::string(dtype_name(kAllDTypes[i])), kAllDTypes[i], {3, 5}}, payloads[i]});
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "42"}, {"quotes \"and\" \\slashes", "line\nbreak\ttab\x01"}, {"unicode", "héllo ✓ 𝔸"}};
  ASSERT_TRUE(write_file(path, tensors, metadata));

  auto file = File::open(path);
  ASSERT_TRUE(file) << file.error().what();
  EXPECT_EQ(file->header().metadata, metadata);
  ASSERT_EQ(file->header().tensors.size(), std::size(kAllDTypes));
  for (std::size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const TensorInfo* info = file->header().find(tensors[i].decl.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, kAllDTypes[i]);
    EXPECT_EQ(info->shape, (std::vector<std::int64_t>{3, 5}));
    EXPECT_EQ(info->numel(), 15u);
    EXPECT_EQ(info->nbytes, payloads[i].size());
    auto bytes = file->data(*info);
    ASSERT_EQ(bytes.size(), payloads[i].size());
    EXPECT_EQ(std::memcmp(bytes.data(), payloads[i].data(), bytes.size()), 0) << info->name;
  }
}

TEST(SafetensorsRoundTrip, HeaderIsPaddedSoDataIsAligned) {
  TempDir dir;
  for (int name_len = 1; name_len <= 9; ++name_len) {
    const fs::path path = dir.path() / ("p" + std::to_string(name_len));
    auto bytes = random_bytes(4, 7);
    ASSERT_TRUE(write_file(path, {{{std::string(name_len, 'x'), DType::F32, {1}}, bytes}}));
    std::ifstream in(path, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(fs::file_size(path), 8 + n + 4);
  }
}

TEST(SafetensorsRoundTrip, OddShapesAndZeroSizeTensors) {
  TempDir dir;
  const fs::path path = dir.path() / "odd.safetensors";
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> shapes = {
      {"empty_first", {0}},   {"scalar", {}},
      {"one", {1}},           {"seven", {7}},
      {"ones", {1, 1, 1, 1}}, {"zero_mid", {3, 0, 5}},
      {"odd", {3, 7, 11}},    {"rank16", std::vector<std::int64_t>(16, 1)},
      {"empty_last", {0, 4}},
  };
  std::vector<std::vector<std::byte>> payloads;
  std::vector<TensorData> tensors;
  std::uint32_t seed = 100;
  for (const auto& [name, shape] : shapes) payloads.push_back(random_bytes(numel_of(shape) * 2, seed++));
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    tensors.push_back({{shapes[i].first, DType::BF16, shapes[i].second}, payloads[i]});
  }
  ASSERT_TRUE(write_file(path, tensors));
  auto file = File::open(path);
  ASSERT_TRUE(file) << file.error().what();
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const TensorInfo* info = file->header().find(shapes[i].first);
    ASSERT_NE(info, nullptr) << shapes[i].first;
    EXPECT_EQ(info->shape, shapes[i].second);
    EXPECT_EQ(info->numel(), numel_of(shapes[i].second));
    auto bytes = file->data(shapes[i].first);
    ASSERT_TRUE(bytes);
    ASSERT_EQ(bytes->size(), payloads[i].size());
    if (!payloads[i].empty()) {
      EXPECT_EQ(std::memcmp(bytes->data(), payloads[i].data(), bytes->size()), 0);
    }
  }
  EXPECT_EQ(file->header().find("scalar")->numel(), 1u);
  EXPECT_EQ(file->header().find("zero_mid")->nbytes, 0u);
}

TEST(SafetensorsRoundTrip, OnlyZeroSizeTensorsAndNoTensors) {
  TempDir dir;
  ASSERT_TRUE(write_file(dir.path() / "z", {{{"a", DType::F32, {0}}, {}}, {{"b", DType::I64, {2, 0}}, {}}}));
  auto z = File::open(dir.path() / "z");
  ASSERT_TRUE(z) << z.error().what();
  EXPECT_EQ(z->header().tensors.size(), 2u);
  EXPECT_TRUE(z->data("b")->empty());

  ASSERT_TRUE(write_file(dir.path() / "none", {}, {{"only", "metadata"}}));
  auto none = File::open(dir.path() / "none");
  ASSERT_TRUE(none) << none.error().what();
  EXPECT_TRUE(none->header().tensors.empty());
  EXPECT_EQ(none->header().metadata.at("only"), "metadata");
}

TEST(SafetensorsRoundTrip, ReadsMapInPlaceWithoutCopies) {
  TempDir dir;
  auto a = random_bytes(12, 1), b = random_bytes(20, 2);
  ASSERT_TRUE(write_file(dir.path() / "m", {{{"a", DType::U8, {12}}, a}, {{"b", DType::U8, {20}}, b}}));
  auto file = File::open(dir.path() / "m");
  ASSERT_TRUE(file);
  auto sa = *file->data("a"), sb = *file->data("b");
  // Both spans point into one mapping, laid out exactly as in the file.
  EXPECT_EQ(sa.data() + sa.size(), sb.data());
  // Moving the File keeps the spans valid (the mapping moves with it).
  File moved = std::move(*file);
  EXPECT_EQ(moved.data(*moved.header().find("b")).data(), sb.data());
  EXPECT_EQ(std::memcmp(sb.data(), b.data(), b.size()), 0);
}

TEST(SafetensorsRoundTrip, FromBytesMatchesOpen) {
  TempDir dir;
  auto a = random_bytes(64, 3);
  ASSERT_TRUE(write_file(dir.path() / "f", {{{"w", DType::F16, {4, 8}}, a}}, {{"k", "v"}}));
  std::ifstream in(dir.path() / "f", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(s.size());
  std::memcpy(bytes.data(), s.data(), s.size());
  auto file = File::from_bytes(std::move(bytes), "socket:batch");
  ASSERT_TRUE(file) << file.error().what();
  EXPECT_EQ(file->header().metadata.at("k"), "v");
  EXPECT_EQ(std::memcmp(file->data("w")->data(), a.data(), a.size()), 0);
  File moved = std::move(*file);
  EXPECT_EQ(std::memcmp(moved.data("w")->data(), a.data(), a.size()), 0);

  auto bad = File::from_bytes({}, "socket:empty");
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().what(), HasSubstr("socket:empty"));
}

TEST(SafetensorsRoundTrip, MissingTensorIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(write_file(dir.path() / "f", {{{"w", DType::U8, {1}}, random_bytes(1, 1)}}));
  auto file = File::open(dir.path() / "f");
  ASSERT_TRUE(file);
  auto missing = file->data("nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_THAT(missing.error().what(), HasSubstr("'nope'"));
  EXPECT_THAT(missing.error().what(), HasSubstr((dir.path() / "f").string()));
}

TEST(SafetensorsRoundTrip, SerializeThenParseHeader) {
  Header h;
  h.metadata = {{"a", "b"}};
  h.tensors.push_back({"x", DType::I32, {2, 3}, 0, 24});
  h.tensors.push_back({"y", DType::BOOL, {5}, 24, 5});
  const std::string json = serialize_header(h);
  EXPECT_EQ(json.size() % 8, 0u);
  auto parsed = parse_header(json, 29);
  ASSERT_TRUE(parsed) << parsed.error().what();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[1].name, "y");
  EXPECT_EQ(parsed->tensors[1].offset, 24u);
  EXPECT_EQ(parsed->metadata, h.metadata);
}

// Other writers order entries freely and may put __metadata__ anywhere.
TEST(SafetensorsRoundTrip, AcceptsAnyKeyOrderAndWhitespace) {
  const std::string header =
      " {\n \"b\" : {\"data_offsets\":[4,6], \"shape\":[1], \"dtype\":\"F16\"},\n"
      "  \"__metadata__\": {\"x\": \"y\"},\n \"a\": {\"shape\":[], \"dtype\":\"F32\", \"data_offsets\":[0,4]} }\t ";
  auto parsed = parse_file_bytes(as_bytes(image(header, "abcdef")), "mem");
  ASSERT_TRUE(parsed) << parsed.error().what();
  ASSERT_EQ(parsed->header.tensors.size(), 2u);
  EXPECT_EQ(parsed->header.tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(parsed->header.tensors[1].name, "b");
  EXPECT_EQ(parsed->data_start, 8 + header.size());
}

// --------------------------------------------------------------------------------------------
// Streaming writer
// --------------------------------------------------------------------------------------------

TEST(SafetensorsWriter, ChunkedWritesAcrossTensorBoundaries) {
  TempDir dir;
  const fs::path path = dir.path() / "chunked.safetensors";
  const std::vector<TensorDecl> decls = {
      {"small", DType::U8, {3}},
      {"big", DType::F32, {700, 1000}},  // 2.8 MB: larger than the writer's internal buffer
      {"empty", DType::I16, {0}},
      {"tail", DType::I64, {17}},
  };
  std::size_t total = 3 + 2'800'000 + 0 + 136;
  const auto payload = random_bytes(total, 99);
  auto writer = Writer::create(path, decls, {{"k", "v"}});
  ASSERT_TRUE(writer) << writer.error().what();
  std::mt19937 rng(5);
  std::size_t pos = 0;
  while (pos < total) {
    const std::size_t sizes[] = {1, 2, 7, 4096, 65537, 1'500'000};
    std::size_t n = std::min(sizes[rng() % std::size(sizes)], total - pos);
    ASSERT_TRUE(writer->write(std::span(payload).subspan(pos, n)));
    pos += n;
    EXPECT_FALSE(fs::exists(path)) << "the target must not appear before finish()";
  }
  ASSERT_TRUE(writer->finish(/*fsync=*/true));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"chunked.safetensors"});

  auto file = File::open(path);
  ASSERT_TRUE(file) << file.error().what();
  std::size_t off = 0;
  for (const auto& d : decls) {
    auto bytes = *file->data(d.name);
    ASSERT_EQ(std::memcmp(bytes.data(), payload.data() + off, bytes.size()), 0) << d.name;
    off += bytes.size();
  }
}

TEST(SafetensorsWriter, DroppedWriterLeavesNoFile) {
  TempDir dir;
  const fs::path path = dir.path() / "dropped.safetensors";
  {
    auto writer = Writer::create(path, {{"a", DType::F32, {4}}});
    ASSERT_TRUE(writer);
    EXPECT_EQ(dir.entries().size(), 1u);  // the hidden temporary
    ASSERT_TRUE(writer->write(as_bytes(std::string(8, 'x'))));
  }
  EXPECT_TRUE(dir.entries().empty());
  {
    auto writer = Writer::create(path, {{"a", DType::F32, {4}}});
    ASSERT_TRUE(writer);
    ASSERT_TRUE(writer->write(as_bytes(std::string(16, 'x'))));  // complete, but never finished
  }
  EXPECT_TRUE(dir.entries().empty());
  {
    auto writer = Writer::create(path, {{"a", DType::F32, {4}}});
    ASSERT_TRUE(writer);
    Writer other = std::move(*writer);  // the moved-from writer owns nothing
    auto assigned = Writer::create(dir.path() / "second", {{"b", DType::U8, {1}}});
    ASSERT_TRUE(assigned);
    other = std::move(*assigned);  // drops the first temporary
    EXPECT_EQ(dir.entries().size(), 1u);
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, FinishRequiresEveryByteAndReplacesAtomically) {
  TempDir dir;
  const fs::path path = dir.path() / "out";
  write_raw(path, "previous contents");
  {
    auto writer = Writer::create(path, {{"a", DType::I32, {2}}});
    ASSERT_TRUE(writer);
    ASSERT_TRUE(writer->write(as_bytes(std::string(4, 'x'))));
    auto st = writer->finish();
    ASSERT_FALSE(st);
    EXPECT_THAT(st.error().what(), HasSubstr("4 of 8"));
    auto over = writer->write(as_bytes(std::string(5, 'x')));
    ASSERT_FALSE(over);
    EXPECT_THAT(over.error().what(), HasSubstr("exceed"));
  }
  std::ifstream in(path);
  std::string old((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(old, "previous contents");
  EXPECT_EQ(dir.entries().size(), 1u);

  auto writer = Writer::create(path, {{"a", DType::I32, {2}}});
  ASSERT_TRUE(writer);
  ASSERT_TRUE(writer->write_tensor("a", as_bytes(std::string(8, 'y'))));
  ASSERT_TRUE(writer->finish());
  EXPECT_FALSE(writer->finish());  // only once
  EXPECT_FALSE(writer->write({}));
  auto file = File::open(path);
  ASSERT_TRUE(file) << file.error().what();
  EXPECT_EQ(dir.entries().size(), 1u);
}

TEST(SafetensorsWriter, WriteTensorChecksOrderSizeAndName) {
  TempDir dir;
  auto writer = Writer::create(dir.path() / "w", {{"a", DType::F32, {2}}, {"b", DType::U8, {3}}});
  ASSERT_TRUE(writer);
  auto wrong_order = writer->write_tensor("b", as_bytes("abc"));
  ASSERT_FALSE(wrong_order);
  EXPECT_THAT(wrong_order.error().what(), HasSubstr("declaration order"));
  auto wrong_size = writer->write_tensor("a", as_bytes("abc"));
  ASSERT_FALSE(wrong_size);
  EXPECT_THAT(wrong_size.error().what(), HasSubstr("needs 8 bytes, got 3"));
  auto unknown = writer->write_tensor("c", as_bytes("abc"));
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(writer->write_tensor("a", as_bytes("12345678")));
  ASSERT_TRUE(writer->write_tensor("b", as_bytes("abc")));
  ASSERT_TRUE(writer->finish());
}

TEST(SafetensorsWriter, RejectsBadDeclarations) {
  TempDir dir;
  const fs::path p = dir.path() / "bad";
  const std::vector<std::vector<TensorDecl>> cases = {
      {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}},         // duplicate
      {{"__metadata__", DType::F32, {1}}},                      // reserved
      {{"neg", DType::F32, {2, -1}}},                           // negative dim
      {{"huge", DType::F64, {1ll << 40, 1ll << 40}}},           // byte size overflow
      {{"rank", DType::U8, std::vector<std::int64_t>(17, 1)}},  // rank limit
      {{std::string("bad\xff utf8"), DType::U8, {1}}},          // name not UTF-8
  };
  for (const auto& decls : cases) {
    auto w = Writer::create(p, decls);
    ASSERT_FALSE(w) << decls[0].name;
    EXPECT_EQ(w.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(w.error().what(), HasSubstr(p.string()));
  }
  EXPECT_FALSE(Writer::create(p, {}, {{"k", "\xc0\xaf"}}));  // overlong UTF-8 in metadata
  auto no_dir = Writer::create(dir.path() / "missing" / "x", {});
  ASSERT_FALSE(no_dir);
  EXPECT_EQ(no_dir.error().code(), ErrorCode::kIo);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsWriter, WriteFileRejectsWrongByteCounts) {
  TempDir dir;
  auto bytes = random_bytes(3, 1);
  auto st = write_file(dir.path() / "x", {{{"a", DType::F32, {1}}, bytes}});
  ASSERT_FALSE(st);
  EXPECT_THAT(st.error().what(), HasSubstr("'a'"));
  EXPECT_TRUE(dir.entries().empty());
}

// --------------------------------------------------------------------------------------------
// Hostile files
// --------------------------------------------------------------------------------------------

struct Hostile {
  std::string label;
  std::string bytes;         // the whole file
  std::string must_mention;  // besides the file name; "" for nothing specific
};

std::string tensor(const std::string& name, const std::string& dtype, const std::string& shape,
                   const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

std::vector<Hostile> hostile_files() {
  const std::string ok4 = "{" + tensor("w", "F32", "[1]", "[0,4]") + "}";
  std::vector<Hostile> v = {
      {"empty file", "", "too short"},
      {"seven bytes", std::string(7, '\0'), "too short"},
      {"length only, empty header", image(""), "malformed JSON"},
      {"truncated header", image(100, "{\"w\":{\"dtype\""), "runs past the end"},
      {"length one past the end", image(ok4.size() + 5, ok4, "abcd"), "runs past the end"},
      {"length 2^64-1", image(~0ull, ok4, "abcd"), "exceeds the limit"},
      {"length above 100 MiB", image((100ull << 20) + 1, ok4, "abcd"), "exceeds the limit"},
      {"length shorter than the JSON", image(ok4.size() - 3, ok4, "abcd"), "malformed JSON"},
      {"header is an array", image("[]"), "must be a JSON object"},
      {"header is a string", image("\"abc\""), "must be a JSON object"},
      {"header is a number", image("12"), "must be a JSON object"},
      {"header is null", image("null"), "must be a JSON object"},
      {"unclosed object", image("{"), "malformed JSON"},
      {"missing value", image("{\"a\":}"), "malformed JSON"},
      {"missing colon", image("{\"a\" {}}"), "malformed JSON"},
      {"trailing garbage", image("{}  x"), "malformed JSON"},
      {"two objects", image("{}{}"), "malformed JSON"},
      {"trailing comma", image("{" + tensor("w", "F32", "[1]", "[0,4]") + ",}", "abcd"), "malformed JSON"},
      {"comment", image("{/* c */}"), "malformed JSON"},
      {"NUL inside header", image(std::string("{\"a\0\":1}", 9)), ""},
      {"NUL padding after JSON", image(std::string("{}\0\0\0\0\0\0", 8)), "malformed JSON"},
      {"NUL then garbage after JSON", image(std::string("{}\0garbage", 10)), "NUL byte"},
      {"single quotes", image("{'a':1}"), "malformed JSON"},
      {"bad escape", image("{\"\\q\":{}}"), "malformed JSON"},
      {"short unicode escape", image("{\"\\u12\":{}}"), "malformed JSON"},
      {"lone surrogate escape", image("{\"\\ud800\":{}}"), "malformed JSON"},
      {"invalid UTF-8 in a name", image("{\"\xff\xfe\":{}}"), "malformed JSON"},
      {"overlong UTF-8 in metadata", image("{\"__metadata__\":{\"k\":\"\xc0\xaf\"}}"), "malformed JSON"},
      {"truncated UTF-8 sequence", image("{\"__metadata__\":{\"k\":\"\xe2\x82\"}}"), "malformed JSON"},
      {"encoded surrogate", image("{\"__metadata__\":{\"k\":\"\xed\xa0\x80\"}}"), "malformed JSON"},
      {"raw control character in a string", image("{\"__metadata__\":{\"k\":\"a\x01\"}}"), "malformed JSON"},
      {"deep array nesting", image(std::string(200000, '[') + std::string(200000, ']')), "JSON object"},
      {"deep object nesting in metadata",
       image("{\"__metadata__\":" +
             [] {
               std::string s;
               for (int i = 0; i < 100000; ++i) s += "{\"a\":";
               return s + "1" + std::string(100000, '}');
             }() +
             "}"),
       "must be a string"},
      {"deep nesting in a tensor",
       image("{\"w\":{\"shape\":" + std::string(100000, '[') + std::string(100000, ']') + "}}"), "'w'"},
      {"metadata value is a number", image("{\"__metadata__\":{\"k\":1}}"), "must be a string"},
      {"metadata value is an object", image("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}"), "must be a string"},
      {"metadata value is null", image("{\"__metadata__\":{\"k\":null}}"), "must be a string"},
      {"metadata value is an array", image("{\"__metadata__\":{\"k\":[\"x\"]}}"), "must be a string"},
      {"metadata is a string", image("{\"__metadata__\":\"x\"}"), "__metadata__ must be an object"},
      {"duplicate metadata", image("{\"__metadata__\":{},\"__metadata__\":{}}"), "duplicate"},
      {"duplicate metadata key", image("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}"), "duplicate"},
      {"tensor entry is an array", image("{\"w\":[1]}"), "'w'"},
      {"tensor entry is a string", image("{\"w\":\"F32\"}"), "'w'"},
      {"unknown dtype", image("{" + tensor("w", "F128", "[1]", "[0,4]") + "}", "abcd"), "unknown dtype"},
      {"lowercase dtype", image("{" + tensor("w", "f32", "[1]", "[0,4]") + "}", "abcd"), "unknown dtype"},
      {"unsupported dtype U16", image("{" + tensor("w", "U16", "[2]", "[0,4]") + "}", "abcd"), "unknown dtype"},
      {"dtype is a number", image("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"), "dtype"},
      {"negative dimension", image("{" + tensor("w", "F32", "[-1]", "[0,4]") + "}", "abcd"), "negative"},
      {"fractional dimension", image("{" + tensor("w", "F32", "[1.5]", "[0,4]") + "}", "abcd"), "not an integer"},
      {"dimension 1e30", image("{" + tensor("w", "F32", "[1e30]", "[0,4]") + "}", "abcd"), "not an integer"},
      {"dimension beyond uint64", image("{" + tensor("w", "U8", "[99999999999999999999999]", "[0,4]") + "}", "abcd"),
       "not an integer"},
      {"dimension above 2^63-1", image("{" + tensor("w", "U8", "[9223372036854775808]", "[0,4]") + "}", "abcd"),
       "above 2^63-1"},
      {"dimension is a string", image("{" + tensor("w", "F32", "[\"1\"]", "[0,4]") + "}", "abcd"), "'w'"},
      {"nested shape", image("{" + tensor("w", "F32", "[[1]]", "[0,4]") + "}", "abcd"), "'w'"},
      {"shape is a number", image("{" + tensor("w", "F32", "1", "[0,4]") + "}", "abcd"), "must be an array"},
      {"rank above the limit",
       image("{" + tensor("w", "U8", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "[0,1]") + "}", "a"), "more than 16"},
      {"element count overflow", image("{" + tensor("w", "I8", "[4294967296,4294967296,2]", "[0,4]") + "}", "abcd"),
       "overflows"},
      {"byte size overflow", image("{" + tensor("w", "F64", "[2305843009213693952]", "[0,4]") + "}", "abcd"),
       "overflows"},
      {"product wraps to the right size",
       image("{" + tensor("w", "U8", "[4294967296,4294967296,4]", "[0,4]") + "}", "abcd"), "overflows"},
      {"one data offset", image("{" + tensor("w", "F32", "[1]", "[0]") + "}", "abcd"), "[begin, end]"},
      {"three data offsets", image("{" + tensor("w", "F32", "[1]", "[0,4,8]") + "}", "abcd"), "[begin, end]"},
      {"no data offsets", image("{" + tensor("w", "F32", "[1]", "[]") + "}", "abcd"), "[begin, end]"},
      {"data offsets are strings", image("{" + tensor("w", "F32", "[1]", "[\"0\",\"4\"]") + "}", "abcd"), "'w'"},
      {"data offsets is an object", image("{" + tensor("w", "F32", "[1]", "{\"0\":4}") + "}", "abcd"), "'w'"},
      {"negative data offset", image("{" + tensor("w", "F32", "[1]", "[-4,0]") + "}", "abcd"), "negative"},
      {"float data offset", image("{" + tensor("w", "F32", "[1]", "[0,4.0]") + "}", "abcd"), "not an integer"},
      {"begin after end", image("{" + tensor("w", "F32", "[0]", "[4,0]") + "}", "abcd"), "begin after end"},
      {"end past the data", image("{" + tensor("w", "F32", "[2]", "[0,8]") + "}", "abcd"), "past the data section"},
      {"end at 2^64-1",
       image("{" + tensor("w", "F32", "[1]", "[18446744073709551611,18446744073709551615]") + "}", "abcd"),
       "past the data section"},
      {"zero-size tensor past the data", image("{" + tensor("z", "F32", "[0]", "[10,10]") + "}"),
       "past the data section"},
      {"byte size does not match shape", image("{" + tensor("w", "F32", "[2]", "[0,4]") + "}", "abcd"),
       "needs 8 bytes"},
      {"shape zero but bytes present", image("{" + tensor("w", "F32", "[0]", "[0,4]") + "}", "abcd"), "needs 0 bytes"},
      {"overlap",
       image("{" + tensor("a", "F32", "[2]", "[0,8]") + "," + tensor("b", "F32", "[2]", "[4,12]") + "}",
             std::string(12, 'x')),
       "overlaps"},
      {"identical ranges",
       image("{" + tensor("a", "F32", "[1]", "[0,4]") + "," + tensor("b", "F32", "[1]", "[0,4]") + "}", "abcd"),
       "overlaps"},
      {"gap",
       image("{" + tensor("a", "F32", "[1]", "[0,4]") + "," + tensor("b", "F32", "[1]", "[8,12]") + "}",
             std::string(12, 'x')),
       "gap"},
      {"gap at the start", image("{" + tensor("a", "F32", "[1]", "[4,8]") + "}", std::string(8, 'x')), "gap"},
      {"trailing uncovered bytes", image("{" + tensor("a", "F32", "[1]", "[0,4]") + "}", std::string(8, 'x')),
       "cover only 4"},
      {"data but no tensors", image("{}", "abcd"), "cover only 0"},
      {"duplicate tensor name",
       image("{" + tensor("a", "F32", "[1]", "[0,4]") + "," + tensor("a", "F32", "[1]", "[4,8]") + "}",
             std::string(8, 'x')),
       "duplicate tensor name 'a'"},
      {"repeated field",
       image("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"),
       "repeats field"},
      {"missing dtype", image("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"), "has no dtype"},
      {"missing shape", image("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "abcd"), "has no shape"},
      {"missing data offsets", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", "abcd"), "has no data_offsets"},
      {"unknown field", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", "abcd"),
       "unknown field 'x'"},
      {"empty tensor object", image("{\"w\":{}}"), "'w'"},
  };
  return v;
}

TEST(SafetensorsHostile, EveryMalformedFileIsAnErrorNamingTheFile) {
  TempDir dir;
  int i = 0;
  for (const Hostile& h : hostile_files()) {
    const fs::path path = dir.path() / ("hostile_" + std::to_string(i++) + ".safetensors");
    write_raw(path, h.bytes);
    auto file = File::open(path);
    ASSERT_FALSE(file) << h.label << ": accepted";
    const std::string what = file.error().what();
    EXPECT_THAT(what, HasSubstr(path.string())) << h.label;
    if (!h.must_mention.empty()) {
      EXPECT_THAT(what, HasSubstr(h.must_mention)) << h.label;
    }
    EXPECT_LT(what.size(), 1000u) << h.label << ": messages stay short whatever the input";
    // The same image through the in-memory path gives the same verdict.
    auto mem = parse_file_bytes(as_bytes(h.bytes), "mem");
    ASSERT_FALSE(mem) << h.label;
    EXPECT_EQ(mem.error().what(), std::string(what).replace(what.find(path.string()), path.string().size(), "mem"))
        << h.label;
  }
}

TEST(SafetensorsHostile, HeaderLimitErrorsAreResourceExhausted) {
  auto big = parse_file_bytes(as_bytes(image(~0ull, "{}")), "mem");
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code(), ErrorCode::kResourceExhausted);

  Limits small;
  small.max_header_bytes = 16;
  const std::string header = "{\"__metadata__\":{\"k\":\"a long enough value\"}}";
  auto limited = parse_file_bytes(as_bytes(image(header)), "mem", small);
  ASSERT_FALSE(limited);
  EXPECT_EQ(limited.error().code(), ErrorCode::kResourceExhausted);

  Limits two;
  two.max_tensors = 2;
  const std::string three = "{" + tensor("a", "U8", "[1]", "[0,1]") + "," + tensor("b", "U8", "[1]", "[1,2]") + "," +
                            tensor("c", "U8", "[1]", "[2,3]") + "}";
  auto many = parse_file_bytes(as_bytes(image(three, "abc")), "mem", two);
  ASSERT_FALSE(many);
  EXPECT_EQ(many.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(parse_file_bytes(as_bytes(image(three, "abc")), "mem"));
}

TEST(SafetensorsHostile, NotARegularFileOrMissing) {
  TempDir dir;
  auto d = File::open(dir.path());
  ASSERT_FALSE(d);
  EXPECT_THAT(d.error().what(), HasSubstr("not a regular file"));
  auto missing = File::open(dir.path() / "nope.safetensors");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_THAT(missing.error().what(), HasSubstr("nope.safetensors"));
}

// A seeded mutation sweep over a valid file: every outcome is either a clean Error or a header
// whose spans all lie inside the image (checked by touching every byte).
TEST(SafetensorsHostile, RandomMutationsNeverEscapeTheBuffer) {
  TempDir dir;
  ASSERT_TRUE(write_file(dir.path() / "seed",
                         {{{"a", DType::F32, {2, 3}}, random_bytes(24, 1)},
                          {{"b", DType::U8, {0}}, {}},
                          {{"c", DType::BF16, {5}}, random_bytes(10, 2)}},
                         {{"step", "7"}}));
  std::ifstream in(dir.path() / "seed", std::ios::binary);
  const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % m.size();
      switch (rng() % 4) {
        case 0: m[pos] = static_cast<char>(rng() & 0xff); break;
        case 1: m.erase(pos, 1 + rng() % 8); break;
        case 2: m.insert(pos, 1, "{}[],:\"0123456789-e."[rng() % 20]); break;
        case 3: m.resize(pos); break;
      }
      if (m.empty()) break;
    }
    std::vector<std::byte> bytes(m.size());
    if (!m.empty()) std::memcpy(bytes.data(), m.data(), m.size());
    auto file = File::from_bytes(std::move(bytes), "mutant");
    if (!file) continue;
    ++accepted;
    unsigned sum = 0;
    for (const auto& t : file->header().tensors) {
      for (std::byte b : file->data(t)) sum += std::to_integer<unsigned>(b);
    }
    (void)sum;
  }
  EXPECT_GT(accepted, 0);  // some mutations (metadata bytes, data bytes) stay valid
}

}  // namespace
}  // namespace arlo::safetensors
