// The bucket plan (vLLM's packing rule), the dtype maps, and loading libnccl.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string_view>
#include <utility>

#include "weight_sync/transports/nccl/group.h"
#include "weight_sync/transports/nccl/layout.h"

namespace arlo::weight_sync::nccl {
namespace {

// Tensors of the given byte sizes (uint8, one dimension).
std::vector<TensorSpec> sized(std::vector<std::int64_t> bytes) {
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    TensorSpec spec;
    spec.name = "t";
    spec.name += std::to_string(i);
    spec.dtype = DType::U8;
    spec.shape = {bytes[i]};
    specs.push_back(std::move(spec));
  }
  return specs;
}

Layout packed(std::uint64_t buffer) { return {.packed = true, .packed_buffer_bytes = buffer, .packed_num_buffers = 2}; }

TEST(NcclLayout, ClosesTheBucketAfterTheTensorThatCrossesTheLimit) {
  // Running totals 4, 8 (== limit: stays open), 12 (> limit: closes after tensor 2), then 4, 8, 9.
  EXPECT_EQ(plan_buckets(sized({4, 4, 4, 4, 4, 1}), packed(8)), (std::vector<Bucket>{{0, 3, 12}, {3, 3, 9}}));
}

TEST(NcclLayout, ExactBoundaryDoesNotClose) {
  EXPECT_EQ(plan_buckets(sized({5, 3}), packed(8)), (std::vector<Bucket>{{0, 2, 8}}));
  EXPECT_EQ(plan_buckets(sized({5, 3, 1}), packed(8)), (std::vector<Bucket>{{0, 3, 9}}));
}

TEST(NcclLayout, TensorLargerThanTheBufferGetsItsOwnBucketOrClosesTheOpenOne) {
  EXPECT_EQ(plan_buckets(sized({100}), packed(8)), (std::vector<Bucket>{{0, 1, 100}}));
  EXPECT_EQ(plan_buckets(sized({2, 100, 2}), packed(8)), (std::vector<Bucket>{{0, 2, 102}, {2, 1, 2}}));
  EXPECT_EQ(largest_bucket(plan_buckets(sized({2, 100, 2}), packed(8))), 102u);
}

TEST(NcclLayout, EmptyListAndZeroByteTensors) {
  EXPECT_TRUE(plan_buckets({}, packed(8)).empty());
  EXPECT_TRUE(plan_buckets({}, Layout{.packed = false}).empty());
  EXPECT_EQ(largest_bucket({}), 0u);
  EXPECT_EQ(plan_buckets(sized({0, 0}), packed(8)), (std::vector<Bucket>{{0, 2, 0}}));
}

TEST(NcclLayout, DtypeSizesCountAndDefaultsAreVllms) {
  Layout defaults;
  EXPECT_TRUE(defaults.packed);
  EXPECT_EQ(defaults.packed_buffer_bytes, 1ull << 30);
  EXPECT_EQ(defaults.packed_num_buffers, 2);
  // 3 x 4 bf16 = 24 bytes, then 10 f32 = 40: total 64 > 32 closes after the second.
  std::vector<TensorSpec> specs = {{"a", DType::BF16, {3, 4}}, {"b", DType::F32, {10}}, {"c", DType::F32, {}}};
  EXPECT_EQ(plan_buckets(specs, packed(32)), (std::vector<Bucket>{{0, 2, 64}, {2, 1, 4}}));
}

TEST(NcclLayout, PerTensorLayoutIsOneBucketPerTensor) {
  EXPECT_EQ(plan_buckets(sized({4, 0, 100}), Layout{.packed = false, .packed_buffer_bytes = 8}),
            (std::vector<Bucket>{{0, 1, 4}, {1, 1, 0}, {2, 1, 100}}));
}

TEST(NcclLayout, ValidateRefusesImpossibleLayouts) {
  EXPECT_TRUE(validate(Layout{}));
  auto zero = validate(Layout{.packed_buffer_bytes = 0});
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message().find("packed_buffer_bytes"), std::string::npos);
  auto buffers = validate(Layout{.packed_num_buffers = 0});
  ASSERT_FALSE(buffers);
  EXPECT_NE(buffers.error().message().find("packed_num_buffers"), std::string::npos);
}

TEST(NcclLayout, TorchDtypeNames) {
  const std::pair<DType, std::string_view> names[] = {{DType::BF16, "bfloat16"},
                                                      {DType::F32, "float32"},
                                                      {DType::F16, "float16"},
                                                      {DType::F64, "float64"},
                                                      {DType::F8_E4M3, "float8_e4m3fn"},
                                                      {DType::F8_E5M2, "float8_e5m2"},
                                                      {DType::I64, "int64"},
                                                      {DType::I32, "int32"},
                                                      {DType::I16, "int16"},
                                                      {DType::I8, "int8"},
                                                      {DType::U8, "uint8"},
                                                      {DType::BOOL, "bool"}};
  for (const auto& [dtype, name] : names) EXPECT_EQ(*torch_dtype_name(dtype), name) << safetensors::dtype_name(dtype);
}

TEST(NcclLayout, NcclDataTypesArePynccls) {
  const std::pair<DType, int> types[] = {{DType::I8, 0},       {DType::U8, 1},      {DType::I32, 2}, {DType::I64, 4},
                                         {DType::F16, 6},      {DType::F32, 7},     {DType::F64, 8}, {DType::BF16, 9},
                                         {DType::F8_E4M3, 10}, {DType::F8_E5M2, 11}};
  for (const auto& [dtype, type] : types) EXPECT_EQ(*nccl_data_type(dtype), type) << safetensors::dtype_name(dtype);
  EXPECT_EQ(kNcclUint8, 1);
  EXPECT_EQ(kNcclFloat32, 7);
  for (DType d : {DType::I16, DType::BOOL}) {
    auto r = nccl_data_type(d);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find(std::string(safetensors::dtype_name(d))), std::string::npos);
    EXPECT_NE(r.error().message().find("packed"), std::string::npos);  // says what to do
  }
}

TEST(NcclLibrary, LoadFailureNamesThePathAndTheLoadersReason) {
  const std::string path = "/nonexistent/arlo-test/libnccl.so.2";
  auto r = library_version(path);
  ASSERT_FALSE(r);
  if (!backend_built()) {
    EXPECT_NE(r.error().what().find("built without NCCL"), std::string::npos) << r.error().what();
    return;
  }
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.error().what().find(path), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("No such file or directory"), std::string::npos) << r.error().what();  // dlerror
  auto id = new_unique_id(path);
  ASSERT_FALSE(id);
  EXPECT_NE(id.error().what().find(path), std::string::npos);
}

TEST(NcclLibrary, NotALibraryIsRefusedWithTheLoadersReason) {
  if (!backend_built()) GTEST_SKIP() << "built without NCCL";
  const std::string path = std::filesystem::absolute(__FILE__).string();  // a file, but not an ELF library
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "source file not found: " << path;
  auto r = library_version(path);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find(path), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("invalid ELF header"), std::string::npos) << r.error().what();
}

// The CUDA install's libnccl loads and reports its version without a GPU (no CUDA call is made).
TEST(NcclLibrary, DefaultLibraryReportsItsVersion) {
  if (!backend_built()) GTEST_SKIP() << "built without NCCL";
  if (!std::filesystem::exists(kDefaultLibraryPath)) GTEST_SKIP() << "no " << kDefaultLibraryPath;
  auto v = library_version("");
  ASSERT_TRUE(v) << v.error().what();
  EXPECT_TRUE(std::regex_match(*v, std::regex(R"(2\.\d+\.\d+)"))) << *v;
  auto again = library_version(kDefaultLibraryPath);  // cached: the same answer
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *v);
  std::printf("libnccl %s: version %s\n", kDefaultLibraryPath, v->c_str());
}

}  // namespace
}  // namespace arlo::weight_sync::nccl
