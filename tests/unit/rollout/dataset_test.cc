// The dataset kinds parquet and hf_dataset (rollout/environments/parquet.cc) on real files: the
// test's Python helper (make_datasets.py) writes Parquet with pyarrow and saves datasets to disk with
// Hugging Face `datasets`, once for the whole suite, under the project's Python.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "rollout/environment.h"

namespace arlo::rollout {
namespace {

namespace fs = std::filesystem;

class DatasetFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "arlo_datasets_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = new std::string(tmpl);
    const std::string cmd = fmt::format("'{}' '{}' '{}'", ARLO_TEST_PYTHON, ARLO_TEST_MAKE_DATASETS, *dir_);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  static Result<std::shared_ptr<const TaskSet>> load(const std::string& kind, const std::string& name,
                                                     Json options = Json::object(), std::size_t size = 0) {
    EnvironmentSpec spec;
    spec.path = path(name);
    spec.size = size;
    spec.options = std::move(options);
    return make_task_source(kind, spec);
  }
  // The error of loading `name`, which must fail.
  static std::string error_of(const std::string& name, Json options = Json::object()) {
    auto r = load("parquet", name, std::move(options));
    EXPECT_FALSE(r) << name;
    return r ? std::string() : r.error().message();
  }

  static std::string* dir_;
};
std::string* DatasetFiles::dir_ = nullptr;

TEST_F(DatasetFiles, ParquetColumnsBecomeTasks) {
  auto r = load("parquet", "good.parquet", {{"info_column", "info"}, {"id_column", "uid"}});
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ((*r)->size(), 10u);
  // An integer answer column becomes the answer's text; the info struct, the task's info.
  auto want =
      task_from_json({{"id", "q3"}, {"env", "parquet"}, {"prompt", "3+3="}, {"answer", "6"}, {"info", {{"i", 3}}}});
  EXPECT_TRUE((*r)->at(3) == *want) << to_json((*r)->at(3)).dump();
}

TEST_F(DatasetFiles, DefaultIdsAndSize) {
  auto r = load("parquet", "good.parquet", Json::object(), 4);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ((*r)->size(), 4u);
  EXPECT_EQ((*r)->at(2).id, "parquet-2");
  EXPECT_TRUE((*r)->at(2).info.empty());
}

TEST_F(DatasetFiles, ChatMessagesAndJsonInfo) {
  auto r = load("parquet", "chat.parquet",
                {{"prompt_column", "question"}, {"answer_column", "solution"}, {"info_column", "meta"}});
  ASSERT_TRUE(r) << r.error().message();
  const Task& t = (*r)->at(0);
  EXPECT_TRUE(t.is_chat());
  ASSERT_EQ(t.messages.size(), 2u);
  EXPECT_EQ(t.messages[1].role, "user");
  EXPECT_EQ(t.messages[1].content, "hi");
  EXPECT_EQ(t.answer, "hello");
  EXPECT_EQ(t.info, Json({{"level", 3}}));
}

TEST_F(DatasetFiles, DirectoryOfShardsInNameOrder) {
  auto r = load("parquet", "shards", {{"id_column", "uid"}});
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ((*r)->size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ((*r)->at(i).id, fmt::format("q{}", i));
}

TEST_F(DatasetFiles, SavedDatasetAndDatasetDict) {
  auto one = load("hf_dataset", "hf_one", {{"info_column", "info"}});
  ASSERT_TRUE(one) << one.error().message();
  ASSERT_EQ((*one)->size(), 10u);
  EXPECT_EQ((*one)->at(5).prompt, "5+5=");
  EXPECT_EQ((*one)->at(5).info, Json({{"i", 5}}));
  EXPECT_EQ((*one)->at(5).env, "hf_dataset");

  auto train = load("hf_dataset", "hf_dict", {{"id_column", "uid"}});  // split: train
  ASSERT_TRUE(train) << train.error().message();
  EXPECT_EQ((*train)->size(), 7u);
  auto test = load("hf_dataset", "hf_dict", {{"id_column", "uid"}, {"split", "test"}});
  ASSERT_TRUE(test) << test.error().message();
  ASSERT_EQ((*test)->size(), 3u);
  EXPECT_EQ((*test)->at(0).id, "q7");

  auto missing = load("hf_dataset", "hf_dict", {{"split", "validation"}});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("split 'validation'"), std::string::npos) << missing.error().message();
  EXPECT_NE(missing.error().message().find("train, test"), std::string::npos);
}

TEST_F(DatasetFiles, MissingColumnNamesFileAndColumns) {
  const auto e = error_of("no_answer.parquet");
  EXPECT_NE(e.find(path("no_answer.parquet")), std::string::npos) << e;
  EXPECT_NE(e.find("no column 'answer'"), std::string::npos) << e;
  EXPECT_NE(e.find("prompt, info, uid"), std::string::npos) << e;  // what the file has
  // Without answers the same file loads.
  EXPECT_TRUE(load("parquet", "no_answer.parquet", {{"answer_column", ""}}));
}

TEST_F(DatasetFiles, WrongTypeAndNullNameRowAndColumn) {
  auto e = error_of("wrong_type.parquet");
  EXPECT_NE(e.find(path("wrong_type.parquet") + ": row 0, column 'answer'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected a string or a number, got list"), std::string::npos) << e;
  e = error_of("null_prompt.parquet");
  EXPECT_NE(e.find(path("null_prompt.parquet") + ": row 2, column 'prompt'"), std::string::npos) << e;
  EXPECT_NE(e.find("got null"), std::string::npos) << e;
  e = error_of("dup_ids.parquet", {{"id_column", "uid"}});
  EXPECT_NE(e.find("row 1, column 'uid': duplicate id 'x'"), std::string::npos) << e;
}

TEST_F(DatasetFiles, EmptyAndCorruptFiles) {
  auto e = error_of("no_rows.parquet");
  EXPECT_NE(e.find(path("no_rows.parquet") + ": the dataset has no rows"), std::string::npos) << e;
  e = error_of("zero_bytes.parquet");
  EXPECT_NE(e.find(path("zero_bytes.parquet") + ": the file is empty"), std::string::npos) << e;
  e = error_of("corrupt.parquet");
  EXPECT_NE(e.find(path("corrupt.parquet") + ": not a readable Parquet file"), std::string::npos) << e;
  auto missing = load("parquet", "no-such.parquet");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message().find("no such file"), std::string::npos) << missing.error().message();
}

TEST_F(DatasetFiles, StreamShufflesAndResumesADataset) {
  auto r = load("parquet", "good.parquet", {{"id_column", "uid"}});
  ASSERT_TRUE(r);
  TaskStream a(*r, {.seed = 3, .shuffle = true, .epochs = 2});
  for (int i = 0; i < 13; ++i) ASSERT_TRUE(a.next());
  TaskStream b(*r, {.seed = 3, .shuffle = true, .epochs = 2});
  ASSERT_TRUE(b.restore(a.cursor()));
  while (!a.exhausted()) EXPECT_EQ(a.next()->id, b.next()->id);
  EXPECT_TRUE(b.exhausted());
}

}  // namespace
}  // namespace arlo::rollout
