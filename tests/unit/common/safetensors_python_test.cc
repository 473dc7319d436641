// Interoperability with an independent reader/writer (tests/unit/common/python/read_safetensors.py,
// written from the format description with numpy) run as a real python3 process: a file arlo
// writes must verify there, and a file Python writes must read here with the right values.
// The value pattern is documented in the script and mirrored by expected_bytes() below.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/temp_dir.h"

namespace arlo::safetensors {
namespace {

namespace fs = std::filesystem;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
};

const std::vector<Spec> kSpecs = {
    {"model.f64", DType::F64, {2, 3}},       {"model.f32", DType::F32, {3, 5, 2}},
    {"model.f16", DType::F16, {17}},         {"model.bf16", DType::BF16, {4, 4}},
    {"model.f8_e4m3", DType::F8_E4M3, {33}}, {"model.f8_e5m2", DType::F8_E5M2, {2, 2, 2, 2}},
    {"model.i64", DType::I64, {5}},          {"model.i32", DType::I32, {1, 7}},
    {"model.i16", DType::I16, {9}},          {"model.i8", DType::I8, {10, 3}},
    {"model.u8", DType::U8, {255}},          {"model.bool", DType::BOOL, {13}},
    {"empty", DType::F32, {0, 3}},           {"scalar", DType::I32, {}},
};
const std::map<std::string, std::string> kMetadata = {{"writer", "arlo"}, {"step", "3"}, {"unicode", "✓ é"}};

std::size_t numel(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// Encodes a value that is exactly representable (the pattern's multiples of 0.5 in [-4, 3.5])
// into a binary float with the given exponent/mantissa widths and bias.
std::uint32_t encode_small_float(double v, int man_bits, int bias) {
  if (v == 0) return 0;
  const std::uint32_t sign = v < 0 ? 1u : 0u;
  const double a = std::fabs(v);
  const int e = static_cast<int>(std::floor(std::log2(a)));
  const double frac = a / std::ldexp(1.0, e) - 1.0;
  const auto man = static_cast<std::uint32_t>(std::lround(frac * std::ldexp(1.0, man_bits)));
  const int exp_bits = man_bits == 10 ? 5 : man_bits == 3 ? 4 : 5;
  return (sign << (exp_bits + man_bits)) | (static_cast<std::uint32_t>(e + bias) << man_bits) | man;
}

template <typename T>
void append(std::vector<std::byte>& out, T v) {
  std::byte b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
  out.insert(out.end(), b, b + sizeof(T));
}

std::vector<std::byte> expected_bytes(DType dtype, std::size_t count) {
  std::vector<std::byte> out;
  for (std::size_t idx = 0; idx < count; ++idx) {
    const auto i = static_cast<std::int64_t>(idx);
    const double f = static_cast<double>((i % 16) - 8) * 0.5;
    const std::int64_t k = (i * 37) % 251 - 125;
    switch (dtype) {
      case DType::F64: append(out, f); break;
      case DType::F32: append(out, static_cast<float>(f)); break;
      case DType::F16: append(out, static_cast<std::uint16_t>(encode_small_float(f, 10, 15))); break;
      case DType::BF16: {
        const auto x = static_cast<float>(f);
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        append(out, static_cast<std::uint16_t>(bits >> 16));
        break;
      }
      case DType::F8_E4M3: append(out, static_cast<std::uint8_t>(encode_small_float(f, 3, 7))); break;
      case DType::F8_E5M2: append(out, static_cast<std::uint8_t>(encode_small_float(f, 2, 15))); break;
      case DType::I64: append(out, static_cast<std::int64_t>(k * 1000000007)); break;
      case DType::I32: append(out, static_cast<std::int32_t>(k * 1000003)); break;
      case DType::I16: append(out, static_cast<std::int16_t>(k * 211)); break;
      case DType::I8: append(out, static_cast<std::int8_t>(k)); break;
      case DType::U8: append(out, static_cast<std::uint8_t>((i * 37) % 251 + 2)); break;
      case DType::BOOL: append(out, static_cast<std::uint8_t>(i % 3 == 0)); break;
    }
  }
  return out;
}

class SafetensorsPython : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("ARLO_SOURCE_DIR");
    ASSERT_NE(src, nullptr) << "ARLO_SOURCE_DIR is set by ctest";
    script_ = fs::path(src) / "tests/unit/common/python/read_safetensors.py";
    ASSERT_TRUE(fs::exists(script_)) << script_;
    nlohmann::json spec = {{"metadata", kMetadata}, {"tensors", nlohmann::json::array()}};
    for (const auto& s : kSpecs) {
      spec["tensors"].push_back({{"name", s.name}, {"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}});
    }
    spec_ = dir_ / "spec.json";
    std::ofstream(spec_) << spec.dump();
  }

  // Runs the script in a child process; returns its exit status and fills `output`.
  int run_python(const std::string& mode, const fs::path& file, std::string& output) {
    const fs::path log = dir_ / "python.log";
    const std::string cmd = std::string(ARLO_PYTHON3) + " '" + script_.string() + "' " + mode + " '" + file.string() +
                            "' '" + spec_.string() + "' > '" + log.string() + "' 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(log);
    output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  const test_files::TempDir tmp_{"arlo-stpy"};
  const fs::path& dir_ = tmp_.path();
  fs::path script_, spec_;
};

TEST_F(SafetensorsPython, PythonReaderVerifiesWhatArloWrote) {
  std::vector<std::vector<std::byte>> payloads;
  for (const auto& s : kSpecs) payloads.push_back(expected_bytes(s.dtype, numel(s.shape)));
  std::vector<TensorData> tensors;
  for (std::size_t i = 0; i < kSpecs.size(); ++i) {
    tensors.push_back({{kSpecs[i].name, kSpecs[i].dtype, kSpecs[i].shape}, payloads[i]});
  }
  const fs::path file = dir_ / "arlo.safetensors";
  ASSERT_TRUE(write_file(file, tensors, kMetadata));
  std::string out;
  EXPECT_EQ(run_python("verify", file, out), 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("verified 14 tensors"));

  // The check can fail: change the file's last byte (the top byte of "scalar", declared last) and
  // the independent reader must notice.
  const fs::path corrupt = dir_ / "corrupt.safetensors";
  fs::copy_file(file, corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x07');
  }
  EXPECT_EQ(run_python("verify", corrupt, out), 1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("mismatch"));
}

TEST_F(SafetensorsPython, ArloReadsWhatPythonWrote) {
  const fs::path file = dir_ / "python.safetensors";
  std::string out;
  ASSERT_EQ(run_python("write", file, out), 0) << out;
  auto st = File::open(file);
  ASSERT_TRUE(st) << st.error().what();
  EXPECT_EQ(st->header().metadata, kMetadata);
  ASSERT_EQ(st->header().tensors.size(), kSpecs.size());
  for (const auto& s : kSpecs) {
    const TensorInfo* info = st->header().find(s.name);
    ASSERT_NE(info, nullptr) << s.name;
    EXPECT_EQ(info->dtype, s.dtype) << s.name;
    EXPECT_EQ(info->shape, s.shape) << s.name;
    const auto want = expected_bytes(s.dtype, numel(s.shape));
    const auto got = st->data(*info);
    ASSERT_EQ(got.size(), want.size()) << s.name;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << s.name;
  }
}

}  // namespace
}  // namespace arlo::safetensors
